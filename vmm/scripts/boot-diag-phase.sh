#!/usr/bin/env bash
# Where one phase of a boot-diag.sh run went, per VM and per vCPU: each
# vCPU's share of the host's CPUs between two sample times.
#
#   vmm/scripts/boot-diag-phase.sh OUTDIR FROM TO
#   e.g. vmm/scripts/boot-diag-phase.sh /tmp/d 92 180
#
# FROM and TO are seconds since the boot started (boot-diag.sh's "T"
# samples; the nearest sample is used). Under the M:N executor the
# numbers are each vCPU's held_ms from counters.txt (its time on a
# worker: in KVM_RUN and exit handling); under `--executor host` they are
# the vCPU threads' CPU time (utime + stime) from threads.txt, VMs told
# apart by their thread order (each VM's vcpu0 starts a new one). To map
# sample times to the guests' own clocks, boot-diag.sh runs keep
# clock.txt where one was taken (wall seconds, then each console's last
# timestamp).
set -euo pipefail
[ $# -eq 3 ] || { sed -n '2,15p' "$0" >&2; exit 2; }
D=$1 FROM=$2 TO=$3
[ -f "$D/threads.txt" ] || { echo "$D has no threads.txt: not a boot-diag.sh directory" >&2; exit 1; }
python3 - "$D" "$FROM" "$TO" <<'EOF'
import json, os, sys

d, ta, tb = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])


def nearest(rows, t):
    return min(rows, key=lambda r: abs(r[0] - t))


def report(name, a, b, unit_s):
    ta, xa = a
    tb, xb = b
    wall = tb - ta
    keys = sorted(xb, key=lambda k: int(k))
    total = sum(xb[k] - xa.get(k, 0) for k in keys) * unit_s
    cells = " ".join(f"{k}:{(xb[k] - xa.get(k, 0)) * unit_s:.1f}" for k in keys)
    print(f"{name}: {cells}  total {total:.1f} s = {total / wall:.3f} CPU")


counters = os.path.join(d, "counters.txt")
by_vm = {}
if os.path.exists(counters):
    for line in open(counters):
        _, t, vm, js = line.split(" ", 3)
        j = json.loads(js)
        held = {k[4:]: v.get("held_ms") for k, v in j.items() if k.startswith("vcpu")}
        if any(v for v in held.values()):
            by_vm.setdefault(vm, []).append((float(t), held))
if by_vm:
    first = next(iter(by_vm.values()))
    a, b = nearest(first, ta), nearest(first, tb)
    print(f"vCPU seconds on a worker (held_ms), {a[0]:.1f} .. {b[0]:.1f} s ({b[0] - a[0]:.1f} s wall)")
    for vm in sorted(by_vm):
        report(vm, nearest(by_vm[vm], ta), nearest(by_vm[vm], tb), 1e-3)
    sys.exit(0)

# host threads: per sample, one VM per run of vcpu0..vcpuN threads
samples = []
for line in open(os.path.join(d, "threads.txt")):
    p = line.split()
    if p[0] == "T":
        samples.append((float(p[1]), []))
    elif samples:
        samples[-1][1].append((p[0], int(p[1]) + int(p[2])))


def vms(sample):
    out = []
    for name, ticks in sample[1]:
        if not name.startswith("vcpu"):
            continue
        if name == "vcpu0":
            out.append({})
        if out:
            out[-1][name[4:]] = ticks
    return out


a, b = nearest(samples, ta), nearest(samples, tb)
if not vms(b):
    sys.exit(f"{d}: no held_ms in counters.txt and no vcpu threads in threads.txt")
print(f"vCPU thread CPU seconds, {a[0]:.1f} .. {b[0]:.1f} s ({b[0] - a[0]:.1f} s wall)")
for i, (x, y) in enumerate(zip(vms(a) + [{}] * len(vms(b)), vms(b))):
    report(f"vm{i + 1}", (a[0], x), (b[0], y), 1e-2)
EOF
