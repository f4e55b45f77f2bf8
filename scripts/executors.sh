#!/usr/bin/env bash
# Which executor runs KVM vCPUs by default: the M:N workers (a worker per
# host CPU runs vCPU fds) or threads (a thread per vCPU, run slots handed
# over). Both run the same vCPU body and the same scheduler core with the
# same mitigation set (all) and the same host thread policy (workload
# defaults: cyclic and transcode at host SCHED_FIFO on both executors, the
# others SCHED_OTHER; recorded as thread_policy in the JSON). For each
# workload, at two points:
#   x1: one vCPU per host CPU, every vCPU pinned to a CPU of its own
#       (`vmm bench --pin`);
#   x4: 4 vCPUs per host CPU, nothing pinned.
# Each point is one interleaved `vmm bench --compare-executors` run of
# REPS repetitions (default 8) of DURATION seconds (default 1): rows
# `all` on workers (the baseline), its A/A row, `all on threads`, and the
# host 1:1 row. The paired reading (threads' per-repetition ratio to
# workers, 95% bootstrap interval) decides: an interval that excludes
# 100% is a difference, one that straddles it a tie.
# Raw outputs (table, and JSON gzipped) go to OUT (default
# docs/data/executors), with OUT/meta.txt: the machine, the commit and
# whether the tree was dirty (scripts/machine-meta.sh). VMM_BIN picks the
# binary (default: a release build); WORKLOADS narrows it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-docs/data/executors}
reps=${REPS:-8}
dur=${DURATION:-1}
target=${CARGO_TARGET_DIR:-target}
if [ -n "${VMM_BIN:-}" ]; then
    vmm() { "$VMM_BIN" "$@"; }
else
    cargo build --release --quiet -p vmm
    vmm() { "$target/release/vmm" "$@"; }
fi
mkdir -p "$out"
scripts/machine-meta.sh >"$out/meta.txt"
commit=$(sed -n 's/^commit=//p' "$out/meta.txt")
dirty=$(sed -n 's/^dirty=//p' "$out/meta.txt")
ncpu=$(nproc)
# messaging pairs its vCPUs: an even count per VM
n1=$((ncpu / 2 * 2))
((n1 >= 2)) || { echo "error: needs at least 2 host CPUs" >&2; exit 1; }
for workload in ${WORKLOADS:-messaging cyclic runq transcode}; do
    for point in x1 x4; do
        if [ $point = x1 ]; then
            shape=(--vms 1 --vcpus "$n1" --pin)
        else
            shape=(--vms 4 --vcpus "$n1")
        fi
        f="$out/$workload-$point"
        # vmm never replaces a file: this script regenerates its own output
        rm -f "$f.json" "$f.json.gz"
        cmd=(bench "$workload" "${shape[@]}" --duration "$dur" --reps "$reps" --compare-executors --json "$f.json")
        { echo "# vmm ${cmd[*]}"; echo "# $(date -u +%FT%TZ), commit $commit, dirty $dirty, $ncpu host CPUs (machine: meta.txt)"; vmm "${cmd[@]}" 2>/dev/null; } >"$f.txt"
        gzip -9f "$f.json"
        echo "$f.txt"
    done
done
