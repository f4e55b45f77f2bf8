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
//! console = "stdout"            # "stderr", "-" (stdout) or a new file's path
//! console-append = true         # append to the console file if it exists
//! until = "root domain span"
//! timeout = "10m"               # or an integer number of seconds
//! vendor = "host"               # "intel", "amd"
//! compat = "auto"               # "pvm", "none"
//! ```
//!
//! Unknown fields and bad values are errors naming the field. Flags given
//! on the command line override the file's values. The file must be a
//! regular file of at most [`MAX_CONFIG_BYTES`] (1 MiB) of UTF-8.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use vcpu_sched::placement::pin::PinSpec;
use vcpu_sched::placement::rt::RtPolicy;
use vmm_machine::compat::CompatArg;
use vmm_machine::memory::parse_size;

/// A bad setting: which field, and what is wrong. Exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    /// `--memory` or `memory (in FILE)`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// A string or an integer, for fields that take both.
#[derive(Clone, Debug, PartialEq)]
pub enum StrOrInt {
    /// Text.
    Str(String),
    /// A number.
    Int(u64),
}

/// Reads a [`StrOrInt`], saying what the field expects in plain words
/// (serde's untagged enums only say "data did not match any variant").
struct StrOrIntVisitor(&'static str);

impl serde::de::Visitor<'_> for StrOrIntVisitor {
    type Value = StrOrInt;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<StrOrInt, E> {
        Ok(StrOrInt::Str(v.to_string()))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<StrOrInt, E> {
        Ok(StrOrInt::Int(v))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<StrOrInt, E> {
        u64::try_from(v)
            .map(StrOrInt::Int)
            .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
    }
}

fn size_field<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<StrOrInt>, D::Error> {
    d.deserialize_any(StrOrIntVisitor(
        "a size in quotes such as \"512M\" or \"2G\", or a whole number of MiB",
    ))
    .map(Some)
}

fn duration_field<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<StrOrInt>, D::Error> {
    d.deserialize_any(StrOrIntVisitor(
        "a duration in quotes such as \"90s\" or \"10m\", or a whole number of seconds",
    ))
    .map(Some)
}

/// The largest `--config` file read (a real one is a few hundred bytes).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// serde's and toml's wording, with Rust type names put in plain words.
fn plain_toml_message(m: &str) -> String {
    m.trim()
        .replace("expected u32", "expected a whole number (0 to 4294967295)")
        .replace("expected u64", "expected a whole number")
        .replace("expected path", "expected a file path in quotes")
        .replace("expected a string", "expected text in quotes")
}

/// The TOML file's fields.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    /// `kernel`.
    pub kernel: Option<PathBuf>,
    /// `initrd`.
    pub initrd: Option<PathBuf>,
    /// `cmdline`.
    pub cmdline: Option<String>,
    /// `memory`.
    #[serde(default, deserialize_with = "size_field")]
    pub memory: Option<StrOrInt>,
    /// `guest`.
    pub guest: Option<String>,
    /// `numa-distance`.
    pub numa_distance: Option<u32>,
    /// `pin`.
    pub pin: Option<String>,
    /// `rt`.
    pub rt: Option<String>,
    /// `console`.
    pub console: Option<String>,
    /// `console-append`.
    pub console_append: Option<bool>,
    /// `until`.
    pub until: Option<String>,
    /// `timeout`.
    #[serde(default, deserialize_with = "duration_field")]
    pub timeout: Option<StrOrInt>,
    /// `vendor`.
    pub vendor: Option<String>,
    /// `compat`.
    pub compat: Option<String>,
    /// `sched`.
    pub sched: Option<String>,
    /// `mitigations` (with `sched = "vcpu_sched"` only).
    pub mitigations: Option<String>,
}

impl FileConfig {
    /// Reads and parses a file; relative paths become relative to it. The
    /// file must be a regular file of at most [`MAX_CONFIG_BYTES`] of
    /// UTF-8 TOML.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let field = format!("--config {}", path.display());
        let fail = |message: String| ConfigError {
            field: field.clone(),
            message,
        };
        let text = read_config_file(path).map_err(&fail)?;
        let mut c: FileConfig = toml::from_str(&text).map_err(|e| {
            let mut where_ = String::new();
            if let Some(span) = e.span() {
                let start = span.start.min(text.len());
                let line_no = text[..start].matches('\n').count() + 1;
                let line = text.lines().nth(line_no - 1).unwrap_or("");
                where_ = format!("line {line_no}");
                if let Some((key, _)) = line.split_once('=') {
                    let key = key.trim();
                    if !key.is_empty() && key.len() <= 40 && !key.starts_with('#') {
                        where_ += &format!(", `{key}`");
                    }
                }
                where_ += ": ";
            }
            fail(format!("{where_}{}", plain_toml_message(e.message())))
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let fix = |p: &mut Option<PathBuf>| {
            if let Some(x) = p {
                if x.is_relative() {
                    *x = dir.join(&*x);
                }
            }
        };
        fix(&mut c.kernel);
        fix(&mut c.initrd);
        if let Some(con) = &mut c.console {
            if !matches!(con.as_str(), "stdout" | "stderr" | "-") && Path::new(con).is_relative() {
                *con = dir.join(&*con).display().to_string();
            }
        }
        Ok(c)
    }
}

/// Reads a config file: a regular file (not a directory, device or FIFO)
/// of at most [`MAX_CONFIG_BYTES`], in UTF-8.
fn read_config_file(path: &Path) -> Result<String, String> {
    use std::io::Read as _;
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read it: {}", io_words(&e)))?;
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file (a device, FIFO or socket)"
        };
        return Err(format!("it is {kind}; give a TOML file"));
    }
    let too_big = || {
        format!(
            "it is larger than {} KiB; a config file is a few lines of TOML",
            MAX_CONFIG_BYTES >> 10
        )
    };
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(too_big());
    }
    let f = std::fs::File::open(path).map_err(|e| format!("cannot open it: {}", io_words(&e)))?;
    let mut buf = Vec::new();
    f.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read it: {}", io_words(&e)))?;
    if buf.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_big());
    }
    String::from_utf8(buf).map_err(|_| "it is not text (not UTF-8); give a TOML file".into())
}

/// An I/O error in words, without the `(os error N)` suffix.
fn io_words(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

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
    /// Console.
    pub console: ConsoleTarget,
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
}

/// Parses a `--timeout`: `90s`, `10m`, `1h`, `500ms`, `1m30s`, or a
/// number of seconds (`0.3`); the one duration parser is
/// [`crate::cli::args::parse_duration`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::cli::args::timeout(s)
}

/// Formats a duration the way [`parse_duration`] reads it.
pub fn format_duration(d: Duration) -> String {
    crate::cli::args::format_duration(d)
}

impl RunConfig {
    /// Merges flags over a file (either may be empty) and checks every
    /// value.
    pub fn resolve(
        flags: RunFlags,
        file: Option<(&Path, FileConfig)>,
    ) -> Result<Self, ConfigError> {
        let (fpath, f) = match file {
            Some((p, f)) => (Some(p.to_path_buf()), f),
            None => (None, FileConfig::default()),
        };
        // The name of a field as the user gave it.
        let name = |flag: &str, from_flag: bool| -> String {
            match (&fpath, from_flag) {
                (Some(p), false) => format!("{flag} (in {})", p.display()),
                _ => format!("--{flag}"),
            }
        };
        let err = |field: String, message: String| ConfigError { field, message };
        let missing = |flag: &str, example: &str| ConfigError {
            field: format!("--{flag}"),
            message: format!("missing: give --{flag} {example} (or `{flag}` in a --config file)"),
        };

        let kernel = flags
            .kernel
            .or(f.kernel)
            .ok_or_else(|| missing("kernel", "PATH"))?;
        let initrd = flags.initrd.or(f.initrd);
        let cmdline = flags.cmdline.or(f.cmdline).unwrap_or_default();

        let memory = match (flags.memory, f.memory) {
            (Some(s), _) => parse_size(&s).map_err(|m| err(name("memory", true), m))?,
            (None, Some(StrOrInt::Str(s))) => {
                parse_size(&s).map_err(|m| err(name("memory", false), m))?
            }
            (None, Some(StrOrInt::Int(mib))) => mib
                .checked_mul(1 << 20)
                .ok_or_else(|| err(name("memory", false), format!("{mib} MiB is too large")))?,
            (None, None) => return Err(missing("memory", "SIZE (e.g. 1G)")),
        };
        let guest = flags
            .guest
            .or(f.guest)
            .ok_or_else(|| missing("guest", "SPEC (e.g. \"package:2 [numa] core:2 pu:2\")"))?;
        let (nd, nd_flag) = match flags.numa_distance {
            Some(d) => (Some(d), true),
            None => (f.numa_distance, false),
        };
        if let Some(d) = nd {
            if !(11..=254).contains(&d) {
                return Err(err(
                    name("numa-distance", nd_flag),
                    format!("{d} is out of range: use 11..=254 (10 is the local distance)"),
                ));
            }
        }
        let pick = |a: Option<String>, b: Option<String>| match a {
            Some(v) => Some((v, true)),
            None => b.map(|v| (v, false)),
        };
        let pin = match pick(flags.pin, f.pin) {
            Some((v, fl)) => crate::cli::args::pin(&v).map_err(|m| err(name("pin", fl), m))?,
            None => PinSpec::None,
        };
        let rt = match pick(flags.rt, f.rt) {
            Some((v, fl)) => crate::cli::args::rt(&v).map_err(|m| err(name("rt", fl), m))?,
            None => None,
        };
        let append = flags.console_append || f.console_append.unwrap_or(false);
        let console = match pick(flags.console, f.console) {
            None => ConsoleTarget::Stdout,
            Some((v, _)) if v == "stdout" || v == "-" => ConsoleTarget::Stdout,
            Some((v, _)) if v == "stderr" => ConsoleTarget::Stderr,
            Some((v, fl)) => {
                if v.trim().is_empty() {
                    return Err(err(
                        name("console", fl),
                        "empty: use stdout, stderr, - (stdout) or a file path".into(),
                    ));
                }
                if append {
                    ConsoleTarget::Append(PathBuf::from(v))
                } else {
                    ConsoleTarget::File(PathBuf::from(v))
                }
            }
        };
        if append && !matches!(console, ConsoleTarget::Append(_)) {
            return Err(err(
                "--console-append".into(),
                "appends to a --console FILE; without one it would be ignored: \
                 give --console FILE or leave it out"
                    .into(),
            ));
        }
        let until = match pick(flags.until, f.until) {
            Some((v, fl)) => {
                regex::Regex::new(&v).map_err(|e| {
                    // The regex crate's message spans several lines (the
                    // pattern, a caret, the error); keep the error.
                    let text = e.to_string();
                    let last = text.lines().last().unwrap_or("").trim();
                    let last = last.strip_prefix("error: ").unwrap_or(last);
                    err(name("until", fl), format!("not a valid regex: {last}"))
                })?;
                Some(v)
            }
            None => None,
        };
        let timeout = match (flags.timeout, f.timeout) {
            (Some(s), _) => Some(parse_duration(&s).map_err(|m| err(name("timeout", true), m))?),
            (None, Some(StrOrInt::Str(s))) => {
                Some(parse_duration(&s).map_err(|m| err(name("timeout", false), m))?)
            }
            (None, Some(StrOrInt::Int(0))) => {
                return Err(err(
                    name("timeout", false),
                    "0 is not a time limit: give seconds > 0 or leave it out".into(),
                ))
            }
            (None, Some(StrOrInt::Int(s))) => {
                Some(parse_duration(&s.to_string()).map_err(|m| err(name("timeout", false), m))?)
            }
            (None, None) => None,
        };
        let vendor = match pick(flags.vendor, f.vendor) {
            None => VendorChoice::Host,
            Some((v, _)) if v.eq_ignore_ascii_case("host") => VendorChoice::Host,
            Some((v, fl)) => VendorChoice::Fixed(
                v.parse::<topology::Vendor>()
                    .map_err(|m| err(name("vendor", fl), m))?,
            ),
        };
        let compat = match pick(flags.compat, f.compat) {
            None => CompatArg::Auto,
            Some((v, fl)) => v.parse().map_err(|m| err(name("compat", fl), m))?,
        };
        let sched = match pick(flags.sched, f.sched) {
            None => SchedMode::Host,
            Some((v, fl)) => match v.to_ascii_lowercase().replace('-', "_").as_str() {
                "host" => SchedMode::Host,
                "vcpu_sched" => SchedMode::VcpuSched,
                _ => {
                    return Err(err(
                        name("sched", fl),
                        format!("{v:?} is not host or vcpu_sched"),
                    ))
                }
            },
        };
        let mitigations = match pick(flags.mitigations, f.mitigations) {
            None => vcpu_sched::Mitigations::all(),
            Some((v, fl)) => {
                if sched != SchedMode::VcpuSched {
                    return Err(err(
                        name("mitigations", fl),
                        "sets vcpu_sched's fixes; with --sched host (the default) the host \
                         kernel schedules the vCPUs and it would be ignored: add \
                         --sched vcpu_sched or leave it out"
                            .into(),
                    ));
                }
                crate::cli::args::mitigations(&v).map_err(|m| err(name("mitigations", fl), m))?
            }
        };
        Ok(RunConfig {
            kernel,
            initrd,
            cmdline,
            memory,
            guest,
            numa_distance: nd,
            pin,
            rt,
            console,
            until,
            timeout,
            vendor,
            compat,
            sched,
            mitigations,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> RunFlags {
        RunFlags {
            kernel: Some("k".into()),
            memory: Some("512M".into()),
            guest: Some("package:1 core:1 pu:1".into()),
            ..Default::default()
        }
    }

    #[test]
    fn sched_mode() {
        let c = RunConfig::resolve(flags(), None).unwrap();
        assert_eq!(c.sched, SchedMode::Host);
        for v in ["vcpu_sched", "vcpu-sched", "VCPU_SCHED"] {
            let f = RunFlags {
                sched: Some(v.into()),
                ..flags()
            };
            assert_eq!(
                RunConfig::resolve(f, None).unwrap().sched,
                SchedMode::VcpuSched
            );
        }
        let f = RunFlags {
            sched: Some("cfs".into()),
            ..flags()
        };
        let e = RunConfig::resolve(f, None).unwrap_err().to_string();
        assert!(
            e.contains("--sched") && e.contains("host or vcpu_sched"),
            "{e}"
        );
    }

    #[test]
    fn console_and_mitigations() {
        let with = |f: RunFlags| RunConfig::resolve(f, None);
        for (v, t) in [
            ("stdout", ConsoleTarget::Stdout),
            ("-", ConsoleTarget::Stdout),
            ("stderr", ConsoleTarget::Stderr),
            ("c.log", ConsoleTarget::File("c.log".into())),
        ] {
            let f = RunFlags {
                console: Some(v.into()),
                ..flags()
            };
            assert_eq!(with(f).unwrap().console, t, "{v}");
        }
        let f = RunFlags {
            console: Some("c.log".into()),
            console_append: true,
            ..flags()
        };
        assert_eq!(
            with(f).unwrap().console,
            ConsoleTarget::Append("c.log".into())
        );
        let f = RunFlags {
            console_append: true,
            ..flags()
        };
        assert!(with(f).unwrap_err().to_string().contains("--console FILE"));
        let f = RunFlags {
            mitigations: Some("none".into()),
            ..flags()
        };
        assert!(with(f).unwrap_err().to_string().contains("--sched host"));
        let f = RunFlags {
            mitigations: Some("only:l2wake".into()),
            sched: Some("vcpu_sched".into()),
            ..flags()
        };
        assert_ne!(with(f).unwrap().mitigations, vcpu_sched::Mitigations::all());
        assert_eq!(
            with(flags()).unwrap().mitigations,
            vcpu_sched::Mitigations::all()
        );
        let f = RunFlags {
            pin: Some("".into()),
            ..flags()
        };
        assert!(with(f).unwrap_err().to_string().contains("--pin: empty"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("45").unwrap(), Duration::from_secs(45));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("0").unwrap_err().contains("more than zero"));
        assert!(parse_duration("0s").unwrap_err().contains("more than zero"));
        assert!(parse_duration("99999999999h")
            .unwrap_err()
            .contains("too long"));
        assert_eq!(format_duration(Duration::from_secs(600)), "10m");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn flags_alone() {
        let c = RunConfig::resolve(flags(), None).unwrap();
        assert_eq!(c.memory, 512 << 20);
        assert_eq!(c.pin, PinSpec::None);
        assert_eq!(c.console, ConsoleTarget::Stdout);
        assert_eq!(c.compat, CompatArg::Auto);
        let mut f = flags();
        f.memory = None;
        let e = RunConfig::resolve(f, None).unwrap_err().to_string();
        assert!(e.starts_with("--memory: missing"), "{e}");
        let mut f = flags();
        f.rt = Some("fifo:0".into());
        let e = RunConfig::resolve(f, None).unwrap_err().to_string();
        assert!(e.starts_with("--rt:"), "{e}");
        let mut f = flags();
        f.until = Some("(".into());
        let e = RunConfig::resolve(f, None).unwrap_err().to_string();
        assert!(e.starts_with("--until: not a valid regex"), "{e}");
        let mut f = flags();
        f.numa_distance = Some(5);
        assert!(RunConfig::resolve(f, None)
            .unwrap_err()
            .to_string()
            .starts_with("--numa-distance"));
        let mut f = flags();
        f.vendor = Some("via".into());
        assert!(RunConfig::resolve(f, None)
            .unwrap_err()
            .to_string()
            .starts_with("--vendor"));
    }

    #[test]
    fn file_and_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vm.toml");
        std::fs::write(
            &p,
            r#"
kernel = "vmlinux"
memory = 1024
guest = "package:2 [numa] core:2 pu:2"
numa-distance = 30
pin = "0-7"
timeout = 120
console = "out.log"
"#,
        )
        .unwrap();
        let f = FileConfig::load(&p).unwrap();
        let c = RunConfig::resolve(RunFlags::default(), Some((&p, f.clone()))).unwrap();
        assert_eq!(c.kernel, dir.path().join("vmlinux"));
        assert_eq!(c.memory, 1 << 30);
        assert_eq!(c.numa_distance, Some(30));
        assert_eq!(c.pin, PinSpec::List((0..8).collect()));
        assert_eq!(c.timeout, Some(Duration::from_secs(120)));
        assert_eq!(c.console, ConsoleTarget::File(dir.path().join("out.log")));
        // Flags win.
        let over = RunFlags {
            memory: Some("2G".into()),
            pin: Some("none".into()),
            ..Default::default()
        };
        let c = RunConfig::resolve(over, Some((&p, f))).unwrap();
        assert_eq!(c.memory, 2 << 30);
        assert_eq!(c.pin, PinSpec::None);
    }

    #[test]
    fn file_errors_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vm.toml");
        std::fs::write(&p, "kernel = \"k\"\nmemroy = \"1G\"\n").unwrap();
        let e = FileConfig::load(&p).unwrap_err().to_string();
        assert!(e.contains("unknown field `memroy`"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        std::fs::write(&p, "kernel = \"k\"\nmemory = \"1Q\"\nguest = \"x:1\"\n").unwrap();
        let f = FileConfig::load(&p).unwrap();
        let e = RunConfig::resolve(RunFlags::default(), Some((&p, f)))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("memory (in "), "{e}");
        assert!(e.contains("unknown unit"), "{e}");
        std::fs::write(&p, "kernel = 5\n").unwrap();
        let e = FileConfig::load(&p).unwrap_err().to_string();
        assert!(e.contains("invalid type"), "{e}");
        assert!(e.contains("line 1, `kernel`"), "{e}");
        assert!(e.contains("expected a file path in quotes"), "{e}");
    }

    #[test]
    fn file_errors_in_plain_words() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vm.toml");
        for (text, want) in [
            (
                "memory = true\n",
                "line 1, `memory`: invalid type: boolean `true`, expected a size in quotes",
            ),
            (
                "memory = 1.5\n",
                "expected a size in quotes such as \"512M\"",
            ),
            (
                "memory = -1\n",
                "invalid value: integer `-1`, expected a size",
            ),
            (
                "timeout = [1]\n",
                "`timeout`: invalid type: sequence, expected a duration",
            ),
            (
                "numa-distance = -3\n",
                "`numa-distance`: invalid value: integer `-3`, expected a whole number",
            ),
            ("numa-distance = \"x\"\n", "expected a whole number"),
            (
                "\n\npin = 5\n",
                "line 3, `pin`: invalid type: integer `5`, expected text in quotes",
            ),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = FileConfig::load(&p).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
            for bad in ["untagged", "StrOrInt", "u32", "u64"] {
                assert!(!e.contains(bad), "{text:?}: {e}");
            }
        }
        let e = FileConfig::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("it is a directory"), "{e}");
        let e = FileConfig::load(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let e = FileConfig::load(&dir.path().join("nope.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("cannot read it: No such file or directory"),
            "{e}"
        );
        std::fs::write(&p, vec![b'#'; 2 << 20]).unwrap();
        let e = FileConfig::load(&p).unwrap_err().to_string();
        assert!(e.contains("larger than 1024 KiB"), "{e}");
        std::fs::write(&p, b"kernel = \"\xff\"\n").unwrap();
        let e = FileConfig::load(&p).unwrap_err().to_string();
        assert!(e.contains("not UTF-8"), "{e}");
        // Both spellings of a StrOrInt still load.
        std::fs::write(&p, "memory = \"1G\"\ntimeout = 30\n").unwrap();
        let f = FileConfig::load(&p).unwrap();
        assert_eq!(f.memory, Some(StrOrInt::Str("1G".into())));
        assert_eq!(f.timeout, Some(StrOrInt::Int(30)));
    }
}
