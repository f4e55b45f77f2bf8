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
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("api.sock");
        let log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
        let child = cmd
            .args(["serve", "--api-socket"])
            .arg(&sock)
            .args(["--topology", topology])
            .args(extra)
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

/// A small multi-threaded tokio runtime for a test's client side.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
