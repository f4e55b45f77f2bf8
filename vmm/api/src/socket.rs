//! The API socket: taken only where nothing of the user's is, removed only
//! while it is still this server's.
//!
//! WHAT: [`claim`] checks the `--api-socket` path before the bind: free,
//! or a stale socket a killed server left (removed); anything else (a
//! live server's socket, a regular file, a directory, a FIFO, a link) is
//! refused, untouched. [`bind`] binds there and remembers the socket's
//! (device, inode); [`Bound::release`] removes the path at exit only if it
//! is still that socket.
//! WHY: the server used to delete whatever was at the path, a user's file
//! included; and a socket another server bound since (after someone
//! removed ours) is that server's, not ours to remove.
//! HOW: `lstat` (never follows a link); a socket no server listens on
//! refuses a connection (`ECONNREFUSED`), which is what makes it stale.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use topology::user_file::kind;

use super::files::FileId;
use super::options::ServeError;

fn input(path: &Path, what: String) -> ServeError {
    ServeError::Input(format!("--api-socket {}: {what}", path.display()))
}

/// Makes `path` free for the server's socket: nothing there, or a socket
/// no server answers on (removed). Refuses, touching nothing, a socket a
/// server answers on and anything that is not a socket.
pub fn claim(path: &Path) -> Result<(), ServeError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(input(path, e.to_string())),
    };
    if !meta.file_type().is_socket() {
        return Err(input(
            path,
            format!(
                "{} is there, not a socket a server left; the server removes nothing but \
                 its own socket: give another path, or remove it yourself",
                kind(&meta)
            ),
        ));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(input(
            path,
            format!(
                "another server listens on {}: stop it, or give another path",
                path.display()
            ),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path).map_err(|e| input(path, format!("removing it: {e}")))?;
            tracing::info!(socket = %path.display(), "replaced a stale socket");
            Ok(())
        }
        Err(e) => Err(input(
            path,
            format!(
                "a socket that cannot be probed ({e}); if no server uses it, remove it, or \
                 give another path"
            ),
        )),
    }
}

/// The socket this server bound.
pub struct Bound {
    path: PathBuf,
    id: FileId,
}

/// Binds a listener at `path` (after [`claim`]) and remembers which
/// socket it made. The socket appears at `path` only once it listens: it
/// is bound under a private name beside it and linked into place, so a
/// client that waits for the file (as Kata's driver and the tests do)
/// never finds it refusing connections between `bind` and `listen`.
pub fn bind(path: &Path) -> Result<(tokio::net::UnixListener, Bound), ServeError> {
    let io = |e| ServeError::Io(format!("--api-socket {}", path.display()), e);
    let mut private = path.as_os_str().to_owned();
    private.push(format!(".binding-{}", std::process::id()));
    let private = PathBuf::from(private);
    let listener = tokio::net::UnixListener::bind(&private).map_err(io)?;
    // a link, not a rename: it fails where something appeared at `path`
    // since the claim, instead of replacing it
    let linked = std::fs::hard_link(&private, path);
    let _ = std::fs::remove_file(&private);
    linked.map_err(io)?;
    let m = std::fs::symlink_metadata(path).map_err(io)?;
    let bound = Bound {
        path: path.to_path_buf(),
        id: (m.dev(), m.ino()),
    };
    Ok((listener, bound))
}

impl Bound {
    /// Removes the socket if the path still holds the one this server
    /// made; true if it did.
    pub fn release(self) -> bool {
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if m.file_type().is_socket() && (m.dev(), m.ino()) == self.id => {
                std::fs::remove_file(&self.path).is_ok()
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_refuses_what_is_not_a_stale_socket() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("f");
        std::fs::write(&file, "keep").unwrap();
        let e = claim(&file).unwrap_err().to_string();
        assert!(
            e.contains("a regular file") && e.contains("remove it yourself"),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
        let e = claim(d.path()).unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        let link = d.path().join("l");
        std::os::unix::fs::symlink("/nonexistent", &link).unwrap();
        assert!(claim(&link)
            .unwrap_err()
            .to_string()
            .contains("symbolic link"));
        assert!(std::fs::symlink_metadata(&link).is_ok());
        // A live socket: refused. The same, no longer listened on: stale.
        let s = d.path().join("s");
        let live = std::os::unix::net::UnixListener::bind(&s).unwrap();
        let e = claim(&s).unwrap_err().to_string();
        assert!(e.contains("another server listens"), "{e}");
        drop(live);
        claim(&s).unwrap();
        assert!(!s.exists());
        claim(&s).unwrap();
    }

    #[test]
    fn release_removes_only_its_own_socket() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let d = tempfile::tempdir().unwrap();
            let s = d.path().join("s");
            let (l, b) = bind(&s).unwrap();
            drop(l);
            assert!(b.release());
            assert!(!s.exists());
            // Replaced by another socket since (ours moved away, so the
            // other cannot reuse its inode): left alone.
            let (l, b) = bind(&s).unwrap();
            drop(l);
            std::fs::rename(&s, d.path().join("moved")).unwrap();
            let other = std::os::unix::net::UnixListener::bind(&s).unwrap();
            assert!(!b.release());
            assert!(s.exists());
            drop(other);
        });
    }
}
