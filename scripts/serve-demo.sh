#!/usr/bin/env bash
# vmm serve driven by curl over its Unix socket: start the server, create
# and boot two micro-guest VMs (one pinned by the planner, one that
# triple-faults), read vm.info, pause and resume the first, read /metrics,
# check the exposition with promtool when it is installed, then
# vmm.shutdown, which stops every VM and removes the socket. VMM_BIN picks the binary (default: target/debug/vmm,
# then `vmm` on PATH).
set -euo pipefail
VMM=${VMM_BIN:-}
if [ -z "$VMM" ]; then
  here=$(cd "$(dirname "$0")/.." && pwd)
  if [ -x "$here/target/debug/vmm" ]; then VMM=$here/target/debug/vmm; else VMM=vmm; fi
fi
dir=$(mktemp -d)
sock=$dir/vmm.sock
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
"$VMM" serve --api-socket "$sock" --topology "package:1 l3:2 l2:2 core:1 pu:2" 2>"$dir/serve.log" &
pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
api() { # METHOD PATH [BODY]: prints the body and the status code
  curl -sS --unix-socket "$sock" -X "$1" -w ' [%{http_code}]\n' "http://localhost/api/v1/$2" \
    ${3:+-H 'Content-Type: application/json' -d "$3"}
}
api GET vmm.ping
api PUT vm.create '{"cpus":{"boot_vcpus":2,"max_vcpus":2,"topology":{"threads_per_core":2,"cores_per_die":1,"dies_per_package":1,"packages":1}},"memory":{"size":2097152},"x_vmm":{"micro":"ticker"}}'
api PUT vm.boot
api PUT vms/crashy/vm.create '{"cpus":{"boot_vcpus":1},"x_vmm":{"micro":"crash"}}'
api PUT vms/crashy/vm.boot
sleep 0.5
api GET vm.info
api PUT vm.pause
api GET vm.info | grep -o '"state":"Paused"'
api PUT vm.resume
api GET vms/crashy/vm.info
api PUT vm.create '{"cpus":{"boot_vcpus":2,"bogus":1}}'
curl -sS --unix-socket "$sock" http://localhost/metrics >"$dir/metrics.txt"
grep -E '^vmm_vm_kvm_exits_total' "$dir/metrics.txt"
if command -v promtool >/dev/null; then
  promtool check metrics <"$dir/metrics.txt" && echo "promtool check metrics: ok"
fi
api PUT vmm.shutdown
wait $pid
[ ! -e "$sock" ] && echo "server stopped, socket removed"
