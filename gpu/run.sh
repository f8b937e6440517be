#!/usr/bin/env bash
# The whole GPU job, as it runs on the lent machine: from the repository root, with the bundle that
# `make gpu-bundle` packed at gpu/bundle (carried with the command) and $OUT the folder whose files come back:
#
#     bash gpu/run.sh [--minutes 9] [--phases environment,smoke,profile,pace,wn18rr_protocol]
#
# It installs the bundle's wheels into a temporary site folder (kgc runs on the machine's own torch and
# transformers), unpacks the datasets and the model there, then runs gpu/job.py: phases with their own budgets and
# logs, each writing its results to $OUT as soon as it ends (summary.md, metrics.jsonl, one log per phase).
# `make gpu-rehearse` runs this same script on a CPU, in an environment of the GPU image's packages.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUNDLE=${KGC_GPU_BUNDLE:-$ROOT/gpu/bundle}
PY=${KGC_GPU_PYTHON:-python3}
: "${OUT:?set OUT to the folder whose files come back}"
mkdir -p "$OUT"
if [ ! -f "$BUNDLE/manifest.json" ]; then
    echo "gpu/run.sh: no bundle at $BUNDLE: run \`make gpu-bundle\` and carry gpu/bundle with the command" >&2
    exit 3
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kgc-gpu.XXXXXX")
start=$(date +%s)
# --find-links: the bundle's wheels (CPython 3.12); the rehearsal adds its own interpreter's (KGC_GPU_WHEELS)
links=(--find-links "$BUNDLE/wheels")
[ -n "${KGC_GPU_WHEELS:-}" ] && links+=(--find-links "$KGC_GPU_WHEELS")
if ! "$PY" -m pip install --quiet --no-index --no-deps --no-compile --disable-pip-version-check \
        "${links[@]}" --target "$WORK/site" -r "$ROOT/gpu/requirements.txt" >"$WORK/install.log" 2>&1; then
    echo "gpu/run.sh: installing the bundle's wheels failed:" >&2
    tail -20 "$WORK/install.log" >&2
    cp "$WORK/install.log" "$OUT/environment.log"
    exit 3
fi
# byte-compile the wheels and kgc once, on every core (pip's --no-compile above: sequential compiling is slower),
# so no command of the job compiles .py files at its start
"$PY" -m compileall -q -j 0 "$WORK/site" "$ROOT/kgc" >>"$WORK/install.log" 2>&1 || true
export PYTHONPATH="$WORK/site:$ROOT" PYTHONNOUSERSITE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
    HF_HOME="$WORK/hf" KGC_DATA_HOME="$WORK/data" KGC_CACHE_HOME="$WORK/cache" TOKENIZERS_PARALLELISM=false
exec "$PY" "$ROOT/gpu/job.py" --bundle "$BUNDLE" --work "$WORK" --out "$OUT" \
    --started "$start" --install-log "$WORK/install.log" "$@"
