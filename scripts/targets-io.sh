#!/usr/bin/env bash
# The I/O targets: vcpu_sched (the workers executor, all fixes) against
# plain 1:1 vCPU threads scheduled by the host kernel, for virtio-blk
# random 4 KiB reads from micro-guests (`vmm bench blk`: IOPS, higher is
# better) at queue depth 1 and 32, at the two points of scripts/targets.sh
# (one 1-vCPU VM per VM slot):
#   x1: one VM per host CPU, each vCPU pinned to a CPU of its own (--pin);
#   x4: 4 VMs per host CPU, nothing pinned.
# Each point is one interleaved `vmm bench --compare "all;none"` run of
# REPS repetitions (default 8) of DURATION seconds (default 2): rows `all`
# (the baseline), its A/A row, `none`, and `host 1:1`, all reading one
# shared sparse image made for the run (removed at exit). The verdict is
# the paired reading, as in scripts/targets.sh.
# Raw outputs (table, JSON gzipped) go to OUT (default
# docs/data/targets-io), with OUT/meta.txt (scripts/machine-meta.sh);
# VMM_BIN picks the binary (default: a release build). With the default
# OUT, the I/O Targets table of docs/results-vcpus.md is then rewritten
# from the new data (results_md --targets; RESULTS_MD picks that binary).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
out=${OUT:-docs/data/targets-io}
reps=${REPS:-8}
dur=${DURATION:-2}
vmm_binary
record_meta "$out"
target_points
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
img=$tmp/blk.img
truncate -s 256M "$img"
hide=$img hide_note="a sparse 256 MiB file made for the run"
for qd in 1 32; do
    for point in x1 x4; do
        if [ "$point" = x1 ]; then
            shape=(--vms "$n1" --pin)
        else
            shape=(--vms $((4 * n1)))
        fi
        recorded_run "$out/blk-qd$qd-$point" bench blk --disk "$img" --qd "$qd" "${shape[@]}" \
            --duration "$dur" --reps "$reps" --compare "all;none"
    done
done
if [ "$out" = docs/data/targets-io ]; then
    if [ -z "${RESULTS_MD:-}" ]; then
        cargo build --quiet -p integration-tests --bin results_md
        RESULTS_MD=${CARGO_TARGET_DIR:-target}/debug/results_md
    fi
    "$RESULTS_MD" --targets docs/results-vcpus.md docs/results-vcpus.md
    echo "docs/results-vcpus.md: Targets tables rewritten"
fi
