#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan) in build-fuzz and runs each for SECONDS
# (default 30) from its seed corpus. Fails when a target crashes, leaks, trips a sanitizer or times out.
#   bash scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
build=build-fuzz
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_FUZZ=ON \
  -DTANDEM_TESTS=OFF -DTANDEM_BENCH=OFF -DTANDEM_CUDA=OFF >/dev/null
cmake --build "$build" --target fuzz_targets -j"$(nproc)"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
for target in fuzz_safetensors fuzz_config fuzz_npy; do
  name="${target#fuzz_}"
  seeds="tests/fuzz/corpus/$name"
  work="$build/corpus-$name"          # new inputs found in this run; the committed seeds stay untouched
  artifacts="$build/artifacts-$name/"
  mkdir -p "$work" "$artifacts"
  echo "== $target for ${secs}s"
  if ! "$build/tests/fuzz/$target" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 -artifact_prefix="$artifacts" "$work" "$seeds" 2>"$build/$target.log"; then
    tail -n 60 "$build/$target.log"
    echo "fuzz.sh: $target failed; reproducer in $artifacts" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$build/$target.log" | tr '\n' ' '
    echo
  fi
done
exit $status
