//! Flag parsers and up-front checks that both binaries' flags share.
//!
//! WHAT: durations, whole numbers in a range (`--burst-us`,
//! `--period-us`, counts, `--prio`, `--reps`), the error for a flag the
//! chosen mode would ignore, and the checks of output paths made before
//! any work.
//! WHY: the same flag follows the same rules in `vmm` and `vmm-sim`
//! (`vmm sim`), and a `--config` file.
//! HOW: the flag parsers return `String` messages (clap's `value_parser`
//! prefixes the flag and exits 2). A message says what is wrong with the
//! value and what to give instead; it never repeats the flag, which the
//! caller adds. Limits are errors, never silent caps. The path checks
//! return an [`InputError`] that names the flag.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::exit::InputError;

/// `--burst-us` and `--period-us`: 1 us to 1 s.
pub const MAX_US: u64 = 1_000_000;
/// `--tasks`, `--groups`, `--group-size`, `--vms`, `--vcpus` of the
/// simulator: at most the scheduler's task table
/// (`vcpu_sched::SchedConfig::default().max_tasks`).
pub const MAX_COUNT: u64 = 4096;

/// What every duration message suggests.
const DURATION_EXAMPLES: &str = "5s, 500ms, 2m, 1h30m or 0.3 (seconds)";

// ------------------------------------------------------------- durations

/// Parses a duration: `5s`, `500ms`, `2m`, `1h`, `1h30m`, or a plain
/// number of seconds (`0.3`, `45`). Zero, negative, NaN, infinite and
/// absurd (over ~30 years) values are errors; callers apply their own
/// range.
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

// ---------------------------------------------------------- numeric flags

/// A whole number in `lo..=hi`; `what` names the unit in messages.
pub fn int_in(s: &str, lo: u64, hi: u64, what: &str) -> Result<u64, String> {
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

/// `--prio`: an RT priority, 1..=99.
pub fn prio(s: &str) -> Result<u8, String> {
    int_in(s, 1, 99, "(an RT priority is 1..=99)").map(|v| v as u8)
}

/// `--reps`: 1..=100.
pub fn reps(s: &str) -> Result<usize, String> {
    int_in(s, 1, 100, "repetitions").map(|v| v as usize)
}

/// A flag that the chosen workload or mode would ignore: an error naming
/// the flag and where it applies.
pub fn ignored(flag: &str, applies_to: &str, here: &str) -> InputError {
    InputError(format!(
        "{flag} applies to {applies_to} only; {here} would ignore it: leave it out"
    ))
}

// ------------------------------------------------------------ work size

/// The longest a command runs without `--long`: a comparison estimated
/// longer is more often a slip (a digit too many in `--duration` or
/// `--reps`, a `--compare` list pasted twice) than a plan.
pub const MAX_WORK: Duration = Duration::from_secs(2 * 3600);

/// Refuses work estimated over [`MAX_WORK`] unless `long` (the command's
/// `--long`): `what` says what would run ("27 runs of 1m"), `lower` which
/// flags make it smaller.
pub fn check_work(
    what: &str,
    estimate: Duration,
    long: bool,
    lower: &str,
) -> Result<(), InputError> {
    if long || estimate <= MAX_WORK {
        return Ok(());
    }
    let hours = estimate.as_secs_f64() / 3600.0;
    Err(InputError(format!(
        "{what} would take about {hours:.1} h, over the {} h a command runs without --long: \
         {lower}, or add --long to run it anyway",
        MAX_WORK.as_secs() / 3600
    )))
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

/// Writes a result file that [`check_output_file`] (without `overwrite`)
/// accepted before the run: created new (`O_EXCL`), so that a file someone
/// put there during the run is refused too, never replaced. The error is
/// the user's (exit 2) when something is there, and names `flag`.
pub fn write_new(flag: &str, path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| {
            let what = if e.kind() == std::io::ErrorKind::AlreadyExists {
                "something was put there during the run; it is left as it is: give \
                 another path"
                    .to_string()
            } else {
                format!("cannot create it ({})", os_message(&e))
            };
            InputError(format!("{flag} {}: {what}", path.display()))
        })?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| anyhow::anyhow!("writing {}: {}", path.display(), os_message(&e)))
}

/// An OS error in words, without Rust's `(os error N)` suffix.
pub fn os_message(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let e = ignored("--reps", "--compare", "a single run").0;
        assert!(e.contains("--reps applies to --compare only"), "{e}");
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
        assert_eq!(
            os_message(&std::io::Error::from_raw_os_error(2)),
            "No such file or directory"
        );
    }
}
