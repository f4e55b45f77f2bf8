//! The terminal side of a command: standard output, stderr's colour, the
//! progress bar, logging, and clap's parse with one-line flag errors.
//!
//! WHAT: [`write_stdout`] and its macros [`out!`](crate::out) and
//! [`outln!`](crate::outln); [`stderr_styled`]; [`progress_bar`];
//! [`init_tracing`]; [`parse`].
//! WHY: `vmm` and `vmm-sim` behave alike on a closed pipe, `NO_COLOR`, a
//! file as stderr and a bad flag value, whichever of them runs.
//! HOW: output ends the process itself on a write error (141 for a closed
//! pipe, as a shell reports SIGPIPE; 1 otherwise); colour and the bar only
//! on a terminal with `NO_COLOR` unset or empty.

use std::io::IsTerminal;
use std::process::ExitCode;

/// Whether stderr may carry colour and cursor codes: only when it is a
/// terminal and `NO_COLOR` is unset or empty (<https://no-color.org>).
pub fn stderr_styled() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The progress bar of long runs (`bench`, `sched-bench`, `sim`); drawn on
/// stderr only when [`stderr_styled`], hidden otherwise (files, pipes,
/// `NO_COLOR`).
pub fn progress_bar() -> indicatif::ProgressBar {
    if !stderr_styled() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(1000);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% (about {eta} left) {msg}",
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

/// `print!` through [`write_stdout`](crate::term::write_stdout).
#[macro_export]
macro_rules! out {
    ($($a:tt)*) => {
        $crate::term::write_stdout(format_args!($($a)*))
    };
}

/// `println!` through [`write_stdout`](crate::term::write_stdout).
#[macro_export]
macro_rules! outln {
    () => {
        $crate::term::write_stdout(format_args!("\n"))
    };
    ($($a:tt)*) => {
        $crate::term::write_stdout(format_args!("{}\n", format_args!($($a)*)))
    };
}

/// Sets up `tracing` on stderr at `-v` count `verbose` (0 warn, 1 info,
/// 2 debug, more trace; `RUST_LOG` overrides), coloured only when
/// [`stderr_styled`].
pub fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(stderr_styled())
        .try_init();
}

/// Parses the command line into `C`. A flag value its parser refuses is
/// one line, `error: --flag: what is wrong and what to give`, and exit
/// status 2, like every other bad input; other usage errors, `--help` and
/// `--version` are clap's own.
pub fn parse<C: clap::Parser>() -> Result<C, ExitCode> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let e = match C::try_parse() {
        Ok(c) => return Ok(c),
        Err(e) => e,
    };
    if e.kind() == ErrorKind::ValueValidation {
        let why = std::error::Error::source(&e).map(|s| s.to_string());
        if let (Some(ContextValue::String(arg)), Some(why)) = (e.get(ContextKind::InvalidArg), why)
        {
            // "--duration <DURATION>" -> "--duration"
            let flag = arg.split_whitespace().next().unwrap_or(arg);
            eprintln!("error: {flag}: {why}");
            return Err(ExitCode::from(crate::exit::INPUT));
        }
    }
    e.exit()
}
