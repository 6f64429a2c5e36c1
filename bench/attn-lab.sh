#!/usr/bin/env bash
# Attention decode lab: one device call that builds cuda_bench only and times the attention shapes
# (`cuda_bench --attention`) under each variant in ATTN_LAB_VARIANTS (space-separated env settings, "-" = none,
# ',' joins several); ATTN_LAB_BENCH="A ..." with ATTN_LAB_TARGETS=tandem adds `tandem bench` decode/verify lines;
# ATTN_LAB_NCU=1 adds ncu kernel durations (mean per kernel and grid). Results: $OUT/attn.txt, $OUT/ncu-durations.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?set OUT}
B=${ATTN_LAB_BUILD:-build-gpu}
logs=$(mktemp -d)
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
[ ${#gen[@]} -eq 0 ] && [ -x /opt/torch/.venv/bin/ninja ] && gen=(-G Ninja -DCMAKE_MAKE_PROGRAM=/opt/torch/.venv/bin/ninja)
s0=$SECONDS
cmake -S . -B $B "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DTANDEM_CUDA=ON \
  >"$logs/configure.log" 2>&1 || { tail -20 "$logs/configure.log"; exit 1; }
cmake --build $B -j "$(nproc)" --target cuda_bench ${ATTN_LAB_TARGETS:-} >"$logs/build.log" 2>&1 || { tail -40 "$logs/build.log"; exit 1; }
echo "build: $((SECONDS - s0))s"
for v in ${ATTN_LAB_VARIANTS:--}; do
  envs=()
  [ "$v" != "-" ] && IFS=',' read -ra envs <<<"$v"
  echo "=== variant: $v"
  env "${envs[@]}" timeout 60 $B/bench/cuda/cuda_bench --attention 2>&1 | grep -E "^attention|FAIL|error" | tee -a "$out/attn.txt"
  for arch in ${ATTN_LAB_BENCH:-}; do  # needs ATTN_LAB_TARGETS=tandem
    env "${envs[@]}" timeout 90 $B/tandem bench --device cuda --arch "$arch" --iters 10 --max-k 4 >"$logs/bench.txt" 2>&1
    grep -E "decode 1 token|verify 5|round K=4" "$logs/bench.txt" | sed "s/^/$arch: /"
  done
done
if [ "${ATTN_LAB_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  timeout ${ATTN_LAB_NCU_S:-90} ncu --clock-control none --metrics gpu__time_duration.sum -k regex:attention --launch-count 300 \
    $B/bench/cuda/cuda_bench --attention >"$logs/ncu.txt" 2>&1
  echo "ncu rc $?"
  grep -E "^  [a-z_]+kernel|gpu__time_duration" "$logs/ncu.txt" | paste - - |
    sed -E 's/\(tandem[^)]*\)//; s/, Context.*sum +[a-z]+ +/ /' >"$out/ncu-durations.txt"
  awk '{k=$0; sub(/ [^ ]+$/, "", k); n[k]++; t[k]+=$NF} END {for (k in n) printf "%-70s n=%3d mean %.2f\n", k, n[k], t[k]/n[k]}' \
    "$out/ncu-durations.txt" | sort
fi
