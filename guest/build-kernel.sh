#!/usr/bin/env bash
# Build the minimal guest kernel from Debian's linux-source-6.1, cached.
#
#   guest/build-kernel.sh [--force] [--clean]
#
# Steps: extract the source once into .cache/guest/src/, `make tinyconfig`,
# merge guest/kernel.config on top (allnoconfig semantics, like tinyconfig),
# check that every option of the fragment ended up as asked, build vmlinux and
# bzImage with -j$(nproc), and copy the results to .cache/guest/kernel/:
#   vmlinux     uncompressed ELF (what the VMM loads: no decompressor run)
#   bzImage     the same kernel, compressed, for bzImage loaders and QEMU
#   config      the final .config
#   System.map  symbols, for reading oopses
#   build-info  cache key inputs and the measured build time
#
# The cache key hashes the fragment, the source package version, the compiler
# version and this script's recipe version: with all unchanged, nothing runs.
#   --force   rebuild even when the cache key matches
#   --clean   also wipe the object directory (.cache/guest/build) first
# Environment: GUEST_KERNEL_FRAGMENT=FILE uses another fragment; see lib.sh
# for GUEST_CACHE, LINUX_SOURCE_TAR, GUEST_NO_APT and GUEST_JOBS.
set -euo pipefail
# shellcheck source=guest/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Bump when a change to this script changes what gets built.
RECIPE=1
FRAGMENT=${GUEST_KERNEL_FRAGMENT:-$GUEST_DIR/kernel.config}
OBJ=$GUEST_CACHE/build
OUTDIR=$GUEST_CACHE/kernel

force=0 clean=0
for arg in "$@"; do
    case $arg in
    --force) force=1 ;;
    --clean) clean=1 force=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$arg' (expected --force or --clean)" ;;
    esac
done

[[ -f $FRAGMENT ]] || die "config fragment $FRAGMENT is missing"

# Check the fragment's syntax first: a malformed line would be ignored by
# Kconfig without a word.
bad=$(grep -nvE '^(#.*|[[:space:]]*|CONFIG_[A-Za-z0-9_]+=.*)$' "$FRAGMENT" || true)
[[ -z $bad ]] || die "malformed lines in $FRAGMENT (expected CONFIG_X=value, '# CONFIG_X is not set' or comments):
$bad"

take_cache_lock

ensure_packages make:make gcc:gcc ld:binutils flex:flex bison:bison bc:bc \
    perl:perl /usr/include/gelf.h:libelf-dev /usr/include/openssl/opensslv.h:libssl-dev \
    cpio:cpio gzip:gzip sha256sum:coreutils

src_version=$(linux_source_version 2>/dev/null || true)
if [[ -z $src_version ]]; then
    ensure_linux_source
    src_version=$(linux_source_version)
fi
cc_version=$(gcc --version | head -n1)
key=$( {
    echo "recipe $RECIPE"
    echo "source $src_version"
    echo "cc $cc_version"
    echo "fragment-sha256 $(sha256sum <"$FRAGMENT" | cut -d' ' -f1)"
} | tee "$GUEST_CACHE/.kernel-key.new" | sha256sum | cut -d' ' -f1)

if ((!force)) && [[ -f $OUTDIR/key && $(cat "$OUTDIR/key") == "$key" &&
    -f $OUTDIR/vmlinux && -f $OUTDIR/bzImage ]]; then
    log "kernel is up to date (key ${key:0:12}): $OUTDIR/vmlinux"
    rm -f "$GUEST_CACHE/.kernel-key.new"
    exit 0
fi

ensure_linux_source
t0=$(date +%s)

# Objects from another source version are useless; start over then.
if ((clean)) || [[ ! -f $OBJ/.source-version || $(cat "$OBJ/.source-version") != "$src_version" ]]; then
    log "fresh object directory $OBJ"
    rm -rf "$OBJ"
fi
mkdir -p "$OBJ"
printf '%s\n' "$src_version" >"$OBJ/.source-version"

export ARCH=x86_64
# Reproducible build metadata (the "Linux version" banner).
export KBUILD_BUILD_USER=vmm KBUILD_BUILD_HOST=guest
export KBUILD_BUILD_TIMESTAMP="2024-01-01 00:00:00 UTC"
mk() { make -C "$LINUX_SRC_DIR" O="$OBJ" ARCH=x86_64 "$@"; }

log "make tinyconfig"
mk -s tinyconfig >"$OBJ/tinyconfig.log" 2>&1 || { cat "$OBJ/tinyconfig.log" >&2; die "make tinyconfig failed"; }
log "merging $FRAGMENT (merge_config.sh -n: options not in the fragment stay as tinyconfig has them)"
(cd "$LINUX_SRC_DIR" && ./scripts/kconfig/merge_config.sh -n -O "$OBJ" "$OBJ/.config" "$FRAGMENT") \
    >"$OBJ/merge.log" 2>&1 || { cat "$OBJ/merge.log" >&2; die "merge_config.sh failed"; }

# Every line of the fragment must hold in the final .config. Kconfig drops an
# option silently when its dependencies are not met; this turns that into an
# error that names the option.
log "verifying that every option of the fragment is set as asked"
# Print the "depends on" lines of a symbol's Kconfig entry, as a hint.
kconfig_deps() {
    local name=${1#CONFIG_}
    (cd "$LINUX_SRC_DIR" && grep -rn --include='Kconfig*' -A15 -E "^(menu)?config $name\$" . 2>/dev/null) |
        awk '/^[^ ]*-[0-9]+-$/ { exit } /depends on/ { sub(/^[^ \t]*-[0-9]+-[ \t]*/, ""); print "      " $0 }' >&2 || true
}
failures=0
while IFS= read -r line; do
    if [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)=(.*)$ ]]; then
        sym=${BASH_REMATCH[1]} want=${BASH_REMATCH[2]}
        if ! grep -qxF -- "$sym=$want" "$OBJ/.config"; then
            got=$(grep -E "^$sym=|^# $sym is not set" "$OBJ/.config" || echo "absent (unknown symbol or unmet dependencies)")
            log "  MISMATCH: asked $sym=$want, got: $got"
            kconfig_deps "$sym"
            failures=$((failures + 1))
        fi
    elif [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
        sym=${BASH_REMATCH[1]}
        if got=$(grep -E "^$sym=" "$OBJ/.config"); then
            log "  MISMATCH: asked '$sym is not set', got: $got (something selects it)"
            failures=$((failures + 1))
        fi
    fi
done <"$FRAGMENT"
if ((failures)); then
    die "$failures option(s) of $FRAGMENT did not end up as asked. See the dependencies with:
  make -C $LINUX_SRC_DIR O=$OBJ ARCH=x86_64 menuconfig   (then '/' and the symbol name)"
fi
log "all $(grep -cE '^(CONFIG_|# CONFIG_.* is not set)' "$FRAGMENT") fragment options verified"

log "building vmlinux and bzImage with -j$GUEST_JOBS (log: $OBJ/build.log)"
if ! mk -j"$GUEST_JOBS" vmlinux bzImage >"$OBJ/build.log" 2>&1; then
    tail -n 40 "$OBJ/build.log" >&2
    die "kernel build failed; full log in $OBJ/build.log"
fi
t1=$(date +%s)

mkdir -p "$OUTDIR"
rm -f "$OUTDIR/key"
for f in vmlinux arch/x86/boot/bzImage .config System.map; do
    install -m 0644 "$OBJ/$f" "$OUTDIR/$(basename "$f").tmp"
done
mv "$OUTDIR/vmlinux.tmp" "$OUTDIR/vmlinux"
mv "$OUTDIR/bzImage.tmp" "$OUTDIR/bzImage"
mv "$OUTDIR/.config.tmp" "$OUTDIR/config"
mv "$OUTDIR/System.map.tmp" "$OUTDIR/System.map"
{
    cat "$GUEST_CACHE/.kernel-key.new"
    echo "key $key"
    echo "kernel $(cat "$OBJ/include/config/kernel.release" 2>/dev/null || echo unknown)"
    echo "build-seconds $((t1 - t0))"
    echo "jobs $GUEST_JOBS"
    echo "built-at $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$OUTDIR/build-info"
rm -f "$GUEST_CACHE/.kernel-key.new"
printf '%s\n' "$key" >"$OUTDIR/key"
log "built in $((t1 - t0)) s: $OUTDIR/vmlinux ($(stat -c %s "$OUTDIR/vmlinux") bytes), $OUTDIR/bzImage ($(stat -c %s "$OUTDIR/bzImage") bytes)"
