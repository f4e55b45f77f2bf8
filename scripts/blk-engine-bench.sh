#!/usr/bin/env bash
# virtio-blk request engines compared (`sync`, `pool`, `io_uring`): the
# measurement behind the default engine (docs/devices.md, "Block engine:
# measured choice").
#
# Micro-guests (one vCPU each, one VM per host CPU, `--executor host`: 1:1
# vCPU threads, as `--sched host` runs them) drive their virtio-blk at
# queue depth 1 and 32:
#   read:  random 4 KiB reads of a shared read-only image in the page cache
#          (the request path, no disk);
#   write: random 4 KiB writes, an image per VM (page cache, no flush);
#   flush: the integrity writer: generations of 32 4 KiB writes, each
#          generation followed by a flush (fdatasync on the host's file
#          system), every image verified after each run.
# read and write are `vmm bench blk --compare-engines sync,pool,io_uring`
# runs: the engines interleaved, REPS repetitions (default 5) of DURATION
# seconds (default 1), `sync` the baseline with its A/A row (sync again:
# its distance from the baseline is this run's noise). flush has no
# comparison mode in `vmm bench`, so this script interleaves its runs
# itself: per repetition sync, sync again (A/A), pool, io_uring, in a
# rotated order, and counts the writes flushed per second.
#
#   scripts/blk-engine-bench.sh [--out DIR] [--duration S] [--reps N]
#
# Raw outputs go to DIR (default docs/data/devices/blk-engine): each
# configuration's table (command, date, commit at its head) and JSON
# gzipped, flush.txt (every integrity run's output line per VM) and
# flush-summary.txt, and DIR/meta.txt (scripts/machine-meta.sh). VMM_BIN
# picks the binary (default: a release build).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
bench_args docs/data/devices/blk-engine 5 1 "$@"
vmm_binary
record_meta "$out"
ncpu=$(nproc)
# images on the file system of the checkout (not a tmpfs): a flush there
# costs what fdatasync costs on this host's disk
tmp=$(mktemp -d "$PWD/.blk-engine.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
dd if=/dev/zero of="$tmp/shared.img" bs=1M count=64 status=none
disks=()
for v in $(seq 0 $((ncpu - 1))); do
    dd if=/dev/zero of="$tmp/w$v.img" bs=1M count=64 status=none
    disks+=(--disk "$tmp/w$v.img")
done
cat "$tmp"/*.img >/dev/null
header() {
    echo "# vmm $*" | sed "s|$tmp/|TMP/|g"
    echo "# TMP/shared.img: 64 MiB of zeros in the page cache (read-only, shared); TMP/wN.img: one 64 MiB image per VM"
    echo "# $(date -u +%FT%TZ), commit $commit, dirty $dirty, $ncpu host CPUs (machine: meta.txt)"
}
for qd in 1 32; do
    for mode in read write; do
        f="$out/$mode-qd$qd"
        clear_old "$f.json" "$f.json.gz" "$f.txt"
        if [ $mode = read ]; then img=(--disk "$tmp/shared.img"); extra=(); else img=("${disks[@]}"); extra=(--write); fi
        cmd=(bench blk "${img[@]}" "${extra[@]}" --vms "$ncpu" --qd "$qd" --executor host
            --compare-engines sync,pool,io_uring --duration "$dur" --reps "$reps" --json "$f.json")
        { header "${cmd[@]}"; vmm "${cmd[@]}" 2>/dev/null; } >"$f.txt"
        gzip -9f "$f.json"
        echo "$f.txt"
    done
done
# flush: the integrity writer, interleaved here
rows=(sync sync pool io_uring)
labels=(sync "sync (A/A)" pool io_uring)
f="$out/flush.txt"
{
    header "bench blk --integrity ${disks[*]} --executor host --qd QD --per-gen 32 --duration $dur --engine E"
    echo "# qd rep row engine vm generations_flushed"
} >"$f"
for qd in 1 32; do
    for rep in $(seq 0 $((reps - 1))); do
        for k in 0 1 2 3; do
            r=$(((rep + k) % 4))
            e=${rows[$r]}
            vmm bench blk --integrity "${disks[@]}" --executor host --qd "$qd" --per-gen 32 \
                --duration "$dur" --engine "$e" 2>/dev/null |
                sed -n "s/^\(vm[0-9]*\): \([0-9]*\) generations flushed;.*/$qd $rep $r $e \1 \2/p" >>"$f"
        done
    done
done
python3 - "$f" "$dur" >"$out/flush-summary.txt" <<'EOF'
import statistics as st, sys
rows = ["sync", "sync (A/A)", "pool", "io_uring"]
path, dur = sys.argv[1], float(sys.argv[2])
per = {}
for line in open(path):
    if line.startswith("#"):
        continue
    qd, rep, r, _e, _vm, g = line.split()
    key = (int(qd), int(r))
    per.setdefault(key, {}).setdefault(int(rep), 0)
    per[key][int(rep)] += int(g) * 32
print("# flushed 4 KiB writes per second (all VMs), mean +- sd over the repetitions;")
print("# ratio: each repetition's value over the same repetition's sync baseline, mean +- sd")
for qd in (1, 32):
    base = per.get((qd, 0), {})
    print(f"qd {qd}:")
    for r, name in enumerate(rows):
        vals = per.get((qd, r), {})
        v = [vals[k] / dur for k in sorted(vals)]
        ratios = [vals[k] / base[k] for k in sorted(vals) if base.get(k)]
        if not v:
            continue
        sd = st.stdev(v) if len(v) > 1 else 0.0
        if not ratios:
            # no repetition flushed a generation on the baseline (a run
            # shorter than one generation): no ratio to give
            print(f"  {name:12} {st.mean(v):10.0f} +- {sd:7.0f}   ratio n/a (baseline flushed nothing)")
            continue
        rs = st.stdev(ratios) if len(ratios) > 1 else 0.0
        print(f"  {name:12} {st.mean(v):10.0f} +- {sd:7.0f}   ratio {100 * st.mean(ratios):6.1f}% +- {100 * rs:4.1f}%")
EOF
echo "$out/flush-summary.txt"
cat "$out/flush-summary.txt"
