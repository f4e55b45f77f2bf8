#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian 12 machine.
# Idempotent: packages already present are not touched.
set -euo pipefail

PKGS=(
  # topology: hwloc 2.x library, headers and its lstopo judge
  libhwloc-dev hwloc libudev-dev pkg-config
  # guest images: busybox for the initramfs, Debian's kernel source and
  # what building a kernel needs
  busybox-static linux-source-6.1 build-essential flex bison bc
  libelf-dev libssl-dev cpio xz-utils kmod
  # vmm serve: promtool (checks the classic /metrics exposition), the
  # Prometheus Python client (its strict OpenMetrics parser checks the
  # other); curl drives the API in scripts/serve-demo.sh and
  # scripts/net-neighbours.sh
  prometheus python3-prometheus-client curl
  # virtio-blk tests: mke2fs -d builds ext4 images, e2fsck judges them
  e2fsprogs
  # virtio-net tests: ip (network namespaces, taps) and ping
  iproute2 iputils-ping
  # virtio-fs tests: QEMU's C virtiofsd, the vhost-user backend
  # (/usr/lib/qemu/virtiofsd; bookworm has no virtiofsd package)
  qemu-system-common
  # ACPI tests: iasl -d disassembles the DSDT (CPU hotplug AML)
  acpica-tools
  # scripts/core-ops.sh: Linux's own handoff (perf bench sched pipe)
  linux-perf
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust with rustup (https://rustup.rs), 1.85 or newer" >&2
  exit 1
fi

# The fuzz targets (scripts/fuzz.sh) build with the nightly toolchain and
# cargo-fuzz; both are installed once, then left alone.
if command -v rustup >/dev/null && ! rustup toolchain list | grep -q '^nightly'; then
  echo "setup: installing the nightly toolchain (for cargo-fuzz)"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "setup: installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
