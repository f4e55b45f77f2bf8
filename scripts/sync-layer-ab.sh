#!/usr/bin/env bash
# Is the binary operators run free of the simulator? The criterion bench of
# every fix's hot path (cpupri, rto, shardrq, llcidle, l2wake, grpload),
# in alternating passes of two builds of the same bench code:
#
#   prod   benches:       the plain vcpu_sched, the crate `vmm` links
#                         (std atomics and locks)
#   twin   benches-twin:  vcpu_sched_sim, the simulator's build (every
#                         shared atomic and lock reports to the recorder;
#                         nothing records here), for the record of what
#                         the reporting layer would cost
#
# prod, twin, prod, twin, ...: the prod passes are the A/A. Before timing,
# the script checks that production is the plain build: `vmm` depends on
# no vcpu_sched_sim (cargo tree), and neither the release `vmm` binary nor
# the prod bench binaries hold a recorder symbol (nm), while the twin's do.
#
#   scripts/sync-layer-ab.sh [-n PASSES_PER_BUILD] [-o OUT]   (default 2, no files)
#
# -o OUT writes OUT.json (criterion's raw data per bench and pass: the
# samples' iterations and times and the estimates with their intervals,
# from ab::collect in benches/src/ab.rs, plus the command, commit, date,
# machine and load) and OUT.md (the same header and the table). The table
# (stdout) has each pass's time per iteration (criterion's slope), the
# prod passes' spread ((max - min) / min), and twin's mean over prod's,
# starred where every twin pass lies outside the prod passes' range.
# BENCH_WRITERS=1 (single writer; l2wake still uses one waker and the
# target) unless set. Criterion's own output goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
passes=2
out=
while [ $# -gt 0 ]; do
    case $1 in
        -n) passes=${2:?-n needs a number}; shift ;;
        -o) out=${2:?-o needs a path prefix}; shift ;;
        -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[[ $passes =~ ^[1-9][0-9]*$ ]] || { echo "error: -n wants a positive number, not '$passes'" >&2; exit 2; }
if [ -n "$out" ] && [ ! -d "$(dirname "$out")" ]; then
    echo "error: -o $out: the directory $(dirname "$out") does not exist" >&2
    exit 2
fi
export BENCH_WRITERS=${BENCH_WRITERS:-1}
target=${CARGO_TARGET_DIR:-target}
BENCHES=(--bench cpupri --bench rto --bench shardrq --bench llcidle --bench l2wake --bench grpload)
CRIT=(--warm-up-time 1 --measurement-time 3 --noplot)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export CRITERION_HOME=$tmp/criterion

# ---- production is the plain build
if cargo tree -q -p vmm -e normal,build --prefix none | grep -q '^vcpu_sched_sim '; then
    echo "error: vmm depends on vcpu_sched_sim: the production binary carries the simulator" >&2
    exit 1
fi
cargo build --release -q -p vmm -p vmm-sim
# the bench binaries, built before any pass so that no pass waits for a compile
exes() { # PACKAGE -> the bench executables' paths
    cargo bench -p "$1" "${BENCHES[@]}" --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p'
}
mapfile -t prod_exes < <(exes benches)
mapfile -t twin_exes < <(exes benches-twin)
[ ${#prod_exes[@]} -eq 6 ] && [ ${#twin_exes[@]} -eq 6 ] || {
    echo "error: expected 6 bench binaries per build, got ${#prod_exes[@]} and ${#twin_exes[@]}" >&2
    exit 1
}
recorder_syms() { nm -C "$1" 2>/dev/null | grep -c -e 'sync::recorder::' -e 'vcpu_sched_sim::' || true; }
check=""
for f in "$target/release/vmm" "${prod_exes[@]}"; do
    n=$(recorder_syms "$f")
    [ "$n" -eq 0 ] || { echo "error: $f holds $n recorder symbols" >&2; exit 1; }
done
check+="vmm: no vcpu_sched_sim in cargo tree; 0 recorder symbols in target/release/vmm and the 6 prod bench binaries"
n=$(recorder_syms "$target/release/vmm-sim")
[ "$n" -gt 0 ] || { echo "error: vmm-sim holds no recorder symbol: the check cannot see one" >&2; exit 1; }
check+="; $n in target/release/vmm-sim (the check sees them where they are)"
echo "$check" >&2

# ---- the passes
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- vcpu_sched benches || echo "+uncommitted")
machine=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
load_before=$(uptime)
names=()
for p in $(seq 1 "$passes"); do
    for build in prod twin; do
        pkg=benches
        [ $build = twin ] && pkg=benches-twin
        names+=("$build-$p")
        echo "== pass $build-$p" >&2
        cargo bench -q -p "$pkg" "${BENCHES[@]}" -- "${CRIT[@]}" --save-baseline "$build-$p" >&2
    done
done
load_after=$(uptime)

# ---- the record
cargo build --release -q -p benches --bin criterion-ab
"$target/release/criterion-ab" "$CRITERION_HOME" "${names[@]}" >"$tmp/data.json" 2>"$tmp/table.md"
cmd="BENCH_WRITERS=$BENCH_WRITERS scripts/sync-layer-ab.sh -n $passes"
header() {
    echo "# $cmd"
    echo "# date $date, commit $commit, machine: $machine ($(nproc) CPUs)"
    echo "# load before: $load_before"
    echo "# load after:  $load_after"
    echo "# $check"
}
header
cat "$tmp/table.md"
if [ -n "$out" ]; then
    { header; echo; cat "$tmp/table.md"; } >"$out.md"
    {
        printf '{\n  "command": "%s",\n  "date": "%s",\n  "commit": "%s",\n' "$cmd" "$date" "$commit"
        printf '  "machine": "%s",\n  "cpus": %s,\n' "$machine" "$(nproc)"
        printf '  "load_before": "%s",\n  "load_after": "%s",\n' "$(echo "$load_before" | sed 's/^ *//')" "$(echo "$load_after" | sed 's/^ *//')"
        printf '  "production_check": "%s",\n' "$check"
        printf '  "criterion": "%s",\n' "${CRIT[*]}, sample size 20 (benches::bench_main)"
        printf '  "passes": [%s],\n' "$(printf '"%s",' "${names[@]}" | sed 's/,$//')"
        printf '  "benches": '
        sed '1!s/^/  /' "$tmp/data.json"
        printf '}\n'
    } >"$out.json"
    echo "written to $out.md and $out.json" >&2
fi
