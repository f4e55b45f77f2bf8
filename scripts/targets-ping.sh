#!/usr/bin/env bash
# The ping target: the guest kernel's ICMP round trip over virtio-net, p50
# and p99, under vcpu_sched (all fixes) against plain 1:1 vCPU threads
# scheduled by the host kernel, at the two points of the Targets:
#   x1: `scripts/net-demo.sh`, a Linux guest with one vCPU per host CPU
#       (300 pings 0.05 s apart);
#   x4: `scripts/net-neighbours.sh`, the same guest on `vmm serve` with 3
#       spinning one-vCPU neighbours per host CPU, 4 vCPUs per host CPU in
#       all (60 pings 1 s apart: at 4x the guest answers fewer than 4 a
#       second, so a faster rate would measure the queue).
# Every repetition boots a fresh guest per row: `all` (the baseline), its
# A/A row `all (A/A)` (the same again) and `host 1:1`, in an order that
# rotates from one repetition to the next. REPS repetitions (default 8).
# Per point and percentile: the paired ratio (geometric mean of each
# repetition's `all` / row, above 100%: the row is faster than `all`)
# with a 95% bootstrap interval (`results_md --ping-table`); the target is
# met when the host row's whole interval lies below 100%, missed when
# above.
# Raw round-trip times go to OUT (default docs/data/targets-ping),
# OUT/<point>-<row>-<rep>.txt, each headed by its command, date and
# commit; OUT/meta.txt records the machine; OUT/summary.md the table. A
# file already there is kept (a stopped run goes on where it stopped);
# `--table` only prints the table from OUT. Needs root, the guest kernel
# (guest/build.sh) and about 70 minutes on 2 CPUs under kvm_pvm. VMM_BIN
# picks the binary (default: a release build).
#
# An A/B of a `vmm serve` setting at x4 reuses all of it: B_ARGS="FLAGS"
# adds a row `b` (`all` with those flags; the table's row `B`), POINTS
# picks the points (default "x1 x4"; `b` needs net-neighbours.sh, so x4
# only), ROWS the rows (default "all host all-aa", with B_ARGS "all b
# all-aa"), e.g.
#   OUT=DIR POINTS=x4 B_ARGS="--sleeper-credit on" scripts/targets-ping.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
out=${OUT:-docs/data/targets-ping}
reps=${REPS:-8}

# the table, by the reading the summary of every target uses (results_md
# --ping-table; RESULTS_MD picks that binary)
table() {
    if [ -z "${RESULTS_MD:-}" ]; then
        cargo build --quiet -p integration-tests --bin results_md
        RESULTS_MD=${CARGO_TARGET_DIR:-target}/debug/results_md
    fi
    "$RESULTS_MD" --ping-table "$out" "$reps"
}

if [ "${1:-}" = --table ]; then
    table
    exit 0
fi
read -r -a points <<<"${POINTS:-x1 x4}"
b_args=()
if [ -n "${B_ARGS:-}" ]; then
    read -r -a b_args <<<"$B_ARGS"
    read -r -a rows <<<"${ROWS:-all b all-aa}"
else
    read -r -a rows <<<"${ROWS:-all host all-aa}"
fi
for p in "${points[@]}"; do
    case $p in x1 | x4) ;; *) echo "targets-ping.sh: POINTS: $p is not a point (x1, x4)" >&2; exit 2 ;; esac
done
for r in "${rows[@]}"; do
    case $r in
        all | host | all-aa) ;;
        b)
            [ ${#b_args[@]} -gt 0 ] || { echo "targets-ping.sh: ROWS has b: give its vmm serve flags in B_ARGS" >&2; exit 2; }
            for p in "${points[@]}"; do
                [ "$p" = x4 ] || { echo "targets-ping.sh: the row b runs on vmm serve (net-neighbours.sh): POINTS=x4" >&2; exit 2; }
            done
            ;;
        *) echo "targets-ping.sh: ROWS: $r is not a row (all, host, all-aa, b)" >&2; exit 2 ;;
    esac
done
need_root "network namespaces and taps"
vmm_binary
export VMM_BIN=$bin
record_meta "$out"
# what the B row is
if [ ${#b_args[@]} -gt 0 ]; then
    echo "b_args=${b_args[*]}" >>"$out/meta.txt"
fi
target_points
nrows=${#rows[@]}
for rep in $(seq "$reps"); do
    for point in "${points[@]}"; do
        for k in $(seq 0 $((nrows - 1))); do
            row=${rows[$(((k + rep) % nrows))]}
            f="$out/$point-$row-$rep.txt"
            [ -e "$f" ] && continue
            sched=vcpu_sched
            [ "$row" = host ] && sched=host
            if [ "$point" = x1 ]; then
                run=(scripts/net-demo.sh --sched "$sched" --vcpus "$ncpu" --queues 1
                    --pings 300 --interval 0.05)
            else
                run=(scripts/net-neighbours.sh --sched "$sched" --vcpus "$ncpu"
                    --neighbours $((3 * ncpu)) --pings 60 --interval 1)
                if [ "$row" = b ]; then
                    for a in "${b_args[@]}"; do run+=(--serve-arg "$a"); done
                fi
            fi
            echo "== rep $rep $point $row: ${run[*]}"
            if ! "${run[@]}" --out "$f.new" >"$f.log" 2>&1; then
                echo "   failed (its output: $f.log)" >&2
                rm -f "$f.new"
                continue
            fi
            mv "$f.new" "$f"
            grep '^rtt ms:' "$f.log" || true
            rm -f "$f.log"
        done
    done
done
table | tee "$out/summary.md"
