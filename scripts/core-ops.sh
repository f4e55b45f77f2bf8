#!/usr/bin/env bash
# The scheduler core's cost per operation, against Linux's on the same
# machine (docs/results-scheduler.md "Per operation"):
#
#  1. `cargo bench -p benches --bench core_ops`: criterion medians of one
#     `wake`, one `schedule` and one `tick` of vcpu_sched (fair and RT,
#     each fix alone, all, and an A/A row), and the accesses each call
#     makes (see benches/benches/core_ops.rs). Output: OUT/core_ops.txt.
#  2. Linux's own handoff on this machine, the operation the core's wake +
#     schedule pair stands for: `perf bench sched pipe` with both tasks
#     pinned to one CPU (every round trip is two wakeups, two blocking
#     `schedule`s and two context switches, plus four pipe syscalls),
#     nice 0 and SCHED_FIFO 50, and `perf bench syscall basic` for the
#     syscall floor; REPS runs each, alternated. Output: OUT/linux.txt.
#
# OUT defaults to docs/data/core-ops; OUT/meta.txt records the machine
# and commit (scripts/machine-meta.sh). Needs perf (Debian: linux-perf)
# for step 2 and root for SCHED_FIFO. REPS (default 5) sizes step 2; set
# SKIP_BENCH=1 to rerun step 2 only.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
out=${OUT:-docs/data/core-ops}
reps=${REPS:-5}
if ! command -v perf >/dev/null; then
    echo "core-ops.sh: perf is missing; install it (Debian: apt-get install linux-perf)" >&2
    exit 2
fi
record_meta "$out"
if [ "${SKIP_BENCH:-0}" != 1 ]; then
    {
        echo "# cargo bench -p benches --bench core_ops  ($(date -u +%FT%TZ), commit $commit, dirty=$dirty)"
        cargo bench -p benches --bench core_ops 2>&1 |
            grep -v '^Benchmarking\|^ *Warning\|^Found\|outliers\|^ *[0-9]* (.*%) \(low\|high\)'
    } >"$out/core_ops.txt"
    sed -n '/^### core_ops/,$p' "$out/core_ops.txt"
fi

cpu=$(taskset -pc $$ | sed 's/.*: *//; s/[,-].*//')
pipe() { # pipe CMD...: usecs per round trip, perf run under CMD
    "$@" perf bench sched pipe -T -l 100000 2>&1 | awk '/usecs\/op/ { print $1 }'
}
{
    echo "# scripts/core-ops.sh step 2 ($(date -u +%FT%TZ), commit $commit), host CPU $cpu, $reps runs alternated"
    echo "# rep  pipe_fair_us_per_roundtrip  pipe_fifo50_us_per_roundtrip  syscall_us"
    for r in $(seq 1 "$reps"); do
        f=$(pipe taskset -c "$cpu")
        x=$(pipe chrt -f 50 taskset -c "$cpu")
        s=$(perf bench syscall basic 2>&1 | awk '/usecs\/op/ { print $1 }')
        echo "$r $f $x $s"
    done
} | tee "$out/linux.txt"
python3 - "$out/linux.txt" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
col = lambda i: sorted(float(r[i]) for r in rows)
for name, i in (("nice 0", 1), ("FIFO 50", 2)):
    v = col(i)
    s = statistics.median(col(3))
    per = [x / 2 for x in v]
    net = [x - 2 * s for x in per]
    print(f"Linux handoff, {name}: {statistics.median(per) * 1000:.0f} ns per wakeup+switch "
          f"(runs {min(per) * 1000:.0f}-{max(per) * 1000:.0f}); "
          f"less two syscalls ({s * 1000:.0f} ns each): {statistics.median(net) * 1000:.0f} ns")
EOF
