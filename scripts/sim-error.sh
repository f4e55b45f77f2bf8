#!/usr/bin/env bash
# The simulator's measured error on this machine (docs/simulator.md,
# "Measured error against this machine"): each workload runs on the real
# CPUs (`vmm sched-bench WORKLOAD --topology host`, the threads executor,
# every CPU this process may use) and in the simulator on the same shape
# with this machine's own cost table (`c2c`'s costs.toml), for `none` and
# `all`; the error of the simulator per metric is sim / real - 1:
#   * call cost: mean ns per `schedule` call (the threaded executors time
#     only those: `sched_ns_per_call`; the simulator's
#     `schedule_ns_per_call`);
#   * wake -> run: median and mean wakeup-to-running latency, from the
#     core's per-task tables on both sides (`task_summary` / the sim
#     report's `wake_to_run_*`);
#   * the workload's metric: throughput (messaging, runq, pingpong), or
#     cyclic's p99 of timer -> running (both sides report it since
#     2026-11-29; before, the simulator's was a mean and the column said
#     "n/a");
#   * direction: all against none on each side, from each side's own
#     `--compare 'none;all'` (its A/A row and paired 95% interval): judged
#     only where the real interval excludes 100%.
#
#   scripts/sim-error.sh             REPS (default 3) x 2 s real, 200 ms sim
#   COSTS=FILE OUT=DIR WORKLOADS="runq" scripts/sim-error.sh
#   COMPARE=seeds OUT=DIR scripts/sim-error.sh   every fix's direction
#   COPIES=2 OUT=DIR scripts/sim-error.sh         twice each default shape
#
# The shapes: the simulator's tasks are set to the thread workload's
# defaults at this CPU count (messaging: 1 group of 10 senders and 10
# receivers; runq: 1 message task and 8 workers; cyclic: 8 RT tasks;
# pingpong: one pair), on
# an hwloc string of this machine's CPUs as two cores sharing one LLC.
# Output: OUT/real-W.txt|json.gz, OUT/sim-MODEL-W-SET-SEED.json|txt,
# OUT/sim-MODEL-W-compare.json|txt, OUT/costs-hw.toml, OUT/table.md,
# OUT/meta.txt. Needs a quiet machine: run nothing else meanwhile. Files
# already there are kept (a stopped run resumes); the table is remade.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
out=${OUT:-docs/data/sim/error-2cpu}
reps=${REPS:-3}
costs=${COSTS:-docs/data/c2c-2/costs.toml}
# the comparison both sides run for the directions; its first set is the
# baseline and it must hold `none` and `all` (the per-metric rows)
compare=${COMPARE:-none;all}
# how many copies of each workload's default shape run at once (COPIES=2:
# twice the tasks on the same 2 CPUs); cyclic's thread workload stretches
# its 1 ms period beyond 16 tasks, which the simulator does not: at most 2
groups=${COPIES:-1}
case $groups in
    1 | 2) ;;
    *) echo "sim-error: COPIES must be 1 or 2 (cyclic's period is 1 ms on both sides only up to 16 tasks), not '$groups'" >&2; exit 2 ;;
esac
vmm_binary
[ -n "${VMM_BIN:-}" ] || cargo build --release --quiet -p vmm-sim
sim_bin=$(dirname "$bin")/vmm-sim
[ -x "$sim_bin" ] || { echo "sim-error: no vmm-sim beside $bin (cargo build --release -p vmm-sim)" >&2; exit 2; }
[ -f "$costs" ] || { echo "sim-error: no cost table $costs (cargo run -p benches --release --bin c2c -- --out DIR)" >&2; exit 2; }
ncpu=$(nproc)
if [ "$ncpu" -ne 2 ]; then
    echo "sim-error: the simulator's shape is written for 2 CPUs; this machine has $ncpu" >&2
    exit 2
fi
topo="package:1 l3:1 l2:2 core:1 pu:1"
mkdir -p "$out"
# a resumed run keeps the first run's record
if [ ! -f "$out/meta.txt" ]; then
    record_meta "$out"
    echo "costs=$costs" >>"$out/meta.txt"
    echo "groups=$groups" >>"$out/meta.txt"
fi
# the same table as a model of hardware CPUs: no executor costs
hw_costs=$out/costs-hw.toml
# (kept if there: a resumed run; never written over)
[ -f "$hw_costs" ] || grep -v -E '^(switch_ns|kick_ns|idle_exit_ns) ' "$costs" >"$hw_costs"
for w in ${WORKLOADS:-messaging runq cyclic pingpong}; do
    # COPIES copies of the default shape (real: --groups or --tasks)
    case $w in
        messaging) shape=(--vms "$groups" --vcpus 20); real_shape=(--groups "$groups") ;;
        runq) shape=(--vms "$groups" --vcpus 9); real_shape=(--groups "$groups") ;;
        cyclic) shape=(--vms 1 --vcpus $((8 * groups))); real_shape=(--tasks $((8 * groups))) ;;
        pingpong) shape=(--vms "$groups" --vcpus 2); real_shape=(--groups "$groups") ;;
        *) echo "sim-error: no shape for $w" >&2; exit 2 ;;
    esac
    # the default shape's command lines stay as they were
    [ "$groups" = 1 ] && real_shape=()
    if [ ! -f "$out/real-$w.json.gz" ]; then
        { echo "\$ vmm sched-bench $w --topology host ${real_shape[*]:+${real_shape[*]} }--compare '$compare' --reps $reps --duration 2s"
          vmm sched-bench "$w" --topology host "${real_shape[@]}" --compare "$compare" --reps "$reps" --duration 2s \
              --json "$out/real-$w.json"; } >"$out/real-$w.txt"
        gzip -n "$out/real-$w.json"
    fi
    for model in hw exec; do
        if [ $model = hw ]; then table=$hw_costs; else table=$costs; fi
        stem=$out/sim-$model-$w
        if [ ! -f "$stem-compare.json" ]; then
            { echo "\$ vmm sim $w --topology '$topo' --costs $table ${shape[*]} --duration 200ms --compare '$compare' --reps $reps --json $stem-compare.json"
              "$sim_bin" "$w" --topology "$topo" --costs "$table" "${shape[@]}" --duration 200ms \
                  --compare "$compare" --reps "$reps" --json "$stem-compare.json" 2>&1; } >"$stem-compare.txt"
        fi
        for set in none all; do
            for seed in $(seq 1 "$reps"); do
                f=$stem-$set-$seed
                [ -f "$f.json" ] && continue
                { echo "\$ vmm sim $w --topology '$topo' --costs $table ${shape[*]} --duration 200ms -m $set --seed $seed --json $f.json"
                  "$sim_bin" "$w" --topology "$topo" --costs "$table" "${shape[@]}" --duration 200ms \
                      -m "$set" --seed "$seed" --json "$f.json" 2>&1; } >"$f.txt"
            done
        done
    done
done
python3 - "$out" ${WORKLOADS:-messaging runq cyclic pingpong} <<'EOF' | tee "$out/table.md"
import glob, gzip, json, statistics as st, sys
out, workloads = sys.argv[1], sys.argv[2:]
def mean(v): return st.mean(v) if v else float("nan")
def pct(sim, real): return f"{(sim / real - 1) * 100:+.0f}%" if real else "n/a"
def effect(c, m):
    row = [x for x in c["rows"] if x["mitigations"] == m][0]
    p = row.get("paired") or {}
    ci = p.get("ci95_pct") or [float("nan")] * 2
    return row["relative_pct"], ci, p.get("verdict", "?")
MODELS = {"hw": "the model of hardware CPUs (executor costs 0)",
          "exec": "with this machine's executor costs (switch_ns, kick_ns, idle_exit_ns)"}
real = {w: json.load(gzip.open(f"{out}/real-{w}.json.gz")) for w in workloads}
for model, title in MODELS.items():
    print(f"Simulator: {title}.\n")
    print("| workload | set | runs real / sim | ns per `schedule` call: real / sim (error) | wake -> run p50, us: real / sim (error) | wake -> run mean, us: real / sim (error) | metric (throughput; cyclic: p99 timer -> running): real / sim (error) |")
    print("|---|---|---|---|---|---|---|")
    for w in workloads:
        byset = {}
        for r in real[w]["runs"]:
            byset.setdefault(r["mitigations"], []).append(r)
        for s in ("none", "all"):
            sims = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/sim-{model}-{w}-{s}-*.json"))]
            rr = byset.get(s, [])
            rc, sc = mean([r["sched_ns_per_call"] for r in rr]), mean([r["schedule_ns_per_call"] for r in sims])
            rp, sp = mean([r["task_summary"]["wake_to_run_p50_ns"] for r in rr]), mean([r["wake_to_run_p50_ns"] for r in sims])
            rm, sm = mean([r["task_summary"]["wake_to_run"]["mean"] for r in rr]), mean([r["wake_to_run_mean_ns"] for r in sims])
            if w == "cyclic" and not all(r.get("metric_name", "").startswith("p99") for r in sims):
                thr = "n/a (metrics differ: the simulator's is a mean)"
            elif w == "cyclic":
                # the real side's p99 is in us, the simulator's in ns
                rt, stv = mean([r["metric"]["value"] * 1e3 for r in rr]), mean([r["metric"] for r in sims])
                thr = f"p99 {rt/1e3:,.1f} / {stv/1e3:,.1f} us ({pct(stv, rt)})"
            else:
                rt, stv = mean([r["metric"]["value"] for r in rr]), mean([r["metric"] for r in sims])
                thr = f"{rt:,.0f} / {stv:,.0f} ({pct(stv, rt)})"
            print(f"| {w} | {s} | {len(rr)} / {len(sims)} | {rc:,.0f} / {sc:,.0f} ({pct(sc, rc)}) | "
                  f"{rp/1e3:,.1f} / {sp/1e3:,.1f} ({pct(sp, rp)}) | {rm/1e3:,.1f} / {sm/1e3:,.1f} ({pct(sm, rm)}) | {thr} |")
    print()
    print("| workload | set vs baseline, real: paired [95% CI] | sim: paired [95% CI] | direction |")
    print("|---|---|---|---|")
    for w in workloads:
        simc = json.load(open(f"{out}/sim-{model}-{w}-compare.json"))
        for row in real[w]["rows"]:
            if row["kind"] != "variant":
                continue
            m = row["mitigations"]
            rr, rci, rv = effect(real[w], m)
            sr, sci, sv = effect(simc, m)
            if rv == "cannot_tell_apart":
                agree = "real cannot tell apart: not judged"
            elif sv == "cannot_tell_apart":
                agree = f"**disagree**: real {rv}, sim cannot tell apart"
            else:
                agree = "agree" if rv == sv else f"**disagree**: real {rv}, sim {sv}"
            print(f"| {w} | {m}: {rr:.1f}% [{rci[0]:.1f}-{rci[1]:.1f}] {rv} | {sr:.1f}% [{sci[0]:.1f}-{sci[1]:.1f}] {sv} | {agree} |")
    print()
EOF
