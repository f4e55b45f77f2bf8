#!/usr/bin/env bash
# Builds a small ext4 root image for the guest with `mke2fs -d`
# (e2fsprogs; scripts/setup.sh installs it): a directory tree with
# /etc/hostname, /etc/motd and the empty mount points a root needs, as an
# image of SIZE (default 32M). The image must not exist yet: it is never
# overwritten.
#
#   guest/build-disk.sh IMG [SIZE]
#
# Boot it with `vmm run --disk path=IMG --cmdline "root=/dev/vda rw"`; the
# guest kernel prints `VFS: Mounted root (ext4 filesystem)`.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: guest/build-disk.sh IMG [SIZE]   (SIZE as mke2fs takes it, default 32M)" >&2
  exit 2
fi
img=$1
size=${2:-32M}
if [ -e "$img" ] || [ -L "$img" ]; then
  echo "guest/build-disk.sh: $img exists; give a new path (an image is never overwritten)" >&2
  exit 2
fi
command -v mke2fs >/dev/null || {
  echo "guest/build-disk.sh: mke2fs not found: install e2fsprogs (scripts/setup.sh does)" >&2
  exit 2
}
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree"/{etc,dev,proc,sys,tmp,root}
echo vmm-guest >"$tree/etc/hostname"
echo "A root filesystem served by vmm's virtio-blk." >"$tree/etc/motd"
mke2fs -q -t ext4 -L vmmroot -d "$tree" "$img" "$size"
echo "guest/build-disk.sh: $img ($size, ext4, label vmmroot)"
