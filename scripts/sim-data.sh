#!/usr/bin/env bash
# Reruns the simulator's committed outputs under docs/data/sim/: every file
# whose first line is the command that made it ("$ vmm sim ..."; a file of
# several runs has one such line before each run's output), and the
# scaling curve (sweep-cyclic-gnr-2s.svg and .csv). A simulation is
# deterministic, so on an unchanged core and model each file comes out byte
# for byte the same; after a change to either, this regenerates them all.
#
#   scripts/sim-data.sh [-j N] [--check] [FILE...]
#
#   FILE...   only these files (default: all of them, except the one-off
#             comparisons made by other builds, each with its patch or
#             README: validation/calibrated-instr-check/, validation/
#             grpload-linux-writes/ and validation/guarded-lines-8/)
#   -j N      N runs at a time (default 1; each run is single-threaded)
#   --check   rerun and compare instead of rewriting: exit 1 and name the
#             files that differ
#
# VMM_BIN=PATH uses that vmm binary instead of building one (`vmm sim` runs
# the vmm-sim binary beside it). The 100 ms and 1 s validation rows take
# tens of minutes each on a 2-CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=1
check=0
files=()
while [ $# -gt 0 ]; do
    case $1 in
        -j)
            [ $# -ge 2 ] || { echo "error: -j needs a number" >&2; exit 2; }
            jobs=$2
            shift
            ;;
        --check) check=1 ;;
        -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
        -*) echo "error: unknown option '$1' (see --help)" >&2; exit 2 ;;
        *) files+=("$1") ;;
    esac
    shift
done
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "error: -j wants a positive number, not '$jobs'" >&2; exit 2; }

if [ -z "${VMM_BIN:-}" ]; then
    cargo build --release -q -p vmm -p vmm-sim
    VMM_BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/vmm
fi
[ -x "$VMM_BIN" ] || { echo "error: no vmm binary at $VMM_BIN" >&2; exit 2; }
[ -x "$(dirname "$VMM_BIN")/vmm-sim" ] || {
    echo "error: no vmm-sim beside $VMM_BIN (cargo build --release -p vmm-sim)" >&2; exit 2; }
export VMM_BIN CHECK=$check

sweep=docs/data/sim/sweep-cyclic-gnr-2s.svg
if [ ${#files[@]} -eq 0 ]; then
    while IFS= read -r f; do
        files+=("$f")
    done < <(grep -l -m1 '^\$ vmm sim ' -r docs/data/sim --include='*.txt' |
        grep -v -e '/calibrated-instr-check/' -e '/grpload-linux-writes/' \
            -e '/guarded-lines-8/' | sort)
    files+=("$sweep")
fi
for f in "${files[@]}"; do
    [ -f "$f" ] || { echo "error: no file $f" >&2; exit 2; }
    if [ "$f" != "$sweep" ] && ! head -1 "$f" | grep -q '^\$ vmm sim '; then
        echo "error: $f does not start with the vmm sim command that made it" >&2
        exit 2
    fi
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TMPD=$tmp SWEEP=$sweep

# One file: rerun its command, then rewrite or compare it.
one() {
    local f=$1 out
    out=$TMPD/$(echo "$f" | tr '/' '_')
    local t0=$SECONDS
    if [ "$f" = "$SWEEP" ]; then
        # the curve: its SVG and CSV (the CSV beside the SVG); vmm never
        # replaces a file
        rm -f "$out.svg" "$out.csv"
        "$VMM_BIN" sim cyclic --topology gnr-2s --duration 10ms --compare "none;all" \
            --sweep cpus=16,64,192,384,480 --plot "$out.svg" > "$out.log" 2>&1 || {
            echo "FAILED $f"; cat "$out.log"; return 1; }
        for ext in svg csv; do
            local want=${f%.svg}.$ext
            if [ "$CHECK" = 1 ]; then
                cmp -s "$out.$ext" "$want" || { echo "DIFFERS $want"; return 1; }
            else
                cp "$out.$ext" "$want"
            fi
        done
    else
        # each "$ vmm sim" line of the file, as committed (quotes and all),
        # then what it prints; a `--json FILE` goes to a new file here (vmm
        # never replaces one), compared with or copied over FILE after
        local line run json
        local -a jsons=()
        : > "$out"
        while IFS= read -r line; do
            run=${line#\$ vmm }
            if [[ $run =~ --json[[:space:]]+([^[:space:]]+) ]]; then
                json=${BASH_REMATCH[1]}
                jsons+=("$json")
                rm -f "$TMPD/json_${json//\//_}"
                run=${run/--json $json/--json $TMPD/json_${json//\//_}}
            fi
            { echo "$line"; eval "\"\$VMM_BIN\" $run" 2>&1; } >> "$out" || {
                echo "FAILED $f: $line"; tail -5 "$out"; return 1; }
        done < <(grep '^\$ vmm sim ' "$f")
        # a file that lost its command lines meanwhile (removed or edited
        # during a long run) is never replaced by nothing
        [ -s "$out" ] || { echo "FAILED $f: no '\$ vmm sim' line in it now"; return 1; }
        # the output names the JSON file it wrote: the committed path
        for json in "${jsons[@]}"; do
            sed -i "s|$TMPD/json_${json//\//_}|$json|g" "$out"
        done
        if [ "$CHECK" = 1 ]; then
            cmp -s "$out" "$f" || { echo "DIFFERS $f"; return 1; }
            for json in "${jsons[@]}"; do
                cmp -s "$TMPD/json_${json//\//_}" "$json" || { echo "DIFFERS $json"; return 1; }
            done
        else
            cp "$out" "$f"
            for json in "${jsons[@]}"; do
                cp "$TMPD/json_${json//\//_}" "$json"
            done
        fi
    fi
    echo "ok $f ($((SECONDS - t0)) s)"
}
export -f one

printf '%s\n' "${files[@]}" | xargs -P "$jobs" -I{} bash -c 'one "$@"' _ {}
