"""Names → local folders. Lookup order: an explicit path → $KGC_DATA_HOME/<NAME> → ./data/<NAME>
→ the copies bundled inside the pykeen wheel (UMLS, Nations, Kinships) → ``kgc data fetch NAME``.

The entries here are KG-BERT or PyKEEN label-TSV folders, the format this layer reads (Wikidata5M's own layout is
converted to KG-BERT's by its fetch, :mod:`kgc.data.wikidata5m`). A task adds the datasets only it reads
(:meth:`kgc.training.task.Task.datasets`, e.g. the C-STS CSVs, fetched from the authors' encrypted archive with the
password they give on request), and another package may add its own through the ``kgc.datasets`` entry point
group (:data:`kgc.registry.DATASETS`: a :class:`CatalogEntry`, or a module that registers some). Where an entry's
folder comes from is its ``source``, an object with its own ``fetch`` (:class:`Source`: :class:`Files`,
:class:`Bundled`, :class:`Encrypted`, :class:`Wikidata5MArchives`, :class:`Derived`, :class:`Generated`). Which
task a dataset is for is the task whose ``dataset_files`` mark its folder.
"""

from __future__ import annotations

import io
import os
import tarfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kgc.data.download import download
from kgc.errors import KGCError
from kgc.fileio import atomic_dir, sha256_file
from kgc.registry import DATASETS, GRAPH_FORMATS, TASKS

KGBERT = "https://raw.githubusercontent.com/yao8839836/kg-bert/master/data"


def graph_markers() -> tuple[str, ...]:
    """The files a graph dataset's folder holds one of: every registered graph format's ``markers``
    (:mod:`kgc.data.formats`: KG-BERT's ``entity2text.txt``, a label TSV's ``train.tsv`` / ``train.txt``, a
    plugin format's own)."""
    return tuple(dict.fromkeys(m for fmt in GRAPH_FORMATS.values() for m in fmt.markers))


class Source:
    """Where a catalog entry's folder comes from. :meth:`fetch` writes it under a data home (``kgc data fetch``)
    and returns it; :meth:`derived` and :meth:`bundled` are copies found without fetching (a folder kgc writes from
    other datasets' files before the data homes are searched; a copy inside an installed wheel after them);
    :meth:`hint` is what a missing dataset's message asks the user to do. A source is an object of its own (a
    plugin may subclass it), so a new kind of home is one class, not a flag of every entry."""

    def fetch(self, entry: "CatalogEntry", home: Path, *, password: str | None = None, source: str | None = None,
              yes: bool = False, ask: Callable[[str], bool] | None = None,
              echo: Callable[[str], None] = print) -> Path:
        raise KGCError(f"{entry.name} has no download home")

    def derived(self, entry: "CatalogEntry", homes: list[Path]) -> Path | None:
        return None

    def bundled(self, entry: "CatalogEntry") -> tuple[Path, str] | None:
        return None

    def hint(self, entry: "CatalogEntry") -> str:
        return f"run `kgc data fetch {entry.name}`"


@dataclass(frozen=True)
class Files(Source):
    """Each file downloaded from ``url/<file>`` and checked against its sha256 (None: not pinned; the sum seen is
    printed), into a staged folder renamed into place whole; ``bundle``: PyKEEN's copy in its wheel, used where no
    data home holds the folder (labels only)."""
    url: str
    files: dict[str, str | None] = field(default_factory=dict)
    bundle: str | None = None

    def fetch(self, entry, home, *, password=None, source=None, yes=False, ask=None, echo=print):
        target = home / entry.folder
        if _looks_like_dataset(target, entry.probes):
            return target
        with atomic_dir(target) as tmp:  # renamed into place only when every file is there and checked
            for fname, expected in self.files.items():
                url = f"{self.url}/{fname}"
                download(url, tmp / fname, f"Copy the files ({', '.join(self.files)}) into {target} by hand.")
                got = sha256_file(tmp / fname)
                if expected is None:
                    echo(f"  {fname}: sha256 {got} (not pinned in the catalog)")
                elif got != expected:
                    raise KGCError(f"{url}: sha256 {got} does not match the catalog's {expected}; refusing it")
        return target

    def bundled(self, entry):
        return _pykeen_folder(self.bundle)


@dataclass(frozen=True)
class Bundled(Source):
    """Only the copy inside the pykeen wheel (``pykeen/datasets/<name>``: labels, no texts)."""
    name: str

    def fetch(self, entry, home, **options):
        raise KGCError(f"{entry.name} has no download home; it ships inside the pykeen wheel")

    def bundled(self, entry):
        return _pykeen_folder(self.name)

    def hint(self, entry):
        return "copy its train/valid/test files there"


@dataclass(frozen=True)
class Encrypted(Source):
    """One ``openssl enc -aes-256-cbc -a -salt -pbkdf2`` tar archive at ``url`` (C-STS's), decrypted with the
    password its authors give on request, ``files`` kept from it and checked by the task before they are
    published; ``source`` (``--from``) reads the archive from a local file instead."""
    url: str
    files: dict[str, str | None] = field(default_factory=dict)

    def fetch(self, entry, home, *, password=None, source=None, yes=False, ask=None, echo=print):
        target = home / entry.folder
        if _looks_like_dataset(target, entry.probes):
            return target
        if not password:
            raise KGCError(f"{entry.name} is distributed encrypted: pass --password (its authors give it on "
                           f"request), or put {', '.join(self.files)} into {target} yourself")
        blob = self._archive(source, target)  # before anything is created
        with atomic_dir(target) as tmp:
            self._unpack(entry, blob, tmp, password, source or self.url)
        return target

    def hint(self, entry):
        return (f"put {', '.join(self.files)} there, or run `kgc data fetch {entry.name} --password …` with the "
                "password its authors give on request")

    def _archive(self, source: str | None, target: Path) -> bytes:
        """The archive's bytes, from a local file, a URL, or the entry's public home."""
        where = source or self.url
        try:
            if source is not None and Path(source).is_file():
                return Path(source).read_bytes()
            with urllib.request.urlopen(where, timeout=60) as resp:
                return resp.read()
        except (OSError, ValueError) as exc:
            raise KGCError(f"could not read {where} ({exc}). Offline? Fetch {self.url} elsewhere and pass it with "
                           f"--from FILE, or put {', '.join(self.files)} into {target} by hand.") from None

    def _unpack(self, entry: "CatalogEntry", blob: bytes, tmp: Path, password: str, where: str) -> None:
        """Decrypt the tar in memory and keep the listed files (checked by the entry's task) in ``tmp``."""
        from kgc.data.openssl import decrypt

        plain = decrypt(blob, password, what=str(where))
        try:
            archive = tarfile.open(fileobj=io.BytesIO(plain))
        except tarfile.TarError:
            raise KGCError(f"{where}: decrypted, but not a tar archive (wrong password?)") from None
        with archive:
            members = {Path(m.name).name: m for m in archive.getmembers() if m.isfile()}
            missing = [f for f in self.files if f not in members]
            if missing:
                raise KGCError(f"{where}: the archive lacks {', '.join(missing)} (it holds "
                               f"{', '.join(sorted(members))})")
            for fname in self.files:
                (tmp / fname).write_bytes(archive.extractfile(members[fname]).read())
        TASKS.lookup(entry.task).check_dataset(tmp)  # every row checked before the folder is published


@dataclass(frozen=True)
class Wikidata5MArchives(Source):
    """Wikidata5M's archives (mirrors and sizes in :mod:`kgc.data.wikidata5m`), converted to KG-BERT files while
    they are read; large, so the fetch asks first (``yes``/``ask``); ``source`` is a folder of the archives."""
    url: str
    variant: str  # transductive or inductive

    def fetch(self, entry, home, *, password=None, source=None, yes=False, ask=None, echo=print):
        from kgc.data import wikidata5m

        target = home / entry.folder
        if _looks_like_dataset(target, entry.probes):
            return target
        return wikidata5m.fetch(variant=self.variant, target=target, home=home, source=source, yes=yes, ask=ask,
                                echo=echo)


@dataclass(frozen=True)
class Generated(Source):
    """Made by kgc itself on first use (``where``: the folder it is written to), or by ``command``."""
    where: str
    command: str | None = None

    def fetch(self, entry, home, **options):
        raise KGCError(f"{entry.name} is made by kgc, not downloaded: name it in a recipe (data.dataset: "
                       f"{entry.name})" + (f", or write it with `{self.command}`" if self.command else ""))


@dataclass(frozen=True)
class Derived(Source):
    """A folder kgc writes from other datasets' files (GraIL's splits with their graph's texts):
    ``derive(name, homes, find_dataset)`` returns it, written on first use; ``download(name, home, echo)`` fetches
    what it is derived from."""
    url: str
    derive: Callable[[str, list[Path], Callable], Path]
    download: Callable[..., Path]

    def fetch(self, entry, home, *, echo=print, **options):
        return self.download(entry.name, home, echo=echo)

    def derived(self, entry, homes):
        return self.derive(entry.name, homes, find_dataset)


@dataclass(frozen=True)
class CatalogEntry:
    """A dataset by name: the folder it is found in under a data home, what it is, where it comes from
    (``source``: one of the :class:`Source` kinds above, or a plugin's), and the files that mark its folder."""
    name: str  # the catalog key, lower case
    folder: str  # folder name under a data home, as distributed (e.g. WN18RR)
    description: str
    source: Source = field(default_factory=Source)
    probe: tuple[str, ...] | None = None  # a folder holding any of these is the dataset's (None: a graph's markers)

    @property
    def task(self) -> str | None:
        """The registered task that reads this dataset (the one whose ``dataset_files`` are its ``probe``)."""
        return task_reading(self.probes)

    @property
    def probes(self) -> tuple[str, ...]:
        """The files any of which marks this dataset's folder (a task's ``dataset_files``; a graph's by default)."""
        return graph_markers() if self.probe is None else self.probe


def task_reading(files: tuple[str, ...]) -> str | None:
    """The registered task whose datasets hold one of ``files`` (:attr:`kgc.training.task.Task.dataset_files`)."""
    return next((name for name in TASKS if set(TASKS[name].dataset_files) & set(files)), None)


def _grail_entries() -> list[CatalogEntry]:
    """GraIL's eight inductive splits (:mod:`kgc.data.grail`): a training graph, a disjoint inference graph."""
    from kgc.data import grail

    about = {"wn18rr": "WN18RR", "fb237": "FB15k-237"}
    return [CatalogEntry(name, name, f"GraIL's inductive {about[kg]} v{v} (Teru et al. 2020): a training graph and an "
                         f"inference graph of unseen entities, {about[kg]}'s texts",
                         Derived(grail.GRAIL_URL, derive=grail.split_folder, download=grail.fetch))
            for name, (kg, v) in grail.SPLITS.items()]


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in [
        CatalogEntry(
            "wn18rr", "WN18RR", "WordNet 3.0 subset (Dettmers et al. 2018), KG-BERT texts",
            Files(f"{KGBERT}/WN18RR", {
                "train.tsv": "038612e783c215ee5f3ca9fbfca27b8d0739be1028fe4ee7c174aecf0b83d5df",
                "dev.tsv": "453ce7202afa58094a04d2b1560ee2b02660f1c260b32ce6651c8ccedd1028ab",
                "test.tsv": "0383bceaaa1096cf3c03ec021ed0048068e2355dbfc0239b292cefdac821cec5",
                "entity2text.txt": "8f5c6f11753dafa879917b9bdf73d398ceb3bd4bed8d5553177e1e0f2c37521f",
                "relation2text.txt": "91b1de5585d686ed31498d50f1c4eed44ba9486dffbbcc0c28927ac884184918",
            }),
        ),
        CatalogEntry(
            "fb15k237", "FB15k-237", "Freebase subset (Toutanova & Chen 2015), KG-BERT texts",
            # Not pinned: no reference copy was available to hash; fetch prints the sums it saw.
            Files(f"{KGBERT}/FB15k-237", {f: None for f in ("train.tsv", "dev.tsv", "test.tsv", "entity2text.txt",
                                                            "entity2textlong.txt", "relation2text.txt")}),
        ),
        CatalogEntry(
            "umls", "UMLS", "Unified Medical Language System (Kok & Domingos 2007), KG-BERT texts",
            Files(f"{KGBERT}/umls", {
                "train.tsv": "873ef4925516b83e7f6f8cc02b4be51d848828710a7f65a956f0ac4a9e452f35",
                "dev.tsv": "025c98f8a4891e2a6582ec5b40ee0d904031edad9c52554522f4b7904820c98e",
                "test.tsv": "a7eb529a3d2810fcc96341ccc97c625a5e202f8389673aa6bd317eeebbb79014",
                "entity2text.txt": "c6438aafd894917cefe73ea75fc20743d18f4226ebc85a2f43758ff3f77330b9",
                "entity2textlong.txt": "cb4eccdebf5bfc73adc2db0fc582d215256aa11d789d3a16a6c0649f338f5fe3",
                "relation2text.txt": "f5c5eddf696c52fc3c435ac031a4a0b06e00cc09116613db6a835d02d610123c",
            }, bundle="umls"),
        ),
        CatalogEntry("nations", "Nations", "Nations (Kemp et al. 2006), labels only", Bundled("nations")),
        CatalogEntry("kinships", "Kinships", "Alyawarra kinship (Kemp et al. 2006), labels only",
                     Bundled("kinships")),
        # Wikidata5M: archives (mirrors and sizes in kgc.data.wikidata5m) converted to KG-BERT files at fetch
        CatalogEntry("wikidata5m", "Wikidata5M", "Wikidata + Wikipedia abstracts (Wang et al. 2021), transductive; "
                     "4.6M entities, ~1.3 GB download",
                     Wikidata5MArchives("https://deepgraphlearning.github.io/project/wikidata5m", "transductive")),
        CatalogEntry("wikidata5m-inductive", "Wikidata5M-inductive", "Wikidata5M, inductive split (test entities "
                     "unseen in training)",
                     Wikidata5MArchives("https://deepgraphlearning.github.io/project/wikidata5m", "inductive")),
        *_grail_entries(),
    ]
}


def entries() -> dict[str, CatalogEntry]:
    """The whole catalog: this layer's entries (:data:`CATALOG`), those another package adds
    (:data:`kgc.registry.DATASETS`, its ``kgc.datasets`` entry points), then each registered task's own."""
    found = dict(CATALOG)
    for name in DATASETS:
        found.setdefault(name, DATASETS[name])
    for name in TASKS:
        for entry in TASKS[name].datasets():
            found.setdefault(entry.name, entry)
    return found


def catalog_entry(name: str) -> CatalogEntry | None:
    """The entry for a name, ignoring case and dashes (``FB15k-237`` → fb15k237, ``Wikidata5M-inductive``)."""
    key = name.lower().replace("-", "")
    return next((e for n, e in entries().items() if n.replace("-", "") == key), None)


def data_homes() -> list[tuple[str, Path]]:
    """The searched folders, in order, labelled by where they come from."""
    homes = []
    if env := os.environ.get("KGC_DATA_HOME"):
        homes.append(("$KGC_DATA_HOME", Path(env).expanduser()))
    homes.append(("./data", Path("data")))
    return homes


def _pykeen_folder(bundle: str | None) -> tuple[Path, str] | None:
    """PyKEEN's copy of a dataset inside its wheel (``pykeen/datasets/<bundle>``), where it is installed."""
    if bundle is None:
        return None
    try:
        import pykeen.datasets
    except ImportError:  # pragma: no cover - pykeen is a dependency
        return None
    folder = Path(pykeen.datasets.__file__).parent / bundle
    return (folder, "pykeen wheel (labels only)") if (folder / "train.txt").is_file() else None


def _looks_like_dataset(folder: Path, files: tuple[str, ...] | None = None) -> bool:
    files = graph_markers() if files is None else files
    return folder.is_dir() and any((folder / f).exists() for f in files)  # a folder there: the reader says so


def _candidates(entry: CatalogEntry, home: Path) -> list[Path]:
    return [home / entry.folder, home / entry.name]


def dataset_task(name_or_path: str) -> str | None:
    """The task a catalog name or a folder holds data for (a folder: by the files it holds, each task's
    ``dataset_files``), or None when that is not clear (no such folder, or files of several tasks)."""
    entry = catalog_entry(name_or_path)
    if entry is not None:
        return entry.task
    folder = Path(name_or_path).expanduser()
    tasks = [task for task in TASKS if _looks_like_dataset(folder, TASKS[task].dataset_files)]
    return tasks[0] if len(tasks) == 1 else None


def find_dataset(name_or_path: str, path: str | None = None, task: str | None = None) -> tuple[Path, str]:
    """Return (folder, where-found) for a catalog name or a folder path; a clear error when absent. ``task``: the
    task whose dataset it must be (None: the one that reads this layer's KG-BERT / PyKEEN folders)."""
    files = TASKS.lookup(task).dataset_files if task is not None else graph_markers()
    task = task if task is not None else task_reading(files)
    if path is not None:
        folder = Path(path).expanduser()
        if not _looks_like_dataset(folder):
            raise KGCError(f"data.path {folder}: no train.tsv or train.txt there. Point it at a KG-BERT "
                           "folder (train.tsv, dev.tsv, test.tsv, entity2text.txt) or a PyKEEN label-TSV folder.")
        return folder, "recipe path"
    entry = catalog_entry(name_or_path)
    if entry is None:
        folder = Path(name_or_path).expanduser()
        if _looks_like_dataset(folder, files):
            return folder, "path"
        simple = not folder.is_absolute() and len(folder.parts) == 1  # a name: also a folder of a data home
        for label, home in data_homes() if simple else []:
            if _looks_like_dataset(home / folder, files):
                return home / folder, label
        names = [n for n, e in entries().items() if e.task == task]
        where = f" here or under {', '.join(str(h / folder) for _, h in data_homes())}" if simple else ""
        raise KGCError(f"dataset {name_or_path!r}: not a catalog name for task {task} ({', '.join(names)}) "
                       f"and not a folder holding {' or '.join(files)}{where} (a derived set is written first: `kgc "
                       "data inductive-split`, `synth-graph`, `synth-routing`, `synth-csts`)")
    if entry.task != task:
        raise KGCError(f"dataset {entry.name!r} is a {entry.task} dataset, and the recipe has task {task}; "
                       f"set task: {entry.task} or pick a {task} dataset")
    if (derived := entry.source.derived(entry, [home for _, home in data_homes()])) is not None:
        return derived, "derived"
    for label, home in data_homes():
        for folder in _candidates(entry, home):
            if _looks_like_dataset(folder, files):
                return folder, label
    if (bundled := entry.source.bundled(entry)) is not None:
        return bundled
    target = data_homes()[0][1] / entry.folder
    raise KGCError(f"dataset {entry.name!r} not found. Populate {target} ({entry.source.hint(entry)}), "
                   "or set KGC_DATA_HOME to a folder that holds it.")


def list_datasets() -> list[dict[str, str]]:
    rows = []
    for entry in entries().values():
        if isinstance(entry.source, Generated):
            rows.append({"name": entry.name, "where": "generated", "folder": entry.source.where,
                         "about": entry.description})
            continue
        try:
            folder, where = find_dataset(entry.name, task=entry.task)
            rows.append({"name": entry.name, "where": where, "folder": str(folder), "about": entry.description})
        except KGCError:
            rows.append({"name": entry.name, "where": "missing", "folder": "-", "about": entry.description})
    return rows


def fetch_dataset(name: str, dest_home: Path | None = None, *, password: str | None = None,
                  source: str | None = None, yes: bool = False, ask: Callable[[str], bool] | None = None,
                  echo: Callable[[str], None] = print) -> Path:
    """Download a catalog dataset from its public home into <home>/<FOLDER>, checking sha256 sums.

    Files land in a temporary folder first; the folder is renamed into place only when every file
    arrived and matched, so an interrupted or failed fetch leaves nothing behind. An encrypted entry
    (``csts``) needs ``password``; ``source`` reads its archive from a local file instead of the URL.
    Wikidata5M is converted while it is read (:mod:`kgc.data.wikidata5m`); its download is large, so it
    needs ``yes`` or an ``ask(question)`` that returns True; ``source`` is then a folder of its archives.
    """
    entry = catalog_entry(name)
    if entry is None:
        raise KGCError(f"unknown dataset {name!r}; catalog names: {', '.join(entries())}")
    home = dest_home or data_homes()[0][1]
    return entry.source.fetch(entry, home, password=password, source=source, yes=yes, ask=ask, echo=echo)
