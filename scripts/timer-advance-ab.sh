#!/usr/bin/env bash
# The A/B of the workers executor's timer advance (an idle worker parks
# ahead of a vCPU's sleep timer, by an advance learnt from how late its
# parks return, and polls the rest of the way: `ExecConfig::timer_advance`,
# docs/results-vcpus.md "Timer advance"): one interleaved
# `vmm bench --compare-timer-advance` run per workload and point, rows
# `no timer advance` (parking until the timer is due, the baseline), its
# A/A row and `timer advance`, all fixes on the workers executor. Points
# as in scripts/targets.sh (x1: one pinned vCPU per host CPU; x4: 4 vCPUs
# per host CPU, nothing pinned). Besides the tables, prints per row the
# metric, the p50 of the timer latency and the CPU time the idle workers
# polled (ms per CPU per second of run; means over the repetitions, from
# the JSON).
# Raw outputs (table, JSON gzipped) go to OUT (default
# docs/data/timer-advance), with OUT/meta.txt (scripts/machine-meta.sh).
# VMM_BIN picks the binary (default: a release build); WORKLOADS
# (default: cyclic), POINTS (default: x1 x4), REPS (default 10) and
# DURATION (seconds, default 2) size it.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
ab_setup docs/data/timer-advance 10
summary=$(cat <<'EOF'
from ab_summary import table, metric, per_s
def extra(r, name):
    return r["run"]["extra"].get(name, 0.0)
table("timer_advance", lambda r: r["timer_advance"], [
    ("metric", metric, ".4g"),
    ("p50 ns", lambda r: extra(r, "p50_ns"), ".0f"),
    # the spin counter covers the whole run (warm-up included)
    ("spin ms/CPU/s", lambda r: per_s(r, extra(r, "timer_spin_ms_per_cpu")), ".2f"),
])
EOF
)
ab_runs --compare-timer-advance "cyclic"
