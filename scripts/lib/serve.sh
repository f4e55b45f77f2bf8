# shellcheck shell=bash
# Talking to `vmm serve`'s API from the scripts that drive it
# (net-neighbours.sh, vmm/scripts/boot-sched.sh); sourced, never run.

# serve_api SOCK ANSWER METHOD PATH [BODY]: one request to the API on the
# Unix socket SOCK (BODY as JSON); the answer's body goes to the file
# ANSWER. Returns 0 on a 2xx answer; otherwise prints "METHOD PATH
# answered CODE: BODY" to stderr and returns 1 (the caller decides whether
# that ends the script).
serve_api() {
    local sock=$1 answer=$2 method=$3 path=$4 body=${5:-} code
    code=$(curl -sS --unix-socket "$sock" -X "$method" -o "$answer" -w '%{http_code}' \
        "http://localhost/api/v1/$path" ${body:+-H 'Content-Type: application/json' -d "$body"})
    case $code in
        2*) return 0 ;;
        *) echo "$method $path answered $code: $(cat "$answer" 2>/dev/null)" >&2; return 1 ;;
    esac
}

# The Linux boot targets' VM (vmm/scripts/boot-sched.sh, boot-diag.sh,
# idle-cost.sh): 12 vCPUs on 2 nodes, 768M, no placement policy.
BOOT_SHAPE="package:2 [numa] die:3 l3:1 l2:1 core:2 pu:1"

# boot_vm_body KERNEL INITRAMFS CONSOLE: the vm.create body of one such VM,
# its kernel printing its sched domains (`sched_verbose`) to the serial
# console file CONSOLE.
boot_vm_body() {
    local kernel=$1 initramfs=$2 console=$3
    printf '%s' "{
    \"cpus\": {\"boot_vcpus\": 12, \"max_vcpus\": 12},
    \"memory\": {\"size\": 805306368},
    \"payload\": {\"kernel\": \"$kernel\", \"initramfs\": \"$initramfs\", \"cmdline\": \"loglevel=8 sched_verbose\"},
    \"serial\": {\"mode\": \"File\", \"file\": \"$console\"},
    \"x_vmm\": {\"topology\": \"$BOOT_SHAPE\", \"placement\": {\"policy\": \"none\"}}}"
}

# serve_wait SOCK PID: waits (up to 10 s) until `vmm serve` (PID) listens
# on SOCK; fails if it ended or never did.
serve_wait() {
    local sock=$1 pid=$2
    for _ in $(seq 200); do
        [ -S "$sock" ] && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    echo "vmm serve is not listening on $sock" >&2
    return 1
}
