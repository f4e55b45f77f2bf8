#!/usr/bin/env bash
# Guest-kernel ping round trips over virtio-net, under both schedulers, at
# one vCPU per host CPU and at 4x overcommit, each configuration twice
# (the second run is the A/A row: its difference from the first is the
# noise of this machine), in interleaved order. An x1 run is one
# scripts/net-demo.sh (`vmm run`: a guest with one vCPU per host CPU); an
# x4 run is one scripts/net-neighbours.sh (`vmm serve`: the same guest,
# then 3 spinning one-vCPU neighbours per host CPU on the same executor,
# 4 vCPUs per host CPU in all; a guest that itself has more vCPUs than
# host CPUs spends minutes in stop_machine under kvm_pvm). Each run is a
# fresh namespace, tap and guest boot; its raw
# round-trip times go to OUT/<config>-<rep>.txt with the command, date,
# commit and machine in the header, and OUT/summary.txt gets one line per
# run (p50, p90, p99, max, replies). Needs root.
#
#   scripts/net-bench.sh --out DIR [--pings N] [--interval S]
#                        [--x4-pings N] [--x4-interval S]
#
# x1 runs send --pings (300) requests --interval (0.05 s) apart; x4 runs
# --x4-pings (60) one --x4-interval (1 s) apart: at 4x overcommit the
# guest answers fewer than 4 a second, so a faster rate would measure the
# queue of unanswered requests rather than each request's wakeup.
# DIR must not exist. VMM_BIN picks the binary (as for net-demo.sh).
set -euo pipefail
out= pings=300 interval=0.05 x4_pings=60 x4_interval=1
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --pings) pings=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --x4-pings) x4_pings=$2; shift 2 ;;
    --x4-interval) x4_interval=$2; shift 2 ;;
    *) echo "net-bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "net-bench.sh: give --out DIR (a new directory)" >&2; exit 2; }
[ -e "$out" ] && { echo "net-bench.sh: $out exists; give a new directory" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
cpus=$(nproc)
mkdir -p "$out"
# name sched neighbours (0: net-demo.sh, a `vmm run`)
configs=(
  "x1-host host 0"
  "x1-vcpu_sched vcpu_sched 0"
  "x4-host host $((3 * cpus))"
  "x4-vcpu_sched vcpu_sched $((3 * cpus))"
)
for rep in 1 2; do
  for c in "${configs[@]}"; do
    set -- $c
    echo "== $1 run $rep: --sched $2, $cpus guest vCPUs, $3 neighbours ($cpus host CPUs)"
    if [ "$3" -eq 0 ]; then
      run=("$here/net-demo.sh" --sched "$2" --vcpus "$cpus" --queues 1 --pings "$pings"
        --interval "$interval")
    else
      run=("$here/net-neighbours.sh" --sched "$2" --vcpus "$cpus" --neighbours "$3"
        --pings "$x4_pings" --interval "$x4_interval")
    fi
    line=$("${run[@]}" --out "$out/$1-$rep.txt" \
      | tee -a /dev/stderr | grep '^rtt ms:' || true)
    echo "$1 rep $rep: ${line:-no replies}" >>"$out/summary.txt"
  done
done
cat "$out/summary.txt"
