#!/usr/bin/env bash
# What idle Linux guests cost the host under `vmm serve`: VMS VMs
# (default 1) of the 12-vCPU boot shape are booted to their root sched
# domain, left SETTLE seconds (default 20) to go idle, and then each
# server thread's CPU time is measured over SECONDS (default 30).
#
#   vmm/scripts/idle-cost.sh VMM_BIN EXECUTOR [SECONDS] [serve flags...]
#   e.g. vmm/scripts/idle-cost.sh target/release/vmm workers 30
#
# Prints one line per thread kind (workers, halt poller, clock, block
# watch, vCPU threads under `--executor host`): CPU seconds over the
# window and the share of one CPU. Nothing is written but a temporary
# directory, removed at the end.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
BIN=$1 EXE=$2
SECS=${3:-30}
shift $(($# >= 3 ? 3 : 2))
VMS=${VMS:-1}
SETTLE=${SETTLE:-20}
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/lib/serve.sh
source scripts/lib/serve.sh
K=$PWD/.cache/guest/kernel/vmlinux
I=$PWD/.cache/guest/initramfs.cpio.gz
[[ -f $K && -f $I ]] || { echo "build the guest first: guest/build.sh" >&2; exit 1; }
D=$(mktemp -d)
sock=$D/api.sock
"$BIN" serve --api-socket "$sock" --executor "$EXE" "$@" 2>"$D/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$D"' EXIT
serve_wait "$sock" "$pid"
for i in $(seq "$VMS"); do
    serve_api "$sock" "$D/answer" PUT "vms/i$i/vm.create" "$(boot_vm_body "$K" "$I" "$D/console-$i.log")"
    serve_api "$sock" "$D/answer" PUT "vms/i$i/vm.boot"
done
for _ in $(seq 300); do
    n=$({ grep -l "root domain span" "$D"/console-*.log 2>/dev/null || true; } | wc -l)
    [ "$n" -ge "$VMS" ] && break
    kill -0 "$pid" 2>/dev/null || { echo "vmm serve ended early: $(tail -3 "$D/serve.log")" >&2; exit 1; }
    sleep 1
done
[ "$n" -ge "$VMS" ] || { echo "the guests did not print their root sched domain in 5 minutes" >&2; exit 1; }
sleep "$SETTLE"
sample() { awk '{gsub(/[()]/, "", $2); k = $2; sub(/\/.*/, "", k); sub(/[0-9]+$/, "", k); u[k] += $14 + $15}
    END {for (k in u) print k, u[k]}' /proc/"$pid"/task/*/stat; }
sample >"$D/a"
sleep "$SECS"
sample >"$D/b"
echo "# $BIN serve --executor $EXE $*: $VMS idle VM(s) of 12 vCPUs, ${SECS} s after ${SETTLE} s of settling"
awk -v s="$SECS" 'NR == FNR {a[$1] = $2; next}
    {d = ($2 - a[$1]) / 100; if (d > 0) printf "cpu %-16s %7.2f s  (%.1f%% of one CPU)\n", $1, d, 100 * d / s}' \
    "$D/a" "$D/b" | sort
