#!/bin/bash
# One VM (12 vCPUs, 2 nodes) booted to its root sched domain under
# --sched vcpu_sched, alternating two binaries, N pairs; each boot's
# stderr to DIR/NAME-REP.log. Used for the busy balance's cost on one VM:
#   run.sh OFF_BIN ON_BIN N DIR
# (OFF_BIN: release binary of ca79f2c, busy balance off; ON_BIN: the
# busy balance with the CPU-bound rule and 100 ms persistence, on by
# default in that build for `vmm run` too.)
set -euo pipefail
cd "$(dirname "$0")/../../../.."
K=.cache/guest/kernel/vmlinux; I=.cache/guest/initramfs.cpio.gz
for rep in $(seq 1 "$3"); do
  for side in off on; do
    if [ $side = off ]; then b=$1; else b=$2; fi
    "$b" -v run --kernel $K --initrd $I --memory 768M --guest "package:2 [numa] die:3 l3:1 l2:1 core:2 pu:1" \
      --sched vcpu_sched --cmdline "loglevel=8 sched_verbose" --until "root domain span" --timeout 20m \
      >/dev/null 2>"$4/$side-$rep.log" || true
    echo "$side $rep $(grep -o 'matched after [0-9.]* s' "$4/$side-$rep.log" | awk '{print $3}') $(grep -o 'busy_pushes=[0-9]*' "$4/$side-$rep.log")"
  done
done
