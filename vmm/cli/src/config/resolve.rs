//! Merging `vmm run`'s flags over its file, and checking every value.
//!
//! WHAT: [`RunConfig::resolve`]: each setting from its flag, else from
//! the file, else its default, checked by the same parser the flag uses
//! ([`crate::args`], [`parse_size`], the types' own `FromStr`).
//! WHY: one rule per setting wherever it comes from, and an error that
//! names where the bad value was: `--memory`, or `memory (in FILE)`.
//! HOW: `Merge` knows the file's path and picks each value with its
//! origin; one small function per setting that needs more than a parse.

use std::path::{Path, PathBuf};

use vmm_machine::memory::parse_size;

use super::{
    ConfigError, ConsoleDevice, ConsoleTarget, FileConfig, RunConfig, RunFlags, SchedMode,
    StrOrInt, VendorChoice,
};
use crate::args;

/// Where values come from: the flags, or the file at `file`.
struct Merge {
    file: Option<PathBuf>,
}

impl Merge {
    /// The name of a setting as the user gave it: `--flag`, or `flag (in
    /// FILE)` for a value from the file.
    fn name(&self, flag: &str, from_flag: bool) -> String {
        match (&self.file, from_flag) {
            (Some(p), false) => format!("{flag} (in {})", p.display()),
            _ => format!("--{flag}"),
        }
    }

    /// An error in setting `flag` (from the flag or the file).
    fn err(&self, flag: &str, from_flag: bool, message: impl Into<String>) -> ConfigError {
        ConfigError {
            field: self.name(flag, from_flag),
            message: message.into(),
        }
    }

    /// A required setting given nowhere.
    fn missing(flag: &str, example: &str) -> ConfigError {
        ConfigError {
            field: format!("--{flag}"),
            message: format!("missing: give --{flag} {example} (or `{flag}` in a --config file)"),
        }
    }

    /// The flag's value (true: from the flag), else the file's.
    fn pick<T>(flag: Option<T>, file: Option<T>) -> Option<(T, bool)> {
        match flag {
            Some(v) => Some((v, true)),
            None => file.map(|v| (v, false)),
        }
    }

    /// Parses setting `flag` with `parse`, if it is given.
    fn parsed<T>(
        &self,
        flag: &str,
        v: Option<(String, bool)>,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ConfigError> {
        v.map(|(s, fl)| parse(&s).map_err(|m| self.err(flag, fl, m)))
            .transpose()
    }

    fn memory(&self, flag: Option<String>, file: Option<StrOrInt>) -> Result<u64, ConfigError> {
        match (flag, file) {
            (Some(s), _) => parse_size(&s).map_err(|m| self.err("memory", true, m)),
            (None, Some(StrOrInt::Str(s))) => {
                parse_size(&s).map_err(|m| self.err("memory", false, m))
            }
            (None, Some(StrOrInt::Int(mib))) => mib
                .checked_mul(1 << 20)
                .ok_or_else(|| self.err("memory", false, format!("{mib} MiB is too large"))),
            (None, None) => Err(Self::missing("memory", "SIZE (e.g. 1G)")),
        }
    }

    fn numa_distance(
        &self,
        flag: Option<u32>,
        file: Option<u32>,
    ) -> Result<Option<u32>, ConfigError> {
        match Self::pick(flag, file) {
            Some((d, fl)) if !(11..=254).contains(&d) => Err(self.err(
                "numa-distance",
                fl,
                format!("{d} is out of range: use 11..=254 (10 is the local distance)"),
            )),
            v => Ok(v.map(|(d, _)| d)),
        }
    }

    /// `--console`: a device word (`serial`, `virtio`, `off`) and a
    /// destination (`tty`/`stdout`/`-`, `stderr`, `pty`, `null`,
    /// `file=PATH`, `socket=PATH`), comma-separated, either optional; or,
    /// as before the virtio console, just a destination or a file path.
    fn console(
        &self,
        v: Option<(String, bool)>,
        append: bool,
    ) -> Result<(ConsoleTarget, ConsoleDevice), ConfigError> {
        let Some((text, fl)) = v else {
            return self
                .console_target(None, append)
                .map(|t| (t, ConsoleDevice::Serial));
        };
        let items: Vec<&str> = text.split(',').map(str::trim).collect();
        let word = |i: &str| matches!(i, "serial" | "virtio" | "off");
        let dest = |i: &str| {
            matches!(i, "tty" | "stdout" | "-" | "stderr" | "pty" | "null")
                || i.starts_with("file=")
                || i.starts_with("socket=")
        };
        if !items.iter().any(|i| word(i) || dest(i)) {
            // A plain path, as before.
            return self
                .console_target(Some((text, fl)), append)
                .map(|t| (t, ConsoleDevice::Serial));
        }
        let bad = |m: String| self.err("console", fl, m);
        let (mut device, mut target) = (None, None);
        for i in &items {
            if word(i) && device.is_none() {
                device = Some(match *i {
                    "virtio" => ConsoleDevice::Virtio,
                    "off" => ConsoleDevice::Off,
                    _ => ConsoleDevice::Serial,
                });
            } else if dest(i) && target.is_none() {
                let path = |p: &str| {
                    if fl {
                        PathBuf::from(p)
                    } else {
                        self.relative_to_file(p)
                    }
                };
                target = Some(match *i {
                    "tty" | "stdout" | "-" => ConsoleTarget::Stdout,
                    "stderr" => ConsoleTarget::Stderr,
                    "pty" => ConsoleTarget::Pty,
                    "null" => ConsoleTarget::Null,
                    s => match s.split_once('=') {
                        Some(("file", "")) | Some(("socket", "")) => {
                            return Err(bad(format!("{s}: give a path after the =")))
                        }
                        Some(("file", p)) if append => ConsoleTarget::Append(path(p)),
                        Some(("file", p)) => ConsoleTarget::File(path(p)),
                        Some((_, p)) => ConsoleTarget::Socket(path(p)),
                        None => unreachable!("dest() matched"),
                    },
                });
            } else {
                return Err(bad(format!(
                    "{text:?}: give at most one device (serial, virtio, off) and one destination \
                     (tty, stderr, pty, null, file=PATH, socket=PATH), e.g. virtio,pty"
                )));
            }
        }
        let device = device.unwrap_or_default();
        let target = match (device, target) {
            (ConsoleDevice::Off, Some(_)) => {
                return Err(bad("off has no destination: give just --console off".into()))
            }
            (ConsoleDevice::Off, None) => ConsoleTarget::Null,
            (ConsoleDevice::Serial, Some(t @ (ConsoleTarget::Pty | ConsoleTarget::Socket(_)))) => {
                return Err(bad(format!(
                    "{} needs the virtio console (the serial port here is output only): \
                     give virtio,{}",
                    if t == ConsoleTarget::Pty {
                        "pty"
                    } else {
                        "socket="
                    },
                    items.iter().find(|i| dest(i)).unwrap_or(&"pty")
                )))
            }
            (_, t) => t.unwrap_or(ConsoleTarget::Stdout),
        };
        if append && !matches!(target, ConsoleTarget::Append(_)) {
            return Err(ConfigError {
                field: "--console-append".into(),
                message: "appends to a --console file; without one it would be ignored: \
                          give --console FILE (or file=FILE) or leave it out"
                    .into(),
            });
        }
        Ok((target, device))
    }

    /// A path from the `--config` file is relative to it.
    fn relative_to_file(&self, p: &str) -> PathBuf {
        let p = PathBuf::from(p);
        match &self.file {
            Some(f) if p.is_relative() => f.parent().unwrap_or(Path::new(".")).join(p),
            _ => p,
        }
    }

    fn console_target(
        &self,
        v: Option<(String, bool)>,
        append: bool,
    ) -> Result<ConsoleTarget, ConfigError> {
        let console = match v {
            None => ConsoleTarget::Stdout,
            Some((v, _)) if v == "stdout" || v == "-" => ConsoleTarget::Stdout,
            Some((v, _)) if v == "stderr" => ConsoleTarget::Stderr,
            Some((v, fl)) if v.trim().is_empty() => {
                return Err(self.err(
                    "console",
                    fl,
                    "empty: use stdout, stderr, - (stdout) or a file path",
                ))
            }
            Some((v, _)) if append => ConsoleTarget::Append(PathBuf::from(v)),
            Some((v, _)) => ConsoleTarget::File(PathBuf::from(v)),
        };
        if append && !matches!(console, ConsoleTarget::Append(_)) {
            return Err(ConfigError {
                field: "--console-append".into(),
                message: "appends to a --console FILE; without one it would be ignored: \
                          give --console FILE or leave it out"
                    .into(),
            });
        }
        Ok(console)
    }

    fn until(&self, v: Option<(String, bool)>) -> Result<Option<String>, ConfigError> {
        self.parsed("until", v, |s| {
            regex::Regex::new(s).map(|_| s.to_string()).map_err(|e| {
                // The regex crate's message spans several lines (the
                // pattern, a caret, the error); keep the error.
                let text = e.to_string();
                let last = text.lines().last().unwrap_or("").trim();
                let last = last.strip_prefix("error: ").unwrap_or(last);
                format!("not a valid regex: {last}")
            })
        })
    }

    fn timeout(
        &self,
        flag: Option<String>,
        file: Option<StrOrInt>,
    ) -> Result<Option<std::time::Duration>, ConfigError> {
        match (flag, file) {
            (Some(s), _) => self.parsed("timeout", Some((s, true)), args::timeout),
            (None, Some(StrOrInt::Str(s))) => {
                self.parsed("timeout", Some((s, false)), args::timeout)
            }
            (None, Some(StrOrInt::Int(0))) => Err(self.err(
                "timeout",
                false,
                "0 is not a time limit: give seconds > 0 or leave it out",
            )),
            (None, Some(StrOrInt::Int(s))) => {
                self.parsed("timeout", Some((s.to_string(), false)), args::timeout)
            }
            (None, None) => Ok(None),
        }
    }

    fn sched(&self, v: Option<(String, bool)>) -> Result<SchedMode, ConfigError> {
        Ok(self
            .parsed("sched", v, |v| {
                match v.to_ascii_lowercase().replace('-', "_").as_str() {
                    "host" => Ok(SchedMode::Host),
                    "vcpu_sched" => Ok(SchedMode::VcpuSched),
                    _ => Err(format!("{v:?} is not host or vcpu_sched")),
                }
            })?
            .unwrap_or_default())
    }

    /// A setting of `vcpu_sched` (`flag`, parsed by `parse`; `default`
    /// when not given), refused with `--sched host`, which would ignore it.
    fn sched_only<T>(
        &self,
        flag: &str,
        what: &str,
        v: Option<(String, bool)>,
        sched: SchedMode,
        parse: impl Fn(&str) -> Result<T, String>,
        default: T,
    ) -> Result<T, ConfigError> {
        if let Some((_, fl)) = v.as_ref().filter(|_| sched != SchedMode::VcpuSched) {
            return Err(self.err(
                flag,
                *fl,
                format!(
                    "sets {what}; with --sched host (the default) the host kernel schedules \
                     the vCPUs and it would be ignored: add --sched vcpu_sched or leave it out"
                ),
            ));
        }
        Ok(self.parsed(flag, v, parse)?.unwrap_or(default))
    }
}

impl Merge {
    /// `--disk` flags, or else the file's `disk` list (paths relative to
    /// the file).
    fn disks(
        &self,
        flags: Vec<String>,
        file: Option<Vec<String>>,
    ) -> Result<(Vec<vmm_machine::devices::DiskSpec>, bool), ConfigError> {
        let (list, from_flag) = match (flags.is_empty(), file) {
            (false, _) | (true, None) => (flags, true),
            (true, Some(f)) => (f, false),
        };
        let disks = list
            .iter()
            .map(|s| {
                let mut d = args::disk(s).map_err(|m| self.err("disk", from_flag, m))?;
                if let (false, Some(f)) = (from_flag, &self.file) {
                    if d.path.is_relative() {
                        d.path = f.parent().unwrap_or(Path::new(".")).join(&d.path);
                    }
                }
                Ok(d)
            })
            .collect::<Result<_, ConfigError>>()?;
        Ok((disks, from_flag))
    }

    /// `--net` flags, or else the file's `net` list.
    fn nets(
        &self,
        flags: Vec<String>,
        file: Option<Vec<String>>,
    ) -> Result<(Vec<vmm_machine::devices::NetSpec>, bool), ConfigError> {
        let (list, from_flag) = match (flags.is_empty(), file) {
            (false, _) | (true, None) => (flags, true),
            (true, Some(f)) => (f, false),
        };
        let nets = list
            .iter()
            .map(|s| args::net(s).map_err(|m| self.err("net", from_flag, m)))
            .collect::<Result<_, ConfigError>>()?;
        Ok((nets, from_flag))
    }

    /// `--fs` flags, or else the file's `fs` list (sockets relative to the
    /// file).
    fn fs(
        &self,
        flags: Vec<String>,
        file: Option<Vec<String>>,
    ) -> Result<(Vec<vmm_machine::devices::FsSpec>, bool), ConfigError> {
        let (list, from_flag) = match (flags.is_empty(), file) {
            (false, _) | (true, None) => (flags, true),
            (true, Some(f)) => (f, false),
        };
        let fs = list
            .iter()
            .map(|s| {
                let mut d = args::fs(s).map_err(|m| self.err("fs", from_flag, m))?;
                if let (false, Some(f)) = (from_flag, &self.file) {
                    if d.socket.is_relative() {
                        d.socket = f.parent().unwrap_or(Path::new(".")).join(&d.socket);
                    }
                }
                Ok(d)
            })
            .collect::<Result<_, ConfigError>>()?;
        Ok((fs, from_flag))
    }

    fn devices(
        &self,
        inputs: DeviceInputs,
        vcpus: usize,
    ) -> Result<vmm_machine::devices::DeviceSpec, ConfigError> {
        let DeviceInputs {
            rng,
            platform,
            disks: (disks, disks_from_flag),
            nets: (nets, nets_from_flag),
            vsock,
            fs: (fs, fs_from_flag),
        } = inputs;
        let vsock_from_flag = vsock.as_ref().is_none_or(|v| v.1);
        let mut vsock = self.parsed("vsock", vsock, args::vsock)?;
        if let (Some(v), false, Some(f)) = (&mut vsock, vsock_from_flag, &self.file) {
            if v.socket.is_relative() {
                v.socket = f.parent().unwrap_or(Path::new(".")).join(&v.socket);
            }
        }
        let rng_from_flag = rng.as_ref().is_none_or(|r| r.1);
        let platform_from_flag = platform.as_ref().is_none_or(|p| p.1);
        let spec = vmm_machine::devices::DeviceSpec {
            pci_segments: self
                .parsed("platform", platform, args::platform)?
                .unwrap_or(1),
            rng: self.parsed("rng", rng, args::rng)?,
            disks,
            nets,
            console: None,
            vsock,
            fs,
        };
        spec.check(vcpus).map_err(|m| {
            if m.starts_with("vsock") || m.starts_with("the vsock") {
                self.err("vsock", vsock_from_flag, m)
            } else if m.starts_with("num_pci_segments") {
                self.err("platform", platform_from_flag, m)
            } else if m.starts_with("the disk") || m.starts_with("disk ") {
                self.err("disk", disks_from_flag, m)
            } else if m.starts_with("the net") || m.starts_with("net ") {
                self.err("net", nets_from_flag, m)
            } else if m.starts_with("the fs") || m.starts_with("fs ") {
                self.err("fs", fs_from_flag, m)
            } else {
                self.err("rng", rng_from_flag, m)
            }
        })?;
        Ok(spec)
    }
}

/// The device settings of the flags and the file, merged but not yet
/// checked: each with whether it came from a flag (for the error's
/// wording).
struct DeviceInputs {
    rng: Option<(String, bool)>,
    platform: Option<(String, bool)>,
    disks: (Vec<vmm_machine::devices::DiskSpec>, bool),
    nets: (Vec<vmm_machine::devices::NetSpec>, bool),
    vsock: Option<(String, bool)>,
    fs: (Vec<vmm_machine::devices::FsSpec>, bool),
}

impl RunConfig {
    /// Merges flags over a file (either may be empty) and checks every
    /// value.
    pub fn resolve(
        flags: RunFlags,
        file: Option<(&Path, FileConfig)>,
    ) -> Result<Self, ConfigError> {
        let (m, f) = match file {
            Some((p, f)) => (
                Merge {
                    file: Some(p.to_path_buf()),
                },
                f,
            ),
            None => (Merge { file: None }, FileConfig::default()),
        };
        let pick = Merge::pick;
        let kernel = flags
            .kernel
            .or(f.kernel)
            .ok_or_else(|| Merge::missing("kernel", "PATH"))?;
        let memory = m.memory(flags.memory, f.memory)?;
        let guest = flags.guest.or(f.guest).ok_or_else(|| {
            Merge::missing("guest", "SPEC (e.g. \"package:2 [numa] core:2 pu:2\")")
        })?;
        let append = flags.console_append || f.console_append.unwrap_or(false);
        let until_flag = flags.until.is_some();
        let (console, console_device) = m.console(pick(flags.console, f.console), append)?;
        let until = m.until(pick(flags.until, f.until))?;
        if until.is_some() && console_device == ConsoleDevice::Off {
            return Err(m.err(
                "until",
                until_flag,
                "watches the guest's console, and --console off leaves it none: \
                 give --console serial or virtio, or leave --until out",
            ));
        }
        let sched = m.sched(pick(flags.sched, f.sched))?;
        Ok(RunConfig {
            kernel,
            initrd: flags.initrd.or(f.initrd),
            cmdline: flags.cmdline.or(f.cmdline).unwrap_or_default(),
            memory,
            guest,
            numa_distance: m.numa_distance(flags.numa_distance, f.numa_distance)?,
            pin: m
                .parsed("pin", pick(flags.pin, f.pin), args::pin)?
                .unwrap_or(vcpu_sched::placement::pin::PinSpec::None),
            rt: m.parsed("rt", pick(flags.rt, f.rt), args::rt)?.flatten(),
            console,
            console_device,
            until,
            timeout: m.timeout(flags.timeout, f.timeout)?,
            vendor: m
                .parsed("vendor", pick(flags.vendor, f.vendor), |v| {
                    if v.eq_ignore_ascii_case("host") {
                        Ok(VendorChoice::Host)
                    } else {
                        v.parse().map(VendorChoice::Fixed)
                    }
                })?
                .unwrap_or(VendorChoice::Host),
            compat: m
                .parsed("compat", pick(flags.compat, f.compat), |v| v.parse())?
                .unwrap_or_default(),
            sched,
            mitigations: m.sched_only(
                "mitigations",
                "vcpu_sched's fixes",
                pick(flags.mitigations, f.mitigations),
                sched,
                args::mitigations,
                vcpu_sched::Mitigations::all(),
            )?,
            fair_slice_scaling: m.sched_only(
                "fair-slice-scaling",
                "how vcpu_sched scales its fair slices",
                pick(flags.fair_slice_scaling, f.fair_slice_scaling),
                sched,
                args::slice_scaling,
                vcpu_sched::SliceScaling::default(),
            )?,
            tick: m.sched_only(
                "tick-us",
                "vcpu_sched's tick period",
                Merge::pick(flags.tick_us, f.tick_us).map(|(v, fl)| (v.to_string(), fl)),
                sched,
                args::period_micros,
                vmm_machine::vcpu_body::DEFAULT_TICK,
            )?,
            halt_poll: m.sched_only(
                "halt-poll-us",
                "the period of the halt poller, which runs with vcpu_sched only",
                Merge::pick(flags.halt_poll_us, f.halt_poll_us).map(|(v, fl)| (v.to_string(), fl)),
                sched,
                args::period_micros,
                vmm_machine::vcpu_body::DEFAULT_HALT_POLL,
            )?,
            halt_park: m.sched_only(
                "halt-park",
                "parking halted vCPUs inside KVM, which runs with vcpu_sched only",
                Merge::pick(flags.halt_park, f.halt_park),
                sched,
                args::halt_park,
                false,
            )?,
            devices: {
                let mut d = m.devices(
                    DeviceInputs {
                        rng: pick(flags.rng, f.rng),
                        platform: pick(flags.platform, f.platform),
                        disks: m.disks(flags.disk, f.disk)?,
                        nets: m.nets(flags.net, f.net)?,
                        vsock: pick(flags.vsock, f.vsock),
                        fs: m.fs(flags.fs, f.fs)?,
                    },
                    // the vCPU count is the guest topology's: num_queues is
                    // checked against it when the VM is built
                    usize::MAX,
                )?;
                if console_device == ConsoleDevice::Virtio {
                    d.console = Some(0);
                }
                d
            },
        })
    }
}
