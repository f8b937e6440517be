"""Rehearse the GPU job on this CPU machine (``make gpu-rehearse``): gpu/run.sh exactly as the device tool runs it,
minus CUDA.

    python gpu/rehearse.py [--bundle gpu/bundle] [--minutes 10] [job options, e.g. --phases environment,smoke]

* **The machine's Python**: a fresh virtual environment that sees only the packages of the GPU image
  (gpu/image-packages.txt: torch, transformers, numpy, … — linked from this checkout's .venv, so the versions are
  this machine's, not the image's) and none of the rest (no pydantic, pykeen, faiss, fastapi, uvicorn, kgc).
  Whatever kgc needs beyond them must come from the bundle's wheels, as there. Those are CPython 3.12 wheels;
  this interpreter's own builds of the same pinned versions are downloaded beside them (gpu/.rehearse/wheels)
  and offered to pip as a second --find-links, the one departure from the real run.
* **The tree**: the working tree as the device tool copies it (tracked files and untracked ones git does not
  ignore) plus the bundle, into a clean temporary folder; ``$OUT`` an empty folder in it.
* **The model**: a 4-layer, 32-wide BERT with random weights and MiniLM's tokenizer (``--backbone`` for every run),
  so the phases take seconds; the budgets are the job's own, scaled by ``--minutes``.
* **The clock**: the job runs with ``--rehearsal``: each phase is bounded by its steps, not by the wall clock (no
  phase skipped or killed for want of time; a hang is still ended), so a slower or busier CPU than the one the
  budgets were set on rehearses the same code instead of failing.

Then it checks what the device tool would bring back (at most 8 files of at most 16 MiB, named plainly) and prints
the summary. Exit status: the job's, or 1 when its output would not come back whole.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REHEARSE = ROOT / "gpu" / ".rehearse"
MAX_FILES, MAX_FILE_BYTES = 8, 16 * 2 ** 20
NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip().lower())


def image_python(dest: Path) -> Path:
    """A virtual environment whose site folder links only the GPU image's packages from this interpreter's."""
    import importlib.metadata as md
    import sysconfig

    from packaging.requirements import Requirement

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    installed = {norm(d.metadata["Name"]): d for d in md.distributions(path=[str(site)])}
    carried = {norm(Requirement(line).name) for line in bundle_requirements()}
    # the image's packages, with what this machine's versions of them require (huggingface_hub here needs httpx2,
    # the image's older one does not): never a package the bundle carries, which must come from its wheels
    allowed = {norm(line) for line in (ROOT / "gpu" / "image-packages.txt").read_text().splitlines() if line.strip()}
    todo = [n for n in allowed if n in installed]
    while todo:
        for spec in installed[todo.pop()].requires or []:
            req = Requirement(spec)
            name = norm(req.name)
            if (req.marker is None or req.marker.evaluate({"extra": ""})) and name in installed \
                    and name not in allowed and name not in carried:
                allowed.add(name)
                todo.append(name)
    allowed -= carried
    shutil.rmtree(dest, ignore_errors=True)
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(dest)],
                   check=True)
    linked = dest / "image-site"
    linked.mkdir()
    for name, dist in installed.items():
        if name not in allowed:
            continue
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source = site / top
            if not top.startswith("..") and source.exists() and not os.path.lexists(linked / top):
                os.symlink(source, linked / top)
    venv_site = next((dest / "lib").glob("python3*/site-packages"))
    (venv_site / "image-site.pth").write_text(f"import site; site.addsitedir({str(linked)!r})\n")
    return dest / "bin" / "python"


def bundle_requirements() -> list[str]:
    lines = (ROOT / "gpu" / "requirements.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def local_wheels(dest: Path) -> Path:
    """The pinned requirements as wheels for this interpreter (its own ABI), for pip beside the bundle's."""
    dest.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                           "-d", str(dest), "-r", str(ROOT / "gpu" / "requirements.txt")], capture_output=True,
                          text=True)  # pip's index warnings: noise
    if done.returncode:
        raise SystemExit(f"gpu/rehearse.py: pip download failed:\n{done.stderr[-3000:]}")
    return dest


def tiny_bert(dest: Path, tokenizer_folder: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder))
    torch.manual_seed(0)
    # 4 layers: the router recipes put their router in the top 2, and need a layer below it
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertModel(config, add_pooling_layer=False).save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def copy_tree(dest: Path, bundle: Path) -> None:
    """The working tree as the device tool carries it, and the bundle at gpu/bundle."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        source = ROOT / rel
        if source.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)
    shutil.copytree(bundle, dest / "gpu" / "bundle")


def check_output(out: Path) -> list[str]:
    """What the device tool would refuse to bring back: too many files, too large, odd names, too deep."""
    files = [f for f in out.rglob("*") if f.is_file()]
    problems = [f"{len(files)} files (at most {MAX_FILES} come back)"] if len(files) > MAX_FILES else []
    for f in files:
        rel = f.relative_to(out)
        if f.stat().st_size > MAX_FILE_BYTES:
            problems.append(f"{rel}: {f.stat().st_size} bytes (at most {MAX_FILE_BYTES})")
        if len(rel.parts) > 3 or not all(NAME.match(p) for p in rel.parts):
            problems.append(f"{rel}: too deep or a name the device tool does not bring back")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=ROOT / "gpu" / "bundle")
    parser.add_argument("--keep", type=Path, help="copy $OUT here afterwards")
    args, job_args = parser.parse_known_args(argv)
    bundle = args.bundle.resolve()
    if not (bundle / "manifest.json").is_file():
        print(f"gpu/rehearse.py: no bundle at {bundle}: run `make gpu-bundle` first", file=sys.stderr)
        return 2
    python = image_python(REHEARSE / "venv")
    wheels = local_wheels(REHEARSE / "wheels")
    with tempfile.TemporaryDirectory(prefix="kgc-rehearse-") as tmp:
        tmp = Path(tmp)
        tree, out = tmp / "tree", tmp / "out"
        tree.mkdir()
        out.mkdir()
        copy_tree(tree, bundle)
        backbone = tiny_bert(tmp / "tiny_bert", bundle / "minilm")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KGC_", "VIRTUAL_ENV", "PYTHON"))}
        env.update(OUT=str(out), KGC_GPU_PYTHON=str(python), KGC_GPU_WHEELS=str(wheels),
                   PATH=f"{python.parent}:{env.get('PATH', '')}", TMPDIR=str(tmp))
        has_minutes = any(a.startswith("--minutes") for a in job_args)
        # --rehearsal: each phase bounded by its steps, not the clock, so a slow or busy CPU rehearses the same code
        cmd = ["bash", "gpu/run.sh", "--rehearsal", "--backbone", str(backbone),
               *([] if has_minutes else ["--minutes", "10"]), *job_args]
        print(f"rehearsal: {' '.join(cmd)}  (in {tree}, OUT={out})", flush=True)
        code = subprocess.run(cmd, cwd=tree, env=env).returncode
        problems = check_output(out)
        for p in problems:
            print(f"rehearsal: would not come back whole: {p}", file=sys.stderr)
        if args.keep:
            shutil.rmtree(args.keep, ignore_errors=True)
            shutil.copytree(out, args.keep)
        return code or (1 if problems else 0)


if __name__ == "__main__":
    sys.exit(main())
