//! Argument parsing shared by the subcommands.
//!
//! WHAT: the user-input error type of the command line ([`InputError`]);
//! one parser per flag that more than one place takes (durations,
//! `--burst-us`, `--period-us`, `--tasks`-like counts, `--prio`, `--pin`,
//! `--rt`, `--mitigations`, `--compare`), each with one set of limits; the
//! up-front checks of output paths; the process's start time (the origin
//! of `--timeout`); whether stderr may be coloured; the progress bar.
//!
//! WHY: the same flag must follow the same rules in every subcommand and in
//! a `--config` file, and a leaf every subcommand uses keeps them from
//! importing each other (or the command table in [`super`]).
//!
//! HOW: a leaf module. It imports nothing from the subcommands or from
//! [`super`]; they import from it. The flag parsers return `String`
//! messages (clap's `value_parser` prefixes the flag and exits 2; the
//! `vmm run` settings wrap them in a [`crate::config::ConfigError`], also
//! exit 2). A message says what is wrong with the value and what to give
//! instead; it never repeats the flag, which the caller adds. Limits are
//! errors, never silent caps. [`InputError`] is [`crate::exit::InputError`].

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::Result;

pub use crate::exit::InputError;

// ---------------------------------------------------------------- limits

/// The shortest measured window of `bench` and `sched-bench`.
pub const MIN_BENCH_DURATION: Duration = Duration::from_millis(100);
/// The longest measured window of `bench` and `sched-bench` (1 hour).
pub const MAX_BENCH_DURATION: Duration = Duration::from_secs(3600);
/// The longest `vmm run --timeout` (7 days).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// `--burst-us` and `--period-us`: 1 us to 1 s.
pub const MAX_US: u64 = 1_000_000;
/// `--tasks`, `--groups`, `--group-size`: at most the scheduler's task
/// table (`vcpu_sched::SchedConfig::default().max_tasks`).
pub const MAX_COUNT: u64 = 4096;
/// `vmm bench --vcpus`: vCPUs per micro-guest VM.
pub const MAX_VCPUS_PER_VM: usize = 256;
/// `vmm bench --vms` x `--vcpus`: the scheduler's CPU limit
/// ([`vcpu_sched::MAX_CPUS`]); more vCPUs than that is oversubscription no
/// topology it supports can give a measurement for.
pub const MAX_TOTAL_VCPUS: usize = vcpu_sched::MAX_CPUS;

/// What every duration message suggests.
const DURATION_EXAMPLES: &str = "5s, 500ms, 2m, 1h30m or 0.3 (seconds)";

// ------------------------------------------------------------ start time

fn start_cell() -> &'static OnceLock<Instant> {
    static START: OnceLock<Instant> = OnceLock::new();
    &START
}

/// Records the process's start (the origin of `--timeout`); `main` calls
/// it first. Later calls change nothing.
pub fn mark_start() {
    start_cell().get_or_init(Instant::now);
}

/// When the process started ([`mark_start`]; the first call of this
/// function when nothing marked it).
pub fn started() -> Instant {
    *start_cell().get_or_init(Instant::now)
}

// ------------------------------------------------------------- durations

/// Parses a duration: `5s`, `500ms`, `2m`, `1h`, `1h30m`, or a plain
/// number of seconds (`0.3`, `45`). Zero, negative, NaN, infinite and
/// absurd (over ~30 years) values are errors; callers apply their own
/// range ([`bench_duration`], [`timeout`]).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err(format!(
            "empty: give a duration such as {DURATION_EXAMPLES}"
        ));
    }
    let bad = || format!("{s:?} is not a duration: use e.g. {DURATION_EXAMPLES}");
    if t.starts_with('-') {
        return Err(format!(
            "{t} is negative: give a duration such as {DURATION_EXAMPLES}"
        ));
    }
    let secs = match t.parse::<f64>() {
        // A plain number (also "1e400", "nan", "inf", which f64 takes).
        Ok(v) if v.is_nan() => return Err(bad()),
        Ok(v) => v,
        Err(_) => {
            let mut total = 0f64;
            let mut rest = t;
            while !rest.is_empty() {
                let end = rest
                    .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .ok_or_else(bad)?;
                let (num, after) = rest.split_at(end);
                let v: f64 = num.parse().map_err(|_| bad())?;
                let uend = after
                    .find(|c: char| c.is_ascii_digit() || c == '.')
                    .unwrap_or(after.len());
                let (unit, next) = after.split_at(uend);
                total += v * match unit.trim() {
                    "ns" => 1e-9,
                    "us" => 1e-6,
                    "ms" => 1e-3,
                    "s" | "sec" => 1.0,
                    "m" | "min" => 60.0,
                    "h" => 3600.0,
                    _ => return Err(bad()),
                };
                rest = next;
            }
            total
        }
    };
    if !secs.is_finite() || secs >= 1e9 {
        return Err(format!(
            "{t} is too long: give a duration such as {DURATION_EXAMPLES}"
        ));
    }
    if secs <= 0.0 {
        return Err(format!(
            "{t} is no time at all: give a duration more than zero, such as {DURATION_EXAMPLES}"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Formats a duration the way [`parse_duration`] reads it.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if d.subsec_nanos() % 1_000_000 != 0 {
        return format!("{}us", d.as_micros());
    }
    if ms % 1000 != 0 {
        return format!("{ms}ms");
    }
    let s = d.as_secs();
    if s >= 3600 && s % 3600 == 0 {
        format!("{}h", s / 3600)
    } else if s >= 60 && s % 60 == 0 {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

fn duration_in(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < min {
        return Err(format!(
            "{} is too short to measure anything: give at least {}",
            s.trim(),
            format_duration(min)
        ));
    }
    if d > max {
        return Err(format!(
            "{} is more than the limit of {}: give a shorter duration",
            s.trim(),
            format_duration(max)
        ));
    }
    Ok(d)
}

/// `bench` and `sched-bench --duration`: [`parse_duration`], then
/// [`MIN_BENCH_DURATION`]..=[`MAX_BENCH_DURATION`].
pub fn bench_duration(s: &str) -> Result<Duration, String> {
    duration_in(s, MIN_BENCH_DURATION, MAX_BENCH_DURATION)
}

/// `vmm run --timeout`: [`parse_duration`], at most [`MAX_TIMEOUT`].
pub fn timeout(s: &str) -> Result<Duration, String> {
    duration_in(s, Duration::from_nanos(1), MAX_TIMEOUT)
}

// ---------------------------------------------------------- numeric flags

/// A whole number in `lo..=hi`; `what` names the unit in messages.
fn int_in(s: &str, lo: u64, hi: u64, what: &str) -> Result<u64, String> {
    let t = s.trim();
    let range = format!(
        "give {lo} to {hi}{}{what}",
        if what.is_empty() { "" } else { " " }
    );
    if t.is_empty() {
        return Err(format!("empty: {range}"));
    }
    if t.starts_with('-') {
        return Err(format!("{t} is negative: {range}"));
    }
    match t.parse::<u64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        Ok(v) => Err(format!("{v} is out of range: {range}")),
        Err(_) if t.chars().all(|c| c.is_ascii_digit()) => {
            Err(format!("{t} is out of range: {range}"))
        }
        Err(_) => Err(format!("{t:?} is not a whole number: {range}")),
    }
}

/// `--burst-us`: compute per operation, 1..=[`MAX_US`] microseconds.
pub fn burst_us(s: &str) -> Result<u64, String> {
    int_in(s, 1, MAX_US, "microseconds")
}

/// `--period-us`: a timer period, 1..=[`MAX_US`] microseconds.
pub fn period_us(s: &str) -> Result<u64, String> {
    int_in(s, 1, MAX_US, "microseconds")
}

/// `--tasks`, `--groups`, `--group-size`: 1..=[`MAX_COUNT`].
pub fn count(s: &str) -> Result<usize, String> {
    int_in(s, 1, MAX_COUNT, "").map(|v| v as usize)
}

/// `--vms`, `--vcpus` of `vmm bench`: 1..=[`MAX_TOTAL_VCPUS`] each; their
/// product is checked by [`check_vcpus`].
pub fn vm_count(s: &str) -> Result<usize, String> {
    int_in(s, 1, MAX_TOTAL_VCPUS as u64, "").map(|v| v as usize)
}

/// `--prio`: an RT priority, 1..=99.
pub fn prio(s: &str) -> Result<u8, String> {
    int_in(s, 1, 99, "(an RT priority is 1..=99)").map(|v| v as u8)
}

/// `--reps`: 1..=100.
pub fn reps(s: &str) -> Result<usize, String> {
    int_in(s, 1, 100, "repetitions").map(|v| v as usize)
}

/// `vmm bench --vms N --vcpus M`: at most [`MAX_VCPUS_PER_VM`] per VM and
/// [`MAX_TOTAL_VCPUS`] in all.
pub fn check_vcpus(vms: usize, vcpus: usize) -> Result<(), InputError> {
    if vcpus > MAX_VCPUS_PER_VM {
        return Err(InputError(format!(
            "--vcpus {vcpus}: a micro-guest VM takes at most {MAX_VCPUS_PER_VM} vCPUs; \
             give fewer, or more --vms"
        )));
    }
    match vms.checked_mul(vcpus) {
        Some(n) if n <= MAX_TOTAL_VCPUS => Ok(()),
        _ => Err(InputError(format!(
            "--vms {vms} --vcpus {vcpus}: {} vCPUs in all; the scheduler takes at most \
             {MAX_TOTAL_VCPUS}: give fewer VMs or vCPUs",
            vms.saturating_mul(vcpus)
        ))),
    }
}

// ------------------------------------------------------- run's placement

/// `--pin`: `auto`, `none` or a host CPU list. Empty is an error.
pub fn pin(s: &str) -> Result<crate::pin::PinSpec, String> {
    if s.trim().is_empty() {
        return Err("empty: give auto, none or a host CPU list such as 0-7 or 0,2,4".into());
    }
    crate::pin::PinSpec::parse(s)
}

/// `--rt`: `fifo:PRIO`, `rr:PRIO` (PRIO 1..=99) or `none`. Empty is an
/// error.
pub fn rt(s: &str) -> Result<Option<crate::rt::RtPolicy>, String> {
    if s.trim().is_empty() {
        return Err("empty: give fifo:PRIO, rr:PRIO (PRIO 1 to 99) or none".into());
    }
    crate::rt::RtPolicy::parse(s)
}

// ----------------------------------------------------------- mitigations

/// `--mitigations SET`: none, all, only:FIX[,FIX..] or all-but:FIX[,..].
pub fn mitigations(s: &str) -> Result<vcpu_sched::Mitigations, String> {
    if s.trim().is_empty() {
        return Err("empty: give none, all, only:FIX[,FIX..] or all-but:FIX[,FIX..]".to_string());
    }
    s.parse::<vcpu_sched::Mitigations>()
        .map_err(|e| e.to_string())
}

/// Parses `--compare`: `seeds` (baseline, each fix alone, all) or
/// `SET;SET;..` whose first entry is the baseline.
pub fn mitigation_sets(list: &str) -> Result<Vec<vcpu_sched::Mitigations>> {
    if list.trim() == "seeds" {
        return Ok(vcpu_sched::Mitigations::seeds_variants());
    }
    let sets = list
        .split(';')
        .filter(|s| !s.trim().is_empty())
        .map(|s| mitigations(s).map_err(|e| InputError(format!("--compare: {e}")).into()))
        .collect::<Result<Vec<_>>>()?;
    if sets.is_empty() {
        return Err(InputError(format!(
            "--compare {list:?}: give seeds or sets such as \"none;all\""
        ))
        .into());
    }
    Ok(sets)
}

/// A flag that the chosen workload or mode would ignore: an error naming
/// the flag and where it applies.
pub fn ignored(flag: &str, applies_to: &str, here: &str) -> InputError {
    InputError(format!(
        "{flag} applies to {applies_to} only; {here} would ignore it: leave it out"
    ))
}

// ---------------------------------------------------------- output paths

/// Checks, before any work, that a result file can be written at `path`:
/// not a directory, its directory exists and is writable, and, unless
/// `overwrite`, nothing is there yet. Writes nothing (a probe file it makes
/// is removed at once).
pub fn check_output_file(flag: &str, path: &Path, overwrite: bool) -> Result<(), InputError> {
    let shown = path.display();
    if path.as_os_str().is_empty() {
        return Err(InputError(format!("{flag}: empty: give a file path")));
    }
    if path.is_dir() {
        return Err(InputError(format!(
            "{flag} {shown}: is a directory; give a file path in it, e.g. {}",
            path.join("out.json").display()
        )));
    }
    let dir = parent_dir(path);
    if !dir.is_dir() {
        return Err(InputError(format!(
            "{flag} {shown}: the directory {} does not exist; create it first",
            dir.display()
        )));
    }
    match std::fs::symlink_metadata(path) {
        Ok(_) if !overwrite => Err(InputError(format!(
            "{flag} {shown}: the file exists and would be overwritten; remove it or \
             give another path"
        ))),
        Ok(_) => std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map(drop)
            .map_err(|e| {
                InputError(format!(
                    "{flag} {shown}: cannot write it ({}); check its permissions",
                    os_message(&e)
                ))
            }),
        Err(_) => probe_dir(flag, path, &dir),
    }
}

/// Checks, before any work, that a directory can be created (or written)
/// at `path`: not a file, and its nearest existing ancestor is a writable
/// directory.
pub fn check_output_dir(flag: &str, path: &Path) -> Result<(), InputError> {
    let shown = path.display();
    if path.as_os_str().is_empty() {
        return Err(InputError(format!("{flag}: empty: give a directory path")));
    }
    if path.exists() && !path.is_dir() {
        return Err(InputError(format!(
            "{flag} {shown}: exists and is not a directory; give a directory path"
        )));
    }
    let mut dir = path.to_path_buf();
    while !dir.is_dir() {
        if dir.exists() {
            return Err(InputError(format!(
                "{flag} {shown}: {} is not a directory",
                dir.display()
            )));
        }
        dir = parent_dir(&dir);
    }
    probe_dir(flag, path, &dir)
}

/// The directory a relative or absolute path lives in (`.` for a bare
/// name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Creates (then removes) a file in `dir` to see that it is writable;
/// `path` is what the user gave.
fn probe_dir(flag: &str, path: &Path, dir: &Path) -> Result<(), InputError> {
    let probe = dir.join(format!(".vmm-write-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(InputError(format!(
            "{flag} {}: cannot write in {} ({}); give a path in a writable directory",
            path.display(),
            dir.display(),
            os_message(&e)
        ))),
    }
}

/// Bytes in GiB (or MiB below 1 GiB), for messages.
pub fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// An OS error in words, without Rust's `(os error N)` suffix.
pub fn os_message(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

// ----------------------------------------------------------------- colour

/// Whether stderr may carry colour and cursor codes: only when it is a
/// terminal and `NO_COLOR` is unset or empty (<https://no-color.org>).
pub fn stderr_styled() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The progress bar of long runs (`bench`, `sched-bench`); drawn on stderr
/// only when [`stderr_styled`], hidden otherwise (files, pipes,
/// `NO_COLOR`).
pub fn progress_bar() -> indicatif::ProgressBar {
    if !stderr_styled() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(1000);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// Writes to standard output. A reader that has gone away (`vmm sim ... |
/// head`) ends the process quietly with status 141, as a shell reports one
/// that SIGPIPE ended, where `print!` would panic; any other write error
/// ends it with a one-line message and status 1.
pub fn write_stdout(a: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let r = {
        let mut o = std::io::stdout().lock();
        o.write_fmt(a).and_then(|()| o.flush())
    };
    if let Err(e) = r {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        eprintln!("error: writing to standard output: {e}");
        std::process::exit(1);
    }
}

/// `print!` through [`write_stdout`].
macro_rules! out {
    ($($a:tt)*) => {
        $crate::cli::args::write_stdout(format_args!($($a)*))
    };
}

/// `println!` through [`write_stdout`].
macro_rules! outln {
    () => {
        $crate::cli::args::write_stdout(format_args!("\n"))
    };
    ($($a:tt)*) => {
        $crate::cli::args::write_stdout(format_args!("{}\n", format_args!($($a)*)))
    };
}

pub(crate) use {out, outln};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_lists() {
        assert!(mitigation_sets("seeds").unwrap().len() > 2);
        assert_eq!(mitigation_sets("none;all").unwrap().len(), 2);
        assert!(mitigation_sets(";;").is_err());
        assert!(mitigation_sets("bogus").is_err());
    }

    #[test]
    fn durations() {
        let ok = |s: &str| parse_duration(s).unwrap();
        assert_eq!(ok("90s"), Duration::from_secs(90));
        assert_eq!(ok("10m"), Duration::from_secs(600));
        assert_eq!(ok("1h30m"), Duration::from_secs(5400));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("45"), Duration::from_secs(45));
        assert_eq!(ok("0.3"), Duration::from_millis(300));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok(" 2m "), Duration::from_secs(120));
        for (bad, needle) in [
            ("", "empty"),
            ("0", "more than zero"),
            ("0s", "more than zero"),
            ("-1", "negative"),
            ("-5s", "negative"),
            ("1e400", "too long"),
            ("inf", "too long"),
            ("nan", "not a duration"),
            ("abc", "not a duration"),
            ("5y", "not a duration"),
            ("s", "not a duration"),
            ("1..2s", "not a duration"),
            ("99999999999999999999h", "too long"),
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains(needle), "{bad:?}: {e}");
            assert!(e.contains("5s"), "{bad:?} suggests a form: {e}");
        }
        assert!(bench_duration("0.3").is_ok());
        assert!(bench_duration("1ms")
            .unwrap_err()
            .contains("at least 100ms"));
        assert!(bench_duration("2h").unwrap_err().contains("limit of 1h"));
        assert!(timeout("0.3").is_ok());
        assert!(timeout("8d").is_err());
        assert!(timeout("200h").unwrap_err().contains("168h"));
        assert_eq!(format_duration(Duration::from_secs(600)), "10m");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        for d in ["300ms", "5s", "2m", "1h", "250us"] {
            assert_eq!(format_duration(ok(d)), d);
        }
    }

    #[test]
    fn numbers() {
        assert_eq!(burst_us("20").unwrap(), 20);
        assert!(burst_us("0").unwrap_err().contains("1 to 1000000"));
        assert!(burst_us("99999999999")
            .unwrap_err()
            .contains("out of range"));
        assert!(burst_us("999999999999999999999999")
            .unwrap_err()
            .contains("out of range"));
        assert!(burst_us("-3").unwrap_err().contains("negative"));
        assert!(burst_us("1.5").unwrap_err().contains("whole number"));
        assert!(period_us("").unwrap_err().contains("empty"));
        assert!(count("4097").is_err());
        assert!(count("4096").is_ok());
        assert!(prio("100").unwrap_err().contains("1..=99"));
        assert!(prio("0").is_err());
        assert!(reps("0").is_err());
        assert!(reps("101").is_err());
        assert!(check_vcpus(4, 1024).unwrap_err().0.contains("at most 256"));
        assert!(check_vcpus(8, 256).unwrap_err().0.contains("2048 vCPUs"));
        assert!(check_vcpus(usize::MAX, 2).is_err());
        assert!(check_vcpus(60, 8).is_ok());
    }

    #[test]
    fn placement_flags() {
        assert!(pin("").unwrap_err().contains("empty"));
        assert!(pin("  ").is_err());
        assert!(pin("auto").is_ok());
        assert!(rt("").unwrap_err().contains("empty"));
        assert!(rt("fifo:100").unwrap_err().contains("1 to 99"));
        assert_eq!(rt("none").unwrap(), None);
        assert!(mitigations("").is_err());
        assert!(mitigations("bogus").is_err());
        assert!(mitigations("only:l2wake").is_ok());
    }

    #[test]
    fn output_paths() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("r.json");
        check_output_file("--json", &f, true).unwrap();
        assert!(!f.exists(), "the check writes nothing");
        std::fs::write(&f, "keep").unwrap();
        check_output_file("--json", &f, true).unwrap();
        let e = check_output_file("--console", &f, false).unwrap_err().0;
        assert!(e.contains("exists"), "{e}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "keep");
        let e = check_output_file("--json", dir.path(), true).unwrap_err().0;
        assert!(e.contains("is a directory"), "{e}");
        let e = check_output_file("--json", Path::new("/nonexistent/dir/x.json"), true)
            .unwrap_err()
            .0;
        assert!(e.contains("does not exist"), "{e}");
        check_output_dir("-o", &dir.path().join("a/b")).unwrap();
        assert!(!dir.path().join("a").exists());
        let e = check_output_dir("-o", &f).unwrap_err().0;
        assert!(e.contains("not a directory"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
