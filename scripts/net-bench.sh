#!/usr/bin/env bash
# Guest-kernel ping round trips over virtio-net, under both schedulers, at
# one vCPU per host CPU and at 4x overcommit, each configuration twice
# (the second run is the A/A row: its difference from the first is the
# noise of this machine), in interleaved order. Each run is one
# scripts/net-demo.sh (a fresh namespace, tap and guest boot); its raw
# round-trip times go to OUT/<config>-<rep>.txt with the command, date,
# commit and machine in the header, and OUT/summary.txt gets one line per
# run (p50, p90, p99, max, replies). Needs root.
#
#   scripts/net-bench.sh --out DIR [--pings N] [--interval S]
#
# DIR must not exist. VMM_BIN picks the binary (as for net-demo.sh).
set -euo pipefail
out= pings=300 interval=0.05
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --pings) pings=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    *) echo "net-bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "net-bench.sh: give --out DIR (a new directory)" >&2; exit 2; }
[ -e "$out" ] && { echo "net-bench.sh: $out exists; give a new directory" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
cpus=$(nproc)
mkdir -p "$out"
# name sched vcpus queues
configs=(
  "x1-host host $cpus 1"
  "x1-vcpu_sched vcpu_sched $cpus 1"
  "x4-host host $((4 * cpus)) 1"
  "x4-vcpu_sched vcpu_sched $((4 * cpus)) 1"
)
for rep in 1 2; do
  for c in "${configs[@]}"; do
    set -- $c
    echo "== $1 run $rep: --sched $2 --vcpus $3 ($cpus host CPUs)"
    line=$("$here/net-demo.sh" --sched "$2" --vcpus "$3" --queues "$4" --pings "$pings" \
      --interval "$interval" --out "$out/$1-$rep.txt" | tee /dev/stderr | grep '^rtt ms:' || true)
    echo "$1 rep $rep: ${line:-no replies}" >>"$out/summary.txt"
  done
done
cat "$out/summary.txt"
