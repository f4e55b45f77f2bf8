#!/usr/bin/env bash
# The main job on an embedded default, from a fresh machine: installs the
# packages, builds the VMM and runs `vmm demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec cargo run --release --quiet -p vmm -- demo "$@"
