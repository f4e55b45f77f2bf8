#!/usr/bin/env bash
# Measures guest boot times with the real `vmm` binary: the time from the
# vCPUs' start to a console line, as `vmm -v run` reports it
# ("--until matched after X s"), plus the process's wall time.
#
#   vmm/scripts/boot-times.sh [REPS]          # default 3 repetitions
#
# Milestones (one boot each, stopped with --until):
#   domains  "root domain span"          all CPUs up, sched domains built
#   init     "Run /init as init process"  the kernel hands over to /init
#   topo     "VMMTOPO END"               /init printed its topology block
#            (only where guest userspace runs, i.e. not under kvm_pvm)
# Prints the machine, the commit and whether the tree was dirty
# (scripts/machine-meta.sh, as `# key=value` lines), then one tab-separated
# line per run:
#   kernel  shape  vcpus  milestone  rep  seconds_to_line  wall_seconds  load1
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=${1:-3}
VMM=${VMM_BIN:-${CARGO_TARGET_DIR:-target}/debug/vmm}
K=.cache/guest/kernel/vmlinux
BZ=.cache/guest/kernel/bzImage
STOCK=.cache/guest/stock/vmlinux
I=.cache/guest/initramfs.cpio.gz
[[ -x $VMM ]] || { echo "build vmm first: cargo build -p vmm" >&2; exit 1; }
[[ -f $K && -f $I ]] || { echo "build the guest first: guest/build.sh" >&2; exit 1; }
scripts/machine-meta.sh "# "

one() { # kernel shape memory milestone regex [extra args...]
    local kernel=$1 shape=$2 mem=$3 milestone=$4 re=$5
    shift 5
    local vcpus
    vcpus=$("$VMM" topology guest -g "$shape" --json | grep -c '"apic_id"')
    for rep in $(seq 1 "$REPS"); do
        local t0 t1 line
        t0=$(date +%s.%N)
        line=$("$VMM" -v run --kernel "$kernel" --initrd "$I" --memory "$mem" \
            --guest "$shape" --cmdline "loglevel=8 sched_verbose" \
            --until "$re" --timeout 20m "$@" 2>&1 >/dev/null |
            grep -o 'matched after [0-9.]* s' || echo "matched after NA s")
        t1=$(date +%s.%N)
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%s\n' "$(basename "$(dirname "$kernel")")/$(basename "$kernel")" \
            "$shape" "$vcpus" "$milestone" "$rep" "$(awk '{print $3}' <<<"$line")" \
            "$(echo "$t1 - $t0" | bc)" "$(cut -d' ' -f1 /proc/loadavg)"
    done
}

SHAPES=(
    "package:2 [numa] l3:1 l2:2 core:1 pu:2"
    "package:2 [numa] die:3 l3:1 l2:1 core:2 pu:1"
    "package:2 [numa] l3:1 l2:3 core:1 pu:2"
    "package:2 die:2 [numa] l3:1 l2:2 core:1 pu:1"
    "package:2 [numa] l3:1 l2:2 core:2 pu:1"
)
for s in "${SHAPES[@]}"; do
    extra=()
    [[ $s == *"core:2 pu:1" && $s != *die* ]] && extra=(--vendor intel)
    mem=768M
    [[ $s == "${SHAPES[0]}" ]] && mem=512M
    one "$K" "$s" "$mem" domains "root domain span" "${extra[@]}"
done
one "$BZ" "${SHAPES[0]}" 512M domains "root domain span"
if [[ -e /sys/module/kvm_pvm ]]; then
    one "$K" "${SHAPES[0]}" 512M init "Run /init as init process"
else
    one "$K" "${SHAPES[0]}" 512M topo "VMMTOPO END"
fi
if [[ -f $STOCK ]]; then
    one "$STOCK" "${SHAPES[0]}" 1G domains "root domain span"
fi
