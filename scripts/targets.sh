#!/usr/bin/env bash
# Every target of vcpu_sched (the workers executor, all fixes) against
# plain 1:1 vCPU threads scheduled by the host kernel, measured in parts
# (PARTS, default "cpu io ping boot"; each part's rows interleaved, with an
# A/A row, REPS repetitions, default 8):
#   cpu:  messaging, cyclic, runq and transcode (WORKLOADS narrows them) at
#         two points:
#           x1: one vCPU per host CPU, every vCPU pinned to a CPU of its
#               own on both sides (`vmm bench --pin`);
#           x4: 4 vCPUs per host CPU, nothing pinned (the host row's
#               threads get the whole host; the workers are pinned one
#               per CPU, as always);
#         each point one interleaved `vmm bench --compare "all;none"` run
#         of DURATION seconds (default 2) per repetition: rows `all` (the
#         baseline), its A/A row, `none`, and `host 1:1`; raw outputs
#         (table, gzipped JSON) in OUT (default docs/data/targets);
#   io:   virtio-blk random reads at queue depth 1 and 32, the same points
#         (scripts/targets-io.sh; docs/data/targets-io);
#   ping: the guest kernel's ICMP round trip over virtio-net, p50 and p99
#         (scripts/targets-ping.sh, needs root; docs/data/targets-ping);
#   boot: the Linux guest on 2 nodes x 6 vCPUs booted to its root sched
#         domain, one VM and then 4 VMs at once (vmm/scripts/boot-sched.sh;
#         docs/data/targets-boot/vms1 and vms4: each boot's log,
#         boots.tsv, paired.txt = `results_md --boot-pairs` with the
#         target's limit, 1.1x for one VM, 1.0x for 4; BOOT_VMS="1" or
#         "4" measures one of the two; B_ARGS="FLAGS" adds boot-sched.sh's
#         B row, vcpu_sched with those flags, paired with vcpu_sched).
# A verdict is the paired reading: each repetition's ratio to the `all`
# run of the same repetition, with a 95% bootstrap interval; met only when
# the whole interval says vcpu_sched did at least as well.
# Each directory gets meta.txt: the machine, the commit and whether the
# tree was dirty (scripts/machine-meta.sh). VMM_BIN picks the binary
# (default: a release build); COMPARE replaces the cpu part's compared
# rows (default: --compare all;none; scripts/executors.sh gives
# --compare-executors). On 2 CPUs under kvm_pvm a full run takes about
# 4 hours (boot: 2 h, ping: 70 min).
# With the default directories and no WORKLOADS, the Targets tables of
# docs/results-vcpus.md, and the summary of every target there, are then
# rewritten from all the data in them (results_md --targets; RESULTS_MD
# picks that binary).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
out=${OUT:-docs/data/targets}
reps=${REPS:-8}
dur=${DURATION:-2}
parts=${PARTS:-cpu io ping boot}
for part in $parts; do
    case $part in
        cpu | io | ping | boot) ;;
        *) echo "$me: PARTS: unknown part '$part' (give some of: cpu io ping boot)" >&2; exit 2 ;;
    esac
done
case " $parts " in *" ping "*) need_root "the ping part: network namespaces and taps; PARTS without ping otherwise" ;; esac
vmm_binary
export VMM_BIN=$bin
if [ -z "${RESULTS_MD:-}" ]; then
    cargo build --quiet -p integration-tests --bin results_md
    RESULTS_MD=$(realpath "${CARGO_TARGET_DIR:-target}/debug/results_md")
fi
export RESULTS_MD
target_points

cpu_part() {
    local compare
    if [ -n "${COMPARE:-}" ]; then
        read -r -a compare <<<"$COMPARE"
    else
        compare=(--compare "all;none")
    fi
    # what these runs ran on and from
    record_meta "$out"
    for workload in ${WORKLOADS:-messaging cyclic runq transcode}; do
        for point in x1 x4; do
            point_shape $point
            recorded_run "$out/$workload-$point" bench "$workload" "${shape[@]}" --duration "$dur" \
                --reps "$reps" "${compare[@]}"
        done
    done
}

boot_part() {
    local vms dir limit
    for vms in ${BOOT_VMS:-1 4}; do
        dir=docs/data/targets-boot/vms$vms
        limit=1.1
        [ "$vms" = 1 ] || limit=1.0
        record_meta "$dir"
        echo "== boot: $vms VM(s) at once, $reps repetitions of host, vcpu_sched and its A/A row${B_ARGS:+ and B (vcpu_sched $B_ARGS)}"
        VMS=$vms OUT=$dir vmm/scripts/boot-sched.sh "$reps" | tee "$dir/boots.tsv.new"
        mv "$dir/boots.tsv.new" "$dir/boots.tsv"
        "$RESULTS_MD" --boot-pairs "$dir/boots.tsv" "$limit" | tee "$dir/paired.txt"
    done
}

for part in $parts; do
    case $part in
        cpu) cpu_part ;;
        # (OUT names the cpu part's directory only)
        io) env -u OUT REPS="$reps" DURATION="$dur" scripts/targets-io.sh ;;
        ping) env -u OUT REPS="$reps" scripts/targets-ping.sh ;;
        boot) boot_part ;;
    esac
done
if [ "$out" = docs/data/targets ] && [ -z "${WORKLOADS:-}" ]; then
    "$RESULTS_MD" --targets docs/results-vcpus.md docs/results-vcpus.md
    echo "docs/results-vcpus.md: Targets tables and the summary of every target rewritten"
fi
