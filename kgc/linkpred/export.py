"""Link prediction's ``kgc export``: a run's towers as plain Hugging Face / sentence-transformers folders
(:meth:`kgc.linkpred.task.LinkPredTask.export`; :func:`kgc.export.export_run` checks the folder and asks the run's
task).

``export_towers(run, out, format=...)`` writes

* ``sentence-transformers`` — ``OUT`` is a sentence-transformers model of the *tail tower* (Transformer →
  Pooling → Normalize, ``max_seq_length`` = the run's ``data.max_tokens``), so
  ``SentenceTransformer(OUT).encode(texts)`` gives kgc's entity embeddings; ``OUT/query/`` is the query
  tower's encoder in the same layout when the towers are separate. Only ``mean`` and ``cls`` pooling map onto
  sentence-transformers' Pooling module; ``s2sent`` is refused (use ``--format hf``);
* ``hf`` — ``save_pretrained`` folders: ``OUT/encoder/`` (shared towers) or ``OUT/tail/`` + ``OUT/query/``,
  loadable with ``AutoModel``/``AutoTokenizer``; pooling and normalisation are applied by the reader, as
  ``kgc.json`` says (``s2sent`` pooling weights ride along as ``pooling.safetensors``).

Both write ``kgc.json`` (how to compose the parts: pooling, normalisation, max_tokens, text format, the
conditioner's query recipe and whether it can be reproduced outside kgc), ``conditioner.safetensors`` (the
weights a conditioner adds: projections, hypernetwork generators), ``entities.tsv`` / ``relations.tsv``
(the exact strings kgc feeds the towers, with a check that each tokenises to kgc's own token ids) and a
short ``README.md``. The folder is built beside ``OUT`` and renamed into place, so an interrupted export
leaves nothing half-written (an earlier export there is replaced only by a complete one). Nothing here needs
sentence-transformers installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kgc.errors import KGCError
from kgc.fileio import atomic_dir, write_error, tsv_text, write_json, write_text, write_with

FORMATS = ("sentence-transformers", "hf")
ST_POOLINGS = ("mean", "cls")  # what sentence_transformers.models.Pooling can express


def export_towers(run: Any, out: Path, *, format: str = "sentence-transformers") -> dict[str, Any]:
    """Export the link-prediction ``run`` into the folder ``out`` (new, empty or an earlier export: kgc.export
    checked it); returns the ``kgc.json`` it wrote."""
    if format not in FORMATS:
        raise KGCError(f"--format {format!r}: choose {' or '.join(FORMATS)}")
    pooling = run.recipe.model.pooling
    if format == "sentence-transformers" and pooling not in ST_POOLINGS:
        raise KGCError(f"model.pooling={pooling}: sentence-transformers' Pooling module supports "
                       f"{' and '.join(ST_POOLINGS)} only; export with --format hf (the pooling's weights are "
                       "written beside the encoder and kgc.json describes it)")
    if run.recipe.model.tail_map_rank:
        raise KGCError(f"{run.path} has a tail map (model.tail_map_rank: t' = normalise(t + U Vᵀ t) after the tail "
                       "tower), which kgc export does not write: its entity vectors would differ from the run's. "
                       "Serve or predict with the run itself (kgc serve / kgc predict)")
    model, graph, tokenizer = _load(run)
    try:
        with atomic_dir(out, replace=True) as stage:  # an earlier export is replaced only by a complete one
            meta = _write(stage, run, model, graph, tokenizer, format)
    except Exception as exc:  # safetensors and transformers say "disk full" their own ways (SafetensorError)
        error = write_error(out, exc)
        if error is None or error is exc:
            raise
        raise error from None
    return meta


def _load(run):
    """(model, graph, tokenizer): the run's model with its weights, without the layer cache (an export needs only
    the weights), and the tokenizer its text bank was built with."""
    from kgc.linkpred.model import build_model

    graph = run.predictor.graph()
    model, tokenizer = build_model(run.recipe, graph, run.dir.backbone, pretrained=run.dir.pretrained)
    run.dir.load_weights(model)
    return model.eval(), graph, tokenizer


def _write(folder: Path, run, model, graph, tokenizer, format: str) -> dict[str, Any]:
    bank = model.bank
    shared = model.query_encoder is model.tail_encoder
    tokenizer.model_max_length = bank.max_tokens  # tokenizer(text, truncation=True) then cuts where kgc cuts
    if format == "sentence-transformers":
        towers = {"tail": ".", "query": "." if shared else "query"}
    else:
        towers = {"tail": "encoder", "query": "encoder"} if shared else {"tail": "tail", "query": "query"}
    for role, encoder in (("tail", model.tail_encoder), ("query", model.query_encoder)):
        if role == "query" and shared:
            continue
        _write_tower(folder / towers[role], encoder, tokenizer, bank.max_tokens, format)

    entity_texts = [bank.entity_text(e) for e in range(graph.num_entities)]
    entity_exact = _tokenises_like_kgc(tokenizer, bank, entity_texts, [bank.entity_ids(e) for e in
                                                                       range(graph.num_entities)])
    n_rel = 2 * graph.num_relations
    relation_texts = [graph.relation_text(r) for r in range(n_rel)]
    relation_exact = _tokenises_like_kgc(tokenizer, bank, relation_texts, bank.relation_ids)
    write_text(folder / "entities.tsv", tsv_text(
        [{"index": e, "id": graph.entities[e], "text": t, "exact": int(x)}
         for e, (t, x) in enumerate(zip(entity_texts, entity_exact))], ["index", "id", "text", "exact"]))
    write_text(folder / "relations.tsv", tsv_text(
        [{"index": r, "id": graph.relation_label(r), "text": t, "exact": int(x)}
         for r, (t, x) in enumerate(zip(relation_texts, relation_exact))], ["index", "id", "text", "exact"]))

    cond = _conditioner_meta(model.conditioner)
    extra = _conditioner_weights(model)
    if extra:
        from safetensors.torch import save_file

        write_with(folder / "conditioner.safetensors", lambda p: save_file(extra, str(p)))
        cond["weights"] = {"file": "conditioner.safetensors",
                           "tensors": {k: list(v.shape) for k, v in extra.items()}}
    meta = _meta(run, model, graph, format, towers, cond, sum(entity_exact), sum(relation_exact))
    write_json(folder / "kgc.json", meta)
    write_text(folder / "README.md", _readme(meta))
    return meta


def _write_tower(folder: Path, encoder, tokenizer, max_tokens: int, format: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    encoder.backbone.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    if encoder.pooling not in ST_POOLINGS:  # s2sent: its excitation and gates, for kgc.encoding.pooling
        from safetensors.torch import save_file

        state = {k: v.detach().cpu().contiguous() for k, v in encoder.pooler.state_dict().items()}
        write_with(folder / "pooling.safetensors", lambda p: save_file(state, str(p)))
    if format != "sentence-transformers":
        return
    # the classic on-disk layout (as sentence-transformers/all-MiniLM-L6-v2 ships), written by hand so that
    # kgc needs no sentence-transformers; current releases still read it (tests: 6.2)
    write_json(folder / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])
    # kgc's encoders have no BERT pooler (add_pooling_layer=False); say so, or loading reports it missing
    write_json(folder / "sentence_bert_config.json", {"max_seq_length": max_tokens, "do_lower_case": False,
                                                      "model_args": {"add_pooling_layer": False}})
    write_json(folder / "1_Pooling" / "config.json", {
        "word_embedding_dimension": encoder.dim,
        "pooling_mode_cls_token": encoder.pooling == "cls",
        "pooling_mode_mean_tokens": encoder.pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False})
    (folder / "2_Normalize").mkdir(exist_ok=True)
    write_json(folder / "config_sentence_transformers.json", {
        "__version__": {"kgc": _version(), "transformers": _version("transformers"), "pytorch": torch.__version__},
        "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"})


def _tokenises_like_kgc(tokenizer, bank, texts: list[str], kgc_ids) -> list[bool]:
    """Per text: does ``tokenizer(text, truncation=True, max_length=max_tokens)`` give the ids kgc encodes?

    kgc assembles a neighbour-extended entity text from separately tokenised pieces; with WordPiece that
    equals tokenising the joined string, with a byte-level BPE (RoBERTa) a piece's leading space can differ.
    """
    got = tokenizer(texts, truncation=True, max_length=bank.max_tokens)["input_ids"]
    return [g == bank.special.wrap(ids, bank.max_tokens)[0] for g, ids in zip(got, kgc_ids)]


def _conditioner_weights(model) -> dict[str, torch.Tensor]:
    """The conditioner's own tensors (not the encoder's, which the tower folders hold)."""
    encoder_storage = {t.data_ptr() for enc in model.encoders for t in enc.state_dict().values()}
    return {k: v.detach().cpu().contiguous().clone() for k, v in model.conditioner.state_dict().items()
            if not k.startswith("encoder.") and v.data_ptr() not in encoder_storage}


def _conditioner_meta(cond) -> dict[str, Any]:
    """``kgc.json``'s ``conditioner``: its name and entry point, then how a query is formed from the exported parts,
    as the conditioner itself states it (:meth:`~kgc.conditioning.base.Conditioner.export_spec`)."""
    spec = dict(cond.export_spec())
    return {"name": cond.name, "enters_at": cond.enters_at, "options": spec.pop("options"), **spec}


def _meta(run, model, graph, format, towers, cond, entity_exact: int, relation_exact: int) -> dict[str, Any]:
    recipe, bank, tail = run.recipe, model.bank, model.tail_encoder
    pooling: dict[str, Any] = {"name": tail.pooling, "over": "every real token (attention mask)",
                               "normalize": "L2, after pooling"}
    if tail.pooling == "mean":
        pooling["how"] = "sum(last_hidden_state * mask) / sum(mask)"
    elif tail.pooling == "cls":
        pooling["how"] = "last_hidden_state[:, 0]"
    else:
        pooling.update(how="kgc.encoding.pooling.S2SentPooling over the last `blocks` hidden states "
                           "(output_hidden_states=True); weights in <tower>/pooling.safetensors",
                       options={"blocks": recipe.model.s2sent_blocks, "frequencies": recipe.model.s2sent_frequencies,
                                "reduction": recipe.model.s2sent_reduction},
                       reproducible_outside_kgc=False)
    tail_how = ("SentenceTransformer(OUT).encode(texts)" if format == "sentence-transformers" else
                "AutoModel.from_pretrained(tail folder, add_pooling_layer=False), tokenizer(texts, padding=True, "
                "truncation=True, max_length=max_tokens), then pooling and L2 normalisation")
    return {
        "kgc_version": _version(),
        "format": format,
        "task": run.task,
        "run": str(run.path.resolve()),
        "weights": {"file": run.dir.weights_file().name, "sha256": run.dir.weights_fingerprint()},
        "dataset": recipe.data.dataset,
        "backbone": recipe.model.backbone,
        "dim": tail.dim,
        "max_tokens": bank.max_tokens,
        "similarity": "cosine: dot product of the L2-normalised query and entity embeddings",
        "towers": {**towers, "shared": model.query_encoder is tail},
        "pooling": pooling,
        "tail_tower": {"reproducible_outside_kgc": tail.pooling in ST_POOLINGS, "how": tail_how},
        "texts": {
            "entities": {"file": "entities.tsv", "rows": graph.num_entities, "exact": entity_exact,
                         "rule": "name: description; descriptions shorter than data.short_description_words words "
                                 "get the names of up to data.max_neighbors train-graph neighbours appended "
                                 "(evaluation-time text: no neighbour left out)"},
            "relations": {"file": "relations.tsv", "rows": 2 * graph.num_relations, "exact": relation_exact,
                          "rule": "rows 0..R-1 forward, R..2R-1 'inverse <relation>': (?, r, t) is asked as "
                                  "(t, inverse r, ?)"},
            "tokenisation": "tokenizer(text, truncation=True, max_length=max_tokens) with special tokens; "
                            "'exact' = 1 where that gives the token ids kgc encodes",
            "read_with": "csv.DictReader(open(path, newline=''), delimiter='\\t') (fields with quotes are quoted)",
        },
        "conditioner": cond,
    }


def _readme(meta: dict[str, Any]) -> str:
    t, q, c = meta["towers"]["tail"], meta["towers"]["query"], meta["conditioner"]
    if meta["format"] == "sentence-transformers":
        load = ("```python\nfrom sentence_transformers import SentenceTransformer\n"
                f"tail = SentenceTransformer({'OUT' if t == '.' else repr('OUT/' + t)})  "
                "# entity embeddings, L2-normalised\n"
                "emb = tail.encode(texts)  # texts: the 'text' column of entities.tsv\n```\n")
    else:
        load = ("```python\nfrom transformers import AutoModel, AutoTokenizer\n"
                f"model = AutoModel.from_pretrained('OUT/{t}', add_pooling_layer=False)\n"
                f"tok = AutoTokenizer.from_pretrained('OUT/{t}')\n"
                f"batch = tok(texts, padding=True, truncation=True, max_length={meta['max_tokens']}, "
                "return_tensors='pt')\n"
                f"# then pooling '{meta['pooling']['name']}' ({meta['pooling'].get('how', '')}) and L2 normalisation\n"
                "```\n")
    return (f"# kgc export of {meta['run']}\n\n"
            f"Link-prediction towers trained by kgc {meta['kgc_version']} on `{meta['dataset']}` "
            f"(backbone `{meta['backbone']}`, {meta['dim']}-d, max {meta['max_tokens']} tokens, "
            f"{meta['pooling']['name']} pooling, L2-normalised; scores are cosines).\n\n"
            f"Tail tower (entities): `{t}`. Query tower: `{q}`, conditioner `{c['name']}` — "
            f"reproducible outside kgc: {c['reproducible_outside_kgc']}. `kgc.json` says how a query is formed.\n\n"
            f"{load}\nThe exact strings kgc feeds the towers are in `entities.tsv` and `relations.tsv` "
            f"({meta['texts']['entities']['exact']} of {meta['texts']['entities']['rows']} entity texts tokenise "
            "exactly as kgc's own token ids).\n")


def _version(package: str = "kgc") -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:  # pragma: no cover
        return "unknown"
