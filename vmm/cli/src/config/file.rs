//! The `vmm run --config` file: read within bounds, parsed, its relative
//! paths made relative to it.
//!
//! WHAT: [`FileConfig`] (the TOML fields, each optional) and
//! [`FileConfig::load`]; [`StrOrInt`] for fields that take text or a
//! number.
//! WHY: a file is user input: a FIFO, a device or a huge file is refused
//! before it is read, and a type error names the line and the field.
//! HOW: [`topology::user_file`] reads it; `toml` parses it with unknown
//! fields denied; serde's and toml's wording is put in plain words.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{ConfigError, MAX_CONFIG_BYTES};

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
    /// `fair-slice-scaling`: `"log"` or `"none"` (with
    /// `sched = "vcpu_sched"` only).
    pub fair_slice_scaling: Option<String>,
    /// `tick-us` (with `sched = "vcpu_sched"` only).
    pub tick_us: Option<u64>,
    /// `halt-poll-us` (with `sched = "vcpu_sched"` only).
    pub halt_poll_us: Option<u64>,
    /// `halt-park`: `"on"` or `"off"` (with `sched = "vcpu_sched"` only).
    pub halt_park: Option<String>,
    /// `rng`: `""` or `"pci_segment=S"`.
    pub rng: Option<String>,
    /// `platform`: `"num_pci_segments=N"`.
    pub platform: Option<String>,
    /// `disk`: a list of
    /// `"path=IMG[,readonly=on][,num_queues=N][,pci_segment=S][,engine=E]"`
    /// (`engine=sync|pool|io_uring` is this VMM's extension).
    pub disk: Option<Vec<String>>,
    /// `net`: a list of `"tap=NAME[,mac=MAC][,num_queues=N][,pci_segment=S]"`.
    pub net: Option<Vec<String>>,
    /// `vsock`: `"cid=N,socket=PATH[,pci_segment=S]"` (a relative socket
    /// path is relative to the file).
    pub vsock: Option<String>,
    /// `fs`: a list of
    /// `"tag=TAG,socket=PATH[,num_queues=N][,queue_size=N][,pci_segment=S]"`
    /// (socket paths relative to the file).
    pub fs: Option<Vec<String>>,
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
            // A bare path, not a device or destination list (resolved later).
            let plain = !con.contains(',')
                && !con.contains('=')
                && !matches!(
                    con.as_str(),
                    "stdout"
                        | "stderr"
                        | "-"
                        | "tty"
                        | "pty"
                        | "null"
                        | "serial"
                        | "virtio"
                        | "off"
                );
            if plain && Path::new(con).is_relative() {
                *con = dir.join(&*con).display().to_string();
            }
        }
        Ok(c)
    }
}

/// Reads a config file: a regular file (not a directory, device or FIFO,
/// which is refused before it is opened) of at most [`MAX_CONFIG_BYTES`],
/// in UTF-8 ([`topology::user_file`]).
fn read_config_file(path: &Path) -> Result<String, String> {
    topology::user_file::read_text(path, MAX_CONFIG_BYTES, "a TOML file")
}
