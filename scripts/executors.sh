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
# The runs are scripts/targets.sh's, with --compare-executors as the rows.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/data/executors} REPS=${REPS:-8} DURATION=${DURATION:-1} \
    COMPARE=--compare-executors exec scripts/targets.sh
