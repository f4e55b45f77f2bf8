#!/usr/bin/env bash
# Opt-in check of the guest images with a third-party VMM (QEMU), not part of
# CI. Boots the kernel + initramfs on an S-socket x C-core x T-thread shape
# with one NUMA node per socket, and checks the guest's own view against it:
#   - kernel log: SRAT APIC->node lines, "smp: Brought up N nodes, M CPUs",
#     each CPU's sched-domain spans (SMT = core, MC = package, NUMA = all);
#   - the /init block (if userspace runs): package, node, SMT siblings,
#     package siblings, L2/L3 shared_cpu_list (QEMU's Intel cache model:
#     L2 per core, L3 per package), node cpulists, distances, MemTotal.
# Prints the host time at which each milestone appeared on the console.
#
#   guest/qemu-check.sh [options]
#     --accel tcg|kvm     QEMU accelerator (default tcg: software emulation)
#     --sockets N --cores N --threads N   shape (default 2 x 2 x 2)
#     --memory MiB        guest memory, split evenly over the nodes (default 1024)
#     --distance D        SLIT distance between nodes (default 21)
#     --kernel FILE       default .cache/guest/kernel/bzImage (vmlinux works too:
#                         QEMU boots it through its PVH entry note)
#     --initrd FILE       default .cache/guest/initramfs.cpio.gz
#     --cpu MODEL         QEMU -cpu (default Skylake-Server for tcg, and for kvm
#                         host with the features kvm_pvm cannot emulate removed)
#     --append "ARGS"     extra kernel command-line arguments
#     --until REGEX       stop QEMU as soon as a console line matches
#     --timeout S         give up after S seconds (default 600)
#     --no-build          do not run guest/build.sh first
#     --no-check          only boot and report timings
# The console log is kept in .cache/guest/qemu-check/<accel>-<shape>-<kernel>.log.
# Exit status: 0 when every check passed, 1 otherwise.
set -euo pipefail
# shellcheck source=guest/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

accel=tcg sockets=2 cores=2 threads=2 memory=1024 distance=21 timeout_s=600
kernel=$GUEST_CACHE/kernel/bzImage initrd=$GUEST_CACHE/initramfs.cpio.gz
cpu="" extra="" until_re="" build=1 check=1
while (($#)); do
    case $1 in
    --accel) accel=$2; shift ;;
    --sockets) sockets=$2; shift ;;
    --cores) cores=$2; shift ;;
    --threads) threads=$2; shift ;;
    --memory) memory=$2; shift ;;
    --distance) distance=$2; shift ;;
    --kernel) kernel=$2; shift ;;
    --initrd) initrd=$2; shift ;;
    --cpu) cpu=$2; shift ;;
    --append) extra=$2; shift ;;
    --until) until_re=$2; shift ;;
    --timeout) timeout_s=$2; shift ;;
    --no-build) build=0 ;;
    --no-check) check=0 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift
done
for n in sockets cores threads memory distance timeout_s; do
    [[ ${!n} =~ ^[1-9][0-9]*$ ]] || die "--${n%_s} must be a positive integer, got '${!n}'"
done
[[ $accel == tcg || $accel == kvm ]] || die "--accel must be tcg or kvm, got '$accel'"

((build)) && "$GUEST_DIR/build.sh"
ensure_packages qemu-system-x86_64:qemu-system-x86
[[ -f $kernel ]] || die "kernel $kernel not found (run guest/build.sh)"
[[ -f $initrd ]] || die "initrd $initrd not found (run guest/build.sh)"

ncpus=$((sockets * cores * threads))
per_pkg=$((cores * threads))
node_mem=$((memory / sockets))
((node_mem >= 64)) || die "--memory $memory gives each of the $sockets nodes less than 64 MiB"

# Features the kvm_pvm instruction emulator cannot run (docs/kvm-notes.md); on
# hardware KVM removing them costs nothing for this check.
pvm_clear="smap,smep,popcnt,cx16,xsave,fsgsbase,pku,umip,rdrand,rdseed"
if [[ -z $cpu ]]; then
    if [[ $accel == tcg ]]; then
        cpu=Skylake-Server
    else
        cpu="host,-arch-capabilities,-smap,-smep,-popcnt,-cx16,-xsave,-fsgsbase,-pku,-umip,-rdrand,-rdseed,-pdcm"
    fi
fi

args=(-accel "$accel" -machine q35 -cpu "$cpu" -m "${memory}M"
    -smp "$ncpus,sockets=$sockets,cores=$cores,threads=$threads")
for ((s = 0; s < sockets; s++)); do
    args+=(-object "memory-backend-ram,id=m$s,size=${node_mem}M"
        -numa "node,nodeid=$s,cpus=$((s * per_pkg))-$(((s + 1) * per_pkg - 1)),memdev=m$s")
done
for ((a = 0; a < sockets; a++)); do
    for ((b = a + 1; b < sockets; b++)); do
        args+=(-numa "dist,src=$a,dst=$b,val=$distance")
    done
done
# The recommended command line of guest/README.md.
cmdline="console=ttyS0 reboot=k panic=-1 noxsave loglevel=8 sched_verbose"
[[ $accel == kvm ]] && cmdline+=" clearcpuid=$pvm_clear"
[[ -n $extra ]] && cmdline+=" $extra"

outdir=$GUEST_CACHE/qemu-check
mkdir -p "$outdir"
kname=$(basename "$kernel")
[[ $kernel == */stock/* ]] && kname="stock-$kname"
name="$accel-${sockets}x${cores}x${threads}-$kname"
logf=$outdir/$name.log
pidf=$outdir/$name.pid
rm -f "$pidf"
args+=(-kernel "$kernel" -initrd "$initrd" -append "$cmdline"
    -display none -nodefaults -serial stdio -no-reboot -pidfile "$pidf")
log "qemu-system-x86_64 ${args[*]}"
log "console log: $logf"

# Time-stamp each console line with the host seconds since QEMU started.
milestones=(
    "smp: Brought up"
    "attaching sched-domain"
    "Run /init"
    "VMMTOPO BEGIN"
    "VMMTOPO END"
    "reboot: Restarting system"
)
us() { local t=${EPOCHREALTIME/./}; echo $((10#$t)); }
start=$(us)
set +e
{
    timeout "$timeout_s" qemu-system-x86_64 "${args[@]}" </dev/null 2>&1
    echo "@@QEMU-EXIT $?"
} | {
    stopped=0
    while IFS= read -r line; do
        line=${line%$'\r'}
        now=${EPOCHREALTIME/./}
        d=$((10#$now - start))
        printf '%5d.%02d %s\n' $((d / 1000000)) $((d % 1000000 / 10000)) "$line"
        # QEMU pauses (does not exit) after a KVM emulation failure: stop it
        # once its register dump (ending with the Code= line) is out.
        [[ $line == "KVM internal error"* ]] && failed=1
        if [[ $stopped == 0 ]] && { [[ -n $until_re && $line =~ $until_re ]] ||
            [[ ${failed:-0} == 1 && $line == Code=* ]]; }; then
            stopped=1
            [[ -f $pidf ]] && kill "$(cat "$pidf")" 2>/dev/null
        fi
    done
} >"$logf"
set -e
end=$(us)
qemu_rc=$(sed -n 's/.*@@QEMU-EXIT \([0-9]*\)$/\1/p' "$logf" | tail -n1)
wall=$(((end - start) / 1000000)).$(((end - start) % 1000000 / 100000))

echo "== $name: QEMU exit status ${qemu_rc:-?}, host wall time ${wall} s"
for m in "${milestones[@]}"; do
    t=$(grep -m1 -F -- "$m" "$logf" | awk '{print $1}' || true)
    if [[ -n $t ]]; then printf '   %-28s at %s s\n' "$m" "$t"; else printf '   %-28s not seen\n' "$m"; fi
done
if grep -q 'KVM internal error\|emulation failure' "$logf"; then
    echo "== KVM emulation failure:"
    grep -A12 'KVM internal error' "$logf" | cut -c10- | head -20
fi
((check)) || exit 0

# ---------------------------------------------------------------- checks
fails=0
ok() { echo "   ok    $*"; }
bad() { echo "   FAIL  $*"; fails=$((fails + 1)); }
span() { if (($1 == $2)); then echo "$1"; else echo "$1-$2"; fi; }
# Console text without our time stamps (a file: `grep -q` on a pipe would
# SIGPIPE the writer and fail under pipefail).
textf=$outdir/$name.txt
cut -c10- "$logf" >"$textf"
body() { cat "$textf"; }

echo "== checks against sockets=$sockets cores=$cores threads=$threads ($ncpus CPUs, $sockets nodes)"
if grep -q "smp: Brought up $sockets nodes\?, $ncpus CPUs" "$textf"; then
    ok "smp: Brought up $sockets node(s), $ncpus CPUs"
else
    bad "no 'smp: Brought up $sockets nodes, $ncpus CPUs' line"
fi

# SRAT: every CPU's APIC ID on its socket's node. QEMU numbers APIC IDs with
# power-of-two fields: thread, then core, then socket.
pow2() { local n=1 b=0; while ((n < $1)); do n=$((n * 2)); b=$((b + 1)); done; echo $b; }
tb=$(pow2 "$threads") cb=$(pow2 "$cores")
srat_ok=1
for ((c = 0; c < ncpus; c++)); do
    s=$((c / per_pkg)) core=$(((c % per_pkg) / threads)) th=$((c % threads))
    apic=$(((s << (tb + cb)) | (core << tb) | th))
    pat=$(printf 'SRAT: PXM %d -> APIC 0x%02x -> Node %d' "$s" "$apic" "$s")
    grep -qF "$pat" "$textf" || { srat_ok=0; bad "missing '$pat'"; }
done
((srat_ok)) && ok "SRAT: all $ncpus APIC IDs on their socket's node"

# Sched domains: collect "cpu level span" triples from the sched_verbose dump.
doms=$(body | awk '
    /CPU[0-9]+ attaching sched-domain/ { match($0, /CPU[0-9]+/); cpu = substr($0, RSTART + 3, RLENGTH - 3) }
    /domain-[0-9]+: span=/ && cpu != "" {
        sp = ""; lv = ""
        for (i = 1; i <= NF; i++) { if ($i ~ /^span=/) sp = substr($i, 6); if ($i ~ /^level=/) lv = substr($i, 7) }
        print cpu, lv, sp
    }')
if [[ -z $doms ]]; then
    bad "no sched-domain lines (needs sched_verbose and loglevel=8)"
else
    dom_ok=1
    for ((c = 0; c < ncpus; c++)); do
        s=$((c / per_pkg))
        core0=$((c - c % threads))
        want=()
        ((threads > 1)) && want+=("SMT $(span "$core0" $((core0 + threads - 1)))")
        ((per_pkg > threads)) && want+=("MC $(span $((s * per_pkg)) $(((s + 1) * per_pkg - 1)))")
        ((sockets > 1)) && want+=("NUMA $(span 0 $((ncpus - 1)))")
        got=$(awk -v c="$c" '$1 == c { print $2, $3 }' <<<"$doms")
        if [[ $got != "$(printf '%s\n' "${want[@]}")" ]]; then
            dom_ok=0
            bad "CPU$c sched domains: got [${got//$'\n'/; }], want [$(printf '%s; ' "${want[@]}")]"
        fi
    done
    ((dom_ok)) && ok "sched domains of all $ncpus CPUs: $(awk '$1 == 0 { printf "%s span=%s; ", $2, $3 }' <<<"$doms")(CPU0)"
fi

# The /init block.
block=$(body | sed -n 's/^\(\[[^]]*\] \)\{0,1\}\(VMMTOPO .*\)$/\2/p')
if ! grep -q '^VMMTOPO END' <<<"$block"; then
    bad "no complete /init block (guest userspace did not run or was stopped)"
else
    field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
    nrec=$(grep -c '^VMMTOPO \(system\|cpu\|node\) ' <<<"$block")
    if [[ $(grep '^VMMTOPO END' <<<"$block" | field records) == "$nrec" ]]; then
        ok "/init block complete ($nrec records)"
    else
        bad "/init END records= does not match $nrec records"
    fi
    if [[ $(grep '^VMMTOPO system' <<<"$block" | field cpus) == "$ncpus" ]]; then
        ok "/init: cpus=$ncpus"
    else
        bad "/init: cpus is not $ncpus"
    fi
    blk_ok=1
    for ((c = 0; c < ncpus; c++)); do
        s=$((c / per_pkg))
        core0=$((c - c % threads))
        rec=$(grep "^VMMTOPO cpu id=$c " <<<"$block" || true)
        pkg_span=$(span $((s * per_pkg)) $(((s + 1) * per_pkg - 1)))
        core_span=$(span "$core0" $((core0 + threads - 1)))
        for kv in "node=$s" "physical_package_id=$s" "thread_siblings_list=$core_span" \
            "core_siblings_list=$pkg_span" "l2_shared_cpu_list=$core_span" "l3_shared_cpu_list=$pkg_span"; do
            [[ " $rec " == *" $kv "* ]] || { blk_ok=0; bad "/init cpu $c: want $kv in '${rec:-<missing>}'"; }
        done
    done
    for ((s = 0; s < sockets; s++)); do
        rec=$(grep "^VMMTOPO node id=$s " <<<"$block" || true)
        row=""
        for ((b = 0; b < sockets; b++)); do row+="${row:+,}$( ((b == s)) && echo 10 || echo "$distance")"; done
        for kv in "cpulist=$(span $((s * per_pkg)) $(((s + 1) * per_pkg - 1)))" "distance=$row"; do
            [[ " $rec " == *" $kv "* ]] || { blk_ok=0; bad "/init node $s: want $kv in '${rec:-<missing>}'"; }
        done
        mt=$(field memtotal_kb <<<"$rec")
        # MemTotal excludes what the kernel reserved; expect 80-100% of the node.
        if ! [[ $mt =~ ^[0-9]+$ ]] || ((mt > node_mem * 1024 || mt < node_mem * 1024 * 8 / 10)); then
            blk_ok=0
            bad "/init node $s: memtotal_kb=$mt not within 80-100% of ${node_mem} MiB"
        fi
    done
    ((blk_ok)) && ok "/init block: packages, nodes, SMT and package siblings, L2/L3 sharing, node cpulists, distances, MemTotal"
fi

if ((fails)); then
    echo "== $name: $fails check(s) FAILED (log: $logf)"
    exit 1
fi
echo "== $name: all checks passed"
