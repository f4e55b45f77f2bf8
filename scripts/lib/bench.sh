# shellcheck shell=bash
# Pieces the benchmark scripts share; sourced (`source scripts/lib/bench.sh`
# from the repository root), never run. Each function names the calling
# script in its messages ($me) and exits 2 on a user's mistake.

me=$(basename "$0")

# bench_args OUT REPS DURATION "$@": the common options --out DIR,
# --reps N and --duration S, into $out, $reps and $dur (the first three
# arguments are their defaults). Anything else is refused.
bench_args() {
    out=$1 reps=$2 dur=$3
    shift 3
    while [ $# -gt 0 ]; do
        case $1 in
            --out | --duration | --reps)
                [ $# -ge 2 ] || { echo "$me: $1 needs a value" >&2; exit 2; }
                case $1 in
                    --out) out=$2 ;;
                    --duration) dur=$2 ;;
                    --reps) reps=$2 ;;
                esac
                shift 2 ;;
            *) echo "$me: unknown argument $1 (give --out DIR, --duration S, --reps N)" >&2; exit 2 ;;
        esac
    done
}

# need_root WHY: exits 2 unless run as root.
need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "$me: needs root ($1)" >&2
        exit 2
    fi
}

# vmm_binary: $bin, the absolute path of the binary to measure: VMM_BIN,
# or else a release build (built here); vmm() runs it.
vmm_binary() {
    if [ -n "${VMM_BIN:-}" ]; then
        bin=$VMM_BIN
    else
        cargo build --release --quiet -p vmm
        bin=${CARGO_TARGET_DIR:-target}/release/vmm
    fi
    bin=$(realpath "$bin")
}
vmm() { "$bin" "$@"; }

# record_meta DIR: DIR/meta.txt from scripts/machine-meta.sh (the machine,
# kvm_pvm or hardware KVM, the commit, whether the tree was dirty),
# replaced whole (written to a new file first: truncating a tracked
# meta.txt would make machine-meta.sh report the tree as dirty); $commit
# and $dirty from it.
record_meta() {
    own_output "$1"
    mkdir -p "$1"
    scripts/machine-meta.sh >"$1/.meta.txt.new"
    mv "$1/.meta.txt.new" "$1/meta.txt"
    commit=$(sed -n 's/^commit=//p' "$1/meta.txt")
    dirty=$(sed -n 's/^dirty=//p' "$1/meta.txt")
}

# restorable PATH...: true when git can give back everything at PATH: it
# is missing, or every file under it is tracked by this repository with no
# uncommitted change (the committed data under docs/data/, say). Anything
# else - an untracked, ignored or edited file, or a file outside the
# repository - is the user's.
restorable() {
    local p
    for p in "$@"; do
        [ -e "$p" ] || continue
        if [ -d "$p" ] && [ -z "$(ls -A "$p")" ]; then continue; fi
        git ls-files --error-unmatch -- "$p" >/dev/null 2>&1 || return 1
        [ -z "$(git status --porcelain --ignored --untracked-files=all -- "$p")" ] || return 1
    done
}

# own_output PATH...: exit 2, naming PATH, unless restorable: a run
# replaces its earlier output (vmm never replaces a file, so the scripts
# remove it first), and may only do so where nothing is lost.
own_output() {
    local p
    for p in "$@"; do
        if ! restorable "$p"; then
            echo "$me: refusing to write over $p: it holds files git cannot restore;" \
                "move them aside or choose a new or empty output directory (--out / OUT)" >&2
            exit 2
        fi
    done
}

# clear_old FILE...: removes earlier output before a run writes it again,
# after own_output.
clear_old() {
    own_output "$@"
    rm -f "$@"
}

# recorded_run STEM ARGS...: runs `vmm ARGS... --json STEM.json` into
# STEM.txt, headed by the command and a line with the date, $commit,
# $dirty and $ncpu (record_meta and target_points set them); then, if
# $summary holds a Python program, its output on the JSON (argv[1]) under
# a comment line; then gzips the JSON and prints STEM.txt. An earlier
# STEM.json(.gz) and STEM.txt go first, if git can restore them (clear_old). With
# $hide set (a path, such as a scratch image) the header shows it as IMG
# and adds $hide_note.
recorded_run() {
    local f=$1
    shift
    clear_old "$f.json" "$f.json.gz" "$f.txt"
    local cmd=("$@" --json "$f.json")
    {
        if [ -n "${hide:-}" ]; then
            echo "# vmm ${cmd[*]}" | sed "s|$hide|IMG|g"
            echo "# IMG: ${hide_note:-a scratch file made for the run}"
        else
            echo "# vmm ${cmd[*]}"
        fi
        echo "# $(date -u +%FT%TZ), commit $commit, dirty $dirty, $ncpu host CPUs (machine: meta.txt)"
        vmm "${cmd[@]}" 2>/dev/null
        if [ -n "${summary:-}" ]; then
            echo
            echo "# per row, means over the repetitions (from the JSON's reports):"
            # (scripts/lib/ab_summary.py: the helpers the programs share)
            PYTHONPATH="$PWD/scripts/lib" python3 -c "$summary" "$f.json"
        fi
    } >"$f.txt"
    # the JSON keeps every run's histograms: megabytes, compressed well
    gzip -9f "$f.json"
    echo "$f.txt"
}

# target_points: $ncpu (the host CPUs) and $n1, the vCPUs of one VM at
# the Targets' points (even: messaging pairs its vCPUs); exits 1 on fewer
# than 2 CPUs. point_shape POINT then sets $shape, that point's `vmm bench`
# flags: x1, one VM of $n1 vCPUs each pinned to a CPU of its own; x4, 4
# such VMs, nothing pinned.
target_points() {
    ncpu=$(nproc)
    n1=$((ncpu / 2 * 2))
    ((n1 >= 2)) || { echo "$me: needs at least 2 host CPUs" >&2; exit 1; }
}
point_shape() {
    if [ "$1" = x1 ]; then
        shape=(--vms 1 --vcpus "$n1" --pin)
    else
        shape=(--vms 4 --vcpus "$n1")
    fi
}

# ab_runs FLAG WORKLOADS: the A/B of one executor or scheduler option,
# `vmm bench --FLAG` (an interleaved comparison along that option, all
# fixes), for every workload of $WORKLOADS (default: the WORKLOADS given)
# and point of $POINTS (default: x1 x4), each a recorded_run into
# $out/WORKLOAD-POINT of $reps repetitions x $dur seconds.
ab_runs() {
    local flag=$1 defaults=$2 workload point
    for workload in ${WORKLOADS:-$defaults}; do
        for point in ${POINTS:-x1 x4}; do
            point_shape "$point"
            recorded_run "$out/$workload-$point" bench "$workload" "${shape[@]}" \
                --duration "$dur" --reps "$reps" --mitigations all "$flag"
        done
    done
}

# ab_setup DEFAULT_OUT DEFAULT_REPS: what every A/B script of one option
# (the *-ab.sh scripts, whose runs ab_runs makes) does first: $out (OUT,
# else DEFAULT_OUT), $reps (REPS, else DEFAULT_REPS) and $dur (DURATION,
# else 2 s), the binary (vmm_binary), OUT/meta.txt (record_meta) and the
# points (target_points).
ab_setup() {
    out=${OUT:-$1}
    reps=${REPS:-$2}
    dur=${DURATION:-2}
    vmm_binary
    record_meta "$out"
    target_points
}

# bench_netns PREFIX: a new network namespace $ns (PREFIX-PID) with its
# loopback up and IPv6 off (no router solicitations in the measurement).
# The caller deletes it (its EXIT trap: ip netns del "$ns").
bench_netns() {
    ns=$1-$$
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
}
