#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs the packages, builds
# the guest images, checks formatting and lints, and runs every test.
# CI (.ci/run) runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s ==\n' "$*"; }

# The run must leave every tracked file as it found it: a clean clone stays
# clean (`git status --porcelain --untracked-files=no` empty), and in a
# working tree with edits the run adds none. Files git ignores (target/,
# .cache/, fuzz/corpus/ ...) do not count.
tracked_state() {
    git status --porcelain --untracked-files=no
    git diff --binary HEAD | sha256sum
}
in_git=0
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    in_git=1
    before=$(tracked_state)
fi

step "setup (apt packages)"
scripts/setup.sh

step "guest images (minimal kernel + initramfs, cached)"
guest/build.sh

step "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# every intra-doc link resolves (private items are not linked from
# public docs)
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "build"
# vmm and vmm-sim side by side in target/debug: `vmm sim` runs vmm-sim
cargo build --workspace --quiet

step "tests"
cargo test --workspace

step "loom model checks (wake list, per-LLC idle accounting)"
# A separate target dir: --cfg loom rebuilds every dependency.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
    cargo test -p vcpu_sched --release --lib loom

step "fuzz targets (each briefly, from the committed seeds)"
scripts/fuzz.sh --ci

step "tracked files unchanged by the run"
if ((in_git)); then
    if [ "$(tracked_state)" != "$before" ]; then
        echo "error: the test run changed tracked files (commit what it should write, or make it write elsewhere):" >&2
        git status --porcelain --untracked-files=no >&2
        git diff --stat HEAD >&2
        exit 1
    fi
    echo "ok"
else
    echo "not a git checkout: not checked"
fi
