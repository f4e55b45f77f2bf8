#!/usr/bin/env bash
# Ping round trips of a guest kernel that shares the host CPUs with busy
# neighbours on one scheduler: the overcommitted case of the network path.
#
# `vmm serve` runs inside a network namespace with a multi-queue tap
# (10.0.2.1/24). Through its API it boots the minimal guest kernel with
# --vcpus vCPUs and a virtio-net card (the kernel's `ip=` configures eth0;
# `root=` names a device that never appears, which keeps the kernel alive),
# waits until eth0 is up, then creates and boots --neighbours micro-guest
# VMs of one vCPU each that compute without end ("spin"), and pings the
# guest from the namespace. Every vCPU, the guest's and the neighbours',
# runs on the server's one executor: `--sched vcpu_sched` is the workers
# executor (vcpu_sched, all fixes), `--sched host` the host executor (1:1
# threads, the host kernel schedules them). The neighbours start after the
# boot: a guest kernel with more vCPUs than host CPUs spends many minutes
# in stop_machine under kvm_pvm (docs/kvm-notes.md), which this avoids
# while the ping still meets the overcommit.
#
#   scripts/net-neighbours.sh [--sched host|vcpu_sched] [--vcpus N]
#                             [--neighbours K] [--pings N] [--interval S]
#                             [--serve-arg ARG]... [--out FILE]
#
# Defaults: --vcpus 2, --neighbours 6 (8 vCPUs: 4 per CPU on a 2-CPU
# host), 300 pings 0.05 s apart. --out FILE gets the raw round-trip times
# (ms, one per line after a # header with the command, date, commit and
# machine). --serve-arg ARG (repeatable) appends ARG to the `vmm serve`
# command line, e.g. `--serve-arg --sleeper-credit --serve-arg on` for an
# A/B of a scheduler setting. After the pings it prints (and appends to
# FILE as a # line) the guest's and the neighbours' running time, run
# delay and runs (switch-ins; the guest's mean turn on a CPU and mean wait
# per turn follow) over the pings, from /metrics: vcpu_sched's statistics,
# or the host kernel's schedstat of the vCPU threads with --sched host;
# then the CPU time of the server's threads (all; the vCPU runners, with
# how often the host preempted them; the executor's helper threads).
# Needs root, the guest kernel (guest/build.sh), iproute2, ping
# and curl (scripts/setup.sh installs them). VMM_BIN picks the binary
# (default: target/debug/vmm, then `vmm` on PATH).
set -euo pipefail
# shellcheck source=scripts/lib/ping.sh
source "$(dirname "$0")/lib/ping.sh"
# shellcheck source=scripts/lib/serve.sh
source "$(dirname "$0")/lib/serve.sh"
sched=vcpu_sched vcpus=2 neighbours=6 pings=300 interval=0.05 out=
serve_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --sched) sched=$2; shift 2 ;;
    --vcpus) vcpus=$2; shift 2 ;;
    --neighbours) neighbours=$2; shift 2 ;;
    --pings) pings=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --serve-arg) serve_args+=("$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "net-neighbours.sh: unknown argument $1 (see the header for the options)" >&2; exit 2 ;;
  esac
done
case $sched in
  host) executor=host ;;
  vcpu_sched) executor=workers ;;
  *) echo "net-neighbours.sh: --sched $sched: give host or vcpu_sched" >&2; exit 2 ;;
esac
if [ -n "$out" ] && [ -e "$out" ]; then
  echo "net-neighbours.sh: --out $out exists; give a new path" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")/.." && pwd)
VMM=${VMM_BIN:-}
if [ -z "$VMM" ]; then
  if [ -x "$here/target/debug/vmm" ]; then VMM=$here/target/debug/vmm; else VMM=$(command -v vmm); fi
fi
kernel=${GUEST_KERNEL:-$here/.cache/guest/kernel/vmlinux}
[ -f "$kernel" ] || { echo "net-neighbours.sh: no guest kernel at $kernel: run guest/build.sh" >&2; exit 2; }

ns=vmmnb-$$
tap=vmmtap0
dir=$(mktemp -d)
sock=$dir/api.sock
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
ip netns add "$ns"
guest_tap "$ns" "$tap"

ip netns exec "$ns" "$VMM" serve --api-socket "$sock" --executor "$executor" "${serve_args[@]}" 2>"$dir/serve.log" &
pid=$!
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "net-neighbours.sh: vmm serve did not start:" >&2; cat "$dir/serve.log" >&2; exit 1; }
api() { # METHOD PATH [BODY]: fails on an HTTP error, naming the answer
  serve_api "$sock" "$dir/answer" "$@" 2> >(sed 's/^/net-neighbours.sh: /' >&2) || exit 1
}
cmdline="root=/dev/vdz rootwait ip=10.0.2.15::10.0.2.1:255.255.255.0::eth0:off loglevel=8"
api PUT vms/guest/vm.create "{
  \"cpus\": {\"boot_vcpus\": $vcpus, \"max_vcpus\": $vcpus,
           \"topology\": {\"threads_per_core\": 1, \"cores_per_die\": $vcpus, \"dies_per_package\": 1, \"packages\": 1}},
  \"memory\": {\"size\": 268435456},
  \"payload\": {\"kernel\": \"$kernel\", \"cmdline\": \"$cmdline\"},
  \"net\": [{\"tap\": \"$tap\", \"mac\": \"52:54:00:12:34:56\"}],
  \"serial\": {\"mode\": \"File\", \"file\": \"$dir/console.log\"},
  \"x_vmm\": {\"placement\": {\"policy\": \"none\"}}}"
api PUT vms/guest/vm.boot
wait_guest_ip "$pid" "$dir/console.log" "$dir/serve.log"
first_answer "$ns"
for i in $(seq "$neighbours"); do
  api PUT "vms/n$i/vm.create" '{"cpus": {"boot_vcpus": 1}, "x_vmm": {"micro": "spin", "placement": {"policy": "none"}}}'
  api PUT "vms/n$i/vm.boot"
done
total=$((vcpus + neighbours))
echo "$total vCPUs on $(nproc) host CPUs under --sched $sched: $vcpus in the guest, $neighbours spinning neighbours"
# the guest's vCPUs and the neighbours' over the pings, from /metrics:
# running time, run delay and runs (vcpu_sched's own statistics, or the host
# kernel's schedstat of each vCPU thread under --executor host), seconds
cpu_split() {
  curl -sS --unix-socket "$sock" http://localhost/metrics | awk '
    /^vmm_vm_running_seconds_total\{vm="guest"\}/ { gr = $2 }
    /^vmm_vm_run_delay_seconds_total\{vm="guest"\}/ { gd = $2 }
    /^vmm_vm_runs_total\{vm="guest"\}/ { gn = $2 }
    /^vmm_vm_running_seconds_total\{vm="n[0-9]+"\}/ { nr += $2 }
    /^vmm_vm_run_delay_seconds_total\{vm="n[0-9]+"\}/ { nd += $2 }
    /^vmm_vm_runs_total\{vm="n[0-9]+"\}/ { nn += $2 }
    END { printf "%.6f %.6f %d %.6f %.6f %d\n", gr, gd, gn, nr, nd, nn }'
}
# the server's own threads over the pings, from each thread's schedstat
# (CPU time, ns) and status: all of them; the vCPU runners (the workers,
# worker/N, under vcpu_sched; the vCPU threads, vcpuN or vM.N, under
# --sched host), with how often the host preempted them
# (nonvoluntary_ctxt_switches); and the executor's helpers (halt-poll,
# block-watch, the clock and checker threads). Under vcpu_sched a vCPU's
# running time above is its time holding a worker, which includes a halt
# inside KVM_RUN until it is found; the workers' CPU time is what the host
# CPUs really gave.
thread_cpu() {
  local t comm ns all=0 runners=0 preempted=0 helpers=0 n
  for t in /proc/"$pid"/task/*; do
    comm=$(cat "$t/comm" 2>/dev/null) || continue
    ns=$(cut -d' ' -f1 "$t/schedstat" 2>/dev/null) || continue
    all=$((all + ns))
    case $comm in
      worker/* | vcpu[0-9]* | v[0-9]*.[0-9]*)
        runners=$((runners + ns))
        n=$(awk '/^nonvoluntary_ctxt_switches/ { print $2 }' "$t/status" 2>/dev/null)
        preempted=$((preempted + ${n:-0})) ;;
      halt-poll | block-watch | *-clock | *-check) helpers=$((helpers + ns)) ;;
    esac
  done
  echo "$all $runners $preempted $helpers"
}
t0=$(cpu_split)
c0=$(thread_cpu)
ping_judge "$ns" "$pings" "$interval" "$dir" "$out" "scripts/net-neighbours.sh --sched $sched --vcpus $vcpus --neighbours $neighbours --pings $pings --interval $interval${serve_args[*]:+ (vmm serve ${serve_args[*]})}"
t1=$(cpu_split)
c1=$(thread_cpu)
split=$(echo "$t0 $t1" | awk '{
  gr = $7 - $1; gd = $8 - $2; gn = $9 - $3; nr = $10 - $4; nd = $11 - $5; nn = $12 - $6
  printf "guest running %.3f s, run delay %.3f s, %d runs (%.3f ms running, %.3f ms waiting per run); neighbours running %.3f s, run delay %.3f s, %d runs", gr, gd, gn, gn ? 1e3 * gr / gn : 0, gn ? 1e3 * gd / gn : 0, nr, nd, nn
}')
split+=$(echo "$c0 $c1" | awk '{
  printf "; vmm CPU %.3f s, of it vCPU runners %.3f s (preempted %d times), executor helpers %.3f s", ($5 - $1) / 1e9, ($6 - $2) / 1e9, $7 - $3, ($8 - $4) / 1e9
}')
echo "over the pings: $split"
if [ -n "$out" ]; then echo "# over the pings: $split" >>"$out"; fi
# every neighbour is still running (none failed while the guest was pinged)
for i in $(seq "$neighbours"); do
  api GET "vms/n$i/vm.info"
  grep -q '"state":"Running"' "$dir/answer" || { echo "net-neighbours.sh: neighbour n$i is not running: $(cat "$dir/answer")" >&2; exit 1; }
done
api PUT vmm.shutdown
wait "$pid" || true
pid=
[ "$replies" -eq "$pings" ] || { echo "net-neighbours.sh: $((pings - replies)) of $pings pings lost" >&2; exit 1; }
