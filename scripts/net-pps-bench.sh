#!/usr/bin/env bash
# Micro-guest virtio-net packets/s (`vmm bench net`): each VM is one vCPU
# driving a virtio-net device on a tap of its own; `vmm bench net` plays
# the host peer on every tap. Three modes:
#   tx:   the guest sends minimal (60-byte) UDP frames as fast as its
#         ring allows; the host counts what reaches the taps;
#   rx:   the host injects 60-byte frames (at most 128 ahead of the
#         guest); the guest counts them;
#   echo: the host sends a frame and waits for the guest to send it back
#         (request/response: every packet's interrupt wakes a halted
#         vCPU); round trips/s and their p50/p99.
# at two points:
#   x1: one VM (one vCPU) per host CPU;
#   x4: four per host CPU (4x overcommit).
# Each of the six configurations is one interleaved `vmm bench net
# --compare-executors` run of REPS repetitions (default 5) of DURATION
# seconds (default 2): rows `all` on the workers executor (vcpu_sched,
# the baseline), its A/A row (its distance from the baseline is this
# machine's noise), `all on threads`, and `host 1:1` (the host executor,
# as `--sched host` runs vCPUs).
#
#   scripts/net-pps-bench.sh [--out DIR] [--duration S] [--reps N]
#
# Needs root: it makes a network namespace with the taps inside it (IPv6
# off, so the host stack sends nothing of its own), runs everything in
# it, and deletes it on exit. Raw outputs go to DIR (default
# docs/data/devices/net-pps): per configuration the table (with the
# command, date, commit and host CPUs at its head) and the JSON gzipped,
# and DIR/meta.txt (scripts/machine-meta.sh). VMM_BIN picks the binary
# (default: a release build).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
bench_args docs/data/devices/net-pps 5 2 "$@"
need_root "it makes a network namespace and taps"
vmm_binary
ncpu=$(nproc)
ntaps=$((4 * ncpu))
bench_netns vmm-pps
trap 'ip netns del "${ns:-}" 2>/dev/null || true' EXIT
for i in $(seq 0 $((ntaps - 1))); do
    ip -n "$ns" tuntap add "pps$i" mode tap
    ip -n "$ns" link set "pps$i" up
done
vmm() { ip netns exec "$ns" "$bin" "$@"; }
record_meta "$out"
for mode in tx rx echo; do
    for point in x1 x4; do
        if [ $point = x1 ]; then vms=$ncpu; else vms=$ntaps; fi
        f="$out/$mode-$point"
        clear_old "$f.json" "$f.json.gz" "$f.txt"
        cmd=(bench net --mode "$mode" --tap-prefix pps --vms "$vms" --duration "$dur" --reps "$reps"
            --compare-executors --json "$f.json")
        {
            echo "# vmm ${cmd[*]}"
            echo "# inside a network namespace of its own with taps pps0..pps$((ntaps - 1)) (up, IPv6 off)"
            echo "# $(date -u +%FT%TZ), commit $commit, dirty $dirty, $ncpu host CPUs (machine: meta.txt)"
            vmm "${cmd[@]}" 2>/dev/null
        } >"$f.txt"
        gzip -9f "$f.json"
        echo "$f.txt"
    done
done
