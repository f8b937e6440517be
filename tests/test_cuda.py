"""What runs on a CUDA GPU: the exact index, pinned non-blocking batch copies, a bf16-autocast training run with an
fp32 loss, and the same evaluation on the GPU as on the CPU. Marked ``cuda`` and skipped without a GPU: the GPU job
(gpu/job.py, smoke phase) runs them there; on the CPU their subjects are covered by the other tests."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_exact_index_on_the_gpu_answers_as_on_the_cpu():
    from kgc.linkpred.index.types import ExactIndex, to_device

    rng = np.random.default_rng(0)
    base = rng.standard_normal((5000, 64)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[:40] + 0.1 * rng.standard_normal((40, 64)).astype(np.float32)
    cpu = ExactIndex(base)
    gpu, where = to_device(ExactIndex(base), "flat", "auto")
    assert where == "gpu" and gpu.device.type == "cuda"
    (s1, i1), (s2, i2) = cpu.search(queries, 20), gpu.search(queries, 20)
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_allclose(s1, s2, atol=1e-4)


def test_batches_reach_the_gpu_whole():
    from kgc.encoding.backbone import to_device

    batch = {"input_ids": torch.randint(0, 30000, (512, 50)), "attention_mask": torch.ones(512, 50, dtype=torch.long)}
    moved = to_device(batch, torch.device("cuda"))
    torch.cuda.synchronize()
    assert all(v.device.type == "cuda" and torch.equal(v.cpu(), batch[k]) for k, v in moved.items())


def test_bf16_training_then_the_same_evaluation_on_gpu_and_cpu(tiny_bert, tmp_path, data_home):
    import kgc
    from tests.conftest import write_toy
    from tests.test_cli_smoke import toy_recipe

    recipe = toy_recipe(tmp_path / "r.yaml", tiny_bert, write_toy(tmp_path / "TOY"), {"conditioner": "biencoder"},
                        epochs=4, max_steps=4, device="cuda", amp="bf16")
    run = kgc.train(recipe, tmp_path / "run", progress=False, echo=None)
    summary = json.loads((run.path / "train_summary.json").read_text())
    assert summary["device"].startswith("cuda") and summary["peak_gpu_bytes"] > 0
    losses = [r["loss"] for r in map(json.loads, (run.path / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    on_gpu = kgc.load(run.path, device="cuda", echo=None).evaluate("test", progress=False)
    on_cpu = kgc.load(run.path, device="cpu", echo=None).evaluate("test", progress=False)
    a, b = (r["both"]["realistic"]["inverse_harmonic_mean_rank"] for r in (on_gpu, on_cpu))
    assert a == pytest.approx(b, abs=1e-3)
    answers = kgc.load(run.path, device="cuda", echo=None).predict("e_dog", "hypernym", top_k=3)
    assert len(answers) == 3


def test_a_training_step_never_waits_for_the_gpu(tiny_bert, data_home):
    """Issue 50: steps on prepared inputs (as the prefetch thread builds them) under
    ``torch.cuda.set_sync_debug_mode("error")``: a synchronising call in the forward, the loss, backward, clipping or
    fused AdamW raises. Two warm-up steps first (the caching allocator, cuBLAS handles)."""
    from kgc.linkpred.task import LinkPredTraining
    from kgc.recipe import load_recipe
    from kgc.training.common import make_optimizer
    from tests.conftest import ROOT

    recipe = load_recipe(ROOT / "recipes" / "umls_biencoder.yaml",
                         [f"model.backbone={tiny_bert}", "train.batch_size=256", "encoder.trainable_layers=all"])
    task = LinkPredTraining(recipe)
    model, _ = task.build_model(tiny_bert)
    device = torch.device("cuda")
    criterion = task.make_loss(device)
    model.to(device)
    criterion.to(device)
    model.train()
    optimizer = make_optimizer([model, criterion], 1e-3, 1e-4, fused=True)
    params = [p for p in list(model.parameters()) + list(criterion.parameters()) if p.requires_grad]
    batches = [task.prepare(model, criterion, b) for b in task.epoch_batches(0)[:5]]
    try:
        for i, batch in enumerate(batches):
            if i == 2:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            task.before_step(model, criterion, i)
            loss = task.batch_loss(model, criterion, batch)  # bf16 autocast inside (train.amp auto)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 10.0)
            optimizer.step()
            criterion.after_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert math.isfinite(float(loss))
