#!/usr/bin/env bash
# Trains tandem's embedded demo models on the GPU machine (models/README.md): tokenizer, target, drafter
# (tools/train/*.py), packs models/demo into parts of at most 15 MiB ($OUT/demo.tgz.part-aa, -ab, ...), then
# runs the clean-mode acceptance check. Log: $OUT/train_log.txt; metrics of every stage: $OUT/metrics.json.
# Usage, from the repository root with .cache/train carried (made by tools/train/prepare_data.sh):
#   bash tools/train/run_on_device.sh "$OUT"
# Knobs (environment): TARGET_SECONDS (150), DRAFTER_SECONDS (120), GEN_SECONDS (30); SMOKE=1: tiny budgets
# to check the pipeline in ~2 min (own stage folder, parts named smoke-demo.tgz.part-*, not for models/);
# FRESH=1: redo stages that an earlier call on the same (still warm) machine finished.
set -uo pipefail

OUT=${1:?usage: bash tools/train/run_on_device.sh OUT_DIR}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
DATA=$ROOT/.cache/train
STAGE_DEFAULT=$ROOT/.cache/train-out
[[ -n ${SMOKE:-} ]] && STAGE_DEFAULT=$ROOT/.cache/train-smoke
STAGE=${STAGE:-$STAGE_DEFAULT}
PARTS=demo.tgz.part-
[[ -n ${SMOKE:-} ]] && PARTS=smoke-demo.tgz.part-
TRAIN=$ROOT/tools/train
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/train_log.txt

TARGET_SECONDS=${TARGET_SECONDS:-150}
DRAFTER_SECONDS=${DRAFTER_SECONDS:-120}
GEN_SECONDS=${GEN_SECONDS:-30}
TARGET_EXTRA=()
DRAFTER_EXTRA=()
EVAL_EXTRA=()
if [[ -n ${SMOKE:-} ]]; then
  TARGET_SECONDS=15; DRAFTER_SECONDS=15; GEN_SECONDS=3
  TARGET_EXTRA=(--eval-every 50)
  DRAFTER_EXTRA=(--gen-seqs 256 --eval-every 50)
  EVAL_EXTRA=(--new 24 --long-prompts 1)
fi
STAGES=(tokenizer target drafter)

# Runs stage $1 unless an earlier call on this machine finished it; a stage that runs invalidates the later ones.
run_stage() {
  local name=$1; shift
  local marker=$STAGE/done.$name
  if [[ -f $marker ]]; then
    echo "=== stage $name: already done in an earlier call (FRESH=1 to redo)"
    return 0
  fi
  local later=0 s
  for s in "${STAGES[@]}"; do
    [[ $later == 1 ]] && rm -f "$STAGE/done.$s"
    [[ $s == "$name" ]] && later=1
  done
  echo "=== stage $name: $*"
  local t0=$SECONDS
  "$@" || { echo "=== stage $name FAILED after $((SECONDS - t0)) s"; return 1; }
  touch "$marker"
  echo "=== stage $name done in $((SECONDS - t0)) s"
}

pack() {
  local demo=$STAGE/models/demo
  rm -f "$OUT/$PARTS"*
  if [[ ! -d $demo ]]; then
    echo "=== pack: nothing to pack"
    return 1
  fi
  (cd "$demo" && find . -type f ! -name SHA256SUMS | LC_ALL=C sort | xargs sha256sum > "$STAGE/SHA256SUMS.tmp") &&
    mv "$STAGE/SHA256SUMS.tmp" "$demo/SHA256SUMS"
  echo "=== models/demo:"
  (cd "$STAGE" && find models/demo -type f | LC_ALL=C sort | xargs ls -l | awk '{printf "  %12d  %s\n", $5, $9}')
  local total
  total=$(find "$demo" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
  echo "  total $total bytes (budget 60000000)"
  [[ $total -le 60000000 ]] || echo "WARNING: models/demo is over the 60 MB budget"
  tar -C "$STAGE" -cf - models/demo | gzip -6 | split -b 15M - "$OUT/$PARTS" || return 1
  echo "=== packed:"
  ls -l "$OUT/$PARTS"* | awk '{printf "  %10d  %s\n", $5, $9}'
}

main() {
  local t_start=$SECONDS rc=0
  cd "$ROOT" || return 1
  echo "=== tandem demo-model training, $(date -u +%Y-%m-%dT%H:%M:%SZ), repo $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi -L || true
  "$PY" -c 'import sys, torch, transformers, tokenizers, safetensors; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)' || return 1
  for f in kjv.txt heldout.txt; do
    [[ -s $DATA/$f ]] || { echo "missing $DATA/$f: run tools/train/prepare_data.sh here and carry .cache/train"; return 1; }
  done
  "$PY" -m py_compile "$TRAIN"/*.py || return 1
  if [[ -n ${FRESH:-} ]]; then rm -rf "$STAGE"; fi
  mkdir -p "$STAGE/metrics"

  run_stage tokenizer "$PY" "$TRAIN/train_tokenizer.py" --data "$DATA" --out "$STAGE/tokenizer" &&
    run_stage target "$PY" "$TRAIN/train_target.py" --data "$DATA" --tokenizer "$STAGE/tokenizer" --out "$STAGE" \
      --seconds "$TARGET_SECONDS" --metrics "$STAGE/metrics/target.json" "${TARGET_EXTRA[@]}" &&
    run_stage drafter "$PY" "$TRAIN/train_drafter.py" --data "$DATA" --out "$STAGE" --seconds "$DRAFTER_SECONDS" \
      --gen-seconds "$GEN_SECONDS" --metrics "$STAGE/metrics/drafter.json" "${DRAFTER_EXTRA[@]}" || rc=1

  pack || rc=1

  if [[ $rc == 0 ]]; then
    echo "=== stage eval: clean-mode acceptance check (K=3)"
    "$PY" "$TRAIN/eval_acceptance.py" --models "$STAGE/models/demo" --data "$DATA" \
      --json "$STAGE/metrics/eval.json" "${EVAL_EXTRA[@]}" || { echo "=== eval FAILED"; rc=1; }
  fi

  "$PY" - "$STAGE/metrics" "$OUT/metrics.json" <<'EOF' || true
import json, os, sys
src, dst = sys.argv[1], sys.argv[2]
merged = {}
for name in sorted(os.listdir(src)):
    if name.endswith(".json"):
        with open(os.path.join(src, name)) as f:
            merged[name[:-5]] = json.load(f)
with open(dst, "w") as f:
    json.dump(merged, f, indent=1)
print("=== metrics of", sorted(merged), "->", dst)
EOF
  echo "=== finished in $((SECONDS - t_start)) s with status $rc"
  return $rc
}

main 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
