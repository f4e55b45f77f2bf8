#!/usr/bin/env bash
# Micro-guest virtio-blk IOPS (`vmm bench blk`): each VM is one vCPU
# driving a virtio-blk device with random 4 KiB reads from one shared,
# read-only image held in the page cache (so the numbers are the VMM's
# request path and the vCPU's wakeups, not the host's disk), at queue
# depth 1 and 32, at two points:
#   x1: one VM (one vCPU) per host CPU;
#   x4: four per host CPU (4x overcommit).
# Each of the four configurations is one interleaved `vmm bench blk
# --compare-executors` run of REPS repetitions (default 5) of DURATION
# seconds (default 2): rows `all` on the workers executor (vcpu_sched,
# the baseline), its A/A row (the same configuration again: its distance
# from the baseline is this machine's noise), `all on threads`, and
# `host 1:1` (the host executor, as `--sched host` runs vCPUs).
#
#   scripts/blk-bench.sh [--out DIR] [--duration S] [--reps N]
#
# Raw outputs go to DIR (default docs/data/devices/blk): per configuration
# the table (with the command, date, commit and host CPUs at its head)
# and the JSON gzipped, and DIR/meta.txt (scripts/machine-meta.sh: the
# machine, kvm_pvm or hardware KVM, the commit, whether the tree was
# dirty). VMM_BIN picks the binary (default: a release build).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
bench_args docs/data/devices/blk 5 2 "$@"
vmm_binary
record_meta "$out"
ncpu=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
img=$tmp/blk.img
# 64 MiB of data, not a sparse file, read once so the page cache holds it
dd if=/dev/zero of="$img" bs=1M count=64 status=none
cat "$img" >/dev/null
for qd in 1 32; do
    for point in x1 x4; do
        if [ $point = x1 ]; then vms=$ncpu; else vms=$((4 * ncpu)); fi
        hide=$img hide_note="a 64 MiB file of zeros in the page cache (read-only, shared by the VMs)" \
            recorded_run "$out/qd$qd-$point" bench blk --disk "$img" --vms "$vms" --qd "$qd" \
            --duration "$dur" --reps "$reps" --compare-executors
    done
done
