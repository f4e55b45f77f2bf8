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
