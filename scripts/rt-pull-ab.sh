#!/usr/bin/env bash
# The A/B of the bounded RT pull (a CPU that lowers its priority passes by
# a pull source whose runqueue lock another thread holds, and asks it to
# push, instead of waiting for the lock; `SchedConfig::bounded_rt_pull`,
# docs/breakdown.md "The RT pull's lock wait"): one interleaved
# `vmm bench --compare-rt-pull` run per RT workload and point, rows `waiting
# RT pull` (the protocol before, the baseline), its A/A row and `bounded
# RT pull`, all fixes on the workers executor. Points as in
# scripts/targets.sh (x1: one pinned vCPU per host CPU; x4: 4 vCPUs per
# host CPU, nothing pinned). Besides the tables, prints per row the RT
# pulls, the sources passed by and the time per `schedule` call (means
# over the repetitions, from the JSON).
# Raw outputs (table, JSON gzipped) go to OUT (default docs/data/rt-pull),
# with OUT/meta.txt (scripts/machine-meta.sh). VMM_BIN picks the binary
# (default: a release build); WORKLOADS (default: cyclic transcode),
# POINTS (default: x1 x4), REPS (default 10) and DURATION (seconds,
# default 2) size it.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
ab_setup docs/data/rt-pull 10
summary=$(cat <<'EOF'
from ab_summary import table, metric, per_s, counter
table("rt_pull", lambda r: r["rt_pull"], [
    ("pulls/s", lambda r: per_s(r, counter(r, "rt_pulls")), ".0f"),
    ("passed by/s", lambda r: per_s(r, counter(r, "rt_pull_busy")), ".0f"),
    ("pushes/s", lambda r: per_s(r, counter(r, "rt_pushes")), ".0f"),
    ("ns/schedule", lambda r: r["run"]["sched_ns_per_call"], ".0f"),
    ("metric", metric, ".4g"),
])
EOF
)
ab_runs --compare-rt-pull "cyclic transcode"
