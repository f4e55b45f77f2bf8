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
# min-max lies above the A/A band beats vcpu_sched; inside it, a tie.
# Raw outputs (table, and JSON gzipped) go to OUT (default docs/data/targets);
# VMM_BIN picks the binary (default: a release build); WORKLOADS narrows it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-docs/data/targets}
reps=${REPS:-5}
dur=${DURATION:-2}
if [ -n "${VMM_BIN:-}" ]; then
    vmm() { "$VMM_BIN" "$@"; }
else
    cargo build --release --quiet -p vmm
    vmm() { target/release/vmm "$@"; }
fi
mkdir -p "$out"
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
        cmd=(bench "$workload" "${shape[@]}" --duration "$dur" --reps "$reps" --compare "all;none" --json "$f.json")
        { echo "# vmm ${cmd[*]}"; echo "# $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $ncpu host CPUs"; vmm "${cmd[@]}" 2>/dev/null; } >"$f.txt"
        # the JSON keeps every run's histograms: megabytes, compressed well
        gzip -9f "$f.json"
        echo "$f.txt"
    done
done
