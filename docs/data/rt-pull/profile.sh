#!/usr/bin/env bash
# Reproduces docs/breakdown.md "The RT pull's lock wait": a build of commit
# 22ee457 with profile.patch (temporary timers around the parts of
# `schedule`, printed at exit; and VS_CLOCK_ABOVE, the clock thread's host
# priority above the workers', 1 in the code), then cyclic at x4 (8 FIFO
# vCPUs on the 2 CPUs) with the waiting RT pull, the clock 1 and 0 above
# the workers, alternated, RUNS runs each (default 3), then REPS (default
# 10) alternated pairs of the same through scripts/ab-bench.sh.
#   git worktree add /tmp/prof 22ee457 && cd /tmp/prof && git apply docs/data/rt-pull/profile.patch
#   CARGO_TARGET_DIR=/tmp/prof-target cargo build --release -p vmm
#   PROF_VMM=/tmp/prof-target/release/vmm docs/data/rt-pull/profile.sh > docs/data/rt-pull/profile.txt 2>&1
set -euo pipefail
cd "$(dirname "$0")/../../.."
vmm=${PROF_VMM:?the profiling build of vmm}
args=(cyclic --vms 4 --vcpus 2 --duration 2 --executor workers --mitigations all --rt-pull wait)
for r in $(seq 1 "${RUNS:-3}"); do
    for above in 1 0; do
        echo "== run $r, clock $above above the workers: vmm bench ${args[*]} --breakdown"
        VS_CLOCK_ABOVE=$above "$vmm" bench "${args[@]}" --breakdown 2>&1 | grep -v "^\s*$"
    done
done
for above in 1 0; do
    printf '#!/bin/sh\nVS_CLOCK_ABOVE=%s exec %s "$@"\n' "$above" "$vmm" >"/tmp/vmm-clock$above"
    chmod +x "/tmp/vmm-clock$above"
done
echo "== A/B: A = clock 1 above, B = clock 0 above (B/A below 1: B better)"
scripts/ab-bench.sh /tmp/vmm-clock1 /tmp/vmm-clock0 "${args[@]:0:1}" "${REPS:-10}" -- "${args[@]:1}"
echo "== A/A: clock 1 above, both sides"
scripts/ab-bench.sh /tmp/vmm-clock1 /tmp/vmm-clock1 "${args[@]:0:1}" "${REPS:-10}" -- "${args[@]:1}"
