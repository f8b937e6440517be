"""model.tail_map_rank: a low-rank residual map after the tail tower, the tail side's one learner when the tail tower
is frozen (loss.table_tails): the identity at the start, mapped with gradients inside the loss, and the same map
wherever entity vectors come from (validation, evaluation, kgc index, added entities)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kgc.errors import KGCError
from kgc.linkpred.loss import SimKGCLoss
from kgc.linkpred.model import TailMap
from tests.test_end_to_end import assert_resume_reproduces, write_recipe


def test_tail_map_by_hand():
    torch.manual_seed(0)
    m = TailMap(6, 2)
    t = F.normalize(torch.randn(5, 6), dim=-1)
    assert torch.allclose(m(t), t, atol=1e-6)  # U = 0: the identity
    with torch.no_grad():
        m.u.normal_()
    want = F.normalize(t @ (torch.eye(6) + m.u @ m.v.t()).t(), dim=-1)
    assert torch.allclose(m(t), want, atol=1e-6)
    assert torch.allclose(m.matrix(), torch.eye(6) + m.u.detach() @ m.v.detach().t())


def test_the_loss_maps_its_table_with_gradients():
    """With table_map the loss equals the loss over the table mapped beforehand, and its gradient reaches U."""
    torch.manual_seed(1)
    e, d, b = 12, 8, 4
    table = F.normalize(torch.randn(e, d), dim=-1).double()
    query = F.normalize(torch.randn(b, d), dim=-1).double()
    ids = dict(heads=torch.tensor([0, 1, 2, 3]), rels=torch.tensor([0, 1, 0, 1]), tails=torch.tensor([4, 5, 6, 7]),
               train_keys=torch.tensor([], dtype=torch.long), num_entities=e, num_relations2=2)
    m = TailMap(d, 3).double()
    with torch.no_grad():
        m.u.normal_(std=0.3)
    mapped = SimKGCLoss(table_negatives=10, table_tails=True).double()
    mapped.set_table(table)
    mapped.set_table_map(m)
    assert not list(mapped.parameters())[1:] and set(mapped.state_dict()) == {"log_inv_t"}
    plain = SimKGCLoss(table_negatives=10, table_tails=True).double()
    plain.set_table(m(table).detach())
    got = mapped(query, None, None, **ids)
    assert torch.allclose(got, plain(query, None, None, **ids), atol=1e-10)
    got.backward()
    assert m.u.grad is not None and m.u.grad.abs().sum() > 0 and m.v.grad.abs().sum() > 0
    assert torch.equal(mapped.table, table)  # the stored table stays the tail tower's own


def test_tail_map_learns_beside_a_frozen_tail_tower(tiny_bert, tmp_path, data_home, monkeypatch):
    from kgc.linkpred.answer.run import LinkPredRun
    from kgc.linkpred.task import LinkPredTraining
    from kgc.recipe import load_recipe
    from kgc.training.loop import train

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    sets = ["loss.table_negatives=2", "loss.table_tails=true", "model.tail_map_rank=4", "train.lr=0.01"]
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", tiny_bert, max_steps=4), sets)
    task = LinkPredTraining(recipe)
    model, _ = task.build_model(tiny_bert)
    model.attach_layer_cache(recipe)
    model.eval()
    raw = model.entity_table(64, mapped=False)
    assert torch.allclose(model.entity_table(64), raw, atol=1e-6)  # the identity before training
    run = train(recipe, out=tmp_path / "run", progress=False, echo=lambda *_: None)
    loaded = LinkPredRun(run, device="cpu", echo=None)
    trained = loaded.predictor.model()
    assert trained.tail_map is not None and trained.tail_map.u.abs().sum() > 0  # it learned, and was saved
    torch.testing.assert_close(trained.tail_encoder.state_dict(), model.tail_encoder.state_dict(), rtol=0, atol=0)
    # every path to entity vectors maps: the whole table, single entities, validation's table
    table = trained.entity_table(64)
    with torch.no_grad():
        want = trained.tail_map(raw)
        single = trained.encode_entities([0, 5, 9]).float()
    torch.testing.assert_close(table, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(single, table[[0, 5, 9]], rtol=1e-4, atol=1e-4)
    task.fixed_table = raw
    ev_val = task.validate(trained)[0]["dev_mrr"]
    from kgc.linkpred.evaluation.scoring import evaluate

    ev = evaluate(trained, task.graph, "dev", batch_size=64, max_triples=recipe.eval.dev_queries,
                  seed=recipe.train.seed)
    assert ev_val == pytest.approx(ev.metric(), abs=1e-6)
    # the whole evaluation, and kgc export refusing what it cannot write
    results = loaded.evaluate(progress=False)
    assert 0 < results["both"]["realistic"]["inverse_harmonic_mean_rank"] <= 1
    from kgc.export import export_run

    with pytest.raises(KGCError, match="tail map"):
        export_run(loaded, tmp_path / "export")
    assert np.isfinite(results["both"]["realistic"]["arithmetic_mean_rank"])


def test_a_tail_map_run_resumes_bit_identical(tiny_bert, tmp_path, data_home, monkeypatch):
    from kgc.recipe import load_recipe

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", tiny_bert, max_steps=4, checkpoint_every=1),
                         ["loss.table_negatives=2", "loss.table_tails=true", "model.tail_map_rank=4",
                          "eval.validate_every_steps=null"])
    assert_resume_reproduces(recipe, tmp_path, monkeypatch, at_step=2, steps=4)
    last = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=False)
    assert "tail_map.u" in last["model"] and set(last["loss"]) == {"log_inv_t"}


def test_embedded_and_added_entities_go_through_the_map(tiny_bert, tmp_path, data_home, monkeypatch):
    import kgc
    from kgc.recipe import load_recipe
    from kgc.training.loop import train

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", tiny_bert, max_steps=3),
                         ["loss.table_negatives=2", "loss.table_tails=true", "model.tail_map_rank=4", "train.lr=0.01",
                          "eval.validate_every_steps=null"])
    run = kgc.load(train(recipe, out=tmp_path / "run", progress=False, echo=lambda *_: None), echo=None)
    model = run.predictor.model()
    assert model.tail_map.u.abs().sum() > 0
    table = model.entity_table(64)
    got = run.embed_entities([model.bank.graph.entities[3], model.bank.graph.entities[7]])
    np.testing.assert_allclose(got, table[[3, 7]].numpy(), atol=1e-4)
    text = "a tiny infectious agent"
    (tmp_path / "new.tsv").write_text(f"new_agent\t{text}\n")
    run.index(progress=False)
    run.add_entities(tmp_path / "new.tsv", progress=False)
    vec = run.embed_entities([text])
    index_rows = run.entities.table()  # the index's table: the graph's entities, then the added one
    assert index_rows.shape[0] == model.bank.graph.num_entities + 1
    np.testing.assert_allclose(index_rows[-1].numpy(), vec[0], atol=1e-4)
    np.testing.assert_allclose(index_rows[3].numpy(), table[3].numpy(), atol=1e-4)
    with torch.no_grad():
        raw = model.tail_encoder.encode_unique({k: v for k, v in model.bank.special.pad(
            [model.bank.special.wrap(run.predictor.tokenizer()([text], add_special_tokens=False)["input_ids"][0],
                                     model.bank.max_tokens)]).items()})
        want = model.tail_map(raw).numpy()
    np.testing.assert_allclose(vec, want, atol=1e-5)
