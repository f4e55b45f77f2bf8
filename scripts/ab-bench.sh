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
#       --topology host --vms 8 --vcpus 8 --duration 2 --mitigations none --no-host
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
    "$bin" bench "$w" "$@" --json "$tmp/r.json" >"$tmp/out" 2>&1 || {
        echo "error: $bin bench $w failed:" >&2
        tail -5 "$tmp/out" >&2
        exit 1
    }
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run"]["metric"]["value"])' "$tmp/r.json"
}

echo "# $w: A=$a B=$b, $reps pairs, args: $*"
ratios=()
for r in $(seq 1 "$reps"); do
    if (( r % 2 )); then
        va=$(one "$a" "$@"); vb=$(one "$b" "$@")
    else
        vb=$(one "$b" "$@"); va=$(one "$a" "$@")
    fi
    ratio=$(python3 -c "print(f'{$vb/$va:.3f}')")
    ratios+=("$ratio")
    echo "pair $r: A $va  B $vb  B/A $ratio"
done
python3 - "${ratios[@]}" <<'EOF'
import statistics, sys
r = [float(x) for x in sys.argv[1:]]
sd = statistics.stdev(r) if len(r) > 1 else 0.0
print(f"B/A: mean {statistics.mean(r):.3f}, stddev {sd:.3f}, min {min(r):.3f}, max {max(r):.3f} "
      f"(metric's own direction: for a latency, below 1 is better)")
EOF
