#!/usr/bin/env bash
# A/B lab: one device call that builds the working tree (tandem and the CUDA test binaries) and a base tree side by
# side, runs the CUDA tests of the working tree, then benches both trees in alternation, so that every figure it
# prints has its baseline from the same machine and call.
#
#   AB_BASE_TGZ   a `git archive` of the base tree's CMakeLists.txt cmake src tools bench (made on the host:
#                 git archive --format=tar.gz -o ab-base.tgz HEAD CMakeLists.txt cmake src tools bench);
#                 without it only the working tree is benched
#   AB_GTEST      gtest filter for cuda_test ("-" skips it; default: all); cuda_model_test runs whole unless
#                 AB_MODEL_TEST=0
#   AB_ARCHS      architectures to bench (default: gemma4-e2b gemma4-e4b gemma4-26b-a4b)
#   AB_ROUNDS     rounds of (base, working tree with each variant) per architecture (default 2)
#   AB_VARIANTS   env settings for extra runs of the working tree in each round ("-" = none, ',' joins several;
#                 a prefix "ARCH@" runs one for that architecture only), e.g. "TANDEM_L2_KEEP=0
#                 gemma4-e2b@TANDEM_PLI_PREFETCH=0"; they run on the first round only
#   AB_BENCH      extra `tandem bench` flags (default: --iters 10 --max-k 4 --no-draft --trace)
#   AB_BUDGET_S   stop starting benches after this many seconds (default 540)
#   AB_LINES, AB_LINE_COUNT  the bench lines kept (an extended regex over decode, verify, draft step and K = 4
#                 round lines by default) and how many of the first (default 5: the two decode lines, verify 2-4)
#   AB_TIMELINE   the kernel timeline the AB_KERNELS lines come from (default "decode 1 token"; e.g. "verify 5 tokens")
# Results: $OUT/ab.txt (per run: the decode lines, the draft step and the K = 4 round when drafts are benched, and
# the kernels named in AB_KERNELS, default per_layer_input|rms_norm|attention) and $OUT/ab-logs.tgz (every full log).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?set OUT}
logs=$(mktemp -d)
budget=${AB_BUDGET_S:-540}
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
[ ${#gen[@]} -eq 0 ] && [ -x /opt/torch/.venv/bin/ninja ] && gen=(-G Ninja -DCMAKE_MAKE_PROGRAM=/opt/torch/.venv/bin/ninja)
cfg=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DTANDEM_CUDA=ON)
jobs=$(nproc)

build_new() {
  cmake -S . -B build-gpu "${gen[@]}" "${cfg[@]}" >"$logs/new-configure.log" 2>&1 &&
    cmake --build build-gpu -j "$jobs" --target tandem cuda_test cuda_model_test >"$logs/new-build.log" 2>&1
}
build_base() {
  rm -rf ab-base && mkdir ab-base && tar -xzf "$AB_BASE_TGZ" -C ab-base && cp -r .deps ab-base/ 2>/dev/null
  (cd ab-base && cmake -S . -B build "${gen[@]}" "${cfg[@]}" -DTANDEM_TESTS=OFF >"$logs/base-configure.log" 2>&1 &&
    cmake --build build -j "$jobs" --target tandem >"$logs/base-build.log" 2>&1)
}

s0=$SECONDS
base_bin=
if [ -n "${AB_BASE_TGZ:-}" ]; then
  build_base &
  base_pid=$!
fi
build_new || { tail -40 "$logs/new-build.log" "$logs/new-configure.log" 2>/dev/null; exit 1; }
if [ -n "${AB_BASE_TGZ:-}" ]; then
  wait $base_pid && base_bin=ab-base/build/tandem || { tail -30 "$logs/base-build.log"; exit 1; }
fi
echo "build: $((SECONDS - s0))s" | tee "$out/ab.txt"

if [ "${AB_GTEST:-}" != "-" ]; then
  timeout 240 build-gpu/tests/cuda/cuda_test --gtest_filter="${AB_GTEST:-*}" >"$logs/cuda_test.txt" 2>&1
  echo "cuda_test (${AB_GTEST:-*}): rc $?" | tee -a "$out/ab.txt"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$logs/cuda_test.txt" | tee -a "$out/ab.txt"
fi
if [ "${AB_MODEL_TEST:-1}" != 0 ]; then
  (cd build-gpu/tests/cuda && timeout 240 ./cuda_model_test >"$logs/cuda_model_test.txt" 2>&1)
  echo "cuda_model_test: rc $?" | tee -a "$out/ab.txt"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$logs/cuda_model_test.txt" | tee -a "$out/ab.txt"
fi

kernels=${AB_KERNELS:-per_layer_input|rms_norm|attention}
read -ra flags <<<"${AB_BENCH:---iters 10 --max-k 4 --no-draft --trace}"
n=0
bench() {  # bench LABEL BINARY ARCH [ENV...]
  local label=$1 bin=$2 arch=$3
  shift 3
  if [ $((SECONDS - s0)) -ge "$budget" ]; then
    echo "$arch $label: skipped (budget)" | tee -a "$out/ab.txt"
    return
  fi
  n=$((n + 1))
  local log="$logs/bench-$n-$arch-${label//[^A-Za-z0-9_=.-]/_}.txt"
  env "$@" timeout 150 "$bin" bench --device cuda --arch "$arch" "${flags[@]}" >"$log" 2>&1
  {
    echo "--- $arch $label (rc $?)"
    grep -E "${AB_LINES:-decode 1 token|verify [0-9] tokens|draft step|round K=4}" "$log" | head -"${AB_LINE_COUNT:-5}"
    awk -v t="${AB_TIMELINE:-decode 1 token}" '$0 ~ "kernel timeline, " t {on = 1} on && /^$/ {on = 0} on' "$log" |
      grep -E "$kernels|most replays" | head -14
  } | tee -a "$out/ab.txt"
}

for arch in ${AB_ARCHS:-gemma4-e2b gemma4-e4b gemma4-26b-a4b}; do
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    [ -n "$base_bin" ] && bench base "$base_bin" "$arch"
    bench new build-gpu/tandem "$arch"
    if [ "$round" = 1 ]; then
      for v in ${AB_VARIANTS:-}; do
        if [[ "$v" == *@* ]]; then
          [ "${v%%@*}" = "$arch" ] || continue
          v=${v#*@}
        fi
        envs=()
        [ "$v" != "-" ] && IFS=',' read -ra envs <<<"$v"
        bench "new $v" build-gpu/tandem "$arch" "${envs[@]}"
      done
    fi
  done
done
tar -czf "$out/ab-logs.tgz" -C "$logs" .
echo "total: $((SECONDS - s0))s" | tee -a "$out/ab.txt"
