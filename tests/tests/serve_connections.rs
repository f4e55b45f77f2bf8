//! `vmm serve` under many and misbehaving clients: 100 at once, a server
//! out of descriptors, stalled connections and more than the slots; the
//! API keeps answering and the vCPUs keep running. Each test starts its
//! own server (see `serve_api.rs`).

use std::process::Command;
use std::time::{Duration, Instant};

use integration_tests::serve::{
    boot_default, call, call_text, exits, metric, rt, start, Server, TICKER2, TOPO,
};
use integration_tests::vmm_bin;

#[test]
fn hundred_clients_neither_stall_the_api_nor_the_vcpus() {
    let srv = start(&[]);
    let sock = srv.sock.clone();
    rt().block_on(async {
        let before = boot_default(&sock, TICKER2).await;
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..100 {
            let sock = sock.clone();
            tasks.push(tokio::spawn(async move {
                let mut worst = Duration::ZERO;
                for i in 0..10 {
                    let path = if (c + i) % 2 == 0 {
                        "/api/v1/vm.info"
                    } else {
                        "/metrics"
                    };
                    let t = Instant::now();
                    let (s, _) = call_text(&sock, "GET", path, None).await;
                    assert_eq!(s, 200, "{path}");
                    worst = worst.max(t.elapsed());
                }
                worst
            }));
        }
        let all = tokio::time::timeout(Duration::from_secs(120), futures_join(tasks))
            .await
            .expect("1000 requests from 100 clients did not finish in 120 s");
        let worst = all.into_iter().max().unwrap();
        let after = exits(&sock, "default").await;
        eprintln!(
            "100 clients x 10 requests in {:?}, slowest {:?}; vCPU exits {before} -> {after}",
            t0.elapsed(),
            worst
        );
        assert!(
            after > before,
            "the vCPUs made no progress while the API was hammered"
        );
        assert!(worst < Duration::from_secs(30), "a request took {worst:?}");
    });
    drop(srv);
}

async fn futures_join(tasks: Vec<tokio::task::JoinHandle<Duration>>) -> Vec<Duration> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("client task"));
    }
    out
}

/// CPU seconds (user + system) process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // fields after the ")" that ends the command name: state is 3rd,
    // utime the 14th and stime the 15th of the whole line
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no memory-safety preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Reads until EOF or `limit`; how long the server took to close.
fn closed_within(s: &mut std::os::unix::net::UnixStream, limit: Duration) -> Option<Duration> {
    use std::io::Read;
    let t0 = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(t0.elapsed()),
            Err(_) => return None,
        }
    }
}

#[test]
fn out_of_descriptors_the_accept_loop_pauses_and_a_real_client_gets_through() {
    // 48 descriptors: the server starts (KVM, runtime, socket), then the
    // idle connections below use up the rest and accept fails (EMFILE).
    let mut cmd = Command::new("prlimit");
    cmd.arg("--nofile=48:48").arg(vmm_bin());
    let srv = Server::spawn(cmd, TOPO, &[]);
    let sock = srv.sock.clone();
    let idle: Vec<_> = (0..80)
        .filter_map(|_| std::os::unix::net::UnixStream::connect(&sock).ok())
        .collect();
    assert!(idle.len() >= 48, "only {} connections", idle.len());
    std::thread::sleep(Duration::from_millis(500));
    let (c0, t0) = (cpu_seconds(srv.child.id()), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let used = (cpu_seconds(srv.child.id()) - c0) / t0.elapsed().as_secs_f64();
    // A loop that retries accept at once burns a whole CPU (1.0).
    assert!(
        used < 0.3,
        "the server used {used:.2} CPUs while out of descriptors"
    );
    drop(idle);
    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let ok = tokio::time::timeout(
                Duration::from_secs(1),
                call(&sock, "GET", "/api/v1/vmm.ping", None),
            )
            .await;
            if matches!(ok, Ok((200, _))) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no ping answered after the descriptors came back"
            );
        }
        assert!(metric(&sock, "vmm_api_accept_errors_total").await >= 1.0);
    });
}

#[test]
fn stalled_connections_are_closed_and_excess_ones_wait_for_a_slot() {
    use std::io::Write;
    let srv = start(&[]);
    let sock = srv.sock.clone();
    // Headers that never end: closed after the 10 s header timeout,
    // while other clients are served.
    let mut stalled = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    stalled
        .write_all(b"GET /api/v1/vmm.ping HTTP/1.1\r\nHost: localhost\r\n")
        .unwrap();
    rt().block_on(async {
        assert_eq!(call(&sock, "GET", "/api/v1/vmm.ping", None).await.0, 200);
    });
    let took = closed_within(&mut stalled, Duration::from_secs(20));
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(15)),
        "a connection stalled mid-headers was not closed ({took:?})"
    );
    // The cap: with 256 connections open, one more waits (in the
    // socket's backlog) until one of them closes; then it is served.
    let mut held: Vec<_> = (0..256)
        .map(|_| std::os::unix::net::UnixStream::connect(&sock).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut extra = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    extra
        .write_all(b"GET /api/v1/vmm.ping HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let answer = |s: &mut std::os::unix::net::UnixStream, limit: Duration| {
        use std::io::Read;
        s.set_read_timeout(Some(limit)).unwrap();
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
            Err(_) => String::new(),
        }
    };
    assert_eq!(
        answer(&mut extra, Duration::from_secs(1)),
        "",
        "served over the cap"
    );
    held.pop();
    let got = answer(&mut extra, Duration::from_secs(5));
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    drop(held);
    rt().block_on(async {
        assert_eq!(call(&sock, "GET", "/api/v1/vmm.ping", None).await.0, 200);
        assert!(metric(&sock, "vmm_api_connection_cap_waits_total").await >= 1.0);
    });
}
