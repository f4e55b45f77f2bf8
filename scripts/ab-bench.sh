#!/usr/bin/env bash
# A/B of two vmm binaries on one `vmm bench` workload: runs them in turn,
# REPS pairs, alternating which goes first in each pair (so that an order
# effect cancels), and prints each pair and the B/A ratios with their
# mean and range. For changes that are not a switchable fix (those are
# compared inside one run with --compare).
#
#   scripts/ab-bench.sh A_BIN B_BIN WORKLOAD [REPS] [-- extra vmm bench args]
#
# Example (the RT placement change, docs/results-scheduler.md):
#   git worktree add /tmp/old 8d1a47c
#   (cd /tmp/old && CARGO_TARGET_DIR=$PWD/../old-target cargo build --release -p vmm)
#   cargo build --release -p vmm
#   scripts/ab-bench.sh /tmp/old-target/release/vmm target/release/vmm transcode 11 -- \
#       --topology host --vms 8 --vcpus 8 --duration 2 --mitigations none
set -euo pipefail

if [ $# -lt 3 ]; then
    sed -n '2,14p' "$0" >&2
    exit 2
fi
a=$1 b=$2 w=$3
reps=${4:-5}
shift $(( $# >= 4 ? 4 : 3 ))
[ "${1:-}" = "--" ] && shift
for bin in "$a" "$b"; do
    if [ ! -x "$bin" ]; then
        echo "error: $bin is not an executable vmm binary (build it with cargo build --release -p vmm)" >&2
        exit 2
    fi
done
if ! [[ "$reps" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: REPS must be a positive number, not '$reps'" >&2
    exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

one() { # BIN ARGS... -> the run's metric value
    local bin=$1
    shift
    rm -f "$tmp/r.json" # vmm never replaces a file
    "$bin" bench "$w" "$@" --json "$tmp/r.json" >"$tmp/out" 2>&1 || {
        echo "error: $bin bench $w failed:" >&2
        tail -5 "$tmp/out" >&2
        exit 1
    }
    # The JSON is pretty-printed: the first "value" after "metric" is it.
    awk '/"metric": *\{/ { m = 1 } m && /"value":/ { gsub(/[",]/, ""); print $2; exit }' "$tmp/r.json"
}

echo "# $w: A=$a B=$b, $reps pairs, args: $*"
ratios=()
for r in $(seq 1 "$reps"); do
    if (( r % 2 )); then
        va=$(one "$a" "$@"); vb=$(one "$b" "$@")
    else
        vb=$(one "$b" "$@"); va=$(one "$a" "$@")
    fi
    if [ -z "$va" ] || [ -z "$vb" ]; then
        echo "error: no metric value in the JSON of pair $r" >&2
        exit 1
    fi
    if awk -v a="$va" -v b="$vb" 'BEGIN { exit !(a == 0 || b == 0) }'; then
        echo "error: pair $r measured nothing (A $va, B $vb): a longer --duration?" >&2
        exit 1
    fi
    ratio=$(awk -v a="$va" -v b="$vb" 'BEGIN { printf "%.3f", b / a }')
    ratios+=("$ratio")
    echo "pair $r: A $va  B $vb  B/A $ratio"
done
printf '%s\n' "${ratios[@]}" | awk '
    { r[NR] = $1; s += $1; if (NR == 1 || $1 < lo) lo = $1; if (NR == 1 || $1 > hi) hi = $1 }
    END {
        m = s / NR; v = 0
        for (i = 1; i <= NR; i++) v += (r[i] - m) ^ 2
        sd = NR > 1 ? sqrt(v / (NR - 1)) : 0
        printf "B/A: mean %.3f, stddev %.3f, min %.3f, max %.3f (metric'"'"'s own direction: for a latency, below 1 is better)\n", m, sd, lo, hi
    }'
