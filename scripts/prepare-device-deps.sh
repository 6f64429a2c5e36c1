#!/usr/bin/env bash
# Run on THIS (Debian) machine before sending the tree to the GPU machine, which has no apt: copies the header-only
# dependencies and GoogleTest's source into .deps/ (gitignored). cmake/deps.cmake falls back to .deps/ when
# find_package fails, so the GPU machine configures with -DTANDEM_DEPS_DIR unset. Carry ".deps" with the run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
deps="$root/.deps"

need() { [ -e "$1" ] || { echo "prepare-device-deps: $1 is missing (run scripts/install-deps.sh)" >&2; exit 1; }; }
need /usr/include/nlohmann/json.hpp
need /usr/include/CLI/CLI.hpp
need /usr/src/googletest/CMakeLists.txt

rm -rf "$deps"
mkdir -p "$deps/include"
cp -r /usr/include/nlohmann "$deps/include/"
cp -r /usr/include/CLI "$deps/include/"
# GoogleTest + GoogleMock sources without their own tests, docs and samples (they are not built).
cp -r /usr/src/googletest "$deps/googletest"
rm -rf "$deps/googletest/googletest/test" "$deps/googletest/googlemock/test" \
       "$deps/googletest/googletest/docs" "$deps/googletest/googletest/samples"
echo "prepare-device-deps: wrote $(du -sh "$deps" | cut -f1) to $deps"
