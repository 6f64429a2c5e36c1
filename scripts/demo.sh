#!/usr/bin/env bash
# The main job of `make demo`: the embedded demo pair (models/demo, a small Gemma 4 target trained on the KJV Bible
# and its assistant drafter) generates text with speculative decoding, streaming to the terminal, then prints
# tokens, tokens/s, acceptance, and the speedup over plain decoding measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
prompt=${DEMO_PROMPT:-"And God said unto Moses,"}
echo "== tandem info (demo target)"
"./$build/tandem" info --model models/demo/target | sed -n '1,12p'
echo
echo "== tandem generate: speculative decoding with the assistant drafter (greedy, K=3), compared with plain decoding"
"./$build/tandem" generate --model models/demo/target --draft models/demo/assistant \
  --prompt "$prompt" --max-tokens 160 --draft-tokens 3 --compare --repeat 5
