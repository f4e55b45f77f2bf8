#!/usr/bin/env bash
# Build (or confirm up to date) both guest images, cached:
#   .cache/guest/kernel/vmlinux, .cache/guest/kernel/bzImage   (build-kernel.sh)
#   .cache/guest/initramfs.cpio.gz, .cache/guest/initramfs.cpio (build-initramfs.sh)
# Arguments (--force, --clean) are passed to both scripts. On a fresh machine, as root,
# missing Debian packages are installed with apt-get; see guest/README.md.
set -euo pipefail
dir=$(dirname "${BASH_SOURCE[0]}")
"$dir/build-kernel.sh" "$@"
"$dir/build-initramfs.sh" "$@"
