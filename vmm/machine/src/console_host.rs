//! The host ends a virtio console can have besides stdout and files: a
//! new pseudo-terminal, or a new Unix socket. Each gives the device a
//! writer for the guest's output and a file descriptor of input for it.
//!
//! Neither may stall the guest: output to a pty nobody reads, or to a
//! socket with no client, is dropped rather than blocking the device's
//! I/O thread (a serial cable with nobody at the other end loses the
//! bytes too).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tracing::{debug, info};

/// A host end: the writer, the input, and what to tell the user.
pub struct HostConsole {
    /// The guest's output goes here.
    pub out: Box<dyn Write + Send>,
    /// The guest's input comes from here.
    pub input: OwnedFd,
    /// Where the user connects (the pty's path, the socket's path).
    pub path: PathBuf,
    /// Removes the socket file when dropped.
    pub guard: Option<SocketGuard>,
}

/// Writes that never block and never fail: a full or closed end drops
/// the bytes.
struct Lossy(File);

impl Write for Lossy {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Err(e) = self.0.write_all(buf) {
            debug!("console output dropped: {e}");
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A new pseudo-terminal in raw mode; its path is the one to open
/// (`screen /dev/pts/N`).
pub fn pty() -> io::Result<HostConsole> {
    // SAFETY: posix_openpt takes flags only; a descriptor or -1 returns.
    let fd = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let master = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut name = [0u8; 128];
    // SAFETY: grantpt/unlockpt/tcgetattr/tcsetattr/fcntl on `master`, and
    // ptsname_r writing at most `name.len()` bytes into `name`; `tio` is a
    // termios the kernel fills before cfmakeraw changes it.
    let ok = unsafe {
        let mut tio: libc::termios = std::mem::zeroed();
        libc::grantpt(fd) == 0
            && libc::unlockpt(fd) == 0
            && libc::ptsname_r(fd, name.as_mut_ptr().cast(), name.len()) == 0
            && libc::tcgetattr(fd, &mut tio) == 0
            && {
                libc::cfmakeraw(&mut tio);
                libc::tcsetattr(fd, libc::TCSANOW, &tio) == 0
            }
            && libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) == 0
    };
    if !ok {
        return Err(io::Error::last_os_error());
    }
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let path = PathBuf::from(String::from_utf8_lossy(&name[..end]).into_owned());
    let out = File::from(master.try_clone()?);
    info!(pty = %path.display(), "virtio console on a pty");
    Ok(HostConsole {
        out: Box::new(Lossy(out)),
        input: master,
        path,
        guard: None,
    })
}

/// Ends the socket's acceptor thread and removes the socket file it was
/// made for, if the file there is still that socket.
pub struct SocketGuard {
    path: PathBuf,
    ino: u64,
    stop: Arc<AtomicBool>,
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        // The acceptor waits in accept(): a connection of our own wakes it
        // to see the flag.
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.path);
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The client that gets the output now.
#[derive(Clone, Default)]
struct Client(Arc<Mutex<Option<UnixStream>>>);

impl Write for Client {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut c = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = c.as_mut() {
            if let Err(e) = s.write_all(buf) {
                debug!("console client gone: {e}");
                *c = None;
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A new Unix socket at `path` (which must not exist). One client at a
/// time: the newest gets the output, and what any client sends is the
/// guest's input.
pub fn socket(path: &Path) -> io::Result<HostConsole> {
    let listener = UnixListener::bind(path)?;
    let ino = std::fs::symlink_metadata(path)?.ino();
    let stop = Arc::new(AtomicBool::new(false));
    let guard = SocketGuard {
        path: path.to_path_buf(),
        ino,
        stop: stop.clone(),
    };
    // A socket pair as the pipe from the clients to the device.
    let (input, feed) = UnixStream::pair()?;
    let client = Client::default();
    let current = client.clone();
    std::thread::Builder::new()
        .name("console-socket".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (Ok(reader), Ok(mut feed)) = (conn.try_clone(), feed.try_clone()) else {
                    continue;
                };
                *current.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn);
                let _ = std::thread::Builder::new()
                    .name("console-client".into())
                    .spawn(move || {
                        let mut reader = reader;
                        let mut buf = [0u8; 4096];
                        while let Ok(n) = reader.read(&mut buf) {
                            if n == 0 || feed.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    });
            }
        })?;
    info!(socket = %path.display(), "virtio console on a Unix socket");
    let input = OwnedFd::from(input);
    Ok(HostConsole {
        out: Box::new(client),
        input,
        path: path.to_path_buf(),
        guard: Some(guard),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pty_carries_output_and_input() {
        let mut c = pty().unwrap();
        assert!(c.path.starts_with("/dev/pts"), "{}", c.path.display());
        let mut slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&c.path)
            .unwrap();
        c.out.write_all(b"to the user\n").unwrap();
        let mut got = [0u8; 12];
        slave.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"to the user\n");
        slave.write_all(b"k").unwrap();
        let mut input = File::from(c.input);
        let mut b = [0u8; 1];
        let t = std::time::Instant::now();
        loop {
            match input.read(&mut b) {
                Ok(1) => break,
                _ if t.elapsed().as_secs() < 5 => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                r => panic!("no input from the pty: {r:?}"),
            }
        }
        assert_eq!(&b, b"k");
    }

    #[test]
    fn a_socket_is_new_and_removed_after() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("console.sock");
        let mut c = socket(&p).unwrap();
        assert!(socket(&p).is_err(), "an existing path is refused");
        let mut s = UnixStream::connect(&p).unwrap();
        s.write_all(b"in").unwrap();
        let mut input = File::from(c.input.try_clone().unwrap());
        let mut got = [0u8; 2];
        input.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"in");
        // The acceptor may not have recorded the client yet: retry.
        let t = std::time::Instant::now();
        let mut b = [0u8; 3];
        s.set_read_timeout(Some(std::time::Duration::from_millis(50)))
            .unwrap();
        loop {
            c.out.write_all(b"out").unwrap();
            if s.read_exact(&mut b).is_ok() {
                break;
            }
            assert!(t.elapsed().as_secs() < 5, "no output on the socket");
        }
        assert_eq!(&b, b"out");
        drop(c);
        assert!(!p.exists(), "the socket file is removed");
        // The acceptor thread ends with it (a server making many VMs
        // must not keep one per VM).
        let acceptors = || {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|c| c.trim() == "console-socket")
                .count()
        };
        let t = std::time::Instant::now();
        while acceptors() > 0 {
            assert!(
                t.elapsed().as_secs() < 5,
                "the acceptor thread is still there"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
