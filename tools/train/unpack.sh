#!/usr/bin/env bash
# Reassembles the demo models trained by run_on_device.sh (demo.tgz.part-aa, -ab, ... fetched from the GPU
# machine) into models/demo/, checks the SHA256SUMS packed with them and prints the sizes.
# Usage, from anywhere: bash tools/train/unpack.sh DIR_WITH_PARTS
set -euo pipefail

SRC=${1:?usage: bash tools/train/unpack.sh DIR_WITH_PARTS}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
shopt -s nullglob
parts=("$SRC"/demo.tgz.part-*)
[[ ${#parts[@]} -gt 0 ]] || { echo "no demo.tgz.part-* in $SRC" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat "${parts[@]}" | tar -xzf - -C "$tmp"
[[ -d $tmp/models/demo/target && -d $tmp/models/demo/assistant ]] || { echo "archive lacks models/demo/{target,assistant}" >&2; exit 1; }
(cd "$tmp/models/demo" && sha256sum --check --quiet SHA256SUMS)

rm -rf "$ROOT/models/demo"
mkdir -p "$ROOT/models"
mv "$tmp/models/demo" "$ROOT/models/demo"
echo "unpacked ${#parts[@]} parts into $ROOT/models/demo (checksums OK):"
(cd "$ROOT" && find models/demo -type f | LC_ALL=C sort | xargs ls -l | awk '{printf "  %12d  %s\n", $5, $9}')
total=$(find "$ROOT/models/demo" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
echo "  total $total bytes"
