//! Exit statuses and whose fault an error is.
//!
//! WHAT: the statuses both binaries exit with (0 done, 1 a runtime
//! failure, 2 the user's fault), the [`InputError`] for bad input that
//! fits no typed error, and [`one_line`], the message an error leaves on
//! stderr.
//! WHY: `vmm` and `vmm-sim` must agree: `vmm sim` hands its exit status
//! through, and a user's mistake is 2 in both.
//! HOW: each binary classifies its own error types (`vmm::exit::fault`,
//! `vmm-sim`'s `fault`) and [`status_with`] walks an error's chain with
//! that classifier; an error of no listed type is a runtime failure.

/// Success.
pub const SUCCESS: u8 = 0;
/// A runtime failure (the host, KVM, the guest, a bug).
pub const FAILURE: u8 = 1;
/// The user's fault: bad input (also what clap exits with on usage errors).
pub const INPUT: u8 = 2;

/// A user-input problem that fits no typed error: exits with [`INPUT`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InputError(pub String);

/// Whose fault an error is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The user's: a different request would work (exit 2).
    User,
    /// The run's: the host, KVM, the guest or a bug (exit 1).
    Runtime,
}

impl Fault {
    /// Its exit status.
    pub fn status(self) -> u8 {
        match self {
            Fault::User => INPUT,
            Fault::Runtime => FAILURE,
        }
    }

    /// [`Fault::User`] when `user`, else [`Fault::Runtime`].
    pub fn user_if(user: bool) -> Self {
        if user {
            Fault::User
        } else {
            Fault::Runtime
        }
    }
}

/// The exit status of a command that failed with `e`: the first error of
/// its chain, outermost first, that `fault` knows decides; none known is
/// a runtime failure.
pub fn status_with(
    e: &anyhow::Error,
    fault: impl Fn(&(dyn std::error::Error + 'static)) -> Option<Fault>,
) -> u8 {
    e.chain().find_map(fault).unwrap_or(Fault::Runtime).status()
}

/// The one line printed for an error: its chain of contexts and causes,
/// outermost first, joined by ": ", leaving out a cause whose text the
/// line already holds (typed errors often print their source inside their
/// own message, and the chain would repeat it).
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read /x: {source}")]
    struct Read {
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let e = anyhow::Error::new(Read {
            source: std::io::Error::other("it is a directory"),
        })
        .context("--initrd /x");
        assert_eq!(
            one_line(&e),
            "--initrd /x: cannot read /x: it is a directory"
        );
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(one_line(&e), "outer: inner");
    }

    #[test]
    fn the_outermost_known_error_decides() {
        let user =
            |e: &(dyn std::error::Error + 'static)| e.is::<InputError>().then_some(Fault::User);
        let e = anyhow::Error::from(InputError("x".into())).context("c");
        assert_eq!(status_with(&e, user), INPUT);
        assert_eq!(status_with(&anyhow::anyhow!("plain"), user), FAILURE);
        assert_eq!(Fault::user_if(true), Fault::User);
        assert_eq!(Fault::user_if(false).status(), FAILURE);
    }
}
