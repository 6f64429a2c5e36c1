#!/usr/bin/env bash
# GPU-machine check (H200, no apt, no network): configures a Release build with the CUDA backend for sm_90a in
# build-gpu/, builds everything, runs every test through ctest (CPU and CUDA) and the CUDA op bench, and writes
# the logs to $OUT (at most 8 files). Run from the repo root with .deps/ carried (scripts/prepare-device-deps.sh
# fills it on the dev machine); carry .cache/ too for the tokenizer parity data. Exits non-zero on any failure,
# including CUDA tests that skipped. Budget: GPU_CHECK_BUDGET_S seconds in all (default 540); GPU_CHECK_BUILD_DIR
# overrides the build folder.
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$SECONDS
budget=${GPU_CHECK_BUDGET_S:-540}
build=${GPU_CHECK_BUILD_DIR:-build-gpu}
out=${OUT:-$build/out}
mkdir -p "$out" && out=$(cd "$out" && pwd)
jobs=$(nproc)
left() { echo $((budget - (SECONDS - start))); }
declare -a summary=()
failed=0
note() { summary+=("$1"); echo "== $1"; }

# Runs "$@" with the time left, output to $out/$log; records ok / FAILED / TIMEOUT for step $name.
step() {
  local name=$1 log=$2
  shift 2
  local t
  t=$(left)
  if [ "$t" -le 10 ]; then note "$name: SKIPPED (time budget spent)"; failed=1; return 1; fi
  echo "== $name (${t}s left)"
  local s0=$SECONDS
  timeout "$t" "$@" >>"$out/$log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then note "$name: ok ($((SECONDS - s0))s)"; return 0; fi
  if [ $rc -eq 124 ]; then note "$name: TIMEOUT after $((SECONDS - s0))s"; else note "$name: FAILED (rc $rc, $((SECONDS - s0))s)"; fi
  failed=1
  echo "-- last lines of $out/$log:"
  tail -n 40 "$out/$log"
  return 1
}

[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
gen=()
if command -v ninja >/dev/null 2>&1; then
  gen=(-G Ninja)
elif [ -x /opt/torch/.venv/bin/ninja ]; then
  gen=(-G Ninja -DCMAKE_MAKE_PROGRAM=/opt/torch/.venv/bin/ninja)
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)  cores: $jobs"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | wc -l) changed files"
  nvidia-smi 2>&1 || echo "nvidia-smi failed"
  nvcc --version 2>&1 | tail -n 2 || echo "nvcc not found"
  cmake --version | head -n 1
  c++ --version | head -n 1
  echo "generator: ${gen[*]:-default}"
  ls .deps 2>/dev/null | sed 's/^/.deps: /' || echo ".deps missing (run scripts/prepare-device-deps.sh here before carrying)"
} >"$out/env.txt" 2>&1
head -n 20 "$out/env.txt"

if step configure configure.log cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_CUDA_ARCHITECTURES=90a -DTANDEM_CUDA=ON; then
  if ! grep -q "CUDA backend ON" "$out/configure.log"; then
    note "configure: CUDA backend is OFF (nvcc not found?)"
    failed=1
  fi
  if step build build.log cmake --build "$build" -j "$jobs"; then
    # Many test processes run at once: keep OpenMP from oversubscribing the cores.
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} step ctest ctest.log \
      ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout 240 --output-junit "$out/ctest-junit.xml"
    n_cuda_skipped=$(grep -E "Test +#[0-9]+: +(Fixtures/)?(CudaMemory|CudaOps|CudaLinear|CudaSampling|CudaModel|CudaModelDemo)\." "$out/ctest.log" | grep -c "Skipped" || true)
    n_cuda=$(grep -cE "Test +#[0-9]+: +(Fixtures/)?(CudaMemory|CudaOps|CudaLinear|CudaSampling|CudaModel|CudaModelDemo)\." "$out/ctest.log" || true)
    if [ "${n_cuda:-0}" -eq 0 ]; then
      note "cuda tests: NONE RAN (cuda_test not built or not discovered)"
      failed=1
    elif [ "${n_cuda_skipped:-0}" -gt 0 ]; then
      note "cuda tests: $n_cuda_skipped of $n_cuda SKIPPED (no usable GPU?)"
      failed=1
    else
      note "cuda tests: $n_cuda ran"
    fi
    if [ -x "$build/bench/cuda/cuda_bench" ]; then
      step cuda_bench cuda_bench.txt "$build/bench/cuda/cuda_bench" && cat "$out/cuda_bench.txt"
    else
      note "cuda_bench: not built"
      failed=1
    fi
  fi
fi

{
  echo "gpu-check summary ($((SECONDS - start))s)"
  for l in "${summary[@]}"; do echo "  $l"; done
  grep -E "tests passed|tests failed" "$out/ctest.log" 2>/dev/null | tail -n 1 | sed 's/^/  /'
  if grep -q "The following tests FAILED" "$out/ctest.log" 2>/dev/null; then
    sed -n '/The following tests FAILED/,$p' "$out/ctest.log" | grep -E "^\s+[0-9]+ - " | head -n 40
  fi
  [ $failed -eq 0 ] && echo "  RESULT: PASS" || echo "  RESULT: FAIL"
} | tee "$out/summary.txt"
exit $failed
