#!/usr/bin/env bash
# What the simulator's reporting sync layer costs the hot paths when no
# simulation runs: the criterion benches of every fix (cpupri, rto,
# shared_rq, idle, wakeup, group_load) built without feature `sim` (plain
# std atomics and locks: the production form) and with it (every shared
# atomic and lock first reads a thread-local flag: what `vmm` builds by
# default), in alternating passes: plain, sim, plain, sim, ... The two
# plain passes are the A/A: a difference inside their spread is noise.
#
#   scripts/sync-layer-ab.sh [PASSES_PER_BUILD]   (default 2)
#
# BENCH_WRITERS=1 (single writer; wakeup still uses one waker and the
# target) unless set. Prints one markdown table, bench by pass (criterion's
# point estimate of the time per iteration), to stdout; criterion's own
# output goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
PASSES=${1:-2}
export BENCH_WRITERS=${BENCH_WRITERS:-1}
BENCHES=(--bench cpupri --bench rto --bench shared_rq --bench idle --bench wakeup --bench group_load)
CRIT=(--warm-up-time 1 --measurement-time 3 --noplot)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# build both forms first, so no pass waits for a compile
cargo bench -p benches "${BENCHES[@]}" --no-run --quiet 2>/dev/null
cargo bench -p benches --features sim "${BENCHES[@]}" --no-run --quiet 2>/dev/null

cols=()
for p in $(seq 1 "$PASSES"); do
    for form in plain sim; do
        feat=()
        [ "$form" = sim ] && feat=(--features sim)
        name=$form-$p
        cols+=("$name")
        echo "== pass $name" >&2
        # "ID  time: [lo mid hi]" (a long ID gets a line of its own)
        cargo bench -p benches "${feat[@]}" "${BENCHES[@]}" -- "${CRIT[@]}" 2>/dev/null \
            | tee /dev/stderr \
            | awk '/^[a-z_]+\/[^ ]+/ { id = $1 }
                   /time:/ { sub(/.*time: *\[/, ""); print id "\t" $3 " " $4 }' >"$tmp/$name"
    done
done

printf '| bench |'
printf ' %s |' "${cols[@]}"
printf '\n|---|'
printf -- '---|%.0s' "${cols[@]}"
printf '\n'
cut -f1 "$tmp/${cols[0]}" | while read -r id; do
    printf '| %s |' "$id"
    for c in "${cols[@]}"; do
        printf ' %s |' "$(awk -F'\t' -v id="$id" '$1 == id { print $2 }' "$tmp/$c")"
    done
    printf '\n'
done
