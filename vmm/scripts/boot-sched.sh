#!/usr/bin/env bash
# The Linux boot target: the minimal kernel on 2 nodes x 6 vCPUs, booted
# until the guest prints its root sched domain, under `--sched host` (a
# thread per vCPU, the host kernel schedules) and `--sched vcpu_sched`
# (the workers executor, all fixes), with an A/A row: a second
# `vcpu_sched` boot (`vcpu_sched-aa`) in every repetition. REPS
# repetitions (first argument, default 2); the three rows (four with
# B_ARGS, below) run back to back
# in an order that rotates from one repetition to the next, so no row
# always goes first.
#
# VMS=N (default 1) boots N such VMs at once on the host's CPUs: one
# `vmm serve` per boot, its executor `host` or `workers`, N VMs created
# and booted through the API one after the other; the boot's time is the
# time from the first `vm.boot` until the last VM printed the line (each
# VM's own time is in the log). With VMS=1 each boot is one `vmm run`.
# SERVE_ARGS adds flags to the workers rows' `vmm serve` (VMS>1 only),
# e.g. SERVE_ARGS="--busy-balance off".
#
# B_ARGS, when given, adds a fourth row, `vcpu_sched-b`: `vcpu_sched` with
# these flags added to its `vmm run` (VMS=1) or `vmm serve` (VMS>1), e.g.
# B_ARGS="--fair-slice-scaling none", which `results_md --boot-pairs`
# pairs with `vcpu_sched` as it pairs the A/A row (an A/B of the setting).
#
# The whole log of each boot goes to OUT (default docs/data/boot-sched),
# one tab-separated line per boot to stdout:
#   sched  rep  seconds_to_root_domain  wall_seconds  load1
# (`results_md --boot-pairs` reads these lines). Each log starts with the
# command, then the machine, the commit the binary was built from and
# whether the tree was dirty (scripts/machine-meta.sh, taken once when the
# binary is built), then the boot's own date. A log already in OUT is
# kept and its line printed again (a stopped run goes on where it
# stopped). VMM_BIN picks the binary (default: a release build).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=${1:-2}
OUT=${OUT:-docs/data/boot-sched}
VMS=${VMS:-1}
[[ $REPS =~ ^[1-9][0-9]*$ ]] || { echo "boot-sched.sh: REPS $REPS: give a count of repetitions" >&2; exit 2; }
[[ $VMS =~ ^[1-9][0-9]?$ ]] || { echo "boot-sched.sh: VMS=$VMS: give 1 to 99 VMs" >&2; exit 2; }
if [ -z "${VMM_BIN:-}" ]; then
    cargo build --release --quiet -p vmm
    VMM_BIN=${CARGO_TARGET_DIR:-target}/release/vmm
fi
K=$PWD/.cache/guest/kernel/vmlinux
I=$PWD/.cache/guest/initramfs.cpio.gz
[[ -f $K && -f $I ]] || { echo "build the guest first: guest/build.sh" >&2; exit 1; }
# shellcheck source=scripts/lib/serve.sh
source scripts/lib/serve.sh
SHAPE=$BOOT_SHAPE
LINE="root domain span"
mkdir -p "$OUT"
meta=$(scripts/machine-meta.sh "# ")
ROWS=(host vcpu_sched vcpu_sched-aa)
read -r -a B_FLAGS <<<"${B_ARGS:-}"
if [ "${#B_FLAGS[@]}" -gt 0 ]; then ROWS+=(vcpu_sched-b); fi

# sched_of ROW: what --sched the row boots under; b_flags ROW: its B flags
sched_of() { local s=${1%-aa}; echo "${s%-b}"; }
b_flags() { if [ "$1" = vcpu_sched-b ]; then printf '%s\n' "${B_FLAGS[@]}"; fi; }

# boot_one SCHED LOG: one `vmm run`; the log gets its stderr.
boot_one() {
    local sched extra=()
    sched=$(sched_of "$1")
    mapfile -t extra < <(b_flags "$1")
    local cmd=("$VMM_BIN" -v run --kernel "$K" --initrd "$I" --memory 768M --guest "$SHAPE"
        --sched "$sched" "${extra[@]}" --cmdline "loglevel=8 sched_verbose" --until "$LINE" --timeout 20m)
    { echo "# ${cmd[*]}"; echo "$meta"; echo "# boot started $(date -u +%FT%TZ)"; "${cmd[@]}" 2>&1 >/dev/null || true; } >"$2"
}

# boot_many SCHED LOG: VMS VMs at once on one `vmm serve`; the log gets
# the server's stderr, each VM's time and, at the end, `matched after X s`
# (the last VM) when all of them printed the line within 20 minutes.
boot_many() {
    local executor=host dir sock pid i t0 now done_n extra=()
    if [ "$(sched_of "$1")" = vcpu_sched ]; then
        executor=workers
        read -r -a extra <<<"${SERVE_ARGS:-}"
        mapfile -t -O "${#extra[@]}" extra < <(b_flags "$1")
    fi
    dir=$(mktemp -d)
    sock=$dir/api.sock
    {
        echo "# $VMM_BIN serve --api-socket SOCK --executor $executor ${extra[*]}; $VMS VMs of --guest \"$SHAPE\", 768M, --cmdline \"loglevel=8 sched_verbose\", until \"$LINE\""
        echo "$meta"
        echo "# boot started $(date -u +%FT%TZ)"
    } >"$2"
    "$VMM_BIN" -v serve --api-socket "$sock" --executor "$executor" "${extra[@]}" 2>"$dir/serve.log" &
    pid=$!
    serve_wait "$sock" "$pid" || true
    # a refused request goes to the boot's log as a comment line
    api() { serve_api "$sock" "$dir/answer" "$@" 2> >(sed 's/^/# /' >>"$LOG"); }
    LOG=$2
    local ok=1
    for i in $(seq "$VMS"); do
        api PUT "vms/b$i/vm.create" "$(boot_vm_body "$K" "$I" "$dir/console-$i.log")" || ok=
    done
    t0=$(date +%s.%N)
    if [ -n "$ok" ]; then
        for i in $(seq "$VMS"); do api PUT "vms/b$i/vm.boot" || ok=; done
    fi
    declare -A seen=()
    done_n=0
    while [ -n "$ok" ] && [ "$done_n" -lt "$VMS" ]; do
        now=$(date +%s.%N)
        for i in $(seq "$VMS"); do
            if [ -z "${seen[$i]:-}" ] && grep -q "$LINE" "$dir/console-$i.log" 2>/dev/null; then
                seen[$i]=1
                done_n=$((done_n + 1))
                awk -v a="$t0" -v b="$now" -v i="$i" 'BEGIN {printf "# VM b%s printed the line after %.2f s\n", i, b - a}' >>"$LOG"
            fi
        done
        if [ "$done_n" -eq "$VMS" ]; then
            awk -v a="$t0" -v b="$now" 'BEGIN {printf "matched after %.2f s (the last of the VMs)\n", b - a}' >>"$LOG"
        elif ! kill -0 "$pid" 2>/dev/null; then
            echo "# vmm serve ended before every VM printed the line" >>"$LOG"; ok=
        elif awk -v a="$t0" -v b="$now" 'BEGIN {exit !(b - a > 1200)}'; then
            echo "# not every VM printed the line within 20 minutes" >>"$LOG"; ok=
        else
            sleep 0.2
        fi
    done
    api PUT vmm.shutdown 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    cat "$dir/serve.log" >>"$LOG"
    rm -rf "$dir"
}

for rep in $(seq 1 "$REPS"); do
    # rotate: repetition r starts with row (r - 1) mod the rows
    for k in "${!ROWS[@]}"; do
        sched=${ROWS[$(( (rep - 1 + k) % ${#ROWS[@]} ))]}
        if [ "$VMS" = 1 ]; then log=$OUT/$sched-$rep.log; else log=$OUT/$sched-$rep-vms$VMS.log; fi
        if [ -s "$log" ] && grep -q 'matched after' "$log"; then
            wall=NA load=NA
        else
            t0=$(date +%s.%N)
            if [ "$VMS" = 1 ]; then boot_one "$sched" "$log"; else boot_many "$sched" "$log"; fi
            t1=$(date +%s.%N)
            wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')
            load=$(cut -d' ' -f1 /proc/loadavg)
        fi
        secs=$(grep -o 'matched after [0-9.]* s' "$log" | awk '{print $3}' || true)
        printf '%s\t%s\t%s\t%s\t%s\n' "$sched" "$rep" "${secs:-NA}" "$wall" "$load"
    done
done
