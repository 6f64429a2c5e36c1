#!/usr/bin/env bash
# The main job of `make demo`. Until the embedded demo models exist, it describes a committed test checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
"./$build/tandem" info --model tests/fixtures/models/e2b-tiny
