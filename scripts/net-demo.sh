#!/usr/bin/env bash
# A guest on the network, judged by ping: makes a network namespace with a
# multi-queue tap (10.0.2.1/24), boots the minimal guest kernel inside it
# with `--net tap=...` and the kernel's own `ip=` autoconfiguration, pings
# it from the namespace, prints ping's summary and the round-trip
# percentiles, and removes the namespace. No packet leaves the namespace.
# Needs root (namespaces, taps), the guest kernel (guest/build.sh) and
# iproute2 and iputils-ping (scripts/setup.sh installs them).
#
#   scripts/net-demo.sh [--sched host|vcpu_sched] [--vcpus N] [--queues N]
#                       [--pings N] [--interval S] [--console serial|virtio]
#                       [--out FILE]
#
# --vcpus N boots N vCPUs on one guest node (default 1); --queues N gives
# the device N queue pairs (default 1, at most N vCPUs); --out FILE writes
# the raw round-trip times (ms, one per line, a header of # lines) to a
# new FILE. VMM_BIN picks the binary (default: target/debug/vmm, then
# `vmm` on PATH).
set -euo pipefail
# shellcheck source=scripts/lib/ping.sh
source "$(dirname "$0")/lib/ping.sh"
sched=host vcpus=1 queues=1 pings=20 interval=0.05 console=serial out=
while [ $# -gt 0 ]; do
  case $1 in
    --sched) sched=$2; shift 2 ;;
    --vcpus) vcpus=$2; shift 2 ;;
    --queues) queues=$2; shift 2 ;;
    --pings) pings=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --console) console=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "net-demo.sh: unknown argument $1 (see the header for the options)" >&2; exit 2 ;;
  esac
done
if [ -n "$out" ] && [ -e "$out" ]; then
  echo "net-demo.sh: --out $out exists; give a new path" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")/.." && pwd)
VMM=${VMM_BIN:-}
if [ -z "$VMM" ]; then
  if [ -x "$here/target/debug/vmm" ]; then VMM=$here/target/debug/vmm; else VMM=$(command -v vmm); fi
fi
kernel=${GUEST_KERNEL:-.cache/guest/kernel/vmlinux}
[ -f "$kernel" ] || kernel=$here/.cache/guest/kernel/vmlinux
[ -f "$kernel" ] || { echo "net-demo.sh: no guest kernel: run guest/build.sh" >&2; exit 2; }

ns=vmmdemo-$$
tap=vmmtap0
dir=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
ip netns add "$ns"
guest_tap "$ns" "$tap"

ip netns exec "$ns" "$VMM" -v run --sched "$sched" --kernel "$kernel" --memory 256M \
  --guest "package:1 l3:1 l2:1 core:$vcpus pu:1" \
  --net "tap=$tap,mac=52:54:00:12:34:56,num_queues=$((2 * queues))" --console "$console" \
  --cmdline "root=/dev/vda rootwait ip=10.0.2.15::10.0.2.1:255.255.255.0::eth0:off loglevel=8" \
  --timeout 30m >"$dir/console.log" 2>"$dir/vmm.log" &
pid=$!
wait_guest_ip "$pid" "$dir/console.log" "$dir/vmm.log"
first_answer "$ns"
ping_judge "$ns" "$pings" "$interval" "$dir" "$out" "scripts/net-demo.sh --sched $sched --vcpus $vcpus --queues $queues --pings $pings --interval $interval --console $console"
[ "$replies" -eq "$pings" ] || { echo "net-demo.sh: $((pings - replies)) of $pings pings lost" >&2; exit 1; }
