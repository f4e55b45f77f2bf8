# shellcheck shell=bash
# The ping judge of the scripts that boot a Linux guest on a tap
# (net-demo.sh, net-neighbours.sh); sourced, never run. The guest is
# 10.0.2.15 on the tap's 10.0.2.0/24, configured by the kernel's `ip=`.

me=$(basename "$0")
GUEST_IP=10.0.2.15

# guest_tap NS TAP: a multi-queue tap TAP in namespace NS, 10.0.2.1/24, up.
guest_tap() {
    ip -n "$1" tuntap add "$2" mode tap multi_queue
    ip -n "$1" addr add 10.0.2.1/24 dev "$2"
    ip -n "$1" link set "$2" up
    ip -n "$1" link set lo up
}

# wait_guest_ip PID CONSOLE LOG: waits (at most 900 s) until the guest's
# kernel log in CONSOLE says eth0 got its address; fails, with the tails of
# LOG and CONSOLE, if process PID (the VMM) ends first.
wait_guest_ip() {
    local start=$SECONDS
    until grep -q ", ipaddr=$GUEST_IP," "$2" 2>/dev/null; do
        if ! kill -0 "$1" 2>/dev/null; then
            echo "$me: the VMM ended before the guest configured eth0:" >&2
            tail -20 "$3" "$2" >&2
            exit 1
        fi
        if [ $((SECONDS - start)) -gt 900 ]; then
            echo "$me: eth0 not configured after 900 s" >&2
            exit 1
        fi
        sleep 1
    done
    echo "guest up after $((SECONDS - start)) s: $(grep -m1 'IP-Config: Complete' -A1 "$2" | tail -1 | sed 's/^\[[^]]*\] *//')"
}

# first_answer NS: pings once a second until one answer came back (at most
# 60 tries): `ip=` prints its result before the first exchange (ARP) is
# done, so the counted pings start after it.
first_answer() {
    local _
    for _ in $(seq 60); do
        ip netns exec "$1" ping -n -c 1 -W 1 "$GUEST_IP" >/dev/null 2>&1 && return 0
    done
}

# ping_judge NS PINGS INTERVAL DIR OUT COMMAND: PINGS pings from NS, ping's
# summary and the round-trip percentiles printed; with OUT non-empty the
# raw times (`seq ms` per line, after a header of # lines naming COMMAND,
# the date, commit and machine) written to OUT. $replies is the number of
# answers; the caller decides what a loss means.
ping_judge() {
    local ns=$1 pings=$2 interval=$3 dir=$4 out=$5 command=$6 here
    here=$(cd "$(dirname "$0")/.." && pwd)
    ip netns exec "$ns" ping -n -c "$pings" -i "$interval" -W 10 "$GUEST_IP" >"$dir/ping.txt" || true
    tail -2 "$dir/ping.txt"
    grep -o 'time=[0-9.]*' "$dir/ping.txt" | cut -d= -f2 | sort -g >"$dir/rtt.txt"
    replies=$(wc -l <"$dir/rtt.txt")
    if [ "$replies" -gt 0 ]; then
        p() { sed -n "$(( ( (replies - 1) * $1 + 50) / 100 + 1 ))p" "$dir/rtt.txt"; }
        echo "rtt ms: p50 $(p 50) p90 $(p 90) p99 $(p 99) max $(tail -1 "$dir/rtt.txt") ($replies replies of $pings)"
    fi
    if [ -n "$out" ]; then
        {
            echo "# $command"
            echo "# $(date -u +%FT%TZ) commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown) host $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); kvm: $([ -d /sys/module/kvm_pvm ] && echo kvm_pvm || echo hardware)"
            echo "# $(tail -2 "$dir/ping.txt" | head -1)"
            grep -o 'icmp_seq=[0-9]* .*time=[0-9.]*' "$dir/ping.txt" | sed 's/icmp_seq=\([0-9]*\).*time=\([0-9.]*\)/\1 \2/'
        } >"$out.tmp" && mv "$out.tmp" "$out"
    fi
}
