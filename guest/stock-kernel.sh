#!/usr/bin/env bash
# Fetch Debian's stock cloud kernel for the opt-in slow suite, cached.
#
#   guest/stock-kernel.sh [--force]
#
# Resolves the metapackage linux-image-cloud-amd64 to the versioned package
# that is current in the apt index (e.g. linux-image-6.1.0-56-cloud-amd64),
# downloads it with `apt-get download` and unpacks it with `dpkg-deb -x`
# (nothing is installed: the host's /boot and dpkg database are untouched).
# The uncompressed ELF is extracted from the vmlinuz with the kernel source's
# scripts/extract-vmlinux. Results in .cache/guest/stock/:
#   vmlinux     uncompressed ELF (load this: no ~95 s decompressor under kvm_pvm)
#   vmlinuz     the package's bzImage
#   config      the package's kernel config
#   package     "<package> <version>" that was fetched (also the cache key)
# The stock kernel boots with the same initramfs (.cache/guest/initramfs.cpio.gz):
# its config has 8250 console, initramfs (gzip), ELF and script binfmt built in.
set -euo pipefail
# shellcheck source=guest/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

META=linux-image-cloud-amd64
OUT=$GUEST_CACHE/stock

force=0
for arg in "$@"; do
    case $arg in
    --force) force=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$arg' (expected --force)" ;;
    esac
done

take_cache_lock
ensure_packages apt-get:apt dpkg-deb:dpkg readelf:binutils gzip:gzip xz:xz-utils

resolve() {
    apt-cache depends "$META" 2>/dev/null | awk '/^ *Depends: linux-image-/ { print $2; exit }'
}
pkg=$(resolve || true)
if [[ -z $pkg ]]; then
    if [[ $(id -u) -eq 0 && -z ${GUEST_NO_APT:-} ]]; then
        log "$META unknown to apt-cache; running apt-get update"
        apt-get update >&2 || die "apt-get update failed"
        pkg=$(resolve || true)
    fi
    [[ -n $pkg ]] || die "apt-cache does not know $META; run 'apt-get update' (Debian 12 amd64 main)"
fi
version=$(apt-cache policy "$pkg" | awk '/Candidate:/ { print $2; exit }')
[[ -n $version && $version != "(none)" ]] || die "no candidate version of $pkg in the apt index"
want="$pkg $version"

if ((!force)) && [[ -f $OUT/package && $(cat "$OUT/package") == "$want" && -f $OUT/vmlinux ]]; then
    log "stock kernel is up to date ($want): $OUT/vmlinux"
    exit 0
fi

ensure_linux_source # for scripts/extract-vmlinux
work=$GUEST_CACHE/stock.tmp
rm -rf "$work"
mkdir -p "$work/root"
log "apt-get download $pkg=$version"
# apt's sandbox user cannot write into a root-only directory; we are the
# only reader of the .deb, so make the download directory writable for it.
chmod 0777 "$work"
(cd "$work" && apt-get download "$pkg=$version" >&2) || die "apt-get download $pkg=$version failed"
deb=$(find "$work" -maxdepth 1 -name '*.deb' | head -n1)
[[ -n $deb ]] || die "apt-get download left no .deb in $work"
log "dpkg-deb -x $(basename "$deb") (not installed)"
dpkg-deb -x "$deb" "$work/root"
vmlinuz=$(find "$work/root/boot" -maxdepth 1 -name 'vmlinuz-*' 2>/dev/null | head -n1)
[[ -n $vmlinuz ]] || die "$(basename "$deb") has no /boot/vmlinuz-*"
kver=${vmlinuz##*/vmlinuz-}

log "extracting the uncompressed vmlinux with scripts/extract-vmlinux"
"$LINUX_SRC_DIR/scripts/extract-vmlinux" "$vmlinuz" >"$work/vmlinux" ||
    die "scripts/extract-vmlinux could not decompress $vmlinuz"
readelf -h "$work/vmlinux" | grep -q 'ELF64' || die "extracted vmlinux is not an ELF64 file"

mkdir -p "$OUT"
rm -f "$OUT/package"
install -m 0644 "$vmlinuz" "$OUT/vmlinuz"
install -m 0644 "$work/vmlinux" "$OUT/vmlinux"
install -m 0644 "$work/root/boot/config-$kver" "$OUT/config"
printf '%s\n' "$want" >"$OUT/package"
rm -rf "$work"
log "stock kernel $kver ($want): $OUT/vmlinux ($(stat -c %s "$OUT/vmlinux") bytes), $OUT/vmlinuz"
