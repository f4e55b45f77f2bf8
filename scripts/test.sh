#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs the packages, builds
# the guest images, checks formatting and lints, and runs every test.
# CI (.ci/run) runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s ==\n' "$*"; }

step "setup (apt packages)"
scripts/setup.sh

step "guest images (minimal kernel + initramfs, cached)"
guest/build.sh

step "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "build"
cargo build --workspace --quiet
# The production form of vmm (no simulator, plain atomics and locks) must
# keep compiling. `check`, not `build`: a build would leave that binary at
# target/debug/vmm, where the integration tests expect the default one.
cargo check -p vmm --no-default-features --quiet

step "tests"
cargo test --workspace

step "loom model checks (wake list, per-LLC idle accounting)"
# A separate target dir: --cfg loom rebuilds every dependency.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
    cargo test -p vcpu_sched --release --lib loom

step "fuzz targets (each briefly, from the committed seeds)"
scripts/fuzz.sh --ci
