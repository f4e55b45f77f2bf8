#!/usr/bin/env bash
# The main job on an embedded default, from a fresh machine: installs the
# packages, builds the VMM, shows a preset 2-socket host and what a guest
# placed on it sees (`vmm demo`), then runs 4 micro-guest VMs x 8 vCPUs
# (hackbench-like messaging) on real KVM vCPUs under vcpu_sched without and
# with the six fixes, next to plain 1:1 host threads (`vmm bench`).
#
# A small run (what tests/tests/doc_commands.rs does): VMM_BIN=path/to/vmm
# uses that binary instead of building a release one, DEMO_DURATION=SECS
# and DEMO_REPS=N shorten the comparison (defaults 1 and 2).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
duration=${DEMO_DURATION:-1}
reps=${DEMO_REPS:-2}
if [ -n "${VMM_BIN:-}" ]; then
    vmm() { "$VMM_BIN" "$@"; }
else
    vmm() { cargo run --release --quiet -p vmm -- "$@"; }
fi
vmm demo "$@"
echo
if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
    vmm bench messaging --vms 4 --vcpus 8 --duration "$duration" --reps "$reps" --compare "none;all"
else
    echo "(no usable /dev/kvm: skipping the micro-guest run; see docs/micro-guests.md)"
fi
