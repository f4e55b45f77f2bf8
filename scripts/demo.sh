#!/usr/bin/env bash
# The main job on an embedded default, from a fresh machine: installs the
# packages, builds the VMM, shows a preset 2-socket host and what a guest
# placed on it sees (`vmm demo`), then runs 4 micro-guest VMs x 8 vCPUs
# (hackbench-like messaging) on real KVM vCPUs under vcpu_sched without and
# with the six fixes, next to plain 1:1 host threads (`vmm bench`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
vmm() { cargo run --release --quiet -p vmm -- "$@"; }
vmm demo "$@"
echo
if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
    vmm bench messaging --vms 4 --vcpus 8 --duration 1 --reps 2 --compare "none;all"
else
    echo "(no usable /dev/kvm: skipping the micro-guest run; see docs/micro-guests.md)"
fi
