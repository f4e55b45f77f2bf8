#!/usr/bin/env bash
# The A/B of the busy balance (a busy CPU with fair vCPUs waiting and no
# idle CPU to take one hands one, every balance interval, to a busy CPU
# with at least two fewer waiting: `SchedConfig::busy_balance`,
# docs/results-vcpus.md "Busy balance"): one interleaved
# `vmm bench --compare-busy-balance` run per workload and point, rows
# `no busy balance` (the baseline), its A/A row and `busy balance`, all
# fixes on the workers executor. Points as in scripts/targets.sh; the
# default is x4 only (4 vCPUs per host CPU, nothing pinned): at x1 every
# vCPU is pinned to a CPU of its own, so there is nothing to move
# (POINTS="x1 x4" measures that too). Besides the tables, prints per row
# the metric and the pushes per second (means over the repetitions, from
# the JSON).
# Raw outputs (table, JSON gzipped) go to OUT (default
# docs/data/busy-balance), with OUT/meta.txt (scripts/machine-meta.sh).
# VMM_BIN picks the binary (default: a release build); WORKLOADS
# (default: messaging runq transcode cyclic), POINTS (default: x4), REPS
# (default 8) and DURATION (seconds, default 2) size it.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
ab_setup docs/data/busy-balance 8
summary=$(cat <<'EOF'
from ab_summary import table, metric, per_s, counter
table("busy_balance", lambda r: str(r["busy_balance"]).lower(), [
    ("metric", metric, ".4g"),
    ("pushes/s", lambda r: per_s(r, counter(r, "busy_pushes")), ".0f"),
])
EOF
)
POINTS=${POINTS:-x4} ab_runs --compare-busy-balance "messaging runq transcode cyclic"
