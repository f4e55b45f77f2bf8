#!/usr/bin/env bash
# Issue 11's targets: vcpu_sched (the workers executor, all fixes) against
# plain 1:1 vCPU threads scheduled by the host kernel, for messaging,
# cyclic, runq and transcode, at two points:
#   x1: one vCPU per host CPU, every vCPU pinned to a CPU of its own on
#       both sides (`vmm bench --pin`);
#   x4: 4 vCPUs per host CPU, nothing pinned (the host row's threads get
#       the whole host; the workers are pinned one per CPU, as always).
# Each point is one interleaved `vmm bench --compare "all;none"` run of REPS
# repetitions (default 5) of DURATION seconds (default 2): rows `all`
# (the baseline), its A/A row, `none`, and `host 1:1`. A host row whose
# min-max lies above the A/A band beats vcpu_sched; inside it, a tie (the
# band rule). The target's verdict comes from the paired reading instead:
# the host row's per-repetition ratios to `all` with a 95% bootstrap
# interval: met only when the whole interval says vcpu_sched is faster.
# Raw outputs (table, and JSON gzipped) go to OUT (default docs/data/targets),
# with OUT/meta.txt: the machine, the commit and whether the tree was dirty
# (scripts/machine-meta.sh);
# VMM_BIN picks the binary (default: a release build); WORKLOADS narrows it;
# COMPARE replaces the compared rows' flags (default: --compare all;none;
# scripts/executors.sh gives --compare-executors).
# With the default OUT and every workload, the Targets table of
# docs/results-vcpus.md is then rewritten from the new data (results_md
# --targets; RESULTS_MD picks that binary).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
out=${OUT:-docs/data/targets}
reps=${REPS:-5}
dur=${DURATION:-2}
vmm_binary
if [ -n "${COMPARE:-}" ]; then
    read -r -a compare <<<"$COMPARE"
else
    compare=(--compare "all;none")
fi
# what these runs ran on and from
record_meta "$out"
target_points
for workload in ${WORKLOADS:-messaging cyclic runq transcode}; do
    for point in x1 x4; do
        point_shape $point
        recorded_run "$out/$workload-$point" bench "$workload" "${shape[@]}" --duration "$dur" \
            --reps "$reps" "${compare[@]}"
    done
done
if [ "$out" = docs/data/targets ] && [ -z "${WORKLOADS:-}" ]; then
    if [ -z "${RESULTS_MD:-}" ]; then
        cargo build --quiet -p integration-tests --bin results_md
        RESULTS_MD=${CARGO_TARGET_DIR:-target}/debug/results_md
    fi
    "$RESULTS_MD" --targets docs/results-vcpus.md docs/results-vcpus.md
    echo "docs/results-vcpus.md: Targets table rewritten from $out"
fi
