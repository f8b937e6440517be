"""Make tests/data/runs_at_COMMIT.json: four tiny runs trained by kgc at an earlier commit, each as
tests/test_recipe_versions.py reads it (efc2a8e: before the sub-packages, the small task protocol and results as
data; f3c8230: before the serve and tune packages, lazy references and options from their models).

    git worktree add /tmp/old COMMIT && cd /tmp/old
    PYTHONPATH=/tmp/old python /path/to/tests/data/make_saved_runs.py /tmp/old-runs tests/data/runs_at_COMMIT.json COMMIT

Per run: the recipe given, its text files as that code wrote them (recipe.yaml, train_summary.json, metrics.jsonl,
ranks.tsv, index/meta.json, structure/*), each tensor of best.pt by name (dtype, shape, sha256 of its bytes) and
its other entries, its test MRR and its top 3 answers to (e_dog, hypernym, ?). The weights themselves (8 MB a run)
are not kept: today's code trains the same bytes, which the test checks tensor by tensor."""
import json
import shutil
import sys
from pathlib import Path


def digest(path: Path) -> dict:
    """best.pt by entry: a tensor as [dtype, shape, sha256 of its bytes], a state dict as a mapping of those."""
    import hashlib

    import torch

    def one(value):
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            return [str(t.dtype), list(t.shape), hashlib.sha256(t.view(torch.uint8).numpy().tobytes()
                                                                if t.numel() else b"").hexdigest()]
        if isinstance(value, dict):
            return {str(k): one(v) for k, v in value.items()}
        return value if isinstance(value, (int, float, str, bool, type(None))) else repr(type(value))

    return one(torch.load(path, map_location="cpu", weights_only=False))


# the flags that choose torch's CPU kernels: "AMD EPYC" names Zen 3 (AVX2) and Zen 4 (AVX-512) alike, whose kernels
# round differently, so the digests are bit for bit only on the model name *and* these flags that recorded them
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
                "amx_bf16", "amx_int8")


def cpu_key() -> str:
    """This CPU as the digests depend on it: its model name and which of KERNEL_FLAGS it reports."""
    model, flags = "", set()
    for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines() if Path("/proc/cpuinfo").is_file() else []:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return " ".join([model] + [f for f in KERNEL_FLAGS if f in flags])


def text_files(run: Path) -> dict:
    keep = ["recipe.yaml", "train_summary.json", "metrics.jsonl", "ranks.tsv", "index/meta.json"]
    keep += sorted(str(p.relative_to(run)) for p in (run / "structure").glob("*") if p.suffix in (".json", ".tsv"))
    return {name: (run / name).read_text(encoding="utf-8") for name in keep if (run / name).is_file()}


def main() -> None:
    out, record_file = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    import kgc
    from kgc.recipe import load_recipe
    from kgc.training.loop import train
    from tests.conftest import save_tiny_bert, write_toy
    from transformers import AutoTokenizer
    from kgc.encoding.backbone import resolve_backbone

    work = out.parent / (out.name + "-work"); shutil.rmtree(work, ignore_errors=True); work.mkdir(parents=True)
    tok = AutoTokenizer.from_pretrained(str(resolve_backbone("sentence-transformers/all-MiniLM-L6-v2")))
    bert = save_tiny_bert(work / "bert", tok, 2)
    toy = write_toy(work / "TOY")
    COMMON = ["data.neighbor_text=false", "data.max_tokens=16", "train.batch_size=4", "train.epochs=2",
              "train.warmup_steps=1", "train.lr=1e-3", "eval.validate_every_epoch=false", "train.num_threads=1",
              "train.check_memory=false", "train.keep=best"]
    CASES = {"biencoder": ["model.conditioner=biencoder"],
             "router": ["model.conditioner=router", "model.router_layers=1"],
             "hadamard_shared": ["model.conditioner=hadamard", "model.shared_towers=true", "model.tail_map_rank=2"],
             "hypernet_rules": ["model.conditioner=hypernet", "structure.model=rules"]}
    shutil.rmtree(out, ignore_errors=True); out.mkdir(parents=True)
    commit = sys.argv[3] if len(sys.argv) > 3 else "efc2a8e"
    record = {"commit": commit, "common": COMMON, "cases": {}, "cpu": cpu_key()}  # bit for bit: this CPU's kernels
    for case, sets in CASES.items():
        run = out / case
        recipe = load_recipe(None, [f"data.path={toy}", f"model.backbone={bert}"] + COMMON + sets + [f"name={case}"])
        train(recipe, out=run, progress=False, echo=lambda m: None)
        loaded = kgc.load(run, echo=None)
        results = loaded.evaluate("test")
        answers = loaded.predict("e_dog", "hypernym", top_k=3)
        record["cases"][case] = {"sets": sets, "mrr": results["both"]["realistic"]["inverse_harmonic_mean_rank"],
                                 "answers": [[e, float(s)] for e, s in zip(answers["entity"], answers["score"])],
                                 "best": digest(run / "best.pt"), "files": text_files(run),
                                 "paths": {"data": str(toy), "backbone": str(bert)}}
    record_file.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
