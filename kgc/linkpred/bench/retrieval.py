"""``kgc bench index``: the entity index types (flat, ivf, hnsw, ivfpq, sq) on synthetic clustered unit vectors at a
chosen scale (1M × 384 is the figure in docs/scale.md): build time, index bytes (held in RAM) per entity, queries/s of
one batched search (best of ``repeats``, FAISS on every core) and recall@10 against the exact flat search, with a
sweep over the search-time parameters (nprobe, ef_search, and ivfpq's exact re-scoring factor) of each approximate
type; :func:`clustered_unit_vectors` is also what the index-type kit (:mod:`kgc.linkpred.testing`) searches.
"""

from __future__ import annotations

import time

import numpy as np

from kgc.errors import KGCError


def clustered_unit_vectors(n: int, dim: int, *, clusters: int = 2000, seed: int = 0, stream: int = 0,
                           spread: float = 1.2, latent: int = 24, chunk: int = 65_536) -> np.ndarray:
    """(n, dim) float32 unit vectors from a mixture of ``clusters`` Gaussians on the sphere; deterministic.

    The mixture (centres, noise shape) depends on ``seed`` only; ``stream`` draws an independent sample of it
    (0: the database, 1: held-out query points). Centres are random directions inside a ``latent``-dimensional
    subspace, so neighbouring clusters overlap as topics do; a point is its centre + ``spread`` · noise, the noise
    a Gaussian whose variance along the i-th axis of a random rotation is ∝ 1/i (≈ 26 effective dimensions at
    384: real sentence embeddings are far from isotropic), then normalised. Generated in chunks of float32."""
    rng = np.random.default_rng(seed)
    latent = min(latent, dim)
    basis = rng.standard_normal((latent, dim), dtype=np.float32)
    centres = rng.standard_normal((clusters, latent), dtype=np.float32) @ basis  # (clusters, dim)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    rotation, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    scales = 1.0 / np.sqrt(np.arange(1, dim + 1))
    scales /= np.sqrt((scales ** 2).sum())  # E|noise|² = 1
    mix = (scales[:, None] * rotation.T).astype(np.float32)  # (dim, dim): standard normal -> shaped noise
    out = np.empty((n, dim), np.float32)
    draw = np.random.default_rng([seed, stream])
    for s in range(0, n, chunk):
        m = min(chunk, n - s)
        x = centres[draw.integers(0, clusters, m)] + spread * (draw.standard_normal((m, dim), dtype=np.float32) @ mix)
        out[s: s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def _recall(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean share of each query's true top-k among its returned top-k. found, truth (queries, k)."""
    hit = (found[:, :, None] == truth[:, None, :]) & (found[:, :, None] >= 0)  # (queries, k, k)
    return float(hit.any(2).sum(1).mean() / truth.shape[1])


def _best_search_seconds(index, queries: np.ndarray, k: int, repeats: int) -> tuple[float, np.ndarray]:
    from kgc.linkpred.index.types import search_index

    best, ids = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        _, ids = search_index(index, queries, k)
        best = min(best, time.perf_counter() - start)
    return best, ids


def bench_index(*, entities: int = 1_000_000, dim: int = 384, queries: int = 1000,
                types=("flat", "ivf", "hnsw", "ivfpq"), nprobe=(8, 16, 32, 64, 128),
                ef_search=(16, 32, 64, 128), rescore=(1, 10), build: dict | None = None, k: int = 10,
                clusters: int = 2000, seed: int = 0, threads: int | None = None, repeats: int = 3,
                echo=print) -> dict:
    """Build each index type over ``entities`` synthetic vectors and search ``queries`` held-out ones.

    ``build``: build keys of the recipe's ``index:`` section (nlist, hnsw_m, ef_construction, pq_bytes,
    train_size), each given to the types that read it. One row per (type, search setting): ivf once per
    ``nprobe``, ivfpq once per (``nprobe``, ``rescore``) — rescore 1 is plain PQ, above 1 a row labelled
    ``ivfpq+rescore`` whose k × rescore candidates are re-scored exactly against the table (here the generated
    array in RAM, as a warm page cache holds the run's memory-mapped entities.npy) — hnsw once per ``ef_search``.
    ``bytes_per_entity`` is what the index holds in RAM (its serialised size / entities); ``mmap_bytes_per_entity``
    the table a re-scored search reads from disk / the page cache (4 · dim; 0 for the others). Ground truth is the
    exact flat search (always run, since every row's speed-up is against it)."""
    import os

    import faiss

    from kgc.linkpred.index import types as index_types

    unknown = [t for t in types if t not in index_types.TYPES]
    if unknown or not types:
        raise KGCError(f"--types {','.join(unknown)}: unknown index type. Choose from "
                       f"{', '.join(index_types.TYPES)}.")
    if min(entities, dim, queries, k) < 1 or k > entities:
        raise KGCError(f"need entities >= k >= 1, dim >= 1 and queries >= 1 (got entities={entities}, k={k}, "
                       f"dim={dim}, queries={queries})")
    before = faiss.omp_get_max_threads()
    threads = threads or os.cpu_count() or 1
    faiss.omp_set_num_threads(threads)
    try:
        start = time.perf_counter()
        base = clustered_unit_vectors(entities, dim, clusters=clusters, seed=seed)  # (entities, dim)
        held_out = clustered_unit_vectors(queries, dim, clusters=clusters, seed=seed, stream=1)  # (queries, dim)
        noisy = held_out + 0.1 / np.sqrt(dim) * np.random.default_rng([seed, 2]).standard_normal(
            held_out.shape, dtype=np.float32)
        xq = noisy / np.linalg.norm(noisy, axis=1, keepdims=True)
        data_seconds = time.perf_counter() - start
        echo(f"data: {entities} × {dim} clustered unit vectors ({clusters} clusters) + {queries} held-out queries "
             f"in {data_seconds:.1f}s; FAISS {faiss.__version__}, {threads} threads")
        rows, flat_seconds, truth = [], None, None
        for kind in dict.fromkeys(["flat", *types]):  # flat first: the ground truth and the speed baseline
            spec = index_types.TYPES[kind]
            keys = {key: v for key, v in (build or {}).items() if key in spec.build and v is not None}
            config = index_types.index_config(None, type=kind, **keys)
            params = index_types.resolve(config, entities, dim)
            index, info = index_types.build(base, params, seed=seed)
            build_seconds = info["train_seconds"] + info["add_seconds"]
            size = index_types.index_bytes(index)
            echo(f"{kind}: {info['factory']} built in {build_seconds:.1f}s (train {info['train_seconds']:.1f}s, "
                 f"add {info['add_seconds']:.1f}s) on {info['device']}, {size / 2**20:.1f} MiB")
            sweep = {"ivf": ("nprobe", nprobe), "ivfpq": ("nprobe", nprobe), "hnsw": ("ef_search", ef_search)}
            key, values = sweep.get(kind, (None, [None]))
            settings = [(v, f) for v in values for f in (rescore if "rescore" in spec.search else [None])]
            for value, factor in settings:
                if key is not None:
                    params = {**params, key: min(value, params["nlist"]) if key == "nprobe" else value}
                if factor is not None:
                    params = {**params, "rescore": factor}
                index_types.set_search_params(index, params)
                searched = index_types.with_rescore(index, base, params)  # ivfpq, rescore > 1: re-scored exactly
                seconds, ids = _best_search_seconds(searched, xq, k, repeats)
                if kind == "flat":
                    flat_seconds, truth = seconds, ids
                if kind == "flat" and "flat" not in types:
                    continue
                rescored = searched is not index
                row = {"type": kind, "label": f"{kind}+rescore" if rescored else kind, "params": dict(params),
                       "factory": info["factory"], "device": info["device"],
                       "build_seconds": round(build_seconds, 2), "train_seconds": info["train_seconds"],
                       "add_seconds": info["add_seconds"], "index_bytes": size,
                       "bytes_per_entity": round(size / entities, 1),
                       "mmap_bytes_per_entity": 4 * dim if rescored else 0, "search_seconds": round(seconds, 4),
                       "queries_per_s": round(queries / seconds, 1),
                       "speedup_vs_flat": round(flat_seconds / seconds, 2),
                       f"recall_at_{k}": round(_recall(ids, truth), 4)}
                rows.append(row)
                what = " ".join(f"{n}={params[n]}" for n in (key, "rescore" if factor is not None else None) if n) \
                    or "exact"
                echo(f"  {what:<22} {row['queries_per_s']:>10.1f} queries/s  {row['speedup_vs_flat']:>7.2f}× flat  "
                     f"recall@{k} {row[f'recall_at_{k}']:.4f}")
            del index
    finally:
        faiss.omp_set_num_threads(before)
    good = [r for r in rows if r[f"recall_at_{k}"] >= 0.95 and r["type"] != "flat"]
    best = max(good, key=lambda r: r["speedup_vs_flat"], default=None)
    small = min(good, key=lambda r: (r["bytes_per_entity"], -r["speedup_vs_flat"]), default=None)
    return {"entities": entities, "dim": dim, "queries": queries, "k": k, "clusters": clusters, "seed": seed,
            "threads": threads, "repeats": repeats, "faiss_version": faiss.__version__,
            "data_seconds": round(data_seconds, 2), "flat_queries_per_s": round(queries / flat_seconds, 1),
            "rows": rows,
            "fastest_at_recall_0.95": None if best is None else {
                "type": best["type"], "params": best["params"], "speedup_vs_flat": best["speedup_vs_flat"],
                f"recall_at_{k}": best[f"recall_at_{k}"]},
            "smallest_at_recall_0.95": None if small is None else {  # least RAM per entity, then fastest
                "type": small["type"], "params": small["params"], "bytes_per_entity": small["bytes_per_entity"],
                "speedup_vs_flat": small["speedup_vs_flat"], f"recall_at_{k}": small[f"recall_at_{k}"]}}


def index_table(result: dict) -> str:
    """The rows of :func:`bench_index` as a markdown table (RAM: the index's bytes per entity; mmap: the table a
    re-scored search reads from disk / the page cache)."""
    k = result["k"]
    lines = [f"| type | parameters | build (s) | index size | RAM bytes / entity | + mmap bytes / entity | "
             f"queries/s | × flat | recall@{k} |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        params = ", ".join(f"{key}={v}" for key, v in r["params"].items() if key != "type") or "exact"
        mmap = r.get("mmap_bytes_per_entity", 0)
        lines.append(f"| {r.get('label', r['type'])} | {params} | {r['build_seconds']:.1f} | "
                     f"{r['index_bytes'] / 2**20:,.1f} MiB | {r['bytes_per_entity']:,.0f} | "
                     f"{f'{mmap:,}' if mmap else '–'} | {r['queries_per_s']:,.0f} | {r['speedup_vs_flat']:.1f} | "
                     f"{r[f'recall_at_{k}']:.3f} |")
    return "\n".join(lines)
