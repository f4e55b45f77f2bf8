//! A `vmm serve` child process and an HTTP client on its Unix socket, for
//! the tests that drive the API as a client would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::vmm_bin;

/// A running `vmm serve` (killed on drop) with its socket and log in a
/// temporary directory of its own.
pub struct Server {
    pub child: Child,
    pub sock: PathBuf,
    dir: tempfile::TempDir,
}

impl Server {
    /// `vmm serve --api-socket S --topology T EXTRA...` with `env` set.
    pub fn start_env(topology: &str, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(vmm_bin());
        cmd.envs(env.iter().copied());
        Self::spawn(cmd, topology, extra)
    }

    /// Starts the server through `cmd`, which is either the `vmm` binary
    /// or a wrapper that runs it (`ip netns exec NS vmm`).
    pub fn spawn(mut cmd: Command, topology: &str, extra: &[&str]) -> Server {
        cmd.arg("serve");
        Self::launch(cmd, |c, sock| {
            c.arg("--api-socket")
                .arg(sock)
                .args(["--topology", topology])
                .args(extra);
        })
    }

    /// Starts the server as Kata starts Cloud Hypervisor: `cmd` (the
    /// binary, or a wrapper) `--api-socket S EXTRA...`, no subcommand.
    pub fn spawn_ch(cmd: Command, extra: &[&str]) -> Server {
        Self::launch(cmd, |c, sock| {
            c.arg("--api-socket").arg(sock).args(extra);
        })
    }

    fn launch(mut cmd: Command, args: impl FnOnce(&mut Command, &Path)) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("api.sock");
        let log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
        args(&mut cmd, &sock);
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn vmm serve");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !sock.exists() {
            assert!(Instant::now() < deadline, "no socket after 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, sock, dir }
    }

    /// The server's temporary directory (its socket and log live there).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What the server wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    /// Waits (bounded) for the server to exit; its status code.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            assert!(
                Instant::now() < deadline,
                "server still running after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request on a fresh connection: (status, body as JSON, or as a
/// JSON string when it is not JSON).
pub async fn call(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let (status, text) = call_text(sock, method, path, body).await;
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, v)
}

/// One request on a fresh connection: (status, body).
pub async fn call_text(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let stream = tokio::net::UnixStream::connect(sock)
        .await
        .expect("connect");
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://localhost{path}"))
        .header("host", "localhost")
        .body(Full::new(Bytes::from(body.unwrap_or("").to_string())))
        .unwrap();
    let resp = tx.send_request(req).await.expect("request");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Waits (bounded) until `file` (a guest console file) holds `needle`,
/// while the default VM stays `Running`; the file's text. Fails the test
/// with the file's last lines otherwise.
pub async fn wait_for_log(sock: &Path, file: &Path, needle: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let log = std::fs::read_to_string(file).unwrap_or_default();
        if log.contains(needle) {
            return log;
        }
        let (_, v) = call(sock, "GET", "/api/v1/vm.info", None).await;
        let tail: String = log.lines().rev().take(30).collect::<Vec<_>>().join("\n");
        assert_eq!(v["state"], "Running", "{v}\n{tail}");
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in {} after {limit:?}; last lines (newest first):\n{tail}",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits (up to `limit`) until `vm.info`'s `x_vmm.pci_devices` no longer
/// lists the function at `bdf`: the guest ejected it (PCI hotplug).
pub async fn wait_ejected(sock: &Path, bdf: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let (_, v) = call(sock, "GET", "/api/v1/vm.info", None).await;
        let devs = v["x_vmm"]["pci_devices"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !devs.iter().any(|d| d["bdf"] == bdf) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{bdf} not ejected in {limit:?}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A small multi-threaded tokio runtime for a test's client side.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The descriptors `pid` has open (`/proc/PID/fd`).
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// `PUT path` with a JSON `body` and `fds` sent with it as `SCM_RIGHTS`
/// ancillary data, in one `sendmsg`, as Kata's driver sends `vm.add-net`
/// (`httputil.DumpRequest`, then `WriteMsgUnix`); (status, body as JSON).
/// A blocking client of its own: hyper's cannot send ancillary data.
pub fn put_with_fds(sock: &Path, path: &str, body: &str, fds: &[i32]) -> (u16, Value) {
    use std::io::{BufRead, Read};
    use std::os::fd::AsRawFd;
    let s = std::os::unix::net::UnixStream::connect(sock).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "PUT {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\
         Content-Length: {}\r\nContent-Type: application/json\r\n\r\n{body}",
        body.len()
    );
    let bytes = std::mem::size_of_val(fds) as u32;
    let mut control = vec![0u64; 8 + fds.len()];
    let mut iov = libc::iovec {
        iov_base: req.as_ptr() as *mut _,
        iov_len: req.len(),
    };
    // SAFETY: a msghdr is plain data; all-zero is its empty value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE computes a size.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(bytes) } as _;
        // SAFETY: `control` has room for one header with `fds` (its
        // CMSG_SPACE, within 8 + len words); the header is written in it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c).cast::<i32>(),
                fds.len(),
            );
        }
    }
    // SAFETY: `msg` points at `iov` (the request) and `control`, alive
    // for the call.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, 0) };
    assert_eq!(
        n,
        req.len() as isize,
        "sendmsg: {}",
        std::io::Error::last_os_error()
    );
    let mut r = std::io::BufReader::new(&s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {line:?}"));
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        if h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).unwrap();
    let text = String::from_utf8_lossy(&body).into_owned();
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, v)
}

/// The topology the API tests' servers manage: 8 CPUs, 2 LLCs of 2 L2s of one
/// SMT2 core each (emulated on this host's CPUs).
pub const TOPO: &str = "package:1 l3:2 l2:2 core:1 pu:2";

/// `vmm serve` on [`TOPO`] with `extra` flags.
pub fn start(extra: &[&str]) -> Server {
    Server::start_env(TOPO, extra, &[])
}

/// `vmm serve` on `topology` with `extra` flags.
pub fn start_on(topology: &str, extra: &[&str]) -> Server {
    Server::start_env(topology, extra, &[])
}

/// A VM of 2 vCPUs (one SMT2 core) running the `ticker` micro-guest, as
/// `vm.create` takes it.
pub const TICKER2: &str = r#"{"cpus":{"boot_vcpus":2,"max_vcpus":2,"topology":{"threads_per_core":2,"cores_per_die":1,"dies_per_package":1,"packages":1}},"x_vmm":{"micro":"ticker"}}"#;

/// `vm`'s KVM exits so far (`vm.info`'s `x_vmm.kvm_exits`; `default` is
/// the unnamed VM).
pub async fn exits(sock: &Path, vm: &str) -> u64 {
    let p = if vm == "default" {
        "/api/v1/vm.info".to_string()
    } else {
        format!("/api/v1/vms/{vm}/vm.info")
    };
    let (s, v) = call(sock, "GET", &p, None).await;
    assert_eq!(s, 200, "{v}");
    v["x_vmm"]["kvm_exits"].as_u64().unwrap()
}

/// Waits (bounded) until `vm`'s exits exceed `than`.
pub async fn progresses(sock: &Path, vm: &str, than: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = exits(sock, vm).await;
        if n > than {
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "VM {vm} made no progress past {than} exits"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Creates the default VM from `config` (a `vm.create` body), boots it
/// and waits (bounded) until it runs: its KVM exits so far.
pub async fn boot_default(sock: &Path, config: &str) -> u64 {
    let created = call(sock, "PUT", "/api/v1/vm.create", Some(config)).await;
    assert_eq!(created.0, 204, "{}", created.1);
    assert_eq!(call(sock, "PUT", "/api/v1/vm.boot", None).await.0, 204);
    progresses(sock, "default", 0).await
}

/// `name{labels} value` lines of a classic exposition.
pub fn samples(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            (
                k.to_string(),
                v.parse::<f64>()
                    .unwrap_or_else(|_| panic!("bad value {l:?}")),
            )
        })
        .collect()
}

/// The value of sample `key` (name and labels, as the exposition writes
/// them) among `s`; fails the test when there is none.
pub fn sample(s: &[(String, f64)], key: &str) -> f64 {
    s.iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no sample {key}"))
        .1
}

/// A metric's value from a scrape.
pub async fn metric(sock: &Path, key: &str) -> f64 {
    let (s, text) = call_text(sock, "GET", "/metrics", None).await;
    assert_eq!(s, 200, "{text}");
    sample(&samples(&text), key)
}
