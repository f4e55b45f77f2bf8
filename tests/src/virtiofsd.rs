//! A vhost-user backend for the virtio-fs tests: QEMU's C virtiofsd
//! (Debian's `qemu-system-common`, which `scripts/setup.sh` installs),
//! serving a directory on a socket, killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// QEMU's virtiofsd, where Debian puts it (or one on `PATH`).
pub fn virtiofsd() -> Option<PathBuf> {
    let debian = PathBuf::from("/usr/lib/qemu/virtiofsd");
    if debian.is_file() {
        return Some(debian);
    }
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("virtiofsd"))
            .find(|c| c.is_file())
    })
}

/// What QEMU's virtiofsd prints once it listens.
const LISTENING: &str = "Waiting for vhost-user socket connection";

/// A virtiofsd serving `root` on `sock`, killed on drop.
pub struct Backend {
    /// The process.
    pub child: Child,
    log: PathBuf,
}

impl Backend {
    /// Starts `bin` serving `root` on `sock` (its output in `log`) and
    /// waits until it listens (a stale socket file is removed first: an
    /// earlier virtiofsd stops listening once it has its one client).
    pub fn start(bin: &Path, root: &Path, sock: &Path, log: &Path) -> Backend {
        let _ = std::fs::remove_file(sock);
        let out = std::fs::File::create(log).unwrap();
        let child = Command::new(bin)
            .arg(format!("--socket-path={}", sock.display()))
            .args(["-o", &format!("source={}", root.display())])
            .args(["-o", "cache=none", "-o", "sandbox=chroot"])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("starting virtiofsd");
        let mut b = Backend {
            child,
            log: log.into(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !sock.exists() || !b.log().contains(LISTENING) {
            if let Some(s) = b.child.try_wait().unwrap() {
                panic!("virtiofsd exited ({s}) before listening:\n{}", b.log());
            }
            assert!(Instant::now() < deadline, "no virtiofsd socket after 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        b
    }

    /// What it wrote so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, and waits for the exit: the backend crashed.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The shared directory: a few files, and a `/sbin/init` that is text.
pub fn shared_root(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("sbin")).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("hello.txt"), "hello from the host\n").unwrap();
    std::fs::write(root.join("etc/hostname"), "virtiofs-guest\n").unwrap();
    let init = root.join("sbin/init");
    std::fs::write(&init, "this is not an executable\n").unwrap();
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755)).unwrap();
    root
}
