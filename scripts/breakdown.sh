#!/usr/bin/env bash
# The wakeup breakdown of docs/breakdown.md: `vmm bench --breakdown` for
# messaging (doorbell wakeups) and cyclic (timer wakeups), on the workers
# executor (vcpu_sched) and the host executor (1:1 threads), at one vCPU
# per host CPU and at 4x overcommit, each REPS times (default 3), the
# executors interleaved; then the same workers run without --breakdown,
# for what the stamps cost. Raw outputs go to OUT (default
# docs/data/breakdown). VMM_BIN picks the binary (default: a release build);
# WORKLOADS (default "messaging cyclic"), REPS and DURATION (s) narrow it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-docs/data/breakdown}
reps=${REPS:-3}
dur=${DURATION:-2}
if [ -n "${VMM_BIN:-}" ]; then
    vmm() { "$VMM_BIN" "$@"; }
else
    cargo build --release --quiet -p vmm
    vmm() { target/release/vmm "$@"; }
fi
mkdir -p "$out"
ncpu=$(nproc)
for workload in ${WORKLOADS:-messaging cyclic}; do
    # cyclic's vCPUs are RT: both executors' threads run at host SCHED_FIFO
    # (vmm bench's default), as the host baseline's vCPU threads do
    extra=()
    for over in 1 4; do
        vcpus=$((ncpu * over))
        for r in $(seq "$reps"); do
            for exec in workers host; do
                f="$out/$workload-x$over-$exec-$r.txt"
                cmd=(bench "$workload" --vms 1 --vcpus "$vcpus" --duration "$dur" --executor "$exec" --breakdown "${extra[@]}")
                echo "# vmm ${cmd[*]}" >"$f"
                vmm "${cmd[@]}" >>"$f" 2>/dev/null
                echo "$f"
            done
            f="$out/$workload-x$over-workers-plain-$r.txt"
            cmd=(bench "$workload" --vms 1 --vcpus "$vcpus" --duration "$dur" --executor workers "${extra[@]}")
            echo "# vmm ${cmd[*]}" >"$f"
            vmm "${cmd[@]}" >>"$f" 2>/dev/null
            echo "$f"
        done
    done
done
