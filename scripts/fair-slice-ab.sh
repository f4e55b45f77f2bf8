#!/usr/bin/env bash
# The A/B of the fair bounds' scaling (`SchedConfig::fair_slice_scaling`:
# Linux's 6 ms latency, 0.75 ms min granularity and 1 ms wakeup
# granularity as given, or times 1 + log2(min(CPUs, 8)) as Linux does;
# docs/results-vcpus.md "Slice bounds that grow with the CPUs"): one
# interleaved `vmm bench --compare-fair-slice-scaling` run per workload and
# point, rows `unscaled slices` (the baseline), its A/A row and
# `log-scaled slices`, all fixes on the workers executor. Only the fair
# workloads (messaging, runq; cyclic and transcode run RT vCPUs, which fair
# bounds do not touch). Points as in scripts/targets.sh (x1: one pinned
# vCPU per host CPU; x4: 4 per CPU, nothing pinned). Besides the tables,
# prints per row the metric and the context switches per second (means
# over the repetitions, from the JSON).
# Raw outputs (table, JSON gzipped) go to OUT (default
# docs/data/fair-slice/ab), with OUT/meta.txt (scripts/machine-meta.sh).
# VMM_BIN picks the binary (default: a release build); WORKLOADS
# (default: messaging runq), POINTS (default: x1 x4), REPS (default 8) and
# DURATION (seconds, default 2) size it.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
ab_setup docs/data/fair-slice/ab 8
summary=$(cat <<'EOF'
from ab_summary import table, metric, per_s, counter
table("scaling", lambda r: f'{r["fair_slice_scaling"]} {r["fair_slice_ns"][0] / 1e6:g} ms', [
    ("metric", metric, ".4g"),
    ("switches/s", lambda r: per_s(r, counter(r, "switches")), ".0f"),
])
EOF
)
ab_runs --compare-fair-slice-scaling "messaging runq"
