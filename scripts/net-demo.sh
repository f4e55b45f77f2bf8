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
ip -n "$ns" tuntap add "$tap" mode tap multi_queue
ip -n "$ns" addr add 10.0.2.1/24 dev "$tap"
ip -n "$ns" link set "$tap" up
ip -n "$ns" link set lo up

ip netns exec "$ns" "$VMM" -v run --sched "$sched" --kernel "$kernel" --memory 256M \
  --guest "package:1 l3:1 l2:1 core:$vcpus pu:1" \
  --net "tap=$tap,mac=52:54:00:12:34:56,num_queues=$((2 * queues))" --console "$console" \
  --cmdline "root=/dev/vda rootwait ip=10.0.2.15::10.0.2.1:255.255.255.0::eth0:off loglevel=8" \
  --timeout 30m >"$dir/console.log" 2>"$dir/vmm.log" &
pid=$!
start=$SECONDS
until grep -q ", ipaddr=10.0.2.15," "$dir/console.log" 2>/dev/null; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "net-demo.sh: the VMM ended before the guest configured eth0:" >&2
    tail -20 "$dir/vmm.log" "$dir/console.log" >&2
    exit 1
  fi
  if [ $((SECONDS - start)) -gt 900 ]; then
    echo "net-demo.sh: eth0 not configured after 900 s" >&2
    exit 1
  fi
  sleep 1
done
echo "guest up after $((SECONDS - start)) s: $(grep -m1 'IP-Config: Complete' -A1 "$dir/console.log" | tail -1 | sed 's/^\[[^]]*\] *//')"
# ip= prints its result before the first exchange (ARP) is done: the
# counted pings start once one answer came back
for _ in $(seq 60); do
  ip netns exec "$ns" ping -n -c 1 -W 1 10.0.2.15 >/dev/null 2>&1 && break
done
ip netns exec "$ns" ping -n -c "$pings" -i "$interval" -W 10 10.0.2.15 >"$dir/ping.txt" || true
tail -2 "$dir/ping.txt"
grep -o 'time=[0-9.]*' "$dir/ping.txt" | cut -d= -f2 | sort -g >"$dir/rtt.txt"
n=$(wc -l <"$dir/rtt.txt")
if [ "$n" -gt 0 ]; then
  p() { sed -n "$(( ( (n - 1) * $1 + 50) / 100 + 1 ))p" "$dir/rtt.txt"; }
  echo "rtt ms: p50 $(p 50) p90 $(p 90) p99 $(p 99) max $(tail -1 "$dir/rtt.txt") ($n replies of $pings)"
fi
if [ -n "$out" ]; then
  {
    echo "# scripts/net-demo.sh --sched $sched --vcpus $vcpus --queues $queues --pings $pings --interval $interval --console $console"
    echo "# $(date -u +%FT%TZ) commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown) host $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); kvm: $([ -d /sys/module/kvm_pvm ] && echo kvm_pvm || echo hardware)"
    echo "# $(tail -2 "$dir/ping.txt" | head -1)"
    grep -o 'icmp_seq=[0-9]* .*time=[0-9.]*' "$dir/ping.txt" | sed 's/icmp_seq=\([0-9]*\).*time=\([0-9.]*\)/\1 \2/'
  } >"$out.tmp" && mv "$out.tmp" "$out"
fi
[ "$n" -eq "$pings" ] || { echo "net-demo.sh: $((pings - n)) of $pings pings lost" >&2; exit 1; }
