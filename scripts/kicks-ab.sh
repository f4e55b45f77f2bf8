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
import json, sys
d = json.load(open(sys.argv[1]))
rows = {}
for r in d["reports"]:
    c = r["run"]["counters"]
    wakes = c["wake_direct"] + c["wake_queued"]
    exits = sum(v.get("window_exits", 0) for v in r["per_vcpu"])
    pk = sum(v.get("preempt_kicks", 0) for v in r["per_vcpu"])
    rows.setdefault(r["kicks"], []).append((
        c["wake_kicks"] / max(wakes, 1),
        c.get("wake_deferred", 0) / max(wakes, 1),
        exits / r["run"]["duration_s"],
        pk / r["run"]["duration_s"],
        r["run"]["metric"]["value"],
    ))
print(f"{'kicks':<8} {'runs':>4} {'kicks/wake':>10} {'deferred/wake':>13} {'exits/s':>10} {'vCPU kicks/s':>12} {'metric':>10}")
for k, v in rows.items():
    n = len(v)
    m = [sum(x[i] for x in v) / n for i in range(5)]
    print(f"{k:<8} {n:>4} {m[0]:>10.3f} {m[1]:>13.3f} {m[2]:>10.0f} {m[3]:>12.0f} {m[4]:>10.4g}")
EOF
)
ab_runs --compare-kicks "messaging runq cyclic transcode"
