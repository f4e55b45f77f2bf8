#!/usr/bin/env bash
# Issue 11's boot target: the minimal kernel on 2 nodes x 6 vCPUs, booted
# until the guest prints its root sched domain, under `--sched host` (a
# thread per vCPU, the host kernel schedules) and `--sched vcpu_sched`
# (the workers executor, all fixes), REPS times each (default 2),
# interleaved. The whole `vmm -v run` log of each boot goes to OUT
# (default docs/data/boot-sched), one tab-separated line per boot to
# stdout:
#   sched  rep  seconds_to_root_domain  wall_seconds  load1
# Each log starts with the command, then the machine, the commit the
# binary was built from and whether the tree was dirty
# (scripts/machine-meta.sh, taken once when the binary is built), then the
# boot's own date. VMM_BIN picks the binary (default: a release build).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=${1:-2}
OUT=${OUT:-docs/data/boot-sched}
if [ -z "${VMM_BIN:-}" ]; then
    cargo build --release --quiet -p vmm
    VMM_BIN=${CARGO_TARGET_DIR:-target}/release/vmm
fi
K=.cache/guest/kernel/vmlinux
I=.cache/guest/initramfs.cpio.gz
[[ -f $K && -f $I ]] || { echo "build the guest first: guest/build.sh" >&2; exit 1; }
SHAPE="package:2 [numa] die:3 l3:1 l2:1 core:2 pu:1"
mkdir -p "$OUT"
meta=$(scripts/machine-meta.sh "# ")
for rep in $(seq 1 "$REPS"); do
    for sched in host vcpu_sched; do
        log=$OUT/$sched-$rep.log
        cmd=("$VMM_BIN" -v run --kernel "$K" --initrd "$I" --memory 768M --guest "$SHAPE"
            --sched "$sched" --cmdline "loglevel=8 sched_verbose" --until "root domain span" --timeout 20m)
        t0=$(date +%s.%N)
        { echo "# ${cmd[*]}"; echo "$meta"; echo "# boot started $(date -u +%FT%TZ)"; "${cmd[@]}" 2>&1 >/dev/null || true; } >"$log"
        t1=$(date +%s.%N)
        secs=$(grep -o 'matched after [0-9.]* s' "$log" | awk '{print $3}' || true)
        wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')
        printf '%s\t%s\t%s\t%s\t%s\n' "$sched" "$rep" "${secs:-NA}" "$wall" "$(cut -d' ' -f1 /proc/loadavg)"
    done
done
