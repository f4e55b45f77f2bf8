#!/usr/bin/env bash
# Build the guest initramfs from Debian's busybox-static and guest/init, cached.
#
#   guest/build-initramfs.sh [--force]
#
# Results in .cache/guest/:
#   initramfs.cpio.gz   gzip'd newc cpio (the kernel has RD_GZIP)
#   initramfs.cpio      the same archive uncompressed (no decompression in the
#                       guest; any initrd loader accepts it)
#
# Contents: /init (guest/init), /bin/busybox (from the busybox-static package,
# /bin/busybox on this host) with a symlink for each of its applets,
# /dev/console, and empty /proc /sys /dev /tmp /root. The archive is written
# by the kernel source's own usr/gen_init_cpio (no root needed for device
# nodes), with all mtimes 0: same inputs, same bytes.
#
# Cache key: hashes of guest/init, the busybox binary and this recipe.
set -euo pipefail
# shellcheck source=guest/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RECIPE=1
INIT=$GUEST_DIR/init
BUSYBOX=${GUEST_BUSYBOX:-/bin/busybox}
OUT_GZ=$GUEST_CACHE/initramfs.cpio.gz
OUT_RAW=$GUEST_CACHE/initramfs.cpio

force=0
for arg in "$@"; do
    case $arg in
    --force | --clean) force=1 ;; # --clean: as passed on by build.sh
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$arg' (expected --force or --clean)" ;;
    esac
done

[[ -f $INIT ]] || die "$INIT is missing"
take_cache_lock
ensure_packages gcc:gcc gzip:gzip sha256sum:coreutils
[[ -n ${GUEST_BUSYBOX:-} ]] || ensure_packages "$BUSYBOX:busybox-static"
[[ -x $BUSYBOX ]] || die "$BUSYBOX is not an executable"
# Debian's /bin/busybox comes from busybox-static (static) or busybox (dynamic,
# useless in an initramfs without a libc). Insist on a static binary.
if command -v file >/dev/null && ! file -L "$BUSYBOX" | grep -q 'statically linked'; then
    die "$BUSYBOX is not statically linked: apt-get install busybox-static (it replaces the dynamic busybox)"
fi

key=$( {
    echo "recipe $RECIPE"
    echo "init $(sha256sum <"$INIT" | cut -d' ' -f1)"
    echo "busybox $(sha256sum <"$BUSYBOX" | cut -d' ' -f1)"
} | sha256sum | cut -d' ' -f1)
if ((!force)) && [[ -f $OUT_GZ && -f $OUT_RAW && -f $GUEST_CACHE/initramfs.key &&
    $(cat "$GUEST_CACHE/initramfs.key") == "$key" ]]; then
    log "initramfs is up to date (key ${key:0:12}): $OUT_GZ"
    exit 0
fi

# gen_init_cpio from the kernel source, compiled once.
GEN=$GUEST_CACHE/tools/gen_init_cpio
if [[ ! -x $GEN ]]; then
    ensure_linux_source
    log "compiling usr/gen_init_cpio from the kernel source"
    mkdir -p "$GUEST_CACHE/tools"
    gcc -O2 -o "$GEN.tmp" "$LINUX_SRC_DIR/usr/gen_init_cpio.c"
    mv "$GEN.tmp" "$GEN"
fi

t0=$(date +%s%N)
list=$GUEST_CACHE/initramfs.list
# gen_init_cpio stamps regular files with their own mtime: stage copies with
# mtime 0 so that the archive depends on the contents only.
stage=$GUEST_CACHE/initramfs.stage
rm -rf "$stage" && mkdir -p "$stage"
cp "$BUSYBOX" "$stage/busybox"
cp "$INIT" "$stage/init"
touch -d @0 "$stage/busybox" "$stage/init"
{
    echo "dir /bin 0755 0 0"
    echo "dir /sbin 0755 0 0"
    echo "dir /usr 0755 0 0"
    echo "dir /usr/bin 0755 0 0"
    echo "dir /usr/sbin 0755 0 0"
    echo "dir /dev 0755 0 0"
    echo "nod /dev/console 0600 0 0 c 5 1"
    echo "dir /proc 0555 0 0"
    echo "dir /sys 0555 0 0"
    echo "dir /tmp 1777 0 0"
    echo "dir /root 0700 0 0"
    echo "file /bin/busybox $stage/busybox 0755 0 0"
    echo "file /init $stage/init 0755 0 0"
    # One absolute symlink per applet, at the path busybox expects it.
    "$BUSYBOX" --list-full | sort -u | while read -r applet; do
        [[ $applet == bin/busybox || -z $applet ]] && continue
        echo "slink /$applet /bin/busybox 0777 0 0"
    done
} >"$list"
napplets=$(grep -c '^slink' "$list")

"$GEN" -t 0 "$list" >"$OUT_RAW.tmp"
gzip -n -9 -c "$OUT_RAW.tmp" >"$OUT_GZ.tmp"
mv "$OUT_RAW.tmp" "$OUT_RAW"
mv "$OUT_GZ.tmp" "$OUT_GZ"
printf '%s\n' "$key" >"$GUEST_CACHE/initramfs.key"
t1=$(date +%s%N)
log "built in $(((t1 - t0) / 1000000)) ms: $OUT_GZ ($(stat -c %s "$OUT_GZ") bytes), $OUT_RAW ($(stat -c %s "$OUT_RAW") bytes); busybox with $napplets applets"
