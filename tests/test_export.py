"""`kgc export`: a run's towers as sentence-transformers / Hugging Face folders that reproduce kgc's embeddings.

Tiny runs (one optimiser step on the toy graph with the random 2-layer BERT, a large lr so the two towers
really differ) are exported; the folders are read back with stock sentence-transformers / transformers and
the documented recipe in kgc.json, and compared with the model kgc loads.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kgc.errors import KGCError
from tests.conftest import linkpred_model, write_toy

MAX_TOKENS = 12  # short enough that some toy entity texts are truncated


def train_run(tmp_path_factory, tiny_bert, **model) -> Path:
    from kgc.recipe import load_recipe
    from kgc.training.loop import train

    tmp = tmp_path_factory.mktemp("export_run")
    toy = write_toy(tmp / "TOY")
    overrides = ["data.dataset=toy", f"data.path={toy}", f"data.max_tokens={MAX_TOKENS}",
                 f"model.backbone={tiny_bert}", "train.max_steps=1", "train.batch_size=4", "train.lr=0.01",
                 "train.warmup_steps=0", "train.num_threads=1", "eval.dev_queries=2"]
    overrides += [f"model.{k}={v}" for k, v in model.items()]
    return train(load_recipe(None, overrides), out=tmp / "run", progress=False, echo=lambda m: None)


def read_tsv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def kgc_embeddings(run: Path):
    """(model, entity table (entities, dim), queries (2R x entities, dim) for every (head, relation))."""
    model, graph = linkpred_model(run)
    pairs = [(h, r) for r in range(2 * graph.num_relations) for h in range(graph.num_entities)]
    with torch.no_grad():
        table = model.entity_table()
        queries = model.encode_queries([h for h, _ in pairs], [r for _, r in pairs])
    return model, table, pairs, queries


@pytest.fixture(scope="module", params=["mean", "cls"])
def st_run(request, tmp_path_factory, tiny_bert):
    return train_run(tmp_path_factory, tiny_bert, pooling=request.param)


def test_sentence_transformers_folder_reproduces_both_towers(st_run, tmp_path):
    from sentence_transformers import SentenceTransformer

    from kgc.export import export_run

    out = tmp_path / "st"
    meta = export_run(st_run, out, format="sentence-transformers")
    model, table, pairs, queries = kgc_embeddings(st_run)
    entities, relations = read_tsv(out / "entities.tsv"), read_tsv(out / "relations.tsv")
    assert [int(r["index"]) for r in entities] == list(range(len(table)))
    assert all(r["exact"] == "1" for r in entities + relations)
    assert meta["texts"]["entities"]["exact"] == len(entities) and meta["max_tokens"] == MAX_TOKENS
    texts = [r["text"] for r in entities]
    assert max(len(model.bank.entity_ids(e)) for e in range(len(texts))) > MAX_TOKENS - 2  # truncation is exercised

    tail = SentenceTransformer(str(out), device="cpu")
    assert tail.max_seq_length == MAX_TOKENS
    emb = tail.encode(texts, convert_to_tensor=True, batch_size=4)
    torch.testing.assert_close(emb, table, atol=1e-5, rtol=0)

    # separate towers: the query tower is OUT/query; the bi-encoder's query is the text pair (head, relation)
    assert meta["towers"] == {"tail": ".", "query": "query", "shared": False}
    query = SentenceTransformer(str(out / "query"), device="cpu")
    q = query.encode([[texts[h], relations[r]["text"]] for h, r in pairs], convert_to_tensor=True)
    torch.testing.assert_close(q, queries, atol=1e-5, rtol=0)
    assert not torch.allclose(query.encode(texts, convert_to_tensor=True), emb, atol=1e-3)  # really two towers
    assert meta["conditioner"]["name"] == "biencoder" and meta["conditioner"]["reproducible_outside_kgc"] is True
    assert not (out / "conditioner.safetensors").exists()  # the bi-encoder adds no weights
    assert json.loads((out / "kgc.json").read_text()) == meta
    assert (out / "README.md").read_text().startswith("# kgc export")


def hf_tower(folder: Path, meta: dict):
    """The documented recipe: AutoModel + AutoTokenizer, then pooling and L2 normalisation (kgc.json)."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(folder), add_pooling_layer=False).eval()
    tok = AutoTokenizer.from_pretrained(str(folder))

    def encode(texts, pairs=None, first_only=False):
        """``first_only``: pool over the first sequence's own tokens (CASE's span), not every token."""
        batch = tok(texts, pairs, padding=True, truncation="longest_first", max_length=meta["max_tokens"],
                    return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"]
        if first_only:
            mask = torch.tensor([[s == 0 for s in batch.sequence_ids(i)] for i in range(len(texts))])
        mask = mask.unsqueeze(-1).float()
        pooled = hidden[:, 0] if meta["pooling"]["name"] == "cls" else (hidden * mask).sum(1) / mask.sum(1)
        return F.normalize(pooled, dim=-1)

    return encode


def compose(meta: dict, weights: dict, hs: torch.Tensor, hc: torch.Tensor) -> torch.Tensor:
    """The pooled conditioners' formulas, as kgc.json states them."""
    name, h = meta["conditioner"]["name"], hs.shape[-1]
    lin = lambda p, x: x @ weights[f"{p}.weight"].T + weights[f"{p}.bias"]  # noqa: E731
    if name == "hadamard":
        return F.normalize(hs * lin("proj", hc), dim=-1)
    if name == "case":  # hs = f(c; s), hc = f(c; none)
        return F.normalize((hs - hc) @ weights["proj.weight"].T, dim=-1)
    if name == "concat":
        return F.normalize(F.gelu(lin("proj", torch.cat([hs, hc], -1))), dim=-1)
    assert name == "hypernet" and meta["conditioner"]["options"]["hypernet_form"] == "lowrank"
    k = meta["conditioner"]["options"]["rank"]
    w1, w2 = lin("gen1", hc).view(-1, h, k), lin("gen2", hc).view(-1, h, k)
    return F.normalize(torch.einsum("bh,bhk,bjk->bj", hs, w1, w2), dim=-1)


@pytest.mark.parametrize("model", [
    {"conditioner": "biencoder"},
    {"conditioner": "hadamard", "shared_towers": True},
    {"conditioner": "concat", "pooling": "cls"},
    {"conditioner": "hypernet", "shared_towers": True, "rank": 4},
    {"conditioner": "case"},
], ids=["biencoder", "hadamard-shared", "concat-cls", "hypernet-shared", "case"])
def test_hf_folders_reproduce_with_the_recipe_in_kgc_json(model, tmp_path_factory, tiny_bert, tmp_path):
    from safetensors.torch import load_file

    from kgc.export import export_run

    run = train_run(tmp_path_factory, tiny_bert, **model)
    out = tmp_path / "hf"
    meta = export_run(run, out, format="hf")
    _, table, pairs, queries = kgc_embeddings(run)
    shared = model.get("shared_towers", False)
    assert meta["towers"] == ({"tail": "encoder", "query": "encoder", "shared": True} if shared else
                              {"tail": "tail", "query": "query", "shared": False})
    assert not (out / "modules.json").exists()
    texts = [r["text"] for r in read_tsv(out / "entities.tsv")]
    relations = [r["text"] for r in read_tsv(out / "relations.tsv")]
    tail = hf_tower(out / meta["towers"]["tail"], meta)
    torch.testing.assert_close(tail(texts), table, atol=1e-5, rtol=0)

    query = hf_tower(out / meta["towers"]["query"], meta)
    heads, rels = [texts[h] for h, _ in pairs], [relations[r] for _, r in pairs]
    cond = meta["conditioner"]
    assert cond["reproducible_outside_kgc"] is True
    if cond["name"] == "biencoder":
        q = query(heads, rels)
    elif cond["name"] == "case":  # the relation read in the head's context, minus the relation alone
        weights = load_file(str(out / "conditioner.safetensors"))
        q = compose(meta, weights, query(rels, heads, first_only=True), query(rels, first_only=True))
    else:
        assert cond["weights"]["file"] == "conditioner.safetensors"
        weights = load_file(str(out / "conditioner.safetensors"))
        assert {k: list(v.shape) for k, v in weights.items()} == cond["weights"]["tensors"]
        q = compose(meta, weights, query(heads), query(rels))
    torch.testing.assert_close(q, queries, atol=1e-5, rtol=0)


def test_s2sent_exports_to_hf_with_its_pooling_weights_and_is_refused_by_sentence_transformers(
        tmp_path_factory, tiny_bert, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer

    from kgc.encoding.pooling import S2SentPooling
    from kgc.export import export_run

    run = train_run(tmp_path_factory, tiny_bert, pooling="s2sent", s2sent_blocks=2, s2sent_frequencies=4)
    with pytest.raises(KGCError, match="model.pooling=s2sent: sentence-transformers' Pooling module supports "
                                       "mean and cls only; export with --format hf"):
        export_run(run, tmp_path / "st", format="sentence-transformers")
    assert not (tmp_path / "st").exists()

    meta = export_run(run, tmp_path / "hf", format="hf")
    p = meta["pooling"]
    assert p["name"] == "s2sent" and p["reproducible_outside_kgc"] is False and meta["tail_tower"][
        "reproducible_outside_kgc"] is False
    folder = tmp_path / "hf" / meta["towers"]["tail"]
    pool = S2SentPooling(meta["dim"], **p["options"])
    pool.load_state_dict(load_file(str(folder / "pooling.safetensors")))
    backbone = AutoModel.from_pretrained(str(folder), add_pooling_layer=False).eval()
    texts = [r["text"] for r in read_tsv(tmp_path / "hf" / "entities.tsv")]
    batch = AutoTokenizer.from_pretrained(str(folder))(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = backbone(**batch, output_hidden_states=True).hidden_states
        emb = F.normalize(pool(torch.stack(hidden[-p["options"]["blocks"]:], 2), batch["attention_mask"]), dim=-1)
    torch.testing.assert_close(emb, kgc_embeddings(run)[1], atol=1e-5, rtol=0)


def test_router_exports_its_towers_and_says_its_queries_need_kgc(tmp_path_factory, tiny_bert, tmp_path):
    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer

    from kgc.export import export_run

    run = train_run(tmp_path_factory, tiny_bert, conditioner="router", scorer="heavy", shared_towers=True)
    meta = export_run(run, tmp_path / "st")
    cond = meta["conditioner"]
    assert meta["towers"] == {"tail": ".", "query": ".", "shared": True}
    assert cond["reproducible_outside_kgc"] is False and "Use kgc for queries" in cond["query"]
    assert cond["options"]["router_layers"] == 1  # the effective value, not the recipe's unset default
    assert sorted(load_file(str(tmp_path / "st" / "conditioner.safetensors"))) == [
        "w_k.bias", "w_k.weight", "w_q.bias", "w_q.weight"]  # the heavy scorer's own projections, no encoder
    tail = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    assert getattr(tail[0].auto_model, "pooler", None) is None  # loaded as kgc built it: no BERT pooler
    texts = [r["text"] for r in read_tsv(tmp_path / "st" / "entities.tsv")]
    torch.testing.assert_close(tail.encode(texts, convert_to_tensor=True), kgc_embeddings(run)[1], atol=1e-5,
                               rtol=0)


def test_kgc_json_describes_the_conditioner_in_its_own_words():
    """export.py knows no conditioner: kgc.json's part is the name, the entry point and the conditioner's spec."""
    from kgc.linkpred.export import _conditioner_meta

    class NewConditioner:  # stands in for a conditioner kgc.export has never heard of
        name, enters_at = "new", "pooled"

        def export_spec(self):
            return {"reproducible_outside_kgc": True, "query": "normalize(h_s + h_c)", "options": {"width": 8},
                    "h_s": "query tower(head text)"}

    meta = _conditioner_meta(NewConditioner())
    assert list(meta) == ["name", "enters_at", "options", "reproducible_outside_kgc", "query", "h_s"]
    assert meta == {"name": "new", "enters_at": "pooled", "options": {"width": 8}, "reproducible_outside_kgc": True,
                    "query": "normalize(h_s + h_c)", "h_s": "query tower(head text)"}


@pytest.mark.parametrize("st_run", ["mean"], indirect=True)
def test_cli_export_force_and_clear_refusals(st_run, tmp_path):
    from typer.testing import CliRunner

    from kgc.cli import app
    from kgc.recipe import load_recipe

    cli = CliRunner()
    out = tmp_path / "out"
    res = cli.invoke(app, ["export", str(st_run), str(out)])
    assert res.exit_code == 0, res.output
    assert f"→ {out}" in res.output and "query reproducible outside kgc: True" in res.output
    assert (out / "modules.json").is_file() and (out / "query" / "modules.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind

    res = cli.invoke(app, ["export", str(st_run), str(out), "--format", "hf"])
    assert isinstance(res.exception, KGCError) and "is not empty" in str(res.exception) and "--force" in str(
        res.exception)
    res = cli.invoke(app, ["export", str(st_run), str(out), "--format", "hf", "--force"])
    assert res.exit_code == 0, res.output
    assert not (out / "modules.json").exists() and (out / "tail" / "config.json").is_file()  # replaced whole

    res = cli.invoke(app, ["export", str(st_run), str(st_run), "--force"])  # never deletes what it did not write
    assert isinstance(res.exception, KGCError) and "not an earlier export" in str(res.exception)
    assert (st_run / "best.pt").is_file()

    res = cli.invoke(app, ["export", str(st_run), str(tmp_path / "x"), "--format", "onnx"])
    assert isinstance(res.exception, KGCError) and "--format 'onnx': choose sentence-transformers or hf" in str(
        res.exception)

    csts = tmp_path / "csts_run"
    csts.mkdir()
    (csts / "recipe.yaml").write_text(load_recipe(None, ["task=csts", "data.dataset=synth-csts"]).to_yaml())
    with pytest.raises(KGCError, match="is a csts run; kgc export writes link-prediction towers"):
        from kgc.export import export_run

        export_run(csts, tmp_path / "y")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
