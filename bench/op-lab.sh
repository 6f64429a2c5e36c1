#!/usr/bin/env bash
# Op lab: one device call that builds cuda_bench only and times one section of its shapes (OP_LAB_SECTION: attention,
# the default, or moe: `cuda_bench --attention` / `--moe`) under each variant in OP_LAB_VARIANTS (space-separated
# env settings, "-" = none, ',' joins several; commas inside a value are not supported, so a value like
# TANDEM_MOE_ROWS=2,4 is written TANDEM_MOE_ROWS=2:4 and the colon becomes a comma). OP_LAB_BENCH="A ..." adds
# `tandem bench` decode/verify lines per variant (builds tandem too); OP_LAB_GTEST="BINARY:FILTER" builds a test
# binary and runs it once with that gtest filter first (its whole output: $OUT/gtest-full.txt); OP_LAB_NCU=1 adds ncu kernel durations (mean per kernel and
# grid) of the default variant. Results: $OUT/op.txt, $OUT/ncu-durations.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?set OUT}
B=${OP_LAB_BUILD:-build-gpu}
section=${OP_LAB_SECTION:-attention}
logs=$(mktemp -d)
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
[ ${#gen[@]} -eq 0 ] && [ -x /opt/torch/.venv/bin/ninja ] && gen=(-G Ninja -DCMAKE_MAKE_PROGRAM=/opt/torch/.venv/bin/ninja)
targets=(cuda_bench)
[ -n "${OP_LAB_BENCH:-}" ] && targets+=(tandem)
gtest=${OP_LAB_GTEST:-}
[ -n "$gtest" ] && targets+=("${gtest%%:*}")
s0=$SECONDS
cmake -S . -B $B "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DTANDEM_CUDA=ON \
  >"$logs/configure.log" 2>&1 || { tail -20 "$logs/configure.log"; exit 1; }
cmake --build $B -j "$(nproc)" --target "${targets[@]}" >"$logs/build.log" 2>&1 || { tail -40 "$logs/build.log"; exit 1; }
echo "build: $((SECONDS - s0))s"
if [ -n "$gtest" ]; then
  bin=$(find $B/tests -type f -name "${gtest%%:*}" -perm -u+x | head -1)
  timeout 240 "$bin" --gtest_filter="${gtest#*:}" >"$logs/gtest.txt" 2>&1
  echo "gtest ${gtest}: rc $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran" "$logs/gtest.txt" | tee "$out/gtest.txt"
  cp "$logs/gtest.txt" "$out/gtest-full.txt"
fi
for v in ${OP_LAB_VARIANTS:--}; do
  envs=()
  [ "$v" != "-" ] && IFS=',' read -ra envs <<<"$v"
  envs=("${envs[@]//:/,}")
  echo "=== variant: $v"
  env "${envs[@]}" timeout 60 $B/bench/cuda/cuda_bench --$section 2>&1 | grep -E "^$section|FAIL|error" | tee -a "$out/op.txt"
  for arch in ${OP_LAB_BENCH:-}; do
    env "${envs[@]}" timeout 120 $B/tandem bench --device cuda --arch "$arch" --iters 10 --max-k 8 --no-draft \
      >"$logs/bench.txt" 2>&1
    grep -E "decode 1 token|verify [0-9] tokens|prefill" "$logs/bench.txt" | sed "s/^/$arch: /" | tee -a "$out/op.txt"
  done
done
if [ "${OP_LAB_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  timeout ${OP_LAB_NCU_S:-90} ncu --clock-control none --metrics gpu__time_duration.sum -k regex:$section \
    --launch-count 300 $B/bench/cuda/cuda_bench --$section >"$logs/ncu.txt" 2>&1
  echo "ncu rc $?"
  # Each profiled kernel: a header line "  <signature> (grid)x(block), Context ..." then its metric line; kept as
  # "name<template args> (grid)x(block) microseconds".
  awk '/\)x\(/ && /Context/ {name = $0; gsub(/\(anonymous namespace\)::/, "", name);
         sub(/^ *(void )?/, "", name); sub(/\(.*$/, "", name); sub(/^.*::/, "", name); gsub(/ /, "", name);
         match($0, /\([0-9, ]+\)x\([0-9, ]+\)/); geo = substr($0, RSTART, RLENGTH); gsub(/ /, "", geo); next}
       /gpu__time_duration/ && name != "" {print name, geo, $NF; name = ""}' "$logs/ncu.txt" >"$out/ncu-durations.txt"
  awk '{k = $1 " " $2; n[k]++; t[k] += $3} END {for (k in n) printf "%-90s n=%3d mean %.2f us\n", k, n[k], t[k] / n[k]}' \
    "$out/ncu-durations.txt" | sort
fi
