#!/usr/bin/env bash
# The A/B of lazy kicks (fix 5's wake list: a fair wakeup that would not
# preempt a busy CPU is not kicked; docs/scheduler.md): one interleaved
# `vmm bench --compare-kicks` run per workload and point, rows `eager
# kicks` (the protocol before, the baseline), its A/A row and `lazy kicks`,
# every scheduler row with all fixes on the workers executor. Points as in
# scripts/targets.sh:
#   x1: one vCPU per host CPU, each pinned to a CPU of its own (--pin);
#   x4: 4 vCPUs per host CPU, nothing pinned.
# Besides the tables, prints per row the kicks and wake-list deferrals per
# wakeup and the vCPU exits per second (means over the repetitions, from
# the JSON), and the preemption kicks that reached running vCPUs per
# second: what the change is meant to cut.
# Raw outputs (table, JSON gzipped, the counter summary) go to OUT
# (default docs/data/kicks), with OUT/meta.txt (scripts/machine-meta.sh).
# VMM_BIN picks the binary (default: a release build); WORKLOADS narrows
# it (default: messaging runq cyclic transcode), POINTS (default: x1 x4);
# REPS (default 8) and DURATION (seconds, default 2) size it.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
ab_setup docs/data/kicks 8
summary=$(cat <<'EOF'
from ab_summary import table, metric, per_s, counter
def wakes(r):
    return max(counter(r, "wake_direct") + counter(r, "wake_queued"), 1)
def vcpus(r, name):
    return sum(v.get(name, 0) for v in r["per_vcpu"])
table("kicks", lambda r: r["kicks"], [
    ("kicks/wake", lambda r: counter(r, "wake_kicks") / wakes(r), ".3f"),
    ("deferred/wake", lambda r: counter(r, "wake_deferred") / wakes(r), ".3f"),
    ("exits/s", lambda r: per_s(r, vcpus(r, "window_exits")), ".0f"),
    ("vCPU kicks/s", lambda r: per_s(r, vcpus(r, "preempt_kicks")), ".0f"),
    ("metric", metric, ".4g"),
])
EOF
)
ab_runs --compare-kicks "messaging runq cyclic transcode"
