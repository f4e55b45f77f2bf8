#!/usr/bin/env bash
# The main job on an embedded default, from a fresh machine: installs the
# packages, builds the VMM, shows a preset 2-socket host and what a guest
# placed on it sees (`vmm demo`), then runs micro-guest VMs passing
# messages (hackbench-like) on real KVM vCPUs under vcpu_sched with and
# without the six fixes, next to plain 1:1 host threads (`vmm bench`), at
# one vCPU per host CPU (pinned) and at 4x overcommit; then, as root, boots
# the Linux guest (built by guest/build.sh, cached) with a virtio-net
# device under each scheduler and prints the guest kernel's ping round
# trip (scripts/net-demo.sh; the paired target is scripts/targets-ping.sh).
#
# A small run (what tests/tests/doc_commands.rs does): VMM_BIN=path/to/vmm
# uses that binary instead of building a release one, DEMO_DURATION=SECS
# and DEMO_REPS=N shorten the comparison (defaults 1 and 2), DEMO_PINGS=N
# the pings (default 20).
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
    # vcpu_sched with all fixes (the baseline row, and its A/A row),
    # without them, and plain 1:1 threads scheduled by the host kernel:
    # at one vCPU per host CPU, each pinned to its own, and at 4x
    # overcommit (scripts/targets.sh runs all four workloads this way)
    n1=$(($(nproc) / 2 * 2))
    n1=$((n1 < 2 ? 2 : n1 > 64 ? 64 : n1))
    pin=()
    [ "$n1" -le "$(nproc)" ] && pin=(--pin)
    echo "== one vCPU per host CPU${pin:+, pinned}"
    vmm bench messaging --vms 1 --vcpus "$n1" "${pin[@]}" --duration "$duration" --reps "$reps" --compare "all;none"
    echo
    echo "== 4x overcommit"
    vmm bench messaging --vms 4 --vcpus "$n1" --duration "$duration" --reps "$reps" --compare "all;none"
else
    echo "(no usable /dev/kvm: skipping the micro-guest run; see docs/micro-guests.md)"
fi
echo
if [ "$(id -u)" != 0 ]; then
    echo "(not root: skipping the ping round trip, which needs a network namespace and a tap; run as root)"
elif [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
    pings=${DEMO_PINGS:-20}
    guest/build.sh >/dev/null
    if [ -z "${VMM_BIN:-}" ]; then
        cargo build --release --quiet -p vmm
        VMM_BIN=${CARGO_TARGET_DIR:-target}/release/vmm
    fi
    VMM_BIN=$(realpath "$VMM_BIN")
    export VMM_BIN
    echo "== the guest kernel's ping round trip over virtio-net ($n1 vCPUs, one per host CPU; $pings pings 0.05 s apart, one boot each)"
    for sched in vcpu_sched host; do
        label=$sched
        [ "$sched" = host ] && label="host 1:1"
        line=$(scripts/net-demo.sh --sched "$sched" --vcpus "$n1" --pings "$pings" | grep '^rtt ms:' || true)
        echo "$label: ${line:-no replies}"
    done
    echo "(one boot each: scripts/targets-ping.sh measures the target, 8 paired repetitions with an A/A row, docs/results-vcpus.md)"
fi
