#!/usr/bin/env bash
# Where the device I/O threads run, measured on micro-guests: the local
# stand-in for the NUMA rule (docs/devices.md, "Where the I/O threads
# run"), which needs a two-node host to be measured itself.
#
# One VM per host CPU, each one vCPU on the host executor (1:1 threads,
# as `--sched host` runs them), VM v's vCPU thread pinned to host CPU v
# (`--pin`). Its device's I/O thread (`vmm bench ... --io-cpus`):
#   same:  on host CPU v, the vCPU's;
#   other: on host CPU v+1 (mod the CPUs), another;
#   any:   not placed (every CPU the process may use; the baseline).
# Three configurations, each one interleaved `--compare-io-cpus
# any,same,other` run of REPS repetitions (default 5) of DURATION seconds
# (default 1), `any` the baseline with its A/A row (any again: its
# distance from the baseline is this run's noise):
#   blk-qd1, blk-qd32: random 4 KiB reads of a shared read-only 64 MiB
#          image in the page cache (the request path, no disk), the
#          default engine (io_uring);
#   net-echo: the host peer sends a 60-byte frame, the guest sends it
#          back, the next one goes: round trips/s and their p50/p99.
#
#   scripts/io-placement-bench.sh [--out DIR] [--duration S] [--reps N]
#
# Needs root (net: a network namespace with a tap per VM, IPv6 off, run
# inside it and deleted on exit). Raw outputs go to DIR (default
# docs/data/devices/io-placement): per configuration the table (command,
# date, commit at its head) and the JSON gzipped, DIR/summary.txt (per
# row: the latencies from the JSON, median and range over the
# repetitions) and DIR/meta.txt (scripts/machine-meta.sh). VMM_BIN picks the binary (default: a release
# build).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
bench_args docs/data/devices/io-placement 5 1 "$@"
need_root "it makes a network namespace and taps"
vmm_binary
ncpu=$(nproc)
tmp=$(mktemp -d)
trap 'ip netns del "${ns:-}" 2>/dev/null || true; rm -rf "$tmp"' EXIT
bench_netns vmm-iop
for i in $(seq 0 $((ncpu - 1))); do
    ip -n "$ns" tuntap add "iop$i" mode tap
    ip -n "$ns" link set "iop$i" up
done
dd if=/dev/zero of="$tmp/shared.img" bs=1M count=64 status=none
cat "$tmp/shared.img" >/dev/null
record_meta "$out"
common=(--vms "$ncpu" --executor host --pin --compare-io-cpus any,same,other
    --duration "$dur" --reps "$reps")
for cfg in blk-qd1 blk-qd32 net-echo; do
    f="$out/$cfg"
    clear_old "$f.json" "$f.json.gz" "$f.txt"
    case $cfg in
        blk-qd*) cmd=(bench blk --disk "$tmp/shared.img" --qd "${cfg#blk-qd}") ;;
        net-echo) cmd=(bench net --mode echo --tap-prefix iop) ;;
    esac
    cmd+=("${common[@]}" --json "$f.json")
    {
        echo "# vmm ${cmd[*]}" | sed "s|$tmp/|TMP/|g"
        echo "# TMP/shared.img: 64 MiB of zeros in the page cache; taps iop0..iop$((ncpu - 1)) in a network namespace of their own (up, IPv6 off)"
        echo "# $(date -u +%FT%TZ), commit $commit, dirty $dirty, $ncpu host CPUs (machine: meta.txt)"
        ip netns exec "$ns" "$bin" "${cmd[@]}" 2>/dev/null
    } >"$f.txt"
    gzip -9f "$f.json"
    echo "$f.txt"
done
# the per-row latencies: the reports are in the comparison's interleaved
# order (repetition r runs rows r, r+1, .. mod the rows)
python3 - "$out" >"$out/summary.txt" <<'PY'
import gzip, json, statistics as st, sys
out = sys.argv[1]
def rng(xs):
    return "%.1f [%.1f-%.1f]" % (st.median(xs), min(xs), max(xs))
for cfg in ["blk-qd1", "blk-qd32", "net-echo"]:
    j = json.load(gzip.open(f"{out}/{cfg}.json.gz"))
    labels = [r["mitigations"] for r in j["rows"]]
    nv, reps = len(labels), len(j["rows"][0]["values"])
    order = [(k + rep) % nv for rep in range(reps) for k in range(nv)]
    per = {l: [] for l in labels}
    for v, r in zip(order, j["reports"]):
        per[labels[v]].append(r)
    for l in labels:
        rs = per[l]
        if cfg == "net-echo":
            ex = [dict(r["run"]["extra"]) for r in rs]
            what = "round trip p50 %s us, p99 %s us, lost %d, corrupt %d" % (
                rng([e["rtt_p50_ns"] / 1e3 for e in ex]),
                rng([e["rtt_p99_ns"] / 1e3 for e in ex]),
                sum(e["lost"] for e in ex), sum(e["corrupt"] for e in ex))
        else:
            what = "interrupt to guest p50 %s us, p99 %s us" % (
                rng([r["guest_latency"]["p50"] / 1e3 for r in rs]),
                rng([r["guest_latency"]["p99"] / 1e3 for r in rs]))
        print(f"{cfg:9} {l:10} {what}")
PY
echo "$out/summary.txt"
