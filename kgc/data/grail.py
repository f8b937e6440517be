"""GraIL's inductive splits (Teru, Denis & Hamilton 2020, "Inductive Relation Prediction by Subgraph Reasoning"):
WN18RR v1–v4 and FB15k-237 v1–v4, each a training graph (``WN18RR_vN``) and an inference graph (``WN18RR_vN_ind``)
whose entities the training graph does not hold, as published in github.com/kkteru/grail (``data/``).

The splits carry no texts. Named in a recipe (``data.dataset: grail-wn18rr-v1``), a split is found under a data
home's ``GraIL/`` folder (each file's sha256 checked against the published files'), and its texts in the same
home's WN18RR / FB15k-237 folders (the catalog's ``wn18rr`` and ``fb15k237``); kgc writes, once, under
``$KGC_CACHE_HOME/datasets/<name>/``:

* the training graph as a KG-BERT folder — ``train.tsv`` / ``dev.tsv`` / ``test.tsv`` (``vN/train.txt``,
  ``valid.txt``, ``test.txt``) and the texts of **its own entities only** (``entity2text.txt``, and
  ``entity2textlong.txt`` for FB15k-237), so no inference-graph entity is ever embedded in training (no batch, no
  pre-batch queue, no entity table holds one);
* ``inference/`` — the inference graph as a KG-BERT folder: ``train.tsv`` = ``vN_ind/train.txt`` (the graph known
  at test time), ``dev.tsv`` / ``test.tsv`` = its queries, and the texts of its entities;
* ``grail.json`` — where each file came from (sha256), the counts, and the entities the two graphs share (the
  published WN18RR v3 shares 8: a quirk of the release, said by ``kgc data check``).

``kgc evaluate RUN --inductive`` ranks ``inference/test.tsv`` over the inference graph's entities
(:mod:`kgc.linkpred.evaluation.sampled` for GraIL's 50 negatives). Where a network exists, ``kgc data fetch
grail-wn18rr-v1`` downloads the six files of a split into ``$KGC_DATA_HOME/GraIL``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Callable

from kgc.data.download import download
from kgc.errors import KGCError
from kgc.fileio import atomic_dir, cache_home, sha256_cached, sha256_file, write_json, write_text

GRAIL_URL = "https://raw.githubusercontent.com/kkteru/grail/master/data"
FORMAT = 1  # of the folder written here: a change rebuilds every cached split
FILES = ("train.txt", "valid.txt", "test.txt")
KG_SPLITS = {"train.txt": "train.tsv", "valid.txt": "dev.tsv", "test.txt": "test.tsv"}
GRAPHS = {"wn18rr": ("WN18RR", "wn18rr"), "fb237": ("fb237", "fb15k237")}  # name -> (GraIL's folder stem, texts)
SPLITS = {f"grail-{kg}-v{v}": (kg, v) for kg in GRAPHS for v in range(1, 5)}
TEXTS = ("entity2text.txt", "entity2textlong.txt")

# the sha256 of every published file (kkteru/grail, data/, as in ../shared/data/README.md)
SHA256 = {
    "WN18RR_v1/train.txt": "4cc72d4fdcc8206e208e1f59f3c778be5de4a68cfe76776d15245b0d2c08d396",
    "WN18RR_v1/valid.txt": "5cebd29da8ada35ac73b6875329884cdf83943ddea454e9f70cc43b423ea479b",
    "WN18RR_v1/test.txt": "f1cb44e999e2540a0a614f4bb710c7f82a9304432ff37ce282749b56c66d0d20",
    "WN18RR_v1_ind/train.txt": "7d1b73c5994e9aa816b34e33ee10707656803ba6b8a0f6066cae7ddc04f87553",
    "WN18RR_v1_ind/valid.txt": "cfa28b9d75dbab17ea82a9443a5bf8acb738e60267cc63f8a221b38967e1d238",
    "WN18RR_v1_ind/test.txt": "6df8c00a2e0cf1a4b484ac638c081198926fcbc411ce2e12ccc79d432eead269",
    "WN18RR_v2/train.txt": "a14a902df92e32f4aeb65761560072a007ae915308bb8a7a03c58dc1e9c2a9ad",
    "WN18RR_v2/valid.txt": "2d3f6703d87fe1605f636736f0e848d9750b8e1593bd41101554ecbb41a1d836",
    "WN18RR_v2/test.txt": "04e03f270adf4970132ad51ab1a4022e46e790e9b662890ce4e13d31e6d096ad",
    "WN18RR_v2_ind/train.txt": "8dc9bb459e6306737a083b15698ed1420ce8dc57e27f8a42ab7b90c26dfc5154",
    "WN18RR_v2_ind/valid.txt": "fc32db7cb56dba0ff05bf57efd8a2279f0825dc6ae763c9d32281a9a1373c09a",
    "WN18RR_v2_ind/test.txt": "3b3942ce7665f1a6667721f5eab946bde79a5929f1996c5af16e0b092a5084bb",
    "WN18RR_v3/train.txt": "324a2b04b621bfe8d2dd98ad1c585fbc7efefb1548e92b5d10afc08733286aa7",
    "WN18RR_v3/valid.txt": "7f008df4879d36ef70a5c5eb58a7c87488c3f1fea606ab484e66a1aff89b0cbc",
    "WN18RR_v3/test.txt": "df6690cc2a454c14f79a62e879ba6d688bd666f2cf6168e1d6abffd7a7efc598",
    "WN18RR_v3_ind/train.txt": "85b817c364d097793a4b0969fa49d20167345256bf812c978bff381ad3aef492",
    "WN18RR_v3_ind/valid.txt": "c0876dafce4cef4c6ef1aa53457fb9f4e40a31a8bf9edbaf05389bfe5ba26f43",
    "WN18RR_v3_ind/test.txt": "efad21a11c1cf26a1a4a5fcf7a64c585ccde3c4f8f71de3a00a995d9e8c9938d",
    "WN18RR_v4/train.txt": "5eace2cdfdffb2b19c6d27c7527ae79b8f4b1b3fb712d9a5049243a13edb95ca",
    "WN18RR_v4/valid.txt": "ca1568ca934bbf5ccfeabb3a67010968433c0e5bc1df9b0d3d48279023abd7bd",
    "WN18RR_v4/test.txt": "7d4f3226400ea477a5559aa69034df73f0cd314c1a1916963ac000b2cac44e82",
    "WN18RR_v4_ind/train.txt": "d5608132dab5873666e249c1de9412608c0e0b2cc0d154b0ffceff1ce067cc03",
    "WN18RR_v4_ind/valid.txt": "0928c5cb528ebde49a3be13f3df4d863f95312c247854bea556c65008cc5b54c",
    "WN18RR_v4_ind/test.txt": "10ccff353175e6eaaff0b3d7ef7931115845868653ddba0ba6fb5c8dfdab6364",
    "fb237_v1/train.txt": "74ef3120fe38a22e5131064d23108b88a8d339496057fa8467d80dcda8f1cec1",
    "fb237_v1/valid.txt": "d4c2698d7dc36c0dc39ffb3d810caeafe530d779bf9f6451fac2027f41c2ff6d",
    "fb237_v1/test.txt": "130534f98bc3b9621bc866035098b132091e8bc749fbad327b5978f3d47f49f7",
    "fb237_v1_ind/train.txt": "049829f7047ecf0e0bff0769efca31bc7f811f760c4ffcb20a5680f789b00c61",
    "fb237_v1_ind/valid.txt": "ac817123c4177ef46b08a3802380a355282b99d4283c43474c9dd91c082107dd",
    "fb237_v1_ind/test.txt": "c79d39372be30a3864cfe5094b3022f38b57d88c351dbbfa2d9e7f3368ac23aa",
    "fb237_v2/train.txt": "542f81af46d6727979278643105ba7c236dd8b29ee5d9962e3c3fa295ab8869c",
    "fb237_v2/valid.txt": "59e07dcb883b28bb35585ba95576e4ebb2a71ddbc906119abcc4c87b28198d0c",
    "fb237_v2/test.txt": "95da050e60b94f285cdf18ea7899b34df9e0a4a1d638f5ec6ff99caef36a2beb",
    "fb237_v2_ind/train.txt": "6756f8d4aa688bc1a18c1106117a7fde94e0469f223f5d00954846afce471e54",
    "fb237_v2_ind/valid.txt": "2c3b4430cac899b868c9dd22ece0eae830ca62c8a6c0bf8610c670bbeaf7d6d8",
    "fb237_v2_ind/test.txt": "17c16e008cb6dfdc67ef0f375aab0a8fee2b087c7d687a72f5217b789d0c4a10",
    "fb237_v3/train.txt": "0f27b7f00d3e34964450c22445d17f7612d12d7c382caa3317f45bfe7465f299",
    "fb237_v3/valid.txt": "8b034e73fe64af9c7baf1e12704a94e7e9a9e6b9242feb498c69ebd65bccf269",
    "fb237_v3/test.txt": "f93ff5277296486e2ce5d035e46b81b24b89e55a7a8e41196636482aeb50a49b",
    "fb237_v3_ind/train.txt": "2805f9237816f5bb5bb1ff1fbc3d37cc0beb99047bef3a6bd82cc1f6947e8525",
    "fb237_v3_ind/valid.txt": "76f7691aa597d43d704af047d01a5f4d266c02733c52a5c340c2bea4a85dd281",
    "fb237_v3_ind/test.txt": "7dbd4d74210ffd5029d95327639f83c3b46f8bd4ee3571e619812b367d0880da",
    "fb237_v4/train.txt": "b9fa0f2650a1ab7687e21e0aec24bb51c0b0eacf0d88c8780c03c9b201b9148d",
    "fb237_v4/valid.txt": "d99dedcd13bc0cd338a299a895685b66f15e0b7ed42477d40f1ad1a65ce6d483",
    "fb237_v4/test.txt": "f1ecc866636b2704bd6f7cae53d2bbeea414fa88c1f2b4ab9f1924719bd505c8",
    "fb237_v4_ind/train.txt": "ef55c03e05d5eeeec97fe2030e92bc36bd5ee9311b770ae0a3fd812982686e8d",
    "fb237_v4_ind/valid.txt": "0a237c20719267449388e1d43995ccf67da5a3c82085ba5d2e3996c77dc73921",
    "fb237_v4_ind/test.txt": "8e6e19adb9b154348897bf896b5305a76126bc4d79a21705ea47e4efce2d84f3",
}


def folders(name: str) -> tuple[str, str]:
    """GraIL's two folder names of a split: (training graph, inference graph), e.g. (WN18RR_v1, WN18RR_v1_ind)."""
    kg, v = SPLITS[name]
    stem = f"{GRAPHS[kg][0]}_v{v}"
    return stem, f"{stem}_ind"


def source(name: str, homes: list[Path]) -> tuple[Path, Path]:
    """The split's two published folders in the ``GraIL/`` of the first of ``homes`` (the data homes) that holds
    them, each file checked, else one KGCError naming where they were looked for and how to get them."""
    train, ind = folders(name)
    looked = []
    for home in homes:
        root = home / "GraIL"
        looked.append(str(root))
        if all((root / f / file).is_file() for f in (train, ind) for file in FILES):
            for f in (train, ind):
                for file in FILES:
                    got = sha256_cached(root / f / file)
                    if got != SHA256[f"{f}/{file}"]:
                        raise KGCError(f"{root / f / file}: sha256 {got[:12]}… is not the published file's "
                                       f"({SHA256[f'{f}/{file}'][:12]}…). Put GraIL's own file back (kgc data fetch "
                                       f"{name} downloads it) and run this again.")
            return root / train, root / ind
    raise KGCError(f"dataset {name!r}: GraIL's {train}/ and {ind}/ were not found in {', '.join(looked)}. Copy "
                   f"them there from github.com/kkteru/grail (data/), or run `kgc data fetch {name}`, or set "
                   "KGC_DATA_HOME to a folder whose GraIL/ holds them.")


def _read_stamp(path: Path) -> dict | None:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _triples(path: Path) -> list[tuple[str, str, str]]:
    out = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split("\t")
        if len(parts) != 3:
            raise KGCError(f"{path}:{lineno}: expected head<TAB>relation<TAB>tail, got {line[:80]!r}")
        out.append((parts[0], parts[1], parts[2]))
    return out


def _texts(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, _, text = line.partition("\t")
        out[key] = text
    return out


def split_folder(name: str, homes: list[Path], find: Callable[[str], tuple[Path, str]]) -> Path:
    """The KG-BERT folder of GraIL split ``name`` (with ``inference/``), written into the cache on first use and
    again whenever a source file changes; its training graph holds only its own entities' texts. ``homes``: the
    data homes; ``find``: the catalog's lookup, for the texts' dataset (``kgc.data.catalog`` passes both)."""
    kg, _ = SPLITS[name]
    train_dir, ind_dir = source(name, homes)
    texts_dir, _ = find(GRAPHS[kg][1])
    target = cache_home() / "datasets" / name
    have = _read_stamp(target / "grail.json") or {}
    found = {texts_dir / f: _stat(texts_dir / f) for f in (*TEXTS, "relation2text.txt")}
    found = {p: st for p, st in found.items() if st is not None}
    stats = {str(p): [st.st_size, st.st_mtime_ns, st.st_ino] for p, st in found.items()}
    stamp = {"format": FORMAT, "split": name,
             "sources": {str(p / f): SHA256[f"{p.name}/{f}"] for p in (train_dir, ind_dir) for f in FILES},
             "texts": {str(p): _digest(p, st, stats[str(p)], have) for p, st in found.items()}}
    if {k: have.get(k) for k in stamp} == stamp:
        if have.get("stats") != stats:  # the same contents, touched or copied (or a cache from before "stats"):
            write_json(target / "grail.json", {**have, "stats": stats})  # recorded, so the next lookup trusts it
        return target
    graphs = {"train": {f: _triples(train_dir / f) for f in FILES}, "inference": {f: _triples(ind_dir / f) for f in FILES}}
    entities = {g: sorted({e for rows in t.values() for h, _, tl in rows for e in (h, tl)}) for g, t in graphs.items()}
    relations = {g: {r for rows in t.values() for _, r, _ in rows} for g, t in graphs.items()}
    if relations["inference"] - relations["train"]:
        raise KGCError(f"{ind_dir}: relation(s) {', '.join(sorted(relations['inference'] - relations['train']))} "
                       f"are not in {train_dir}; a text model trained there cannot be asked about them")
    texts = {f: _texts(texts_dir / f) for f in TEXTS if (texts_dir / f).is_file()}
    short = texts.get("entity2text.txt", {})
    for g, ents in entities.items():
        missing = [e for e in ents if e not in short]
        if missing:
            raise KGCError(f"{texts_dir / 'entity2text.txt'}: no text for {len(missing)} entities of GraIL's "
                           f"{(train_dir if g == 'train' else ind_dir).name} (e.g. {', '.join(missing[:3])}): not "
                           f"the {GRAPHS[kg][1]} texts the splits were cut from")
    shared = sorted(set(entities["train"]) & set(entities["inference"]))
    with atomic_dir(target, replace=True) as tmp:
        for g, sub in (("train", tmp), ("inference", tmp / "inference")):
            sub.mkdir(exist_ok=True)
            for f, rows in graphs[g].items():
                write_text(sub / KG_SPLITS[f], "".join(f"{h}\t{r}\t{t}\n" for h, r, t in rows))
            for f, table in texts.items():
                write_text(sub / f, "".join(f"{e}\t{table[e]}\n" for e in entities[g] if e in table))
            shutil.copyfile(texts_dir / "relation2text.txt", sub / "relation2text.txt")
        write_json(tmp / "grail.json", {
            **stamp, "protocol": "train on the training graph (valid.txt for model selection); at test time the "
                                 "inference graph's train.txt is the known graph and its test.txt the queries",
            "entities": {g: len(e) for g, e in entities.items()},
            "triples": {g: {KG_SPLITS[f]: len(rows) for f, rows in t.items()} for g, t in graphs.items()},
            "relations": {g: len(r) for g, r in relations.items()},
            "shared_entities": shared, "stats": stats})
    return target


def _stat(path: Path) -> os.stat_result | None:
    """The file's stat, or None where it is not a file."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _digest(path: Path, st: os.stat_result, recorded: list[int], have: dict) -> str:
    """The sha256 of a text file the cached split was built from: read from its stamp while the file's size,
    modification time and inode (``recorded``) are those it recorded (WN18RR's entity2text is 4 MB, hashed
    otherwise at every lookup)."""
    if (have.get("stats") or {}).get(str(path)) == recorded and str(path) in (have.get("texts") or {}):
        return have["texts"][str(path)]
    return sha256_cached(path, st)


def fetch(name: str, home: Path, echo=print) -> Path:
    """Download split ``name``'s six files from GraIL's repository into ``home/GraIL`` (each checked)."""
    root = home / "GraIL"
    for f in folders(name):
        if all((root / f / file).is_file() and sha256_file(root / f / file) == SHA256[f"{f}/{file}"]
               for file in FILES):
            continue
        with atomic_dir(root / f, replace=True) as tmp:
            for file in FILES:
                url = f"{GRAIL_URL}/{f}/{file}"
                download(url, tmp / file, f"Copy GraIL's data/{f}/ into {root / f} by hand.")
                if sha256_file(tmp / file) != SHA256[f"{f}/{file}"]:
                    raise KGCError(f"{url}: not the published file (sha256 differs); refusing it")
        echo(f"  {root / f}: {', '.join(FILES)}")
    return root
