//! Argument parsing shared by the subcommands.
//!
//! WHAT: the user-input error type of the command line ([`InputError`]),
//! the `--compare` list parser, the range checks of `--duration` and
//! `--reps`, and the progress bar of the long runs.
//!
//! WHY: `bench` and `sched-bench` parse the same kinds of arguments; a leaf
//! they both use keeps them from importing each other (or the command
//! table in [`super`]).
//!
//! HOW: a leaf module. It imports nothing from the subcommands or from
//! [`super`]; they import from it. [`InputError`] is
//! [`crate::exit::InputError`], which decides its exit status.

use anyhow::Result;

pub use crate::exit::InputError;

/// The progress bar of long runs (`bench`, `sched-bench`); drawn on stderr
/// only when it is a terminal.
pub fn progress_bar() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(1000);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
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
        .map(|s| {
            s.parse::<vcpu_sched::Mitigations>()
                .map_err(|e| InputError(format!("--compare: {e}")).into())
        })
        .collect::<Result<Vec<_>>>()?;
    if sets.is_empty() {
        return Err(InputError(format!(
            "--compare {list:?}: give seeds or sets such as \"none;all\""
        ))
        .into());
    }
    Ok(sets)
}

/// Checks `--duration SECS` (0 < SECS <= 3600); `example` is the value the
/// message suggests.
pub fn check_duration(secs: f64, example: &str) -> Result<std::time::Duration> {
    if !(secs.is_finite() && secs > 0.0 && secs <= 3600.0) {
        return Err(InputError(format!(
            "--duration {secs}: give seconds between 0 and 3600, e.g. --duration {example}"
        ))
        .into());
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// Checks `--reps N` (1..=100).
pub fn check_reps(reps: usize) -> Result<()> {
    if reps == 0 || reps > 100 {
        return Err(InputError(format!("--reps {reps}: give 1..=100")).into());
    }
    Ok(())
}

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
    fn ranges() {
        assert!(check_duration(2.0, "2").is_ok());
        for bad in [0.0, -1.0, f64::NAN, 3601.0] {
            let e = check_duration(bad, "2").unwrap_err();
            assert!(e.downcast_ref::<InputError>().is_some());
        }
        assert!(check_reps(1).is_ok());
        assert!(check_reps(0).is_err());
        assert!(check_reps(101).is_err());
    }
}
