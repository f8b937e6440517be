"""train.amp on a CPU (kgc.encoding.precision): the choice (fp32 where the CPU has no bf16 hardware, the detection
mocked; bf16 where a probe of the run's own step finds it faster; the probe cached and leaving no trace), recorded
in the run, its index and its results; bf16 gives fp32's loss within bf16's tolerance and the same ranking on a
trained tiny run; a run trained in bf16 loads, evaluates and serves on a CPU without bf16; `amp: off` in YAML is
"off". The suite runs with KGC_AMP=off (tests/conftest.py): these tests clear it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import kgc
from kgc.encoding import precision as prec
from tests.conftest import cli
from tests.test_api import tiny_linkpred

NO_BF16 = {"model": "a CPU without bf16", "flags": frozenset({"avx2", "avx512f"})}
BF16 = {"model": "a CPU with AMX", "flags": frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})}


@pytest.fixture(autouse=True)
def _own_choice(tmp_path, monkeypatch):
    monkeypatch.delenv("KGC_AMP", raising=False)
    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))


def cpu(monkeypatch, info: dict) -> None:
    monkeypatch.setattr(prec, "cpu_info", lambda: info)


def timings(monkeypatch, fp32: float, bf16: float) -> list:
    """The probe's timings fixed (its calls counted): the choice without depending on this machine's speed."""
    calls = []

    def fake(run, rounds=prec.PROBE_ROUNDS):
        calls.append(run)
        return {"fp32": fp32, "bf16": bf16}

    monkeypatch.setattr(prec, "time_both", fake)
    return calls


def test_the_choice_follows_the_rule(monkeypatch):
    cpu_dev, cuda = torch.device("cpu"), torch.device("cuda")
    cpu(monkeypatch, NO_BF16)
    never = lambda name: pytest.fail("no probe on a CPU without bf16")  # noqa: E731
    c = prec.choose("auto", cpu_dev, shape={"s": 1}, probe=never)
    assert c.name == "fp32" and "no bf16 hardware" in c.reason and c.warning is None
    c = prec.choose("bf16", cpu_dev)
    assert c.name == "bf16" and "emulated" in c.warning  # obeyed, with a warning
    assert prec.choose("off", cpu_dev).name == "fp32"
    assert prec.choose("fp16", cpu_dev).name == "fp32" and "use train.amp=bf16" in prec.choose("fp16", cpu_dev).warning
    assert prec.choose("auto", cuda).name == "bf16" and prec.choose("fp16", cuda).name == "fp16"
    assert prec.choose("off", cuda).name == "fp32"

    cpu(monkeypatch, BF16)
    calls = timings(monkeypatch, 1.0, 0.5)
    c = prec.choose("auto", cpu_dev, shape={"s": 1}, probe=lambda name: None)
    assert c.name == "bf16" and c.probe["speedup"] == 2.0 and "amx_bf16" in c.reason and len(calls) == 1
    again = prec.choose("auto", cpu_dev, shape={"s": 1}, probe=lambda name: None)
    assert again.name == "bf16" and "cached" in again.reason and len(calls) == 1 and again.seconds == 0
    calls = timings(monkeypatch, 1.0, 0.95)  # faster, but by less than FASTER asks: fp32
    c = prec.choose("auto", cpu_dev, shape={"s": 2}, probe=lambda name: None)
    assert c.name == "fp32" and len(calls) == 1
    calls = timings(monkeypatch, 1.0, 2.0)  # asked for bf16 where the probe found it slower: obeyed, warned
    c = prec.choose("bf16", cpu_dev, shape={"s": 3}, probe=lambda name: None)
    assert c.name == "bf16" and "slower" in c.warning
    cached = json.loads((prec.cache_home() / prec.PROBE_FILE).read_text())
    assert len(cached) == 3 and all({"fp32", "bf16", "shape"} <= set(v) for v in cached.values())


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: {family}
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu avx2 avx512f avx512_bf16

processor\t: 1
cpu family\t: 99
model name\t: another CPU
flags\t\t: fpu
"""


def test_two_cpus_of_one_name_are_told_apart_and_probed_apart(monkeypatch):
    zen5, zen4 = (prec.parse_cpuinfo(CPUINFO.format(family=f)) for f in (26, 25))
    assert zen5 == {"model": "AMD EPYC", "flags": frozenset({"fpu", "avx2", "avx512f", "avx512_bf16"}),
                    "family": "family 26 model 2"}  # the first processor's block only
    assert zen4["family"] == "family 25 model 2"
    assert prec.parse_cpuinfo("model name\t: Apple M2\nflags\t: neon\n") == \
        {"model": "Apple M2", "flags": frozenset({"neon"}), "family": None}
    cpu(monkeypatch, zen5)
    assert prec.describe_cpu() == "AMD EPYC, family 26 model 2 (avx512_bf16, avx512f, avx2)"
    key5 = prec.probe_key({"s": 1})
    cpu(monkeypatch, zen4)
    assert prec.probe_key({"s": 1}) != key5  # a probe of one generation is not taken for the other's
    cpu(monkeypatch, NO_BF16)  # a record without the numbers (as older callers build it)
    assert prec.describe_cpu() == "a CPU without bf16 (avx512f, avx2)"


def test_the_real_probe_times_both_ways_alternating():
    order = []
    out = prec.time_both(lambda name: order.append(name), rounds=3, clear=None)
    assert order == ["fp32", "bf16", "fp32", "bf16", "bf16", "fp32", "fp32", "bf16"] and set(out) == {"fp32", "bf16"}


def test_a_clear_bf16_lead_ends_the_probe_after_its_first_pair(monkeypatch):
    from types import SimpleNamespace

    clock = [0.0]
    monkeypatch.setattr(prec, "time", SimpleNamespace(perf_counter=lambda: clock[0]))  # each call costs its share

    def probe(fp32: float, bf16: float):
        order, cost = [], {"fp32": fp32, "bf16": bf16}

        def run(name):
            order.append(name)
            clock[0] += cost[name]
        return order, prec.time_both(run)

    order, out = probe(1.0, 0.4)  # bf16 2.5x: stopped after the untimed pair and one timed pair
    assert out == pytest.approx({"fp32": 1.0, "bf16": 0.4}) and order == ["fp32", "bf16", "fp32", "bf16"]
    order, out = probe(1.0, 0.5)  # exactly PROBE_CLEAR times as fast: stopped too
    assert len(order) == 4
    order, out = probe(1.0, 0.6)  # a lead, not a clear one: every round
    assert out == pytest.approx({"fp32": 1.0, "bf16": 0.6}) and len(order) == 2 + 2 * prec.PROBE_ROUNDS
    order, out = probe(0.4, 1.0)  # fp32 far ahead: every round (a verdict for fp32 is never taken from one pair)
    assert out == pytest.approx({"fp32": 0.4, "bf16": 1.0}) and len(order) == 2 + 2 * prec.PROBE_ROUNDS


def test_amp_off_in_yaml_is_off(tmp_path, tiny_bert):
    """YAML reads a bare off as false: the recipe takes the word back (a file, --set and the API alike)."""
    assert kgc.resolve_recipe(tiny_linkpred(tiny_bert), ["train.amp=off"]).train.amp == "off"
    path = tmp_path / "r.yaml"
    path.write_text(f"task: linkpred\nmodel:\n  backbone: {tiny_bert}\n  conditioner: biencoder\ntrain:\n  amp: off\n")
    assert kgc.resolve_recipe(path).train.amp == "off"
    with pytest.raises(kgc.KGCError, match="got True"):  # on is no value of amp: still refused
        kgc.resolve_recipe(tiny_linkpred(tiny_bert), ["train.amp=on"])


def test_bf16_gives_the_fp32_loss_within_its_tolerance(tiny_bert, data_home):
    from kgc.recipe import load_recipe
    from kgc.training.task import task_class
    from kgc.encoding.backbone import resolve_backbone
    from kgc.training.common import seed_everything

    recipe = kgc.resolve_recipe(tiny_linkpred(tiny_bert, batch_size=64))
    task = task_class(recipe.task).training(recipe)
    seed_everything(0)
    model, _ = task.build_model(resolve_backbone(recipe.model.backbone))
    criterion = task.make_loss(torch.device("cpu"))
    model.eval()  # no dropout: the same function both ways
    batch = task.prepare(model, criterion, task.examples[:64])
    losses = {}
    for name in ("fp32", "bf16"):
        model.set_precision(name)
        losses[name] = task.batch_loss(model, criterion, batch)
        assert losses[name].dtype == torch.float32  # the loss stays fp32
    assert losses["bf16"].item() == pytest.approx(losses["fp32"].item(), rel=2e-2)
    assert losses["bf16"].item() != losses["fp32"].item()  # bf16 really ran
    del load_recipe


def test_inference_casts_each_weight_once_with_autocasts_own_values(tiny_bert):
    """Without gradient a bf16 encoder runs on bf16 copies of its Linear weights made once (not cast again at every
    call, 39 % of a served query's time): the outputs are autocast's bit for bit, a changed weight is copied again,
    the module's own parameters are back after the call, and a step with gradient swaps nothing."""
    from kgc.encoding.backbone import TextEncoder, load_backbone

    enc = TextEncoder(load_backbone(tiny_bert)).eval()
    enc.precision, enc.weights_held = "bf16", True  # as TaskModel.hold_weights sets it in a loaded run
    ids = torch.randint(1000, 30000, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    params = {n: p for n, p in enc.named_parameters()}

    def autocast_alone():  # what in_precision ran before: autocast casting every weight at the call
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return enc._plain(ids, mask, torch.zeros_like(ids), mask).float()

    with torch.no_grad():
        first = enc(ids, mask)
        copies = enc._kgc_cast_once["copies"]
        again = enc(ids, mask)
    assert torch.equal(first, autocast_alone()) and torch.equal(again, first)
    linears = [m for m in enc.modules() if isinstance(m, torch.nn.Linear)]
    assert len(copies) == 2 * len(linears) and all(c[2].dtype == torch.bfloat16 for c in copies.values())
    assert enc._kgc_cast_once["copies"] == copies and enc._kgc_cast_once["depth"] == 0
    assert all(p is params[n] for n, p in enc.named_parameters())  # the same Parameter objects, fp32
    assert all(p.dtype == torch.float32 and isinstance(p, torch.nn.Parameter) for p in enc.parameters())

    with torch.no_grad():
        linears[0].weight.mul_(1.5)  # an update in place (an optimiser's): copied again
        changed = enc(ids, mask)
    assert not torch.equal(changed, first) and torch.equal(changed, autocast_alone())

    def fail(module, args):
        raise RuntimeError("a layer fails mid-call")
    hook = linears[1].register_forward_pre_hook(fail)
    with torch.no_grad(), pytest.raises(RuntimeError, match="mid-call"):
        enc(ids, mask)
    hook.remove()
    assert all(p is params[n] for n, p in enc.named_parameters()) and enc._kgc_cast_once["depth"] == 0  # undone

    enc.train()
    out = enc(ids, mask)  # with gradient: autocast's own casts, the weights' gradients as before
    out.sum().backward()
    assert linears[0].weight.grad is not None and linears[0].weight.grad.dtype == torch.float32
    assert enc._kgc_cast_once["depth"] == 0

    # in training nothing is held: a bf16 step's fused AdamW moves the weights without moving their version, and
    # a validation between steps must score the weights as they are (a kept copy once scored the first ones)
    trained = TextEncoder(load_backbone(tiny_bert))
    trained.precision = "bf16"
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2, fused=True)
    enc = trained
    for _ in range(2):
        trained.train()
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            trained(ids, mask).sum().backward()
        optimizer.step()
        trained.eval()
        with torch.no_grad():
            assert torch.equal(trained(ids, mask), autocast_alone())
    assert "_kgc_cast_once" not in trained.__dict__


def test_a_probe_leaves_no_trace_and_the_run_records_its_precision(tmp_path, tiny_bert, data_home, monkeypatch):
    """train.amp=auto on a CPU with bf16 hardware runs the real probe (this recipe's step, both ways): with fp32
    chosen (FASTER 0: bf16 never wins), the run is the run that train.amp=off trains, weight for weight."""
    cpu(monkeypatch, BF16)
    monkeypatch.setattr(prec, "FASTER", 0.0)
    recipe = tiny_linkpred(tiny_bert, max_steps=3, amp="auto")
    recipe["loss"] = {"pre_batch": 2}  # a queue of negatives the probe must put back
    probed = kgc.train(recipe, tmp_path / "probed", progress=False, echo=None)
    plain = kgc.train({**recipe, "train": {**recipe["train"], "amp": "off"}}, tmp_path / "plain", progress=False,
                      echo=None)
    summary = json.loads((probed.path / "train_summary.json").read_text())
    assert summary["precision"]["name"] == "fp32" and "probe: bf16" in summary["precision"]["reason"]
    assert summary["precision"]["cpu"].startswith("a CPU with AMX")
    a, b = (torch.load(r.dir.best, weights_only=False) for r in (probed, plain))
    tensors = 0

    def same(x, y, where=""):
        nonlocal tensors
        if isinstance(x, torch.Tensor):
            tensors += 1
            assert torch.equal(x, y), where
        elif isinstance(x, dict):
            assert set(x) == set(y), where
            for k in x:
                same(x[k], y[k], f"{where}.{k}")

    same(a, b)
    assert tensors > 10
    assert json.loads((plain.path / "train_summary.json").read_text())["precision"]["reason"] == "train.amp=off"


def test_a_bf16_run_ranks_as_fp32_and_answers_on_a_cpu_without_bf16(tmp_path, tiny_bert, data_home, monkeypatch):
    cpu(monkeypatch, BF16)
    timings(monkeypatch, 1.0, 0.5)  # the probe finds bf16 faster: auto trains in bf16
    run = kgc.train(tiny_linkpred(tiny_bert, max_steps=12, batch_size=64), tmp_path / "run", progress=False,
                    echo=None)
    summary = json.loads((run.path / "train_summary.json").read_text())
    assert summary["precision"]["name"] == "bf16"

    # the same ranking in bf16 and fp32: the test queries' top 10 overlap
    loaded = kgc.load(run.path, echo=None)
    model = loaded.predictor.model()
    assert model.precision == "bf16"
    test = loaded.predictor.graph().splits["test"][:200]
    vectors, tops = {}, {}
    with torch.no_grad():
        for name in ("fp32", "bf16"):
            model.set_precision(name)
            table = model.entity_table(64)
            vectors[name] = model.encode_queries(test[:, 0].tolist(), test[:, 1].tolist())
            assert vectors[name].dtype == torch.float32 and table.dtype == torch.float32
            tops[name] = (vectors[name] @ table.t()).topk(10, dim=1).indices.numpy()
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(tops["fp32"], tops["bf16"])])
    assert overlap >= 0.98, overlap
    assert not torch.equal(vectors["fp32"], vectors["bf16"])

    # then on a CPU without bf16: loads, indexes, evaluates and serves in fp32, and says so
    cpu(monkeypatch, NO_BF16)
    elsewhere = kgc.load(run.path, echo=None)
    results = elsewhere.evaluate("test", progress=False)
    assert results["kgc"]["precision"] == "fp32" and 0 < results["both"]["realistic"]["inverse_harmonic_mean_rank"] <= 1
    elsewhere.index(progress=False)
    meta = json.loads((run.path / "index" / "meta.json").read_text())
    assert meta["precision"] == "fp32"
    from fastapi.testclient import TestClient

    with TestClient(kgc.api.app(elsewhere, load_in_background=False, max_wait_ms=1, watch_seconds=0)) as client:
        info = client.get("/info").json()
        assert info["precision"]["name"] == "fp32" and "no bf16 hardware" in info["precision"]["reason"]
        head, rel = elsewhere.predictor.graph().entities[int(test[0, 0])], elsewhere.predictor.graph().relations[int(test[0, 1])]
        answer = client.post("/predict", json={"head": head, "relation": rel, "top_k": 3})
        assert answer.status_code == 200 and len(answer.json()["predictions"]) == 3


def test_a_bf16_step_updates_with_fused_adamw_and_an_fp32_step_with_the_loop(tmp_path, tiny_bert, data_home,
                                                                             monkeypatch):
    """AdamW's fused kernel is on for a CPU step in bf16 and off in fp32 (whose bits the saved runs pin), whatever
    the optimiser was made with; its update is the loop's within float rounding."""
    from kgc.training import session
    from kgc.training.common import fuse_adamw, make_optimizer

    made = []
    monkeypatch.setattr(session, "make_optimizer", lambda *a, **k: made.append(make_optimizer(*a, **k)) or made[-1])
    for amp, fused in (("bf16", True), ("off", False)):
        kgc.train(tiny_linkpred(tiny_bert, amp=amp), tmp_path / amp, progress=False, echo=None)
        assert {g["fused"] for g in made[-1].param_groups} == {fused}, amp

    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(64, 48)), torch.nn.Parameter(torch.randn(48))]
    copies = [torch.nn.Parameter(w.detach().clone()) for w in weights]
    loop_opt, fused_opt = (torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01) for ps in (weights, copies))
    fuse_adamw(fused_opt, True)
    for step in range(5):
        grads = [torch.randn_like(w) for w in weights]
        for ps, opt in ((weights, loop_opt), (copies, fused_opt)):
            for w, g in zip(ps, grads):
                w.grad = g.clone()
            opt.step()
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(weights, copies))


CONDITIONER_SETS = {"biencoder": {}, "router": {"router_layers": 1}, "hypernet": {}, "hadamard": {}, "concat": {},
                    "case": {}}


@pytest.mark.parametrize("conditioner", sorted(CONDITIONER_SETS))
def test_every_conditioner_trains_and_answers_in_bf16(conditioner, tmp_path, tiny_bert, data_home, monkeypatch):
    """bf16 on the CPU wherever a conditioner computes: two steps, then the test split evaluated and a question
    answered, all under train.amp=bf16 (the encoders' outputs come back fp32 to the conditioners' own layers)."""
    recipe = tiny_linkpred(tiny_bert, amp="bf16")
    recipe["model"] = {**recipe["model"], "conditioner": conditioner, **CONDITIONER_SETS[conditioner]}
    run = kgc.train(recipe, tmp_path / conditioner, progress=False, echo=None)
    assert json.loads((run.path / "train_summary.json").read_text())["precision"]["name"] == "bf16"
    results = kgc.load(run.path, echo=None).evaluate("test", progress=False)
    assert results["kgc"]["precision"] == "bf16"
    assert 0 < results["both"]["realistic"]["inverse_harmonic_mean_rank"] <= 1


def test_kgc_bench_precision_sets_both_side_by_side(tmp_path, tiny_bert, data_home, monkeypatch):
    """`kgc bench precision`: the limit at the model's shapes, training, entities and queries each way, the step's
    FLOPs (the same matrix products both ways), its top operators, and the MRR after equal steps in each."""
    import yaml

    cpu(monkeypatch, BF16)  # as on a CPU with bf16 hardware, whatever this one has
    recipe = tiny_linkpred(tiny_bert)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"task": "linkpred", **recipe}))
    out = tmp_path / "precision.json"
    res = cli("bench", "precision", path, "--steps", "1", "--rounds", "1", "--entities", "40", "--queries", "16",
              "--mrr-steps", "2", "--profile", "--out", out)
    assert "CPU: " in res.stdout and "bf16 / fp32: training" in res.stdout
    result = json.loads(out.read_text())
    limit = result["limit"]
    for name in ("fp32", "bf16"):
        rates = limit[name]["by_shape"].values()
        assert min(rates) <= limit[name]["gflops"] <= max(rates)  # the FLOP-weighted rate of the set
        assert result["training"][name]["triples_per_s"] > 0 and result["entities_per_s"][name] > 0
        assert result["queries_per_s"][name] > 0 and result["profile"][name]
        assert result["same_steps"][name]["precision"] == name and 0 < result["same_steps"][name]["mrr"] <= 1
    assert result["training"]["fp32"]["gflops_per_triple"] == result["training"]["bf16"]["gflops_per_triple"] > 0
    assert result["ratio"]["training"] == pytest.approx(
        result["training"]["bf16"]["triples_per_s"] / result["training"]["fp32"]["triples_per_s"], abs=0.01)
    assert result["same_steps"]["mrr_difference"] == pytest.approx(
        result["same_steps"]["bf16"]["mrr"] - result["same_steps"]["fp32"]["mrr"], abs=1e-4)


def test_kgc_bench_precision_on_a_cpu_without_bf16_times_fp32_and_says_why(tmp_path, tiny_bert, data_home,
                                                                         monkeypatch):
    """Without bf16 hardware bf16 is emulated (many times slower): the limit is measured both ways, only fp32 is
    timed beyond it, and the output says so; --emulated times bf16 too."""
    import yaml

    cpu(monkeypatch, NO_BF16)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"task": "linkpred", **tiny_linkpred(tiny_bert)}))
    common = ("bench", "precision", path, "--steps", "1", "--rounds", "1", "--entities", "40", "--queries", "16")
    out = tmp_path / "fp32.json"
    res = cli(*common, "--mrr-steps", "2", "--out", out)
    assert "bf16 hardware: none (emulated)" in res.stdout and "bf16 is emulated on this CPU" in res.stdout
    assert "only fp32 is timed" in res.stdout and "training bf16" not in res.stdout
    result = json.loads(out.read_text())
    assert result["timed"] == ["fp32"] and result["bf16_hardware"] == []
    assert set(result["training"]) == set(result["entities_per_s"]) == set(result["queries_per_s"]) == {"fp32"}
    assert result["training"]["fp32"]["triples_per_s"] > 0 and result["limit"]["bf16"]["gflops"] > 0
    assert result["same_steps"] is None  # a bf16 run of the recipe is not trained either
    assert set(result["ratio"]) == {"limit"}
    out = tmp_path / "both.json"
    cli(*common, "--emulated", "--out", out)
    result = json.loads(out.read_text())
    assert result["timed"] == ["fp32", "bf16"] and result["training"]["bf16"]["triples_per_s"] > 0
    assert set(result["ratio"]) == {"training", "entities", "queries", "limit"}
