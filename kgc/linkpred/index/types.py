"""The structures an entity index can be — ``flat``, ``ivf``, ``hnsw``, ``ivfpq``, ``sq`` — one class each, registered in
:data:`kgc.registry.INDEX_TYPES` (:data:`TYPES` here); adding a type is one class with its ``Options``, here or in
another package that names it under the ``kgc.index_types`` entry points (a FAISS factory string is enough).

``flat`` (exact, the default) needs no FAISS: it is :class:`~kgc.linkpred.index.exact.ExactIndex`, the unit rows as one torch tensor searched
by one matrix product and a top k, on the GPU when there is one; its only file is the index's ``entities.npy``.
The approximate types are FAISS structures, and FAISS is imported only when one of them is built, loaded or
searched (:func:`faiss_module`), so kgc trains, evaluates, predicts and serves with flat where faiss is not
installed. Every type scores by inner product on unit vectors, so a score is a cosine (for ``ivfpq`` without
re-scoring, the cosine with the compressed vector). A type reads two kinds of recipe keys (``index:``): *build*
keys, fixed once the index is built (changing one means rebuilding it), and *search* keys (``nprobe``,
``ef_search``, ``rescore``), applied whenever the index is loaded — they are stored in ``meta.json`` and can change
without a rebuild.

``ivfpq`` with ``rescore`` > 1 (the default, 10) is searched as a :class:`RescoredIndex`: the PQ index proposes
``k × rescore`` candidates, which are scored exactly against the entity table — memory-mapped, so RAM holds the PQ
codes, inverted lists and ids, and the table stays on disk / in the page cache — and the top k by exact cosine
are returned (their scores are exact cosines).

``sq`` scores every entity, as ``flat`` does, but against its vector kept by FAISS's scalar quantiser in fp16 or
bf16 (2 bytes a value: half of flat's RAM, cosines within ~1e-3) or in 8 bits (a quarter; each dimension's range
learnt from every entity), and can re-score its top ``k × rescore`` exactly as ``ivfpq`` does (default off).

Where FAISS has a GPU version of a type (flat, ivf, ivfpq) and a GPU is present, the index is trained, filled
and searched there; the file on disk is always the CPU form.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Any, ClassVar, Literal, Optional, Protocol, Union

import numpy as np
from pydantic import Field, TypeAdapter, ValidationError

from kgc.errors import KGCError
from kgc.linkpred.index.exact import ExactIndex, RescoredIndex, with_rescore  # noqa: F401  (re-exported)
from kgc.recipe import Section
from kgc.registry import INDEX_TYPES


class IndexOptions(Section):
    """The entity index ``kgc index RUN`` builds (options there override these): a union on ``type``, each type's
    options beside its class below. Inner product on unit vectors throughout, so scores are cosines; every type
    but ``flat`` is approximate (kgc bench index measures it)."""
    type: str = Field(description="flat: exact; ivf: k-means cells, a query visits nprobe of them; hnsw: a graph "
                                  "with hnsw_m links per node; ivfpq: ivf with vectors compressed to pq_bytes bytes; "
                                  "sq: every entity scored against its vector in 2 bytes a value (or 1)")

    @classmethod
    def selected_by(cls, tree: dict) -> bool:
        return tree.get("type", "flat") == cls.model_fields["type"].default


class FlatOptions(IndexOptions):
    type: Literal["flat"] = Field("flat", description="flat: exact, every entity scored (no FAISS)")


class IvfOptions(IndexOptions):
    type: Literal["ivf"] = Field("ivf", description="ivf: k-means cells, a query visits nprobe of them")
    nlist: Optional[int] = Field(None, ge=1, description="number of cells (default 4·√entities, clamped to "
                                                         "16..65536 and ≤ entities / 39)")
    nprobe: int = Field(32, ge=1, description="cells visited per query (search time; no rebuild)")
    train_size: Optional[int] = Field(None, ge=1, description="entities sampled to train k-means (default "
                                                              "64·nlist, at most all of them)")


class IvfPqOptions(IvfOptions):
    type: Literal["ivfpq"] = Field("ivfpq", description="ivfpq: ivf with vectors compressed to pq_bytes bytes")
    pq_bytes: Optional[int] = Field(None, ge=1, description="bytes per vector (sub-quantisers of 8 bits); must "
                                                            "divide the embedding dim (default ≈ dim / 8)")
    rescore: Optional[int] = Field(10, ge=1, description="candidates per answer re-scored exactly against the "
                                                         "memory-mapped entity table (the top k × rescore of the "
                                                         "PQ search; scores are then exact cosines); 1 or null: "
                                                         "off (search time; no rebuild)")


class SqOptions(IndexOptions):
    type: Literal["sq"] = Field("sq", description="sq: every entity scored, as flat, against its vector stored in "
                                                  "2 bytes a value (fp16, bf16) or 1 (8bit): half or a quarter of "
                                                  "flat's RAM")
    sq_codes: Literal["fp16", "bf16", "8bit"] = Field(
        "fp16", description="how a value is kept (FAISS's scalar quantiser): fp16 or bf16, 2 bytes (fp16: 10 bits of "
                            "mantissa, bf16: 7, both exact to ~1e-3 on a cosine); 8bit, 1 byte, each dimension's "
                            "range learnt from every entity")
    rescore: Optional[int] = Field(1, ge=1, description="candidates per answer re-scored exactly against the "
                                                        "memory-mapped entity table (the top k × rescore); 1 or "
                                                        "null: off, scores are the cosines with the stored codes "
                                                        "(search time; no rebuild)")


class HnswOptions(IndexOptions):
    type: Literal["hnsw"] = Field("hnsw", description="hnsw: a graph with hnsw_m links per node")
    hnsw_m: int = Field(32, ge=2, le=256, description="links per node (memory: 8·M bytes per entity)")
    ef_search: int = Field(64, ge=1, description="candidate list per query (search time; no rebuild)")
    ef_construction: int = Field(40, ge=1, description="candidate list while inserting (build quality/time)")


_ADAPTERS: dict[tuple[str, ...], TypeAdapter] = {}


def index_union() -> Any:
    """The recipe's ``index:`` section: one member per registered type (its ``Options``), chosen by ``type``."""
    members = tuple(INDEX_TYPES[name].Options for name in INDEX_TYPES)
    return Annotated[Union[members], Field(discriminator="type")]  # type: ignore[valid-type]


def index_options(tree: dict | None = None) -> IndexOptions:
    """The options of the type ``tree`` names (``{"type": "hnsw", "ef_search": 128}``; default flat), validated."""
    key = tuple(INDEX_TYPES)
    if key not in _ADAPTERS:
        _ADAPTERS[key] = TypeAdapter(index_union())
    return _ADAPTERS[key].validate_python({"type": "flat", **(tree or {})})


def faiss_module():
    """``faiss``, imported on first use; its absence is one message naming the fix."""
    try:
        import faiss
    except ImportError:
        raise KGCError("the approximate index types (ivf, hnsw, ivfpq, sq) need FAISS, which is not installed: "
                       "`pip install faiss-cpu` (or faiss-gpu-cu12), or use index.type=flat (exact, no FAISS)") \
            from None
    return faiss


class IndexType:
    """One FAISS structure: its recipe keys (``build``: fixed once built; ``search``: applied at load), whether
    FAISS has a GPU version, the FAISS factory string, and how its parameters are resolved for a size."""

    name: ClassVar[str]
    build: ClassVar[tuple[str, ...]] = ()  # recipe keys fixed at build time
    search: ClassVar[tuple[str, ...]] = ()  # recipe keys applied at load time
    gpu: ClassVar[bool] = False  # FAISS has a GPU version of it
    summary: ClassVar[str]
    faiss_classes: ClassVar[tuple[str, ...]] = ()  # FAISS class names an index of this type loads as
    Options: ClassVar[type[IndexOptions]]  # its recipe keys (``index:`` when ``type`` is this one)

    def factory(self, params: dict) -> str:
        """The ``faiss.index_factory`` string for resolved ``params``."""
        raise NotImplementedError

    def resolve(self, config: IndexOptions, entities: int, dim: int) -> dict:
        """The type's own keys, defaults filled in and checked against the sizes."""
        return {"type": self.name}

    def prepare(self, index, params: dict) -> None:
        """Settings to make on a fresh FAISS index before it is trained and filled."""


class Flat(IndexType):
    name, gpu, summary = "flat", True, "exact: every entity scored (one matrix product in torch, no FAISS)"
    Options = FlatOptions

    def factory(self, params):
        return "Flat"


class IVF(IndexType):
    name, gpu = "ivf", True
    Options: type[IndexOptions] = IvfOptions
    build, search = ("nlist", "train_size"), ("nprobe",)
    summary = "k-means cells, a query scans nprobe of them (IndexIVFFlat)"
    faiss_classes = ("IndexIVFFlat", "GpuIndexIVFFlat")

    def factory(self, params):
        return f"IVF{params['nlist']},Flat"

    def resolve(self, config, entities, dim):
        params = {"type": self.name}
        nlist = config.nlist if config.nlist is not None else default_nlist(entities)
        if nlist > entities:
            raise KGCError(f"index.nlist={nlist} is more cells than the {entities} entities. Choose nlist <= "
                           f"{max(1, entities // 39)} (or leave it unset: 4·√entities).")
        params["nlist"] = nlist
        self._codes(config, entities, dim, params)
        low = max(params["nlist"], self.min_train)
        size = min(entities, config.train_size if config.train_size is not None else 64 * params["nlist"])
        if size < low:
            raise KGCError(f"index.train_size={size} is too few to train {params['nlist']} cells"
                           f"{self.train_what}. Choose train_size >= "
                           f"{low} (39·nlist = {39 * params['nlist']} or more is better), or leave it unset.")
        params["train_size"] = size
        params["nprobe"] = min(config.nprobe, params["nlist"])
        return params

    min_train, train_what = 1, ""

    def _codes(self, config, entities, dim, params) -> None:
        """ivfpq: the product-quantiser's bytes per vector."""


class IVFPQ(IVF):
    name = "ivfpq"
    Options = IvfPqOptions
    build, search = ("nlist", "pq_bytes", "train_size"), ("nprobe", "rescore")
    summary = ("ivf whose vectors are product-quantised to pq_bytes bytes (IndexIVFPQ), its top k × rescore re-scored "
               "exactly against the memory-mapped entity table")
    faiss_classes = ("IndexIVFPQ", "GpuIndexIVFPQ")
    min_train, train_what = 2 ** 8, " and 256-centroid codebooks"

    def factory(self, params):
        return f"IVF{params['nlist']},PQ{params['pq_bytes']}x{PQ_BITS}"

    def _codes(self, config, entities, dim, params):
        pq = config.pq_bytes if config.pq_bytes is not None else default_pq_bytes(dim)
        if dim % pq:
            raise KGCError(f"index.pq_bytes={pq} does not divide the embedding dim {dim}: each byte codes dim / "
                           f"pq_bytes dimensions. Choose one of {', '.join(map(str, divisors(dim)))}.")
        if entities < 2 ** PQ_BITS:
            raise KGCError(f"index.type=ivfpq needs at least {2 ** PQ_BITS} entities to train its codebooks; this "
                           f"index has {entities}. Use index.type=flat (exact) or ivf.")
        params["pq_bytes"] = pq

    def resolve(self, config, entities, dim):
        return {**super().resolve(config, entities, dim), "rescore": config.rescore or 1}  # null: 1, off

    def prepare(self, index, params):
        index.do_polysemous_training = False  # the factory's default: minutes of annealing, unused by our search


class HNSW(IndexType):
    name = "hnsw"
    Options = HnswOptions
    build, search = ("hnsw_m", "ef_construction"), ("ef_search",)
    summary = "navigable small-world graph, beam search of width ef_search (IndexHNSWFlat)"
    faiss_classes = ("IndexHNSWFlat",)

    def factory(self, params):
        return f"HNSW{params['hnsw_m']},Flat"

    def resolve(self, config, entities, dim):
        return {"type": self.name, "hnsw_m": config.hnsw_m, "ef_construction": config.ef_construction,
                "ef_search": config.ef_search}

    def prepare(self, index, params):
        index.hnsw.efConstruction = params["ef_construction"]


class SQ(IndexType):
    name = "sq"
    Options = SqOptions
    build, search = ("sq_codes",), ("rescore",)
    summary = ("exhaustive, as flat, over vectors kept in fp16 / bf16 (2 bytes a value) or 8 bits (1 byte) "
               "(IndexScalarQuantizer), optionally its top k × rescore re-scored exactly")
    faiss_classes = ("IndexScalarQuantizer",)
    CODES = {"fp16": "SQfp16", "bf16": "SQbf16", "8bit": "SQ8"}

    def factory(self, params):
        return self.CODES[params["sq_codes"]]

    def resolve(self, config, entities, dim):
        # 8bit learns each dimension's range from every entity (build: a trainable index without train_size takes
        # them all; a pass over the table); fp16 and bf16 learn nothing
        return {"type": self.name, "sq_codes": config.sq_codes, "rescore": config.rescore or 1}  # null: 1, off


for _type in (Flat(), IVF(), HNSW(), IVFPQ(), SQ()):
    INDEX_TYPES.register(_type)
TYPES = INDEX_TYPES  # name → IndexType: the built-in types and those of plugins
FAISS_PARAMETER = {"nprobe": "nprobe", "ef_search": "efSearch"}
PQ_BITS = 8  # bits per sub-quantiser code: 256 centroids each, so ivfpq needs >= 256 training vectors


def index_config(base: IndexOptions | None = None, **changes) -> IndexOptions:
    """``base`` (a recipe's ``index:`` section) with ``changes`` applied (``None`` values are ignored), validated.

    A change the resulting type does not read (``nprobe`` for ``hnsw``) is an error, not a silent no-op; the base's
    keys the new type does not read are left behind when ``type`` changes."""
    changes = {k: v for k, v in changes.items() if v is not None}
    kind = changes.get("type", base.type if base is not None else "flat")
    member = TYPES[kind].Options if kind in TYPES else None
    if member is None:
        raise KGCError(f"index.type {kind!r}: unknown. Choose one of {', '.join(TYPES)}")
    unread = sorted(k for k in changes if k not in member.model_fields)
    if unread:
        readers = {k: ", ".join(t.name for t in TYPES.values() if k in t.build + t.search) for k in unread}
        if not all(readers.values()):
            raise KGCError(f"unknown index key(s) {', '.join('index.' + k for k in unread)}. Valid keys for "
                           f"{kind}: {', '.join(member.model_fields)}")
        only = next(iter(readers.values())) if len(readers) == 1 else "; ".join(f"{k}: {v}" for k, v in readers.items())
        raise KGCError(f"{', '.join('index.' + k for k in unread)}: not read by index type {kind} (only by "
                       f"{only}). Drop {'it' if len(unread) == 1 else 'them'}, or choose that type.")
    kept = {k: v for k, v in (base.model_dump() if base is not None else {}).items() if k in member.model_fields}
    try:
        return index_options({**kept, **changes})
    except ValidationError as err:
        lines = [f"index.{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']} (got {e.get('input')!r})"
                 for e in err.errors()]
        raise KGCError("bad index parameters:\n  " + "\n  ".join(lines)) from None


def default_nlist(entities: int) -> int:
    """4·√N cells, clamped to 16..65536, and at most N / 39 (FAISS wants >= 39 training points per cell)."""
    return max(1, min(int(np.clip(round(4 * math.sqrt(entities)), 16, 65536)), entities // 39))


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def default_pq_bytes(dim: int) -> int:
    """The largest divisor of ``dim`` that is at most dim / 8 (384 → 48 bytes, 32× smaller than float32)."""
    return max(d for d in divisors(dim) if d <= max(1, dim // 8))


def resolve(config: IndexOptions, entities: int, dim: int) -> dict:
    """The parameters an index of ``entities`` vectors of ``dim`` is built and searched with: the type's own keys
    only, defaults filled in, checked against the sizes (``{"type": "ivf", "nlist": 4000, "train_size": …}``)."""
    return TYPES[config.type].resolve(config, entities, dim)


def build_params(params: dict) -> dict:
    """The part of ``params`` that only a rebuild can change (type and build keys)."""
    return {k: v for k, v in params.items() if k == "type" or k in TYPES[params["type"]].build}


def search_params(params: dict) -> dict:
    return {k: params[k] for k in TYPES[params["type"]].search if k in params}


def factory_string(params: dict) -> str:
    return TYPES[params["type"]].factory(params)


# ---------------------------------------------------------------- devices


_GPU_RESOURCES: list = []  # one StandardGpuResources for the process, kept alive while its indexes live


def gpu_available(kind: str = "ivf") -> bool:
    """An index of type ``kind`` can run on a GPU here: torch sees a CUDA device (flat), or FAISS was built with
    GPU support and sees a GPU (the FAISS types)."""
    if kind == "flat":
        import torch

        return torch.cuda.is_available()
    faiss = faiss_module()
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def on_gpu(index) -> bool:
    if isinstance(index, RescoredIndex):
        return on_gpu(index.index)
    if isinstance(index, ExactIndex):
        return index.device.type == "cuda"
    return type(index).__name__.startswith("Gpu")


def to_device(index, kind: str, device: str = "auto") -> tuple[object, str]:
    """``index`` on the GPU when ``device`` is auto or gpu, the type has a GPU version and a GPU is present;
    ``(index, "gpu" | "cpu")``. A GPU that refuses the index (memory, PQ size) leaves it on the CPU under auto."""
    if device == "cpu" or not TYPES[kind].gpu or not gpu_available(kind):
        if device == "gpu":
            why = "FAISS has no GPU version of it" if not TYPES[kind].gpu else \
                "torch sees no CUDA device" if kind == "flat" else \
                f"faiss {faiss_module().__version__} sees no GPU (faiss-cpu, or no device)"
            raise KGCError(f"index type {kind} cannot run on the GPU: {why}. Use device auto or cpu.")
        return (index.to("cpu") if isinstance(index, ExactIndex) else index), "cpu"
    if isinstance(index, ExactIndex):
        try:
            return index.to("cuda"), "gpu"
        except RuntimeError as exc:  # out of GPU memory
            if device == "gpu":
                raise KGCError(f"the flat index does not fit on the GPU: {exc}") from None
            return index, "cpu"
    faiss = faiss_module()
    if not _GPU_RESOURCES:
        _GPU_RESOURCES.append(faiss.StandardGpuResources())
    options = faiss.GpuClonerOptions()
    options.useFloat16LookupTables = kind == "ivfpq"  # large PQ tables do not fit shared memory in float32
    try:
        return faiss.index_cpu_to_gpu(_GPU_RESOURCES[0], 0, index, options), "gpu"
    except RuntimeError as exc:
        if device == "gpu":
            raise KGCError(f"FAISS could not put the {kind} index on the GPU: {exc}") from None
        return index, "cpu"


def to_cpu(index):
    if isinstance(index, RescoredIndex):
        return RescoredIndex(to_cpu(index.index), index.table, index.factor)
    if isinstance(index, ExactIndex):
        return index.to("cpu")
    return faiss_module().index_gpu_to_cpu(index) if on_gpu(index) else index


def type_of(index) -> str | None:
    """The registry name of an index object (None for a structure this module does not build); where several
    registered types build the same FAISS class (the built-in ``sq`` and a plugin's scalar quantiser), the first
    registered (:func:`types_of` lists them all)."""
    return next(iter(types_of(index)), None)


def types_of(index) -> list[str]:
    """Every registered type that builds ``index``'s structure (``IndexHNSWFlat`` → [hnsw]), in registration order;
    an index file agrees with a meta.json naming any of them."""
    if isinstance(index, RescoredIndex):
        return types_of(index.index)
    if isinstance(index, ExactIndex):
        return ["flat"]
    return [t.name for t in TYPES.values() if type(index).__name__ in t.faiss_classes]


# ---------------------------------------------------------------- build, search


def build(vectors: np.ndarray, params: dict, *, seed: int = 0, device: str = "auto") -> tuple[object, dict]:
    """Train (ivf, ivfpq: on ``train_size`` vectors sampled with ``seed``) and fill an index of ``vectors``
    (entities, dim), unit rows. Returns the index (on the GPU when one was used, search parameters set) and
    ``{"factory", "device", "train_seconds", "add_seconds"}``."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = vectors.shape
    kind = params["type"]
    if kind == "flat":
        start = time.perf_counter()
        index, where = to_device(ExactIndex(vectors), kind, device)
        return index, {"factory": factory_string(params), "engine": "torch", "device": where, "train_seconds": 0.0,
                       "add_seconds": round(time.perf_counter() - start, 3)}
    faiss = faiss_module()
    index = faiss.index_factory(dim, factory_string(params), faiss.METRIC_INNER_PRODUCT)
    TYPES[kind].prepare(index, params)
    index, where = to_device(index, kind, device)
    start = time.perf_counter()
    if not index.is_trained:
        take = params.get("train_size", n)  # sq's 8bit codes: every vector
        sample = vectors if take >= n else vectors[np.sort(np.random.default_rng(seed).choice(n, take, replace=False))]
        index.train(sample)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    index.add(vectors)
    add_seconds = time.perf_counter() - start
    set_search_params(index, params)
    return index, {"factory": factory_string(params), "device": where, "train_seconds": round(train_seconds, 3),
                   "add_seconds": round(add_seconds, 3)}


def set_search_params(index, params: dict) -> None:
    """Apply ``nprobe`` / ``ef_search`` from ``params`` to a loaded or freshly built FAISS index (``rescore`` is
    not FAISS's: :func:`with_rescore` applies it)."""
    if isinstance(index, RescoredIndex):
        index.factor = params.get("rescore") or 1
        index = index.index
    settings = {k: v for k, v in search_params(params).items() if k in FAISS_PARAMETER}
    if not settings:
        return
    faiss = faiss_module()
    space = faiss.GpuParameterSpace() if on_gpu(index) else faiss.ParameterSpace()
    for key, value in settings.items():
        space.set_index_parameter(index, FAISS_PARAMETER[key], value)


def index_bytes(index) -> int:
    """Size of the index's serialised (CPU) form: what it holds in memory, give or take a few KB of headers (a
    :class:`RescoredIndex`: its FAISS index; the memory-mapped table is not counted)."""
    if isinstance(index, RescoredIndex):
        index = index.index
    if isinstance(index, ExactIndex):
        return index.ntotal * index.d * 4
    return int(faiss_module().serialize_index(to_cpu(index)).nbytes)


class SearchIndex(Protocol):
    """What a search reads of an index, whichever type built it: a FAISS index, :class:`ExactIndex` (flat, in
    torch) or :class:`RescoredIndex` (ivfpq re-scored against the exact table) — the hand-off from the index store
    to every search (:func:`search_index`, :func:`kgc.linkpred.answer.topk.search_many`)."""
    d: int  # the vectors' dimension
    ntotal: int  # how many vectors it holds

    def search(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]: ...


def search_index(index: SearchIndex, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` of every query: ``(scores, ids)``, both (queries, k), best first; scores are cosines (exact ones,
    but for an ivfpq index without re-scoring: the cosines with its compressed vectors).

    ``queries`` (queries, dim) or (dim,), unit rows. ``k`` is capped at the index size; an approximate index
    may return fewer than ``k`` hits for a query (the rest have id -1)."""
    q = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)  # (queries, dim)
    if q.shape[1] != index.d:
        raise KGCError(f"queries have dim {q.shape[1]}, the index holds vectors of dim {index.d}")
    if k < 1:
        raise KGCError(f"k={k}: ask for at least one hit")
    k = min(k, index.ntotal)
    if k == 0:
        return np.zeros((len(q), 0), np.float32), np.zeros((len(q), 0), np.int64)
    if on_gpu(index) and not isinstance(index, ExactIndex) and k > 2048:
        raise KGCError(f"k={k}: FAISS on the GPU returns at most 2048 hits per query; search a CPU copy instead")
    scores, ids = index.search(q, k)
    return scores, ids
