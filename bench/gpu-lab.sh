#!/usr/bin/env bash
# The GPU lab: one device call that builds, checks and times everything on the GPU machine (H200, no network).
#   1. scripts/device/gpu-check.sh: Release build for sm_90a, every test through ctest (CPU and CUDA), cuda_bench;
#   2. the CUDA model tests' measured lines ([bf16 ...], [graphs] ...);
#   3. the demo pair on the GPU (`tandem generate --device cuda --compare`);
#   4. `tandem bench --device cuda --arch A --profile --trace` for each released architecture (random bf16 weights in GPU
#      memory; the per-op profiles stay in the logs), long-prompt prefill (GPU_LAB_PREFILL), one from a checkpoint
#      directory in the page cache, serving-sized KV caches (GPU_LAB_LONG), and A/B benches with a switch flipped
#      (GPU_LAB_AB).
# Writes logs and RESULTS-gpu.md (the bench tables, to be appended to bench/RESULTS.md) under $OUT, snapshotting
# them after each step so that a run cut short still returns what it measured. Needs .deps/ carried
# (scripts/prepare-device-deps.sh). Time budget: GPU_LAB_BUDGET_S seconds (default 560); steps that no longer fit
# are skipped and reported. GPU_LAB_ARCHS overrides the architectures benched.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
budget=${GPU_LAB_BUDGET_S:-560}
out=${OUT:?set OUT to the folder for logs}
work=$(mktemp -d)
mkdir -p "$work/logs"
left() { echo $((budget - (SECONDS - start))); }
snap() { tar czf "$out/logs.tgz" -C "$work" logs; }
summary=()

run_step() {  # name, seconds wanted, log, command...
  local name=$1 want=$2 log=$3
  shift 3
  local t
  t=$(left)
  if [ "$t" -lt "$want" ]; then
    summary+=("$name: SKIPPED (${t}s left, wants ${want}s)")
    return 1
  fi
  local s0=$SECONDS
  timeout "$t" "$@" >"$work/logs/$log" 2>&1
  local rc=$?
  summary+=("$name: rc $rc ($((SECONDS - s0))s)")
  snap
  return $rc
}

OUT=$work/logs/gpu GPU_CHECK_BUDGET_S=${GPU_CHECK_BUDGET_S:-200} run_step gpu-check 60 gpu-check.txt \
  bash scripts/device/gpu-check.sh
B=build-gpu
if [ -x $B/tests/cuda/cuda_model_test ]; then
  run_step cuda_model_test 20 cuda_model_test.txt $B/tests/cuda/cuda_model_test
fi
run_step demo 20 demo_cuda.txt $B/tandem generate --device cuda --model models/demo/target \
  --draft models/demo/assistant --prompt "And God said unto Moses," --max-tokens 200 --draft-tokens 3 --compare \
  --repeat 5 --ignore-eos
for arch in ${GPU_LAB_ARCHS:-gemma4-e2b gemma4-e4b gemma4-26b-a4b gemma4-31b}; do
  run_step "bench $arch" 60 "bench_$arch.txt" $B/tandem bench --device cuda --arch "$arch" --iters 10 --max-k 8 \
    --profile --trace --results "$work/logs/RESULTS-gpu.md"
done
# Long prompts: GPU_LAB_PREFILL lists "arch:tokens" entries (default none: GPU_LAB_LONG times 4096-token prompts),
# benched with that --context, no drafter and one verify size (the prefill row counts).
for pf in ${GPU_LAB_PREFILL-}; do
  run_step "prefill ${pf%%:*} ${pf#*:} tokens" 30 "bench_prefill_${pf%%:*}_${pf#*:}.txt" $B/tandem bench --device cuda \
    --arch "${pf%%:*}" --context "${pf#*:}" --iters 3 --max-k 1 --no-draft --results "$work/logs/RESULTS-gpu.md"
done
# Serving-sized KV caches: GPU_LAB_LONG lists "arch:context:capacity[:VAR=VALUE]" entries, benched with --context and
# --kv-capacity, so the graphs' attention launches are sized as a server's with that context would be, and the long
# prompt's prefill is timed; the optional setting runs that bench with one environment switch flipped, for an A/B
# beside the entry without it ("" skips them all). Default: 26B-A4B and 31B after 4096 prompt tokens in an
# 8192-position cache, each also with the prefill path that became the default after one H100 run (run BL) turned
# off, to be confirmed on an H200 (the wide MoE tiles; the flash kernel's wgmma form), and 31B with the flash kernel's
# four-stage wgmma form (=3, not yet run on a GPU).
long_default="gemma4-26b-a4b:4096:8192 gemma4-26b-a4b:4096:8192:TANDEM_MOE_TC_WIDE=0 gemma4-31b:4096:8192"
long_default+=" gemma4-31b:4096:8192:TANDEM_ATTN_PREFILL_WGMMA=0"
long_default+=" gemma4-31b:4096:8192:TANDEM_ATTN_PREFILL_WGMMA=3"
for lc in ${GPU_LAB_LONG-$long_default}; do
  IFS=: read -r lc_arch lc_ctx lc_cap lc_env <<<"$lc"
  run_step "bench $lc_arch, $lc_ctx of $lc_cap positions${lc_env:+, $lc_env}" 40 \
    "bench_long_${lc_arch}_${lc_ctx}_${lc_cap}${lc_env:+_${lc_env//[^A-Za-z0-9_]/_}}.txt" \
    env ${lc_env:+"$lc_env"} $B/tandem bench --device cuda --arch "$lc_arch" --context "$lc_ctx" --kv-capacity "$lc_cap" \
    --iters 5 --max-k 4 --results "$work/logs/RESULTS-gpu.md"
done
# Loading a real checkpoint directory from the page cache: the random GPU_LAB_DISK_ARCH model (default gemma4-e2b)
# written to disk with `tandem bench --write-checkpoint` (so its pages are cached), then benched with --model.
disk_arch=${GPU_LAB_DISK_ARCH-gemma4-e2b}
if [ -n "$disk_arch" ]; then
  run_step "write $disk_arch checkpoint" 40 "write_$disk_arch.txt" $B/tandem bench --arch "$disk_arch" \
    --write-checkpoint "$work/ck" &&
    run_step "bench $disk_arch from the page cache" 30 "bench_disk_$disk_arch.txt" $B/tandem bench --device cuda \
      --model "$work/ck" --draft "$work/ck/assistant" --iters 5 --max-k 4 --results "$work/logs/RESULTS-gpu.md"
  rm -rf "$work/ck"
fi

# A/B benches of the latest switches: the same bench with one environment setting flipped, without the profile.
# GPU_LAB_AB lists "arch:VAR=VALUE" entries (default: 26B-A4B without the early expert down kernel, which became the
# default after one H100 pair, run BL); the older GPU_LAB_AB_ENV / GPU_LAB_AB_ARCH pair still gives one entry.
ab_list=${GPU_LAB_AB-}
if [ -z "$ab_list" ]; then
  ab_env=${GPU_LAB_AB_ENV-TANDEM_MOE_EARLY=0}
  [ -n "$ab_env" ] && ab_list="${GPU_LAB_AB_ARCH:-gemma4-26b-a4b}:$ab_env"
fi
for ab in $ab_list; do
  ab_arch=${ab%%:*}
  ab_env=${ab#*:}
  # The log's name holds the setting's value too (two values of one switch get two logs).
  run_step "bench $ab_arch $ab_env" 30 "bench_ab_${ab_arch}_${ab_env//[^A-Za-z0-9_]/_}.txt" env "$ab_env" $B/tandem bench \
    --device cuda --arch "$ab_arch" --iters 10 --max-k 8
done
snap

echo "=== gpu-check"
tail -n 16 "$work/logs/gpu-check.txt"
echo "=== model tests"
grep -E '^\[(bf16|graphs)|DIVERGES|FAILED' "$work/logs/cuda_model_test.txt" 2>/dev/null | head -40
echo "=== demo"
tail -n 4 "$work/logs/demo_cuda.txt" 2>/dev/null
for f in "$work"/logs/bench_*.txt; do
  [ -f "$f" ] && { echo "=== $(basename "$f")"; grep -vE "^tandem bench: building|loading" "$f" | sed '/^per-op device time/,$d' | tail -n 28; }
done
echo "=== gpu-lab summary ($((SECONDS - start))s)"
for l in "${summary[@]}"; do echo "  $l"; done
