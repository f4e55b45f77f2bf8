#!/usr/bin/env bash
# Build (or confirm up to date) the guest images, cached:
#   .cache/guest/kernel/vmlinux, .cache/guest/kernel/bzImage   (build-kernel.sh)
#   .cache/guest/initramfs.cpio.gz, .cache/guest/initramfs.cpio (build-initramfs.sh)
#   .cache/guest/root.img: a 32 MiB ext4 root (build-disk.sh), for read-only
#   boots from virtio-blk; built once
# Arguments (--force, --clean) are passed to both scripts. On a fresh machine, as root,
# missing Debian packages are installed with apt-get; see guest/README.md.
set -euo pipefail
dir=$(dirname "${BASH_SOURCE[0]}")
"$dir/build-kernel.sh" "$@"
"$dir/build-initramfs.sh" "$@"
cache=$(cd "$dir/.." && pwd)/.cache/guest
[ -f "$cache/root.img" ] || "$dir/build-disk.sh" "$cache/root.img" >/dev/null
