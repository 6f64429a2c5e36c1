#!/usr/bin/env bash
# Prepares the training text of tandem's demo models (models/README.md): the King James Bible (public domain)
# from Debian's bible-kjv package, dumped with `bible`, verse labels stripped, one verse a line, chapters
# separated by a blank line. Writes .cache/train/kjv.txt (training split), .cache/train/heldout.txt (every 40th
# chapter) and tools/train/heldout_prompts.txt (committed). Runs on the Debian development machine, not on the
# GPU machine; the lead carries .cache/train there.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTDIR=$ROOT/.cache/train
mkdir -p "$OUTDIR"

if ! command -v bible >/dev/null 2>&1; then
  echo "bible not found: installing Debian package bible-kjv"
  apt-get install -y bible-kjv || { apt-get update && apt-get install -y bible-kjv; }
fi

RAW=$(mktemp)
trap 'rm -f "$RAW"' EXIT
bible -f "gen1:1-rev22:21" > "$RAW"
echo "dumped $(wc -l < "$RAW") verse lines"

python3 "$ROOT/tools/train/prepare_data.py" --raw "$RAW" --out "$OUTDIR" \
  --prompts "$ROOT/tools/train/heldout_prompts.txt"
