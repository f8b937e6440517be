"""The README and the documentation pages: every example runs, every reference is generated, nothing drifts.

**The convention.** Every fenced block names its language. A ``python`` block or a shell block (``bash``, ``sh``,
``shell``, ``console``) is *run* by this file unless the line right before it (blank lines aside) is
``<!-- not run: REASON -->`` — and the reason must be there (a GPU, 90 minutes of training, a server that runs until
stopped). Nothing else is skipped: a block that is neither run nor marked fails
:func:`test_every_block_is_run_or_marked`.

**How a page runs** (:func:`test_page_examples_run`, one test per page): in a fresh folder (``recipes/`` and
``data/examples/`` linked in, ``$KGC_CACHE_HOME`` empty), its blocks in page order, so a later block uses what an
earlier one made, as a reader would. Python blocks share one namespace per page and run with ``exec``. Shell blocks
run line by line: a ``kgc …`` command in process through ``tests.conftest.cli`` (``&&`` chains allowed) and must exit
0; a line of plain file utilities (``printf … > new.tsv``) through bash; anything else cannot run here and must be
marked. A ``console`` block is a transcript: each ``$ kgc …`` line is run and its output must equal the lines under
it. ``runs/quickstart`` and ``runs/capitals`` are there already (trained once per session) on a page that uses them
without training them itself.

Here, and only here, ``kgc.train`` is wrapped (as the README example's test always did) so that ``model.backbone`` is
a 6-layer, 32-wide random BERT with MiniLM's tokenizer, ``train.max_steps`` is 3 and one thread trains: everything
else — recipes, commands, calls, printed output — is the page's own. Figures printed by a MiniLM run cannot come out
of that model, so transcripts of trained output are marked not run, and their commands run in a block beside them.

The other tests: YAML blocks are valid recipes (one that starts ``# kgc train recipes/X.yaml`` equals that file);
the README's shape (≤ 200 lines, ``make quickstart`` and ``make test`` first, links that resolve); no dated or
"in progress" text outside ``CHANGELOG.md`` and the study pages (``docs/results/``); the generated recipe-key and
CLI references (``docs/_hooks/reference.py``) cover every key and every command.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pytest
import yaml

import kgc
from tests.conftest import cli

ROOT = Path(__file__).resolve().parents[1]
PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell", "console"}
OTHER = {"text", "yaml", "json", "toml", "tsv", "csv"}
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>.*?)\s*-->$")
UTILITIES = {"printf", "echo", "cat", "head", "tail", "ls", "mkdir", "cp", "rm", "wc"}
STEPS = 3  # training steps of every run made here
TEMPLATES = ("quickstart", "capitals")  # runs a page may use without training them itself
STUDY_PAGES = ROOT / "docs" / "results"  # study pages: dated notes belong there (and in CHANGELOG.md)


def doc_files() -> list[Path]:
    """README.md, CHANGELOG.md and every page under docs/ (the hooks folder holds no pages)."""
    pages = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_hooks" not in p.parts)
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *pages]


@dataclass
class Block:
    path: Path
    line: int          # 1-based line of the opening fence
    lang: str          # the fence's language ("" when it names none)
    code: str
    not_run: str | None  # the reason of a <!-- not run: … --> marker right before it, else None
    marker: bool = False  # a not-run marker stands before it (even with an empty reason)

    @property
    def runnable(self) -> bool:
        return self.lang in PYTHON | SHELL

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with its language and the not-run marker before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        end = i + 1
        while end < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_RUN.match(before)
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:end])
        out.append(Block(path, i + 1, lang.lower(), code + "\n", marker.group("reason") if marker else None,
                         marker is not None))
        i = end + 1
    return out


# ----------------------------------------------------------------------------------------------------------------
# shell lines


def shell_steps(code: str) -> list[tuple[str, Any]]:
    """``("kgc", argv)`` for each kgc command of a shell block, ``("bash", line)`` for a line of file utilities.

    Continuation lines (``\\``) are joined, comments dropped; ``a && b`` runs a then b. Anything else is a
    ValueError naming the line: it cannot run here, so its block must be marked not run."""
    steps: list[tuple[str, Any]] = []
    for line in re.sub(r"\\\n\s*", " ", code).splitlines():
        tokens = shlex.split(line, comments=True)
        if not tokens:
            continue
        if tokens[0] in UTILITIES and "kgc" not in tokens:
            steps.append(("bash", line))
            continue
        command: list[str] = []
        for tok in tokens + ["&&"]:
            if tok != "&&":
                command.append(tok)
                continue
            if not command or command[0] != "kgc" or any(t in {"|", ">", "<", ";", "||", "&"} for t in command):
                raise ValueError(f"cannot run {line.strip()!r} here (kgc commands and file utilities only): "
                                 "mark its block <!-- not run: reason -->")
            steps.append(("kgc", command[1:]))
            command = []
    return steps


def console_steps(code: str) -> list[tuple[list[str], list[str]]]:
    """``(argv, expected output lines)`` for each ``$ kgc …`` line of a transcript."""
    steps: list[tuple[list[str], list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            argv = shlex.split(line[2:], comments=True)
            if not argv or argv[0] != "kgc":
                raise ValueError(f"cannot run {line!r} here: mark its block <!-- not run: reason -->")
            steps.append((argv[1:], []))
        elif steps:
            steps[-1][1].append(line.rstrip())
        elif line.strip():
            raise ValueError(f"a transcript starts with a `$ kgc …` line, not {line!r}")
    return steps


# ----------------------------------------------------------------------------------------------------------------
# the convention, statically


def test_every_block_is_run_or_marked():
    problems = []
    for path in doc_files():
        for b in blocks(path):
            if not b.lang:
                problems.append(f"{b.where()}: a fence without a language (```text for output, ```bash, ```python …)")
            elif b.lang not in PYTHON | SHELL | OTHER:
                problems.append(f"{b.where()}: unknown block language {b.lang!r}")
            if b.marker and not b.runnable:
                problems.append(f"{b.where()}: a not-run marker before a {b.lang or 'plain'} block (only Python and "
                                "shell blocks run)")
            if b.marker and not b.not_run:
                problems.append(f"{b.where()}: <!-- not run: … --> needs its reason")
            if b.runnable and b.not_run is None:
                try:
                    console_steps(b.code) if b.lang == "console" else (
                        shell_steps(b.code) if b.lang in SHELL else compile(b.code, b.where(), "exec"))
                except (ValueError, SyntaxError) as exc:
                    problems.append(f"{b.where()}: {exc}")
    assert not problems, "\n".join(problems)


def test_marker_and_block_extraction(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# x\n```python\nprint(1)\n```\n<!-- not run: a GPU -->\n\n```bash\nkgc train r.yaml\n```\n"
                    "    ```text\n    out\n    ```\n<!-- not run: -->\n````console\n$ kgc data list\n````\n")
    got = blocks(page)
    assert [(b.lang, b.not_run, b.line) for b in got] == [("python", None, 2), ("bash", "a GPU", 7),
                                                           ("text", None, 10), ("console", "", 14)]
    assert got[0].code == "print(1)\n" and got[2].code == "out\n" and got[3].marker
    assert shell_steps('kgc a --x "y z"  # note\nprintf \'a\\tb\\n\' > f.tsv\nkgc b \\\n  --c 1 && kgc d\n') == [
        ("kgc", ["a", "--x", "y z"]), ("bash", "printf 'a\\tb\\n' > f.tsv"), ("kgc", ["b", "--c", "1"]),
        ("kgc", ["d"])]
    for bad in ("make quickstart", "curl -s localhost:8000", "kgc a | head", "KGC_X=1 kgc train r"):
        with pytest.raises(ValueError, match="mark its block"):
            shell_steps(bad)
    assert console_steps("$ kgc data check x\nline 1\n  line 2  \n$ kgc data list\n") == [
        (["data", "check", "x"], ["line 1", "  line 2"]), (["data", "list"], [])]


# ----------------------------------------------------------------------------------------------------------------
# running the pages


@pytest.fixture(scope="session")
def tiny_bert6(tmp_path_factory, tokenizer) -> Path:
    """A 6-layer, 32-wide BERT with random weights and MiniLM's tokenizer: as deep as MiniLM, so every recipe's
    ``encoder.trainable_layers`` and ``model.router_layers`` fit."""
    from tests.conftest import save_tiny_bert

    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert6"), tokenizer, 6)


def small_train(real_train, backbone: Path):
    """``kgc.train`` with the tiny backbone, ``STEPS`` steps and one thread (an example's own values of those keys
    give way; every other override and argument is the example's)."""
    forced = {"model.backbone": str(backbone), "train.max_steps": STEPS, "train.num_threads": 1}

    def train(recipe, out=None, **kwargs):
        given = kwargs.pop("overrides", None)
        for key in forced:
            kwargs.pop(key.replace(".", "__"), None)
        if given is None or isinstance(given, Mapping):
            overrides: Any = {**dict(given or {}), **forced}
        else:
            overrides = [o for o in given if o.split("=", 1)[0].strip() not in forced]
            overrides += [f"{k}={v}" for k, v in forced.items()]
        return real_train(recipe, out, overrides=overrides, **kwargs)

    return train


def workdir(folder: Path) -> Path:
    """A folder laid out like the checkout for the examples: recipes/ and data/examples/ linked, data/ writable."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "recipes").symlink_to(ROOT / "recipes")
    (folder / "data").mkdir()
    (folder / "data" / "examples").symlink_to(ROOT / "data" / "examples")
    return folder


@pytest.fixture(scope="session")
def template_runs(tiny_bert6, tmp_path_factory, data_home) -> Path:
    """``runs/quickstart`` and ``runs/capitals`` trained once, for pages that use them without training them."""
    folder = workdir(tmp_path_factory.mktemp("doc_templates") / "work")
    with pytest.MonkeyPatch.context() as m:
        m.setenv("KGC_CACHE_HOME", str(folder.parent / "cache"))
        m.chdir(folder)
        train = small_train(kgc.train, tiny_bert6)
        train("recipes/umls_biencoder.yaml", "runs/quickstart", progress=False, echo=None)
        train("recipes/capitals.yaml", "runs/capitals", progress=False, echo=None)
    return folder / "runs"


def runnable_pages() -> list[Path]:
    return [p for p in doc_files() if any(b.runnable and b.not_run is None for b in blocks(p))]


def run_console(b: Block) -> None:
    for argv, expected in console_steps(b.code):
        res = cli(*argv, check=False)
        got = [line.rstrip() for line in (res.stdout + res.stderr).strip("\n").splitlines()]
        want = list(expected)
        while want and not want[-1]:
            want.pop()
        assert got == want, f"{b.where()}: `kgc {' '.join(argv)}` printed\n" + "\n".join(got) + \
            "\n--- the page shows\n" + "\n".join(want)


def run_shell(b: Block, folder: Path) -> None:
    for kind, step in shell_steps(b.code):
        if kind == "bash":
            done = subprocess.run(["bash", "-c", step], cwd=folder, capture_output=True, text=True)
            assert done.returncode == 0, f"{b.where()}: `{step}` failed: {done.stderr}"
        else:
            res = cli(*step, check=False)
            assert res.exit_code == 0, f"{b.where()}: {res!r}"


@pytest.mark.slow
@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(page, tiny_bert6, template_runs, tmp_path, monkeypatch, capsys, data_home):
    folder = workdir(tmp_path / "work")
    runnable = [b for b in blocks(page) if b.runnable and b.not_run is None]
    text = "\n".join(b.code for b in runnable)
    for name in TEMPLATES:
        if f"runs/{name}" in text and not re.search(rf"--out\s+runs/{name}\b", text):
            shutil.copytree(template_runs / name, folder / "runs" / name)
    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(kgc, "train", small_train(kgc.train, tiny_bert6))
    monkeypatch.chdir(folder)
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    for b in runnable:
        if b.lang in PYTHON:
            exec(compile(b.code, b.where(), "exec"), namespace)
        elif b.lang == "console":
            run_console(b)
        else:
            run_shell(b, folder)
    capsys.readouterr()


# ----------------------------------------------------------------------------------------------------------------
# YAML blocks, the README's shape, dated text


def test_yaml_blocks_are_recipes():
    for path in doc_files():
        for b in (b for b in blocks(path) if b.lang == "yaml"):
            tree = yaml.safe_load(b.code)
            recipe = kgc.resolve_recipe(tree)  # a bad key fails here, naming it
            first = b.code.lstrip().splitlines()[0]
            m = re.match(r"#\s*kgc train (recipes/\S+\.yaml)", first)
            if m:
                shipped = kgc.resolve_recipe(ROOT / m.group(1))
                assert recipe.model_dump() == shipped.model_dump(), f"{b.where()} differs from {m.group(1)}"


def test_readme_shape():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    first = blocks(ROOT / "README.md")[0]
    commands = [line.split("#")[0].strip() for line in first.code.splitlines() if line.strip()]
    assert first.lang == "bash" and commands[:2] == ["make quickstart", "make test"]
    assert text.index("```bash") < text.index("\n## ")  # the two commands come first
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert local and not [link for link in local if not (ROOT / link).exists()]
    table = text[text.index("## How well it does"):text.index("## Documentation")]
    assert table.count("](docs/results/") >= 3


def test_no_dated_text_outside_the_changelog_and_the_studies():
    dated = re.compile(r"\b20\d\d-\d\d(-\d\d)?\b|in progress|measured before|not yet (run|measured)", re.I)
    found = []
    for path in doc_files():
        if path.name == "CHANGELOG.md" or path.is_relative_to(STUDY_PAGES):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if dated.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


# ----------------------------------------------------------------------------------------------------------------
# the generated references


@pytest.fixture(scope="module")
def reference():
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "_hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recipe_key_reference_is_generated_from_the_schema(reference):
    from kgc.recipe import key_reference

    page = (ROOT / "docs" / "recipes.md").read_text(encoding="utf-8")
    assert "<!-- generated: recipe-keys -->" in page
    text = reference.expand(page, "recipes.md")
    for row in key_reference():
        assert f"| `{row['key']}`" in text, row["key"]
    assert "*(task csts)*" in text and "*(task linkpred)*" in text and "*(model.conditioner hypernet)*" in text


def test_cli_reference_is_generated_from_the_app(reference):
    import typer.main

    from kgc.cli import app

    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "<!-- generated: cli -->" in page
    text = reference.expand(page, "cli.md")
    root = typer.main.get_command(app)
    for name, cmd in root.commands.items():
        if cmd.hidden:  # `kgc recipe`: `kgc recipes` under its earlier name
            assert f"\n## kgc {name}\n" not in text, name
            continue
        assert f"\n## kgc {name}\n" in text, name
        for sub in getattr(cmd, "commands", {}):
            assert f"\n## kgc {name} {sub}\n" in text, f"{name} {sub}"
    assert "| `--set <list[str]>` | override a recipe key" in text
    with pytest.raises(ValueError, match="unknown"):
        reference.expand("<!-- generated: nothing -->", "x.md")


def test_docstring_roles_name_objects_of_kgc(caplog):
    """The API reference turns ``:class:`X``` roles into links (docs/_hooks/griffe_roles.py) and fails the docs build
    on a role naming nothing in kgc; the same check here, without building the site."""
    griffe = pytest.importorskip("griffe")  # the docs extra (make install installs it)

    extensions = griffe.load_extensions(f"{ROOT / 'docs' / '_hooks' / 'griffe_roles.py'}:SphinxRoles")
    with caplog.at_level("WARNING", logger="kgc_docs.roles"):
        pkg = griffe.load("kgc", extensions=extensions, search_paths=[str(ROOT)])
    assert not [r.getMessage() for r in caplog.records if r.name == "kgc_docs.roles"]
    assert "[`kgc.Run`][kgc.training.run.Run]" in pkg["api"].docstring.value


def table_problems(text: str) -> list[tuple[int, str]]:
    """(line, why) for each table in ``text`` that Python-Markdown would not render as one: a run of ``|`` rows
    (indented or not, outside fenced blocks) must have a header separator as its second line and a blank line (or
    the page's start) before it. A table cut by a blank line leaves its later rows as raw ``|`` text, and a table
    glued to the paragraph above it renders whole as text; ``mkdocs build --strict`` catches neither."""
    separator = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
    lines, fence, found, n = text.splitlines(), None, [], 0
    while n < len(lines):
        stripped = lines[n].strip()
        m = re.match(r"(`{3,}|~{3,})", stripped)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and re.fullmatch(rf"{re.escape(fence[0])}{{{len(fence)},}}", stripped):
            fence = None
        if fence is not None or m or not stripped.startswith("|"):
            n += 1
            continue
        start = n
        while n < len(lines) and lines[n].strip().startswith("|"):
            n += 1
        if n - start < 2 or not separator.match(lines[start + 1]):
            found.append((start + 1, "rows without a header separator under their first row (a table cut by a "
                                     "blank line, or a row on its own)"))
        elif start > 0 and lines[start - 1].strip():
            found.append((start + 1, "a table right under a line of text (a blank line must come before it)"))
    return found


def test_table_problems_finds_cut_and_glued_tables():
    good = "text\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```text\n| not | a table |\n```\n"
    assert table_problems(good) == []
    cut = "| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n"
    assert [line for line, _ in table_problems(cut)] == [5]
    glued = "a paragraph\n| a | b |\n|---|---|\n"
    assert "right under a line of text" in table_problems(glued)[0][1]
    nested = "- item\n\n    | a | b |\n    |:--|--:|\n    | 1 | 2 |\n\n    | 3 | 4 |\n"
    assert [line for line, _ in table_problems(nested)] == [7]


def test_no_table_is_cut_by_a_blank_line(reference):
    """Every table of the README, the changelog and every page renders as one table: the pages as written, and
    the two pages whose references are generated at build time as the build expands them."""
    found = []
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        if reference.PLACEHOLDER.search(text):
            text = reference.expand(text, path.name)
        found += [f"{path.relative_to(ROOT)}:{line}: {why}" for line, why in table_problems(text)]
    assert not found, "tables that do not render as tables:\n" + "\n".join(found)


def test_home_page_starts_with_the_readmes_two_commands():
    """The site's home page opens as the README does: its first block holds the README's first two commands (set up
    and run the quickstart, run the tests), before any section."""
    def commands(block: Block) -> list[str]:
        return [line.split("#")[0].strip() for line in block.code.splitlines() if line.strip()]

    readme, home = blocks(ROOT / "README.md")[0], blocks(ROOT / "docs" / "index.md")[0]
    assert commands(readme)[:2] == ["make quickstart", "make test"]
    assert home.lang == readme.lang and commands(home)[:2] == commands(readme)[:2]
    text = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert text.index("```") < text.index("\n## "), "the two commands come before the home page's first section"


def test_api_signatures_are_formatted_one_parameter_a_line():
    """mkdocstrings-python writes each signature on one clipped line unless Black or Ruff is installed: the docs
    extra names one, and mkdocs.yml asks for separate, annotated signatures formatted to a page's width."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    docs = [re.split(r"[<>=!~ \[]", dep, maxsplit=1)[0].lower() for dep in extra["optional-dependencies"]["docs"]]
    assert {"ruff", "black"} & set(docs), docs
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    plugin = next(p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p)
    options = plugin["handlers"]["python"]["options"]
    assert options["separate_signature"] == "true" and options["show_signature_annotations"] == "true"
    assert 60 <= int(options["line_length"]) <= 90


NUMBER = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")


def cited_number_problems(path: Path, text: str) -> list[str]:
    """Each decimal figure of ``text`` (a part of ``path``) must appear on a page linked from the same paragraph,
    list item or table row — or, for a table row with no link, from the paragraph above its table."""
    problems, inherited = [], []
    chunks = re.split(r"\n\s*\n|\n(?=\s*[-*] )|\n(?=\|)", text)
    for chunk in chunks:
        targets = []
        for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", chunk):
            if not re.match(r"[a-z]+://", link):
                targets.append((path.parent / link).resolve())
        is_row = chunk.lstrip().startswith("|")
        if not is_row:
            inherited = targets
        elif not targets:
            targets = inherited
        prose = re.sub(r"`[^`]*`", "", chunk)
        for number in NUMBER.findall(prose):
            pattern = re.compile(rf"(?<![\w.]){re.escape(number)}(?![\w.])")
            if not any(t.is_file() and pattern.search(t.read_text(encoding="utf-8")) for t in targets):
                problems.append(f"{path.relative_to(ROOT)}: {number} in {chunk.strip()[:70]!r} is on no page it links")
    return problems


def test_every_figure_of_the_choosing_page_is_on_the_page_it_cites():
    """docs/choosing.md and the README's results table quote measured figures: each one must be found on the results
    page it links, so a figure cannot be invented or drift from its measurement."""
    problems = cited_number_problems(ROOT / "docs" / "choosing.md",
                                     (ROOT / "docs" / "choosing.md").read_text(encoding="utf-8"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## How well it does"):readme.index("\n## ", readme.index("## How well it does") + 5)]
    problems += cited_number_problems(ROOT / "README.md", table)
    assert not problems, "\n".join(problems)


GPU_CONTEXT = re.compile(r"\b(H200|H100|GPU|one card|lent card|the card)\b")


def gpu_figure_problems(path: Path, text: str, measured: str) -> list[str]:
    """Each figure with four decimals (an MRR, a Hits@k) or a pace in triples/s that ``text`` gives in a sentence,
    list item or table row about a GPU must be one of the figures of ``measured`` (docs/results/gpu.md, where every
    GPU measurement is recorded with its command): a page cannot give a GPU figure another way."""
    known = set(re.findall(r"\b\d\.\d{4}\b", measured)) | set(re.findall(r"\b\d{1,3}(?:,\d{3})+\b", measured))
    units: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        if block.lstrip().startswith("|"):
            units += block.splitlines()
            continue
        for item in re.split(r"\n\s*(?=[-*] )", block):
            units += re.split(r"(?<=[.;:])\s+(?=[A-Z(*])", item)
    problems = []
    for unit in units:
        if not GPU_CONTEXT.search(unit):
            continue
        figures = re.findall(r"\b\d\.\d{4}\b", unit) + re.findall(r"\b(\d{1,3}(?:,\d{3})+) triple[-a-z]*/s", unit)
        for figure in figures:
            if figure not in known:
                problems.append(f"{path.relative_to(ROOT)}: {figure} in {' '.join(unit.split())[:90]!r} is no figure "
                                "of docs/results/gpu.md")
    return problems


def test_no_page_gives_a_gpu_figure_another_way():
    """The GPU figures are measured once (docs/results/gpu.md); the README, the chooser, getting started, the
    roadmap and every other page quote them. A sentence, item or row about a GPU that gives an MRR, a Hits@k or a
    pace not on that page — a figure rounded differently, mistyped or left from an earlier run — fails."""
    measured = (ROOT / "docs" / "results" / "gpu.md").read_text(encoding="utf-8")
    problems = []
    for page in doc_files():
        if page.name == "CHANGELOG.md" or page == ROOT / "docs" / "results" / "gpu.md":
            continue
        problems += gpu_figure_problems(page, page.read_text(encoding="utf-8"), measured)
    assert not problems, "\n".join(problems)
    # the check can fail: a page that gives the bi-encoder's H200 figure rounded another way, or a pace not measured
    wrong = gpu_figure_problems(ROOT / "docs" / "choosing.md", "On one H200 the bi-encoder reached test MRR 0.4410.\n\n"
                                "| GPU | 3,448 triples/s |", measured)
    assert len(wrong) == 2 and "0.4410" in wrong[0] and "3,448" in wrong[1]


def test_explain_heatmap_reads_at_page_width(tmp_path):
    """`kgc explain`'s heatmap (docs/figures/explain_*.png) is drawn 8 inches wide whatever the sentence's length: a
    long entity text wraps onto several rows of tokens instead of a strip too wide for a page."""
    import numpy as np

    from kgc.explain import WIDTH_INCHES, Explanation, plot

    def size(png: Path) -> tuple[int, int]:
        head = png.read_bytes()[:24]
        return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")

    relations = ["_hypernym", "_has_part", "_derivationally_related_form", "_member_meronym"]
    sizes = {}
    for n in (6, 44):
        w = np.random.default_rng(0).random((len(relations), n))
        ex = Explanation("tokens", relations, w / w.sum(1, keepdims=True), tokens=[f"tok{i}" for i in range(n)],
                         layers=[5], special=[False] * n)
        sizes[n] = size(plot(ex, tmp_path / f"w{n}.png", "router weight w per token: " + "x" * 120))
    assert sizes[6][0] == sizes[44][0] <= 160 * WIDTH_INCHES  # one width, ~800 px at the page's scale
    assert sizes[44][1] > 2 * sizes[6][1]  # 44 tokens: the rows wrap (three here), the cells keep their size
