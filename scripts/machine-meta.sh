#!/usr/bin/env bash
# What a measurement ran on and from, as `key=value` lines, for the
# measurement scripts to put beside (or at the head of) their raw data:
#
#   date        now, UTC
#   commit      HEAD of this checkout (12 hex digits), "unknown" outside git
#   dirty       "yes" when tracked files outside docs/ differ from HEAD (the
#               binary may then hold changes that no commit has), else "no";
#               docs/ is left out: measurement scripts rewrite their own
#               pages and data there, which no binary is built from
#   cpu         lscpu's "Model name" (/proc/cpuinfo's "model name" without lscpu)
#   cpu_vendor  lscpu's "Vendor ID"
#   cpu_family  lscpu's "CPU family"
#   nproc       CPUs this process may use
#   kernel      uname -r
#   kvm         kvm_pvm, hardware KVM (which module), or none
#
#   scripts/machine-meta.sh [PREFIX]   PREFIX goes before every line ("# " for a log header)
#
# Run it when the binary under test is built, so that commit and dirty
# describe that binary: a later commit in a shared tree would not.
set -euo pipefail
p=${1:-}
root=$(dirname "$0")/..
lscpu_field() { LC_ALL=C lscpu 2>/dev/null | awk -F': *' -v k="$1" '$1 == k { print $2; exit }'; }
cpu=$(lscpu_field "Model name")
[ -n "$cpu" ] || cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
if [ -d /sys/module/kvm_pvm ]; then
    kvm="kvm_pvm (software virtualization: guest code is emulated)"
elif [ -e /dev/kvm ]; then
    mods=$(for m in kvm_intel kvm_amd; do [ -d "/sys/module/$m" ] && printf '%s ' "$m"; done)
    kvm="hardware KVM (${mods}loaded)"
else
    kvm=none
fi
commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ "$commit" = unknown ]; then
    dirty=unknown
elif [ -n "$(git -C "$root" status --porcelain --untracked-files=no -- . ':!docs' 2>/dev/null)" ]; then
    dirty=yes
else
    dirty=no
fi
cat <<EOF
${p}date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
${p}commit=$commit
${p}dirty=$dirty
${p}cpu=${cpu:-unknown}
${p}cpu_vendor=$(lscpu_field "Vendor ID")
${p}cpu_family=$(lscpu_field "CPU family")
${p}nproc=$(nproc)
${p}kernel=$(uname -r)
${p}kvm=$kvm
EOF
