#!/usr/bin/env bash
# Regenerates the measured tables of docs/results-scheduler.md and
# docs/results-vcpus.md: runs every comparison they present, keeps each
# one's raw JSON in docs/data/NAME.json with the date, commit and machine
# in docs/data/results-meta.txt, and rewrites the sections between
# `<!-- results:begin NAME -->` and `<!-- results:end -->` from that JSON
# (tests/src/bin/results_md.rs); the prose around them is left alone.
#
#   scripts/results.sh                      full size: a release build, 3 x 2 s per row
#                                           (tens of minutes; run it on a quiet machine)
#   scripts/results.sh --small [--out DIR]  tiny runs into DIR (default: a new temporary
#                                           directory), docs/ untouched: a test of this
#                                           script (tests/tests/doc_commands.rs runs it)
#
# VMM_BIN=PATH uses that vmm binary instead of building one; RESULTS_MD=PATH
# that results_md binary.
set -euo pipefail
cd "$(dirname "$0")/.."

small=0
out=""
while [ $# -gt 0 ]; do
    case $1 in
        --small) small=1 ;;
        --out)
            [ $# -ge 2 ] || { echo "error: --out needs a directory" >&2; exit 2; }
            out=$2
            shift
            ;;
        -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if ((small)); then
    out=${out:-$(mktemp -d)}
    data=$out/data
    docs_out=$out
elif [ -n "$out" ]; then
    echo "error: --out goes with --small (a full run writes docs/)" >&2
    exit 2
else
    data=docs/data
    docs_out=docs
fi
mkdir -p "$data"

target=${CARGO_TARGET_DIR:-target}
if [ -z "${VMM_BIN:-}" ]; then
    if ((small)); then
        cargo build --quiet -p vmm
        VMM_BIN=$target/debug/vmm
    else
        cargo build --quiet --release -p vmm
        VMM_BIN=$target/release/vmm
    fi
fi
if [ -z "${RESULTS_MD:-}" ]; then
    cargo build --quiet -p integration-tests --bin results_md
    RESULTS_MD=$target/debug/results_md
fi

meta=$data/results-meta.txt
# Gathered into a new file and moved into place: truncating the tracked meta
# file first would make machine-meta.sh report the tree as dirty.
meta_new=$(mktemp "$data/.results-meta.XXXXXX")
{
    # date, commit, dirty, cpu, cpu_vendor, cpu_family, nproc, kernel, kvm
    scripts/machine-meta.sh
    echo "mode=$( ((small)) && echo small || echo full)"
    # the binary's build, not its path on this machine
    echo "vmm=$("$VMM_BIN" --version 2>/dev/null || echo vmm) ($( ((small)) && echo debug || echo release) build)"
} >"$meta_new"
mv "$meta_new" "$meta"

# run NAME ARGS...: one comparison, its JSON to $data/NAME.json; the exact
# command goes to the meta file for the doc.
run() {
    local name=$1
    shift
    local cmd=("$VMM_BIN" "$@" --json "$data/$name.json")
    echo "== $name: ${cmd[*]}" >&2
    # vmm never replaces a file: this script regenerates its own output
    rm -f "$data/$name.json"
    local t0=$SECONDS
    "${cmd[@]}"
    echo "== $name: $((SECONDS - t0)) s" >&2
    # as a reader types it: `vmm ...`, not this machine's path to the binary
    printf 'cmd.%s=vmm %s\n' "$name" "${cmd[*]:1}" >>"$meta"
}

# Sizes. Small: 1 repetition of 0.1 s (micro-guests 0.5 s), few tasks and vCPUs (transcode's
# micro-guests need 1 s to measure a frame on a busy 2-CPU host).
if ((small)); then
    sched_size=(--reps 1 --duration 0.1)
    declare -A sched_work=([cyclic]="--tasks 4" [messaging]="--groups 2 --group-size 2" [runq]="--groups 2 --tasks 2")
    host_vms=(--vms 2 --vcpus 2)
    gnr_vms=(--vms 2 --vcpus 2)
    bench_size() { if [ "$1" = transcode ]; then echo "--duration 1"; else echo "--duration 0.5"; fi; }
    bench_reps=(--reps 1)
else
    sched_size=(--reps 3 --duration 2)
    declare -A sched_work=([cyclic]="" [messaging]="" [runq]="")
    host_vms=(--vms 8 --vcpus 8)
    gnr_vms=(--vms 60 --vcpus 8)
    # messaging on emulated gnr-2s: at 2 s the baseline's wake-to-run p99
    # (480 workers on 2 host CPUs) outgrew the window (2.07 s), which
    # `vmm bench` refuses as a saturated histogram; 5 s measures it
    bench_size() { if [ "$1 $2" = "messaging gnr-2s" ]; then echo "--duration 5"; else echo "--duration 2"; fi; }
    bench_reps=(--reps 3)
fi

# docs/results-scheduler.md: the scheduler alone, synthetic tasks.
for w in cyclic messaging runq; do
    for t in host genoa-2s gnr-2s; do
        # shellcheck disable=SC2086 # the workload's size flags are words
        run "sched-$w-$t" sched-bench "$w" --topology "$t" --compare seeds "${sched_size[@]}" ${sched_work[$w]}
    done
done

# docs/results-vcpus.md: micro-guests on KVM vCPUs, with the host 1:1 row.
for t in host gnr-2s; do
    for w in cyclic messaging runq transcode; do
        if [ "$t" = host ]; then vms=("${host_vms[@]}"); else vms=("${gnr_vms[@]}"); fi
        # shellcheck disable=SC2046 # bench_size prints flag words
        run "vcpus-$w-$t" bench "$w" --topology "$t" "${vms[@]}" $(bench_size "$w" "$t") --compare seeds "${bench_reps[@]}"
    done
done

pairs=()
for d in results-scheduler results-vcpus; do
    pairs+=("docs/$d.md" "$docs_out/$d.md.new")
done
# The raw data without the histograms' bucket lists, as compact JSON.
"$RESULTS_MD" --compact "$data"/*.json
"$RESULTS_MD" "$meta" "$data" "${pairs[@]}"
for d in results-scheduler results-vcpus; do
    mv "$docs_out/$d.md.new" "$docs_out/$d.md"
done
echo "results: $docs_out/results-scheduler.md, $docs_out/results-vcpus.md; raw data in $data" >&2
