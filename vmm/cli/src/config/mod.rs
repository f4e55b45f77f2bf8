//! `vmm run` settings: command-line flags, a TOML file, or both.
//!
//! The file takes the flags' names without the dashes:
//!
//! ```toml
//! kernel = "vmlinux"            # relative paths are relative to the file
//! initrd = "initramfs.cpio.gz"
//! cmdline = "sched_verbose loglevel=8"
//! memory = "1G"                 # or an integer number of MiB
//! guest = "package:2 [numa] l3:1 l2:2 core:1 pu:2"
//! numa-distance = 21
//! pin = "auto"                  # "none", "auto" or a CPU list "0-7"
//! rt = "fifo:50"                # or "rr:PRIO", "none"
//! console = "stdout"            # "stderr", "-" (stdout), a new file's path, or
//!                               # "virtio[,tty|pty|file=PATH|socket=PATH]", "serial[,..]", "off"
//! console-append = true         # append to the console file if it exists
//! until = "root domain span"
//! timeout = "10m"               # or an integer number of seconds
//! vendor = "host"               # "intel", "amd"
//! compat = "auto"               # "pvm", "none"
//! rng = ""                      # a virtio-rng; or "pci_segment=1"
//! platform = "num_pci_segments=2"
//! disk = ["path=root.img", "path=data.img,readonly=on"]   # paths relative to the file
//! net = ["tap=tap0,mac=52:54:00:12:34:56"]
//! vsock = "cid=3,socket=vm.vsock"  # a relative socket path is relative to the file
//! ```
//!
//! Unknown fields and bad values are errors naming the field. Flags given
//! on the command line override the file's values. The file must be a
//! regular file of at most [`MAX_CONFIG_BYTES`] (1 MiB) of UTF-8.
//!
//! Parts: [`file`](mod@file) reads and parses the TOML file; [`resolve`] merges the
//! flags over it and checks each value with the parsers of
//! [`crate::args`], the same the flags use.

use std::path::PathBuf;
use std::time::Duration;

use vcpu_sched::placement::pin::PinSpec;
use vcpu_sched::placement::rt::RtPolicy;
use vmm_machine::compat::CompatArg;

pub mod file;
pub mod resolve;
#[cfg(test)]
mod tests;

pub use file::{FileConfig, StrOrInt};

/// A bad setting: which field, and what is wrong. Exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    /// `--memory` or `memory (in FILE)`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// The largest `--config` file read (a real one is a few hundred bytes).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Where the console goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsoleTarget {
    /// This process's stdout (`stdout` or `-`).
    Stdout,
    /// This process's stderr (`stderr`).
    Stderr,
    /// A new file: an existing one is refused, never truncated.
    File(PathBuf),
    /// A file appended to (created if absent): `--console-append`.
    Append(PathBuf),
    /// A new pseudo-terminal (virtio console only; input too).
    Pty,
    /// A new Unix socket: one client at a time gets the output and gives
    /// the input (virtio console only).
    Socket(PathBuf),
    /// Nowhere.
    Null,
}

/// Which device is the guest's console.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConsoleDevice {
    /// COM1, `ttyS0` (the default).
    #[default]
    Serial,
    /// A virtio-console, `hvc0`.
    Virtio,
    /// None: the guest's console output goes nowhere.
    Off,
}

/// The CPUID vendor choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VendorChoice {
    /// The host's.
    Host,
    /// A fixed vendor.
    Fixed(topology::Vendor),
}

/// Resolved `vmm run` settings.
#[derive(Clone, Debug, PartialEq)]
pub struct RunConfig {
    /// Kernel.
    pub kernel: PathBuf,
    /// Initrd.
    pub initrd: Option<PathBuf>,
    /// The user's command line.
    pub cmdline: String,
    /// Bytes of RAM.
    pub memory: u64,
    /// Guest topology SPEC.
    pub guest: String,
    /// Remote NUMA distance.
    pub numa_distance: Option<u32>,
    /// Pinning.
    pub pin: PinSpec,
    /// RT policy.
    pub rt: Option<RtPolicy>,
    /// Console: where it goes.
    pub console: ConsoleTarget,
    /// Console: which device.
    pub console_device: ConsoleDevice,
    /// Stop regex (validated).
    pub until: Option<String>,
    /// Time limit.
    pub timeout: Option<Duration>,
    /// CPUID vendor.
    pub vendor: VendorChoice,
    /// kvm_pvm workarounds.
    pub compat: CompatArg,
    /// Who schedules the vCPUs.
    pub sched: SchedMode,
    /// `vcpu_sched`'s fixes (with [`SchedMode::VcpuSched`]; all by default).
    pub mitigations: vcpu_sched::Mitigations,
    /// How `vcpu_sched` scales its fair slices with the CPUs (with
    /// [`SchedMode::VcpuSched`]; log by default).
    pub fair_slice_scaling: vcpu_sched::SliceScaling,
    /// The scheduler's tick period (with [`SchedMode::VcpuSched`]).
    pub tick: Duration,
    /// The halt poller's period (with [`SchedMode::VcpuSched`]).
    pub halt_poll: Duration,
    /// Halted vCPUs parked inside KVM (with [`SchedMode::VcpuSched`]).
    pub halt_park: bool,
    /// PCI segments and devices.
    pub devices: vmm_machine::devices::DeviceSpec,
}

/// `--sched`: who schedules the vCPUs of `vmm run`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchedMode {
    /// One thread per vCPU, scheduled by the host kernel (pinned 1:1 with
    /// `--pin`).
    #[default]
    Host,
    /// vCPUs as `vcpu_sched` tasks on the M:N worker executor, halted
    /// vCPUs giving up their slot (see `vcpu_body::linux`).
    VcpuSched,
}

/// The flags of `vmm run`, each optional so that a file can supply it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunFlags {
    /// `--kernel`.
    pub kernel: Option<PathBuf>,
    /// `--initrd`.
    pub initrd: Option<PathBuf>,
    /// `--cmdline`.
    pub cmdline: Option<String>,
    /// `--memory`.
    pub memory: Option<String>,
    /// `--guest`.
    pub guest: Option<String>,
    /// `--numa-distance`.
    pub numa_distance: Option<u32>,
    /// `--pin`.
    pub pin: Option<String>,
    /// `--rt`.
    pub rt: Option<String>,
    /// `--console`.
    pub console: Option<String>,
    /// `--console-append`.
    pub console_append: bool,
    /// `--until`.
    pub until: Option<String>,
    /// `--timeout`.
    pub timeout: Option<String>,
    /// `--vendor`.
    pub vendor: Option<String>,
    /// `--compat`.
    pub compat: Option<String>,
    /// `--sched`.
    pub sched: Option<String>,
    /// `--mitigations`.
    pub mitigations: Option<String>,
    /// `--fair-slice-scaling`.
    pub fair_slice_scaling: Option<String>,
    /// `--tick-us`.
    pub tick_us: Option<u64>,
    /// `--halt-poll-us`.
    pub halt_poll_us: Option<u64>,
    /// `--halt-park`.
    pub halt_park: Option<String>,
    /// `--rng`.
    pub rng: Option<String>,
    /// `--platform`.
    pub platform: Option<String>,
    /// `--disk`, each.
    pub disk: Vec<String>,
    /// `--net`, each.
    pub net: Vec<String>,
    /// `--vsock`.
    pub vsock: Option<String>,
    /// `--fs`, each.
    pub fs: Vec<String>,
}

/// Parses a `--timeout`: `90s`, `10m`, `1h`, `500ms`, `1m30s`, or a
/// number of seconds (`0.3`); the one duration parser is
/// [`crate::args::parse_duration`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::args::timeout(s)
}

/// Formats a duration the way [`parse_duration`] reads it.
pub fn format_duration(d: Duration) -> String {
    crate::args::format_duration(d)
}
