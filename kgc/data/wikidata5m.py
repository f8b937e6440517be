"""Wikidata5M (Wang et al. 2021, the KEPLER paper): fetch its archives and convert them into a KG-BERT folder.

Wikidata5M ships as four archives (https://deepgraphlearning.github.io/project/wikidata5m)::

    wikidata5m_transductive.tar.gz  wikidata5m_transductive_{train,valid,test}.txt   Q-id<TAB>P-id<TAB>Q-id
    wikidata5m_inductive.tar.gz     wikidata5m_inductive_{train,valid,test}.txt      (entities disjoint across splits)
    wikidata5m_alias.tar.gz         wikidata5m_entity.txt, wikidata5m_relation.txt   id<TAB>alias1<TAB>alias2…
    wikidata5m_text.txt.gz          wikidata5m_text.txt                              Q-id<TAB>Wikipedia abstract

The fetch converts them once, line by line, into the layout :func:`kgc.data.formats.read_graph` reads, so the
loader needs no third layout and nothing large is ever held twice:

    train.tsv, dev.tsv, test.tsv   every triple, as distributed
    entity2text.txt                Q-id<TAB>first alias (SimKGC's name); the Q-id itself when it has none
    entity2textlong.txt            Q-id<TAB>the abstract's first ``description_words`` words (whitespace collapsed)
    relation2text.txt              P-id<TAB>first alias (a relation without one keeps its P-id as text)
    wikidata5m.json                the archives used (url, sha256) and the counts

Only entities that occur in a triple keep their texts (as SimKGC does). The conversion holds one dict of the
~4.6M Q-ids in memory (a few hundred MB); the archives are read as streams (``tarfile`` mode ``r|gz``,
``gzip`` line iteration) and the texts are written as they are read. Descriptions are cut at fetch time
because the abstracts run to 512 tokens while an entity text gets 50 (``data.max_tokens``): keeping the
whole abstract would triple the folder and the loader's memory for words no model reads. SimKGC keeps 30.
Load with ``data.long_text: true``; without it entities get their names only.
"""

from __future__ import annotations

import gzip
import http.client
import os
import tarfile
import urllib.request
import zlib
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator

from kgc.errors import KGCError
from kgc.fileio import atomic_dir, sha256_file, write_json

PROJECT = "https://deepgraphlearning.github.io/project/wikidata5m"
TEXT, ALIAS = "wikidata5m_text.txt.gz", "wikidata5m_alias.tar.gz"
ARCHIVE_DIR = "wikidata5m-archives"  # under the data home; shared by both variants, kept after the fetch
DESCRIPTION_WORDS = 64


def split_archive(variant: str) -> str:
    return f"wikidata5m_{variant}.tar.gz"


def archive_urls(variant: str) -> dict[str, tuple[str, ...]]:
    """Archive → mirrors, tried in order: the authors' Dropbox (linked from the project page), SimKGC's
    author's Hugging Face copy, and for the splits PyKEEN's Zenodo copy."""
    hf = "https://huggingface.co/datasets/intfloat/wikidata5m/resolve/main"
    dropbox = {TEXT: "7jp4ib8zo3i6m10", ALIAS: "lnbhc8yuhit4wm5", split_archive("transductive"): "6sbhm0rwo4l73jq",
               split_archive("inductive"): "csed3cgal3m7rzo"}
    zenodo = {"transductive": "5546383", "inductive": "5546387"}
    out = {}
    for name in (split_archive(variant), ALIAS, TEXT):
        urls = [f"https://www.dropbox.com/s/{dropbox[name]}/{name}?dl=1", f"{hf}/{name}"]
        if name == split_archive(variant):
            urls.append(f"https://zenodo.org/record/{zenodo[variant]}/files/{name}")
        out[name] = tuple(urls)
    return out


# approximate archive sizes (MB) and the counts on the project page, for the message shown before downloading
ARCHIVE_MB = {TEXT: 990, ALIAS: 190, split_archive("transductive"): 160, split_archive("inductive"): 160}
STATS = {
    "transductive": "4,594,485 entities, 822 relations; 20,614,279 / 5,163 / 5,133 train / valid / test triples",
    "inductive": "4,579,609 / 7,374 / 7,475 train / valid / test entities (disjoint), 822 relations; "
                 "20,496,514 / 6,699 / 6,894 train / valid / test triples",
}


def members(archive: str) -> tuple[str, ...]:
    """The files an archive unpacks to (what ``--from FOLDER`` may hold instead of the archive)."""
    if archive == TEXT:
        return ("wikidata5m_text.txt",)
    if archive == ALIAS:
        return ("wikidata5m_entity.txt", "wikidata5m_relation.txt")
    stem = archive.removesuffix(".tar.gz")
    return tuple(f"{stem}_{s}.txt" for s in ("train", "valid", "test"))


def _available(folder: Path, archive: str) -> bool:
    return (folder / archive).is_file() or all((folder / m).is_file() for m in members(archive))


_READ_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error)


def _unreadable(path: Path, exc: BaseException) -> KGCError:
    return KGCError(f"{path}: cannot be read to the end ({type(exc).__name__}: {exc}); a truncated or damaged "
                    "download? Delete it and fetch again.")


def _guarded(lines: Iterable[str], path: Path) -> Iterator[str]:
    """``lines``, with a truncated or corrupt archive reported as one clear error (raised in the reader's frame)."""
    try:
        yield from lines
    except _READ_ERRORS as exc:
        raise _unreadable(path, exc) from None


def _lines(folder: Path, archive: str) -> Iterator[tuple[str, Iterable[str]]]:
    """Yield ``(where, lines)`` for each member of ``archive``, streamed from the archive in its own order,
    or from the extracted files beside it. Each ``lines`` must be consumed before the next is asked for.
    Lines end at ``\n`` only, so a stray ``\r`` inside an abstract does not cut it."""
    path = folder / archive
    if not path.is_file():
        for name in members(archive):
            with open(folder / name, encoding="utf-8", errors="replace", newline="\n") as fh:
                yield str(folder / name), fh
        return
    wanted, seen = set(members(archive)), set()
    try:
        if archive.endswith(".tar.gz"):
            with tarfile.open(path, mode="r|gz") as tar:
                for info in tar:
                    name = PurePosixPath(info.name).name
                    if info.isfile() and name in wanted - seen:
                        seen.add(name)
                        # decoded per line: TextIOWrapper would ask the stream (``r|gz``) to seek
                        raw = (b.decode("utf-8", errors="replace") for b in tar.extractfile(info))
                        yield f"{path}:{name}", _guarded(raw, path)
        else:
            with gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="\n") as fh:
                seen.add(members(archive)[0])
                yield str(path), _guarded(fh, path)
    except _READ_ERRORS as exc:
        raise _unreadable(path, exc) from None
    if missing := wanted - seen:
        raise KGCError(f"{path}: the archive lacks {', '.join(sorted(missing))} (a different or damaged download?). "
                       "Delete it and fetch again.")


def convert(folder: Path, out: Path, *, variant: str,
            description_words: int = DESCRIPTION_WORDS) -> dict[str, object]:
    """Write the KG-BERT folder ``out`` from the Wikidata5M archives (or their extracted files) in ``folder``.

    Three streaming passes: the triples (collecting the Q-ids and P-ids that occur), the aliases (names for
    those ids), the abstracts (descriptions for those ids). Returns the counts.
    """
    if variant not in STATS:
        raise KGCError(f"Wikidata5M variant {variant!r}: expected one of {', '.join(STATS)}")
    out.mkdir(parents=True, exist_ok=True)
    entities: dict[str, int] = {}  # Q-id → bit 1: named, bit 2: described (first-seen order)
    relations: dict[str, bool] = {}  # P-id → has a text
    counts: dict[str, object] = {}
    split_of = {"train": "train", "valid": "dev", "test": "test"}
    for where, lines in _lines(folder, split_archive(variant)):
        split = split_of[where.rsplit("_", 1)[1].removesuffix(".txt")]
        n = 0
        with open(out / f"{split}.tsv", "w", encoding="utf-8") as fh:
            for lineno, line in enumerate(lines, 1):
                parts = line.rstrip("\r\n").split("\t")
                if len(parts) != 3:
                    if not line.strip():
                        continue
                    raise KGCError(f"{where}:{lineno}: expected Q-id<TAB>P-id<TAB>Q-id, got {line[:80]!r}")
                h, r, t = (p.strip() for p in parts)
                entities.setdefault(h, 0)
                entities.setdefault(t, 0)
                relations.setdefault(r, False)
                fh.write(f"{h}\t{r}\t{t}\n")
                n += 1
        counts[f"{split}_triples"] = n
    if not counts.get("train_triples"):
        raise KGCError(f"{folder}: the {variant} train split holds no triples")

    with open(out / "entity2text.txt", "w", encoding="utf-8") as ent_fh, \
            open(out / "relation2text.txt", "w", encoding="utf-8") as rel_fh:
        for where, lines in _lines(folder, ALIAS):
            is_entity = where.endswith("wikidata5m_entity.txt")
            for line in lines:
                key, _, aliases = line.rstrip("\r\n").partition("\t")
                key = key.strip()
                name = " ".join(next((a for a in aliases.split("\t") if a.strip()), "").split())
                if not name:
                    continue
                if is_entity:
                    flag = entities.get(key)
                    if flag is not None and not flag & 1:
                        ent_fh.write(f"{key}\t{name}\n")
                        entities[key] = flag | 1
                elif relations.get(key) is False:
                    rel_fh.write(f"{key}\t{name}\n")
                    relations[key] = True
        unnamed = [e for e, flag in entities.items() if not flag & 1]
        for e in unnamed:  # the loader needs every entity in entity2text.txt: its id is its name
            ent_fh.write(f"{e}\t{e}\n")

    described = 0
    with open(out / "entity2textlong.txt", "w", encoding="utf-8") as fh:
        for _, lines in _lines(folder, TEXT):
            for line in lines:
                key, _, text = line.partition("\t")
                key = key.strip()
                flag = entities.get(key)
                if flag is None or flag & 2:
                    continue
                words = text.split(None, description_words)[:description_words]  # the long tail stays unsplit
                if words:
                    fh.write(f"{key}\t{' '.join(words)}\n")
                    entities[key] = flag | 2
                    described += 1
    counts.update(entities=len(entities), relations=len(relations), entities_without_alias=len(unnamed),
                  entities_without_description=len(entities) - described,
                  relations_without_alias=sorted(r for r, named in relations.items() if not named),
                  description_words=description_words)
    return counts


def size_message(variant: str, to_download: list[str], archive_dir: Path) -> str:
    lines = [f"Wikidata5M ({variant}): {STATS[variant]}."]
    if to_download:
        mb = sum(ARCHIVE_MB[a] for a in to_download)
        parts = ", ".join(f"{a} ~{ARCHIVE_MB[a]} MB" for a in to_download)
        lines.append(f"This downloads about {mb / 1000:.1f} GB ({parts}) into {archive_dir}.")
    lines.append("Converting takes a few minutes and about 3 GB of disk; loading the graph takes several GB of RAM "
                 "(about 6 GB, extrapolated from a 1/20-scale synthetic copy).")
    return "\n".join(lines)


def _say(msg: str) -> None:
    """The default progress line: straight to stdout, flushed (the CLI passes its own echo)."""
    print(msg, flush=True)


def fetch(*, variant: str, target: Path, home: Path, source: str | None = None, yes: bool = False,
          echo: Callable[[str], None] = _say,
          ask: Callable[[str], bool] | None = None) -> Path:
    """Download what is missing (after the size message and a yes), convert, and rename into ``target``.

    ``source``: a folder already holding the archives (or their extracted files); nothing is downloaded.
    Otherwise the archives go to ``<home>/wikidata5m-archives`` and stay there, so the other variant and a
    retried conversion reuse them. ``yes`` agrees to the download; otherwise ``ask(question)`` is asked,
    and with neither the fetch stops with the fix (``--yes``) instead of waiting on a prompt.
    """
    urls = archive_urls(variant)
    if source is not None:
        folder = Path(source).expanduser()
        if not folder.is_dir():
            raise KGCError(f"--from {folder}: for Wikidata5M, give the folder holding {', '.join(urls)}")
        if missing := [a for a in urls if not _available(folder, a)]:
            raise KGCError(f"--from {folder}: missing " + "; ".join(
                f"{a} (or its files {', '.join(members(a))}), from {urls[a][0]}" for a in missing))
        to_download: list[str] = []
    else:
        folder = home / ARCHIVE_DIR
        to_download = [a for a in urls if not _available(folder, a)]
    echo(size_message(variant, to_download, folder))
    if to_download and not yes:
        if ask is None:
            raise KGCError(f"Wikidata5M is a large download (about {sum(ARCHIVE_MB[a] for a in to_download) / 1000:.1f}"
                           f" GB) and nobody was asked (stdin is not a terminal). Rerun with --yes to agree, or "
                           f"download {', '.join(to_download)} yourself and pass --from FOLDER.")
        if not ask("Download now?"):
            raise KGCError("Wikidata5M fetch cancelled; nothing was downloaded")
    sources = {}
    for archive in urls:
        if archive in to_download:
            sources[archive] = _download(archive, urls[archive], folder / archive, echo)
        else:
            sources[archive] = str(folder / archive) if (folder / archive).is_file() else "extracted files"
    sums = {}
    for archive in urls:
        if (folder / archive).is_file():
            sums[archive] = sha256_file(folder / archive)
            echo(f"  {archive}: sha256 {sums[archive]} (not pinned in the catalog)")
    with atomic_dir(target) as tmp:
        echo(f"converting into {target} (streaming; a few minutes for the full set)")
        counts = convert(folder, tmp, variant=variant)
        write_json(tmp / "wikidata5m.json", {
            "variant": variant, "project": PROJECT,
            "archives": {a: {"source": sources[a], "sha256": sums.get(a)} for a in urls}, "counts": counts})
        echo(f"  {counts['entities']:,} entities ({counts['entities_without_alias']:,} without an alias, "
             f"{counts['entities_without_description']:,} without a description), {counts['relations']} relations, "
             f"{counts['train_triples']:,} / {counts['dev_triples']:,} / {counts['test_triples']:,} triples")
    if source is None:
        echo(f"the archives stay in {folder} for the other variant; delete that folder when done")
    return target


def _download(archive: str, urls: tuple[str, ...], dest: Path, echo: Callable[[str], None] = _say) -> str:
    """Stream the first mirror that answers into ``dest`` (via ``dest.part``); return its URL."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    errors = []
    for url in urls:
        try:
            request = urllib.request.Request(url, headers={"User-Agent": "kgc-data-fetch"})
            with urllib.request.urlopen(request, timeout=60) as resp, open(part, "wb") as out:
                total = int(resp.headers.get("Content-Length") or 0)
                done, step = 0, max(total // 10, 100 << 20) if total else 100 << 20
                mark = step
                echo(f"downloading {url}")
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
                    done += len(chunk)
                    if done >= mark:
                        echo(f"  {done >> 20} MB" + (f" of {total >> 20} MB" if total else ""))
                        mark += step
            if total and done != total:
                raise OSError(f"got {done} of {total} bytes")
            with open(part, "rb") as fh:
                if fh.read(2) != b"\x1f\x8b":  # a mirror that answers with a web page instead of the file
                    raise ValueError("not a gzip file")
            os.replace(part, dest)
            return url
        except (OSError, ValueError, http.client.HTTPException) as exc:  # IncompleteRead: a cut connection
            errors.append(f"{url}: {exc}")
        finally:
            if part.exists():
                part.unlink()
    raise KGCError(f"could not download {archive} ({'; '.join(errors)}). Offline? Fetch it elsewhere into a "
                   f"folder and pass --from FOLDER, or put it into {dest.parent}.")
