#!/usr/bin/env bash
# Where a multi-VM Linux boot spends the host's CPUs: VMS VMs (default 4)
# of the 12-vCPU boot shape on one `vmm serve`, booted at once, with
# every guest console kept and each server thread's CPU time sampled
# every 5 s, until every VM printed its root sched domain.
#
#   vmm/scripts/boot-diag.sh VMM_BIN EXECUTOR OUTDIR [serve flags...]
#   e.g. vmm/scripts/boot-diag.sh target/release/vmm workers /tmp/d --busy-balance off
#
# OUTDIR gets console-N.log (each guest's console), counters-bN.json
# (vm.counters at the end), counters.txt (every VM's vm.counters per
# sample, "T seconds bN json"), threads.txt ("T
# seconds" then one "name utime stime" line per thread, in clock ticks,
# per sample), serve.log and summary.txt: the wall time, each thread
# kind's CPU seconds (workers, halt poller, clock, block watch) and, per
# VM, the guest timestamps of four boot milestones (memory set up, SMP
# bring-up start and end, root domain). This is the instrument behind
# the 4-VM boot analysis in docs/results-vcpus.md ("Linux boot"); the
# timed runs themselves are boot-sched.sh's.
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,18p' "$0" >&2; exit 2; }
BIN=$1 EXE=$2 D=$3
shift 3
VMS=${VMS:-4}
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/lib/serve.sh
source scripts/lib/serve.sh
K=$PWD/.cache/guest/kernel/vmlinux
I=$PWD/.cache/guest/initramfs.cpio.gz
[[ -f $K && -f $I ]] || { echo "build the guest first: guest/build.sh" >&2; exit 1; }
LINE="root domain span"
# never delete what the caller named: OUTDIR must be new or empty
if [ -e "$D" ] && [ -n "$(ls -A "$D" 2>/dev/null)" ]; then
    echo "$D exists and is not empty: give a new directory" >&2
    exit 2
fi
mkdir -p "$D"
sock=$D/api.sock
"$BIN" -v serve --api-socket "$sock" --executor "$EXE" "$@" 2>"$D/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
serve_wait "$sock" "$pid"
for i in $(seq "$VMS"); do
    serve_api "$sock" "$D/answer" PUT "vms/b$i/vm.create" "$(boot_vm_body "$K" "$I" "$D/console-$i.log")"
done
t0=$(date +%s.%N)
for i in $(seq "$VMS"); do serve_api "$sock" "$D/answer" PUT "vms/b$i/vm.boot"; done
el=0
while :; do
    el=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
    # one process per sample (thread names have no spaces here)
    { echo "T $el"; awk '{gsub(/[()]/, "", $2); print $2, $14, $15}' /proc/"$pid"/task/*/stat 2>/dev/null || true; } >>"$D/threads.txt"
    # each VM's counters (per vCPU: exits, and under M:N its ms on a worker)
    for i in $(seq "$VMS"); do
        if serve_api "$sock" "$D/sample.json" GET "vms/b$i/vm.counters" 2>/dev/null; then
            echo "T $el b$i $(cat "$D/sample.json")" >>"$D/counters.txt"
        fi
    done
    n=$({ grep -l "$LINE" "$D"/console-*.log 2>/dev/null || true; } | wc -l)
    [ "$n" -ge "$VMS" ] && break
    kill -0 "$pid" 2>/dev/null || { echo "vmm serve ended early (see $D/serve.log)" >&2; exit 1; }
    awk -v e="$el" 'BEGIN {exit !(e > 1800)}' && { echo "not every VM printed the line in 30 min" >&2; exit 1; }
    sleep 5
done
# each VM's exits by reason and, on the workers, the shared scheduler's
# counters, at the moment the last VM printed the line
for i in $(seq "$VMS"); do
    serve_api "$sock" "$D/counters-b$i.json" GET "vms/b$i/vm.counters" || true
done
serve_api "$sock" "$D/answer" PUT vmm.shutdown 2>/dev/null || true
wait "$pid" 2>/dev/null || true
{
    echo "# $BIN serve --executor $EXE $*; $VMS VMs; every VM printed \"$LINE\" by $el s (5 s samples)"
    # the last sample's CPU time per thread kind (ticks of 1/100 s)
    awk -v wall="$el" '
        /^T / {delete u; next}
        { k = $1; sub(/\/.*/, "", k); sub(/[0-9]+$/, "", k); u[k] += $2 + $3 }
        END { for (k in u) if (u[k] > 0) printf "cpu %-16s %8.1f s  (%.0f%% of one CPU)\n", k, u[k] / 100, 100 * u[k] / 100 / wall }
    ' "$D/threads.txt" | sort
    for i in $(seq "$VMS"); do
        f=$D/console-$i.log
        m() { grep -m1 "$1" "$f" | cut -c2-13 | tr -d ' ' || true; }
        echo "vm b$i: memory $(m 'Memory: ') smp-start $(m 'smp: Bringing up') smp-end $(m 'smp: Brought up') root-domain $(m "$LINE")"
    done
} >"$D/summary.txt"
cat "$D/summary.txt"
