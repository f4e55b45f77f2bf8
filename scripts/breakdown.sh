#!/usr/bin/env bash
# The wakeup breakdown of docs/breakdown.md: `vmm bench --breakdown` for
# messaging (doorbell wakeups), cyclic (timer wakeups), runq, transcode
# and blk (virtio-blk at queue depth 1: the I/O path's wakeups, one 1-vCPU
# micro-guest per vCPU slot over a sparse image made for the run), on the workers
# executor (vcpu_sched) and the host executor (1:1 threads), at one vCPU
# per host CPU and at 4x overcommit, each REPS times (default 3), the
# executors interleaved; then the same workers run without --breakdown,
# for what the stamps cost. Raw outputs go to OUT (default
# docs/data/breakdown), with OUT/meta.txt: the machine, the commit and
# whether the tree was dirty (scripts/machine-meta.sh). VMM_BIN picks the binary (default: a release build);
# WORKLOADS (default "messaging cyclic runq transcode blk"), REPS and DURATION
# (s) narrow it.
#
# `scripts/breakdown.sh --table` runs nothing: it prints the markdown tables
# of docs/breakdown.md from the raw outputs in OUT (median of the
# repetitions, min-max for the metric; per stage the median of each run's
# p50 and p99, in us; stages without samples are left out).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
out=${OUT:-docs/data/breakdown}
reps=${REPS:-3}
dur=${DURATION:-2}

# median, min and max of the numbers on stdin, one per line
med() { sort -g | awk '{v[NR]=$1} END {if (NR == 0) {print "-"; exit}
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%s %s %s\n", m, v[1], v[NR]}'; }

# the stage rows of a `vmm bench --breakdown` output: name<TAB>count<TAB>p50<TAB>p99
stage_rows() {
    awk 'FNR == 1 {on = 0}
         /wakeup breakdown/ {on = 1; next}
         on && /^    (doorbell|timer|block|io):/ {name = $1; for (i = 2; i <= NF - 4; i++) name = name " " $i
                        printf "%s\t%s\t%s\t%s\n", name, $(NF - 3), $(NF - 2), $(NF - 1)}' "$@"
}

table() {
    if [ -f "$out/meta.txt" ]; then
        printf 'Machine (`%s/meta.txt`): %s, %s CPUs, Linux %s, /dev/kvm: %s; commit `%s`, dirty: %s; %s.\n' "$out" \
            "$(sed -n 's/^cpu=//p' "$out/meta.txt")" "$(sed -n 's/^nproc=//p' "$out/meta.txt")" \
            "$(sed -n 's/^kernel=//p' "$out/meta.txt")" "$(sed -n 's/^kvm=//p' "$out/meta.txt")" \
            "$(sed -n 's/^commit=//p' "$out/meta.txt")" "$(sed -n 's/^dirty=//p' "$out/meta.txt")" \
            "$(sed -n 's/^date=//p' "$out/meta.txt")"
    fi
    for workload in messaging cyclic runq transcode blk; do
        local files=("$out/$workload"-x*-*.txt)
        [ -e "${files[0]}" ] || continue
        local metric
        metric=$(sed -n 2p "${files[0]}" | sed -E 's/.*: ([a-z0-9_]+) = .*/\1/')
        local stages=()
        # in the order vmm prints them, those with samples in any run
        mapfile -t stages < <(stage_rows "${files[@]}" | awk -F '\t' '
            !($1 in ord) {ord[$1] = ++n; name[n] = $1}
            $2 > 0 {has[$1] = 1}
            END {for (i = 1; i <= n; i++) if (name[i] in has) print name[i]}')
        printf '\n#### %s\n\nRaw outputs: `%s/%s-x*-*.txt`, each starting with its command.\n\n| point | executor | %s |' "$workload" "$out" "$workload" "$metric"
        for st in "${stages[@]}"; do printf ' %s, p50 / p99 |' "$st"; done
        printf '\n|---|---|---|'
        for st in "${stages[@]}"; do printf -- '---|'; done
        printf '\n'
        for over in 1 4; do
            for exec in host workers workers-plain; do
                local runs=("$out/$workload-x$over-$exec"-[0-9]*.txt)
                [ -e "${runs[0]}" ] || continue
                local m
                m=$(for f in "${runs[@]}"; do sed -n 2p "$f" | sed -E 's/.* = ([0-9.eE+-]+) .*/\1/'; done | med)
                read -r mm mlo mhi <<<"$m"
                printf '| x%s | %s | %s (%s-%s) |' "$over" "${exec/-plain/, no stamps}" "$mm" "$mlo" "$mhi"
                for st in "${stages[@]}"; do
                    if [ "$exec" = workers-plain ]; then printf ' |'; continue; fi
                    local p50 p99
                    p50=$(stage_rows "${runs[@]}" | awk -F '\t' -v s="$st" '$1 == s && $2 > 0 {print $3}' | med | cut -d' ' -f1)
                    p99=$(stage_rows "${runs[@]}" | awk -F '\t' -v s="$st" '$1 == s && $2 > 0 {print $4}' | med | cut -d' ' -f1)
                    if [ "$p50" = - ]; then printf ' - |'; else printf ' %s / %s |' "$p50" "$p99"; fi
                done
                printf '\n'
            done
        done
    done
}

if [ "${1:-}" = --table ]; then
    table
    exit 0
fi
vmm_binary
record_meta "$out"
ncpu=$(nproc)
img=${TMPDIR:-/tmp}/breakdown-blk-$$.img
trap 'rm -f "$img"' EXIT
for workload in ${WORKLOADS:-messaging cyclic runq transcode blk}; do
    # cyclic's vCPUs are RT: both executors' threads run at host SCHED_FIFO
    # (vmm bench's default), as the host baseline's vCPU threads do
    extra=()
    for over in 1 4; do
        vcpus=$((ncpu * over))
        shape=(--vms 1 --vcpus "$vcpus")
        if [ "$workload" = blk ]; then
            truncate -s 256M "$img"
            shape=(--vms "$vcpus" --disk "$img" --qd 1)
        fi
        for r in $(seq "$reps"); do
            for exec in workers host; do
                f="$out/$workload-x$over-$exec-$r.txt"
                cmd=(bench "$workload" "${shape[@]}" --duration "$dur" --executor "$exec" --breakdown "${extra[@]}")
                echo "# vmm ${cmd[*]}" >"$f"
                vmm "${cmd[@]}" >>"$f" 2>/dev/null
                echo "$f"
            done
            f="$out/$workload-x$over-workers-plain-$r.txt"
            cmd=(bench "$workload" "${shape[@]}" --duration "$dur" --executor workers "${extra[@]}")
            echo "# vmm ${cmd[*]}" >"$f"
            vmm "${cmd[@]}" >>"$f" 2>/dev/null
            echo "$f"
        done
    done
done
table
