"""Recipe files on disk: reading one (``extends:`` resolved), the shipped families, copying one out.

A recipe file may start from another and list only the keys it changes::

    # kgc train recipes/wn18rr_cpu_hadamard.yaml
    extends: wn18rr_cpu_biencoder.yaml     # a path relative to this file's folder; chains are allowed
    about: "CPU, ~10 min: tri-encoder h_s ⊙ W h_c"
    measured:
      - {split: test, metric: MRR, value: "0.1072", hardware: "2 CPU cores", budget: "about 10 minutes",
         page: "docs/results/wn18rr-cpu-table.md"}
    model:
      conditioner: hadamard

:func:`load_tree` reads it as the base's keys with the file's deep-merged over them: mappings merge key by key,
lists and scalars replace, ``null`` sets null. ``extends``, ``about`` (one line for ``kgc recipes list``) and
``measured`` (:class:`Measured`: the figures measured with this very file, never inherited: the results as data
that ``kgc recipes list``, the README's results rows and docs/choosing.md are checked against) are file-level keys,
not recipe keys: they are removed. ``name`` is the file's own (default: its stem), never the
base's. Nothing here knows the recipe schema: :func:`kgc.recipe.validate_recipe` checks the resolved tree.
"""

from __future__ import annotations

import copy
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from kgc.errors import KGCError
from kgc.fileio import write_text

FILE_KEYS = ("extends", "about", "measured")  # file-level keys of a recipe file: not recipe keys, removed by load_tree
_FIX = ("Recipes start from one of recipes/*.yaml: copy one (e.g. recipes/umls_biencoder.yaml) and change its "
        "keys; `kgc recipes keys` lists them all")


# ----------------------------------------------------------------------------------------------------------------
# reading


def _read_mapping(path: Path) -> dict[str, Any]:
    """The raw mapping of one YAML recipe file, as written (nothing resolved); every way it can fail is one
    KGCError naming the file and the fix (the messages of :func:`kgc.recipe.read_recipe_tree`)."""
    if path.is_dir():
        raise KGCError(f"{path}: a folder, not a recipe. Give a YAML file, e.g. recipes/umls_biencoder.yaml")
    if not path.is_file():
        raise KGCError(f"{path}: recipe not found. Recipes live in recipes/*.yaml")
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise KGCError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}). "
                       "Save the recipe as UTF-8.") from None
    except yaml.YAMLError as exc:
        raise KGCError(f"{path}: not valid YAML: {exc}") from None
    if tree is None:  # an empty file, or comments only: it would train silently with every default
        raise KGCError(f"{path}: an empty recipe (no keys). {_FIX}")
    if not isinstance(tree, dict):
        kind = {"list": "list", "str": "string", "bool": "boolean"}.get(type(tree).__name__, "single value")
        raise KGCError(f"{path}: a recipe must be a mapping of sections (data, model, loss, train, eval), not a "
                       f"{kind}. {_FIX}")
    about = tree.get("about")
    if about is not None and not isinstance(about, str):
        raise KGCError(f"{path}: about: {about!r} is not text. `about:` is one line for `kgc recipes list`, e.g. "
                       "about: \"CPU, 10 min: the bi-encoder row of the WN18RR CPU table\"")
    Measured.read(path, tree.get("measured"))
    return tree


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` deep-merged onto a copy of ``base``: mappings merge key by key, anything else (lists, scalars,
    ``None``) replaces. Neither argument is changed."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _base_path(path: Path, extends: Any) -> Path:
    """The file ``extends`` names, relative to ``path``'s folder (``.yaml`` added to a bare name)."""
    if not isinstance(extends, str) or not extends.strip():
        raise KGCError(f"{path}: extends: {extends!r} is not a file name. `extends:` names the one recipe this file "
                       "starts from, relative to its folder, e.g. extends: wn18rr_biencoder.yaml")
    base = path.parent / Path(extends.strip()).expanduser()
    if not base.exists() and not base.suffix:
        base = base.with_name(base.name + ".yaml")
    return base


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


MISSING_DATA_PATH = "__missing_data_path__"  # a file's data.path found nowhere: said unless an override replaces it


def _data_path_beside(path: Path, tree: dict[str, Any]) -> None:
    """A relative ``data.path`` in the recipe file ``path`` names a folder beside that file (as ``extends:`` does):
    made absolute when it is there, so the recipe trains from any folder and a copy of it still finds its data; one
    that is only under the current folder is read there, as before. One in neither place is one message naming both
    places it looked — kept in the tree (``MISSING_DATA_PATH``) and said when the recipe is validated, unless what
    comes later replaces the path first: a recipe that extends this file, ``--set data.path=…`` or the API's
    overrides (a freshly copied recipe's path is fixed that way)."""
    data = tree.get("data")
    raw = data.get("path") if isinstance(data, dict) else None
    if not isinstance(raw, str) or not raw.strip() or Path(raw).expanduser().is_absolute():
        return
    beside = (path.parent / raw).resolve()
    if beside.exists():
        data["path"] = str(beside)
    elif not Path(raw).exists():
        tree[MISSING_DATA_PATH] = (
            f"{path}: data.path {raw}: no such folder beside the recipe ({beside}) or in the current folder "
            f"({Path(raw).resolve()}). A relative data.path is read beside the recipe file; give the folder's path "
            "from there or an absolute one, or replace it: --set data.path=DIR")


def _resolve(path: Path, chain: tuple[Path, ...], child: Path | None = None) -> dict[str, Any]:
    """The tree of ``path`` with its ``extends`` chain resolved (file keys removed; ``name`` as written).
    ``chain``: the resolved files on the way here, ``path``'s included; ``child``: the file that extends ``path``."""
    try:
        tree = _read_mapping(path)
    except KGCError as exc:
        if child is None:
            raise
        raise KGCError(f"{child}: extends {_shown(path)}, which is not a recipe it can start from: {exc}") from None
    tree.pop("about", None)
    tree.pop("measured", None)  # a file's own figures: a recipe that extends it measured nothing yet
    _data_path_beside(path, tree)
    if "extends" not in tree:
        return tree
    base = _base_path(path, tree.pop("extends"))
    key = base.resolve()
    if key in chain:
        names = " → ".join(p.name for p in (*chain[chain.index(key):], key))
        raise KGCError(f"{path}: `extends` goes round in a circle ({names}). A family starts from a recipe without "
                       "`extends`: remove `extends` from one of them")
    if not base.exists():
        raise KGCError(f"{path}: extends {_shown(base)}, which does not exist. `extends:` names a recipe file "
                       f"relative to this file's folder ({_shown(path.parent)}), e.g. extends: {_nearest(base)}")
    base_tree = _resolve(base, (*chain, key), path)
    base_tree.pop("name", None)  # a name is the file's own, never inherited
    if isinstance(tree.get("data"), dict) and "path" in tree["data"]:
        base_tree.pop(MISSING_DATA_PATH, None)  # the child's own data.path replaces the base's
    return merge(base_tree, tree)


def _nearest(base: Path) -> str:
    """A recipe file in ``base``'s folder whose name is closest to it (for an error's example), else a shipped one."""
    try:
        names = sorted(p.name for p in base.parent.glob("*.yaml"))
    except OSError:
        names = []
    close = difflib.get_close_matches(base.name, names, n=1, cutoff=0.5)
    return close[0] if close else (names[0] if names else "wn18rr_biencoder.yaml")


def load_tree(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping a recipe file says, not yet validated: its ``extends`` chain resolved (the base's keys with this
    file's deep-merged over them), ``extends`` and ``about`` removed, ``name`` the file's own or its stem.

    A folder, a missing file, non-UTF-8 text, bad YAML, an empty file, a file that is not a mapping, an
    ``extends`` that names nothing, a base that cannot be read and a circle of ``extends`` each end in one KGCError
    naming the file and the fix."""
    path = Path(path)
    tree = _resolve(path, (path.resolve(),))
    name = tree.pop("name") if "name" in tree else path.stem
    return {"name": name, **tree}


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """``{"extends": Path | None, "about": str, "measured": [Measured]}`` of one recipe file (only its own
    file-level keys: nothing resolved), for listing."""
    path = Path(path)
    tree = _read_mapping(path)
    extends = _base_path(path, tree["extends"]) if "extends" in tree else None
    return {"extends": extends, "about": " ".join((tree.get("about") or "").split()),
            "measured": Measured.read(path, tree.get("measured"))}


# ----------------------------------------------------------------------------------------------------------------
# the shipped recipes


def recipe_folder() -> Path:
    """The shipped recipes: ``$KGC_RECIPES`` when set; in an installed wheel the copy it carries
    (``kgc/_shipped/recipes``, made by setup.py, beside ``kgc/_shipped/data/examples``); else the checkout's
    ``recipes/`` beside the package (an editable install)."""
    env = os.environ.get("KGC_RECIPES")
    if env:
        return Path(env).expanduser()
    here = Path(__file__).resolve().parent  # not `import kgc`: a core module
    shipped = here / "_shipped" / "recipes"
    return shipped if shipped.is_dir() else here.parent / "recipes"


@dataclass(frozen=True)
class Measured:
    """One figure measured with a recipe file, as its ``measured:`` list gives it: ``value`` as written (its
    digits are the page's), on ``split`` by ``metric`` (MRR, H@10, Spearman …), on ``hardware`` within ``budget``,
    reported on ``page`` (a docs page of this repository, which must show it); ``source``: who measured it when
    not kgc (a paper's figure for the protocol the recipe follows); ``note``: what goes with it; ``command``: the
    exact command that produced it (kgc's figures: it names this recipe's own file, a test holds it)."""
    split: str
    metric: str
    value: str
    hardware: str
    budget: str
    page: str
    source: str = "kgc"
    note: str = ""
    command: str = ""

    FIELDS = ("split", "metric", "value", "hardware", "budget", "page", "source", "note", "command")

    @classmethod
    def read(cls, path: Path, raw: Any) -> "list[Measured]":
        """The ``measured:`` list of the file at ``path``; anything else is one KGCError naming the entry."""
        if raw is None:
            return []
        example = ('measured:\n  - {split: test, metric: MRR, value: "0.6961", hardware: "2 CPU cores", budget: '
                   '"one epoch", page: "docs/results/umls.md"}')
        if not isinstance(raw, list):
            raise KGCError(f"{path}: measured: a list of figures, e.g.\n{example}")
        out = []
        for i, item in enumerate(raw, 1):
            where = f"{path}: measured, entry {i}"
            if not isinstance(item, dict):
                raise KGCError(f"{where}: {item!r} is not a mapping, e.g.\n{example}")
            unknown = sorted(set(item) - set(cls.FIELDS))
            missing = [k for k in cls.FIELDS[:6] if k not in item]
            if unknown or missing:
                raise KGCError(f"{where}: " + "; ".join(
                    ([f"unknown key(s) {', '.join(unknown)}"] if unknown else [])
                    + ([f"missing {', '.join(missing)}"] if missing else []))
                    + f" (keys: {', '.join(cls.FIELDS)}; source, note and command optional)")
            value = item["value"]
            if not isinstance(value, str) or not value.replace(".", "", 1).isdigit():
                raise KGCError(f"{where}: value {value!r}: write the figure as text, with the page's digits "
                               "(value: \"0.2960\"): a YAML number would drop its trailing zeros")
            out.append(cls(**{k: str(v) for k, v in item.items()}))
        return out

    def to_dict(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in self.FIELDS}


@dataclass
class RecipeEntry:
    """One recipe file of a family: its name (the file's stem), path, ``about`` line, the recipe it extends
    (``None`` for a root) and its depth below the root (0 for the root)."""
    name: str
    path: Path
    about: str = ""
    extends: str | None = None
    depth: int = 0
    measured: list[Measured] = field(default_factory=list)

    @property
    def summary(self) -> str:
        """The about line with the first figures kgc measured under one hardware and budget, else a paper's (what
        ``kgc recipes list`` prints): ``about; test MRR 0.6961, H@10 0.8979 [2 CPU cores, one epoch …]``."""
        ours = [m for m in self.measured if m.source == "kgc"]
        shown = [m for m in ours if (m.hardware, m.budget) == (ours[0].hardware, ours[0].budget)][:2] if ours \
            else self.measured[:1]
        if not shown:
            return self.about
        figures = ", ".join(f"{m.split} {m.metric} {m.value}" if i == 0 else f"{m.metric} {m.value}"
                            for i, m in enumerate(shown))
        first = shown[0]
        by = f"[{first.hardware}, {first.budget}]" if first.source == "kgc" else f"[{first.source}, {first.budget}]"
        return f"{self.about}; {figures} {by}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "about": self.about, "summary": self.summary,
                "measured": [m.to_dict() for m in self.measured], "extends": self.extends, "depth": self.depth}


@dataclass
class Family:
    """A root recipe (no ``extends``) and every recipe that extends it, directly or through another, in tree
    order (a variant right after the recipe it extends)."""
    root: RecipeEntry
    variants: list[RecipeEntry] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**self.root.to_dict(), "variants": [v.to_dict() for v in self.variants]}


def families(folder: str | os.PathLike | None = None) -> list[Family]:
    """The recipe files of ``folder`` (default :func:`recipe_folder`) grouped into families, roots by name; a
    variant whose chain leaves the folder is listed under the outside file it starts from. A file that cannot be
    read, a base that is missing and a circle of ``extends`` are one KGCError each (as :func:`load_tree` says)."""
    folder = Path(folder) if folder is not None else recipe_folder()
    if not folder.is_dir():
        raise KGCError(f"{folder}: no recipe folder here (set KGC_RECIPES to a folder of recipe files)")
    headers: dict[Path, dict[str, Any]] = {}

    def header(path: Path) -> dict[str, Any]:
        key = path.resolve()
        if key not in headers:
            headers[key] = {**read_header(path), "path": path}
        return headers[key]

    for path in sorted(folder.glob("*.yaml")):
        load_tree(path)  # a broken file or chain fails here, with its own message
        header(path)
    children: dict[Path, list[Path]] = {}
    roots: list[Path] = []
    for key in list(headers):
        chain = [key]
        while headers[chain[-1]]["extends"] is not None:  # the chain is acyclic: load_tree checked it
            base = headers[chain[-1]]["extends"]
            header(base)
            children.setdefault(base.resolve(), []).append(chain[-1])
            chain.append(base.resolve())
        if chain[-1] not in roots:
            roots.append(chain[-1])

    def entry(key: Path, depth: int) -> RecipeEntry:
        h = headers[key]
        base = h["extends"]
        return RecipeEntry(name=h["path"].stem, path=h["path"], about=h["about"],
                           extends=base.stem if base is not None else None, depth=depth, measured=h["measured"])

    out = []
    for root in sorted(roots, key=lambda k: headers[k]["path"].stem):
        family = Family(entry(root, 0))

        def walk(key: Path, depth: int) -> None:
            for child in sorted(set(children.get(key, [])), key=lambda k: headers[k]["path"].stem):
                family.variants.append(entry(child, depth))
                walk(child, depth + 1)

        walk(root, 1)
        out.append(family)
    return out


def find_recipe(name: str | os.PathLike) -> Path:
    """The recipe file ``name`` means: a path to a file, else a stem (``wn18rr_csr``) or file name
    (``wn18rr_csr.yaml``) in :func:`recipe_folder`. Nothing found: a KGCError with the nearest names."""
    given = Path(name).expanduser()
    if given.is_file():
        return given
    folder = recipe_folder()
    stem = given.name[:-5] if given.name.endswith(".yaml") else given.name
    if given.parent == Path(".") and (folder / f"{stem}.yaml").is_file():
        return folder / f"{stem}.yaml"
    if given.is_dir():
        raise KGCError(f"{given}: a folder, not a recipe. Give a recipe's name (e.g. wn18rr_csr) or a YAML file")
    names = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
    close = difflib.get_close_matches(stem, names, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise KGCError(f"{name}: no such recipe (not a file, nor a recipe in {_shown(folder)}).{hint} "
                   "`kgc recipes list` lists them")


def _dump(tree: dict[str, Any]) -> str:
    tree = {k: v for k, v in tree.items() if k != MISSING_DATA_PATH}
    return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True, default_flow_style=False, width=120)


def recipe_text(name: str | os.PathLike, *, full: Callable[[Path], dict] | None = None,
                dest: Path | None = None) -> tuple[Path, str]:
    """(the recipe file ``name`` names — a stem, a file name or a path —, its text as a copy): ``extends`` merged
    in, no ``extends`` or ``about``; with ``full`` (:func:`kgc.recipe.full_tree`, which validates: a layer above
    this one) every key the recipe reads, with its value. Its first comment lines say where it came from and the
    ``kgc train`` command (of ``dest``, where it is written)."""
    source = find_recipe(name)
    tree = full(source) if full is not None else load_tree(source)
    about = read_header(source)["about"]
    shipped = recipe_folder().resolve()
    shown = (f"{shipped.name}/{source.name}" if source.resolve().parent == shipped else _shown(source))
    lines = [f"# copied from {shown} (kgc recipes copy {source.stem}{' --full' if full else ''}); train it: "
             f"kgc train {_shown(dest) if dest is not None else 'FILE'}"]
    if about:
        lines.append(f"# {source.stem}: {about}")
    return source, "\n".join(lines) + "\n" + _dump(tree)


def copy_recipe(name: str | os.PathLike, dest: str | os.PathLike, *, force: bool = False,
                full: Callable[[Path], dict] | None = None) -> Path:
    """Write :func:`recipe_text` of ``name`` to ``dest`` (a file, or a folder: ``DEST/<name>.yaml``), atomically.
    An existing file is refused unless ``force``. Returns the path written."""
    source = find_recipe(name)
    dest = Path(dest).expanduser()
    if dest.is_dir() or str(dest).endswith(("/", os.sep)):
        dest = dest / f"{source.stem}.yaml"
    if dest.exists() and dest.resolve() == source.resolve():
        raise KGCError(f"{dest}: that is the recipe itself. Give another file or a folder to copy it to")
    if dest.is_dir():
        raise KGCError(f"{dest}: a folder is in the way of the copy. Give another file name")
    if dest.exists() and not force:
        raise KGCError(f"{dest}: already exists; not overwritten. Give another name, or --force (force=True) to "
                       "replace it")
    write_text(dest, recipe_text(source, full=full, dest=dest)[1])
    return dest
