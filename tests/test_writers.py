"""One writer: every file kgc writes goes through :mod:`kgc.fileio` (an atomic file, a staged folder renamed in
whole, a transaction), so a full disk or a kill never leaves half a file where a reader trusts it.

The scan reads every module of ``kgc/`` and finds each call that writes a file — ``open(…, "w"/"a"/"x")``,
``Path.write_text/write_bytes``, ``save_pretrained``, ``torch.save``, ``np.save``, safetensors' ``save_file``,
``savefig``, ``faiss.write_index``, ``json.dump``, ``shutil.copy*``, ``os.replace``, a SQLite connection … — and
fails unless it is inside the writer: in a ``with`` block of ``atomic_dir``/``staged_path``/``atomic_path``/
``Transaction``, or in a function or lambda handed to ``write_with``. The few writes that are not a run's, a
cache's, a study's or the service's (a benchmark's log of its own child process …) are listed below with the
reason; an entry that no longer matches a write fails too, so the list cannot rot.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kgc

ROOT = Path(kgc.__file__).parent

STAGING = {"atomic_dir", "staged_path", "atomic_path", "Transaction", "transaction", "staged_dir"}
HANDED = {"write_with"}  # write_with(path, writer): writer(tmp) writes the staged file

# (module, enclosing function, what): why this write is not through kgc.fileio
ALLOWED: dict[tuple[str, str, str], str] = {
    ("fileio/*", "*", "*"): "the writer itself",
    ("bench.py", "_linked_copy", "copytree"): "`kgc bench` copies a run into its own scratch folder to time it "
                                              "(hard links; never written back into the run)",
    ("bench.py", "link", "copy2"): "the same copy, file by file where a hard link is refused",
    ("bench.py", "bench_serve", "open"): "`kgc bench serve`'s log of the server it started, in a scratch folder",
    ("data/download.py", "download", "open"): "a file of a folder being built: its callers (the catalog's fetch, "
                                              "GraIL's) call it inside atomic_dir, renamed into place whole",
    ("data/wikidata5m.py", "_download", "open"): "a download into a `.part` file, renamed on completion",
    ("data/wikidata5m.py", "_download", "replace"): "that rename (the file checked first: its length, gzip magic)",
    ("linkpred/bench/steps.py", "_tiny_backbone", "save_pretrained"): "a throwaway model in the benchmark's "
                                                               "TemporaryDirectory",
    ("training/trackers.py", "__init__", "sqlite"): "MLflow's own SQLite store (mlflow.db), in MLflow's "
                                                     "transactions",
    ("tune/study.py", "__init__", "sqlite"): "Optuna's SQLite study (SQLite's own journal; a full disk under it is one "
                                       "message: kgc.tune)",
    ("tune/command.py", "_tune", "sqlite"): "the same study's URL handed to the workers",
    ("tune/storage.py", "storage_error", "sqlite"): "the path read out of the study's URL to name its disk (no connection)",
    ("training/study_trackers.py", "parent", "sqlite"): "MLflow's own SQLite store of a study's runs (STUDY/mlflow/mlflow.db)",
    ("tune/storage.py", "check_sqlite_storage", "sqlite"): "the study's SQLite file opened read-only (mode=ro) to check it "
                                                   "before Optuna opens it: it writes nothing",
}

# functions that write into a folder their caller stages: allowed if every call of them is inside the writer
STAGED_BY_CALLER = {
    ("data/wikidata5m.py", "convert"): "the KG-BERT folder, in fetch's atomic_dir",
    ("data/catalog.py", "_unpack"): "an encrypted dataset's files, in Encrypted.fetch's atomic_dir",
    ("data/synth_graph.py", "_write"): "each file of the synthetic graph, in write_graph's atomic_dir",
    ("linkpred/export.py", "_write"): "an export's files, in export_towers' atomic_dir",
    ("linkpred/export.py", "_write_tower"): "each tower's save_pretrained folder, in _write's folder",
}


def _writer_name(call: ast.Call) -> str | None:
    """The kind of write ``call`` is, or None."""
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    base = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
    if name == "open":
        mode = None
        if base is not None and base[:1].isupper():
            return None  # a class's own open() (Shards.open), not a file's
        modules = ("io", "builtins", "os", "gzip", "bz2", "lzma", "codecs", "tarfile", "zipfile")
        args = call.args[1:] if isinstance(f, ast.Name) or base in modules else call.args[:1]
        if args and isinstance(args[0], ast.Constant):
            mode = args[0].value
        for kw in call.keywords:
            if kw.arg == "mode" and isinstance(kw.value, ast.Constant):
                mode = kw.value.value
        if base == "os":  # os.open(path, flags): writing flags
            return "open" if any(isinstance(a, ast.Attribute) and a.attr in ("O_WRONLY", "O_RDWR", "O_CREAT")
                                 for a in ast.walk(call)) else None
        if mode is None and (len(args) > 0 or any(kw.arg == "mode" for kw in call.keywords)):
            return "open"  # a mode the scan cannot read: counted as a write
        return "open" if isinstance(mode, str) and any(c in mode for c in "wax+") else None
    if name in ("write_text", "write_bytes"):
        return None if base in ("tx", "fileio") or isinstance(f, ast.Name) else name
    if name in ("copytree", "copy", "copy2", "copyfile", "move"):
        return name if base == "shutil" else None  # dict.copy(), a local move()
    if name in ("replace", "rename"):
        return name if base == "os" or (name == "rename" and isinstance(f, ast.Attribute)) else None
    if name in ("save_pretrained", "savefig", "write_index", "to_csv", "to_parquet", "tofile", "savez",
                "savez_compressed"):
        return name if isinstance(f, ast.Attribute) else None  # a method; a local to_csv(rows) makes text
    if name == "save" and base in ("torch", "np", "numpy"):
        return name
    if name == "save_file":
        return name
    if name == "dump" and base in ("json", "pickle", "yaml"):
        return name if len(call.args) >= 2 else None
    if name == "connect" and base == "sqlite3":
        return "sqlite"
    return None


class _Scan(ast.NodeVisitor):
    def __init__(self, module: str) -> None:
        self.module, self.stack, self.found, self.calls = module, ["<module>"], [], []
        self.inside = 0  # depth of staging blocks and handed writers around the node

    def _staging(self, node: ast.With) -> bool:
        for item in node.items:
            c = item.context_expr
            if isinstance(c, ast.Call):
                f = c.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if name in STAGING:
                    return True
        return False

    def visit_With(self, node: ast.With) -> None:
        staged = self._staging(node)
        for item in node.items:
            self.visit(item)
        self.inside += staged
        for stmt in node.body:
            self.visit(stmt)
        self.inside -= staged

    def _function(self, node) -> None:
        self.stack.append(node.name)
        handed = node.name in self.handed_names or (self.module, node.name) in STAGED_BY_CALLER
        self.inside += handed
        self.generic_visit(node)
        self.inside -= handed
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in HANDED:  # its writer argument (a lambda or a local function's name) writes the staged file
            self.visit(f)
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                handed = isinstance(arg, ast.Lambda)
                self.inside += handed
                self.visit(arg)
                self.inside -= handed
            return
        what = _writer_name(node)
        if what is not None and not self.inside:
            self.found.append((self.stack[-1], what, node.lineno))
        if name in {fn for _, fn in STAGED_BY_CALLER}:
            self.calls.append((name, bool(self.inside), node.lineno))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and node.value.startswith("sqlite:///") and not self.inside:
            self.found.append((self.stack[-1], "sqlite", node.lineno))


def _handed_names(tree: ast.AST) -> set[str]:
    """Names of local functions passed to write_with somewhere in the module (``write_with(p, save)``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in HANDED:
                out |= {a.id for a in node.args if isinstance(a, ast.Name)}
                out |= {a.func.id for a in node.args if isinstance(a, ast.Call) and isinstance(a.func, ast.Name)}
    return out


CALLS: list[tuple[str, str, bool, int]] = []  # (module, function, inside the writer, line) of STAGED_BY_CALLER


def scan() -> list[tuple[str, str, str, int]]:
    out = []
    CALLS.clear()
    for path in sorted(ROOT.rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        s = _Scan(module)
        s.handed_names = _handed_names(tree)
        s.visit(tree)
        out += [(module, fn, what, line) for fn, what, line in s.found]
        CALLS.extend((module, fn, inside, line) for fn, inside, line in s.calls)
    return out


def _allowed(module: str, fn: str, what: str) -> bool:
    return any((m, f, w) in ALLOWED for m in (module, module.rsplit("/", 1)[0] + "/*") for f in (fn, "*")
               for w in (what, "*"))


def test_writers_that_their_callers_stage_are_called_only_inside_the_writer():
    scan()
    for module, fn in STAGED_BY_CALLER:
        calls = [c for c in CALLS if c[1] == fn and c[0] == module]  # private helpers: called in their module
        assert calls, f"{module}: {fn} is never called (remove it from STAGED_BY_CALLER)"
        outside = [f"kgc/{m}:{line}" for m, _, inside, line in calls if not inside]
        assert not outside, f"{fn} writes into the folder its caller stages, but is called outside one: {outside}"


def test_every_write_goes_through_the_writer():
    outside = [f"kgc/{m}:{line} in {fn}(): {what}" for m, fn, what, line in scan() if not _allowed(m, fn, what)]
    assert not outside, "writes outside kgc.fileio (stage them: atomic_dir, write_with, Transaction):\n" + \
        "\n".join(outside)


def test_every_allowance_still_names_a_write():
    found = {(m, fn, what) for m, fn, what, _ in scan()}
    stale = [k for k in ALLOWED if k[1] != "*" and k not in found]
    assert not stale, f"allowances that match no write any more (remove them): {stale}"


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The scan itself: each kind of write outside the writer is found; inside, it is not."""
    code = '''
import json, os, shutil, sqlite3, numpy as np, torch
from kgc.fileio import atomic_dir, write_with
def bad(p, model, fig, tx):
    open(p, "w"); p.open("a"); p.write_text("x"); model.save_pretrained(p); torch.save({}, p); np.save(p, 1)
    fig.savefig(p); json.dump({}, open(p, "r")); shutil.copy2(p, p); os.replace(p, p); sqlite3.connect(p)
    url = "sqlite:///x.db"
def good(p, model, fig, tx):
    open(p); p.open(); d = {}.copy(); "a".replace("a", "b"); tx.write_text("n", "x")
    with atomic_dir(p) as tmp:
        model.save_pretrained(tmp); (tmp / "x").write_text("y")
    write_with(p, lambda t: torch.save({}, t))
    def save(t):
        np.save(t, 1)
    write_with(p, save)
'''
    tree = ast.parse(code)
    s = _Scan("x.py")
    s.handed_names = _handed_names(tree)
    s.visit(tree)
    kinds = sorted(what for fn, what, _ in s.found if fn == "bad")
    assert kinds == sorted(["open", "open", "write_text", "save_pretrained", "save", "save", "savefig", "dump",
                            "copy2", "replace", "sqlite", "sqlite"]), kinds
    assert [f for f in s.found if f[0] != "bad"] == []
