//! `vmm serve`'s `/metrics`: parsed, growing as the guests run, adding up
//! (migrations by distance), checked by `promtool` where it is installed,
//! in both expositions; the host executor's vCPU threads and their
//! schedstat. Each test starts its own server (see `serve_api.rs`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use integration_tests::require_tool;
use integration_tests::serve::{
    boot_default, call, call_text, progresses, rt, sample, samples, start, TICKER2,
};

/// Pauses the default VM and waits until its migration counts stop
/// moving; then the scheduler's migrations by distance add up to the VM's
/// own count (its 2 vCPUs are the only tasks this scheduler has had).
async fn migrations_add_up_once_paused(sock: &Path) {
    assert_eq!(call(sock, "PUT", "/api/v1/vm.pause", None).await.0, 204);
    let by_distance = |s: &[(String, f64)]| -> f64 {
        ["l2", "llc", "node", "remote"]
            .iter()
            .map(|d| {
                sample(
                    s,
                    &format!("vmm_sched_migrations_total{{distance=\"{d}\"}}"),
                )
            })
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = None;
    loop {
        let (s, text) = call_text(sock, "GET", "/metrics", None).await;
        assert_eq!(s, 200);
        let m = samples(&text);
        let now = (
            sample(&m, "vmm_vm_migrations_total{vm=\"default\"}"),
            by_distance(&m),
        );
        if last == Some(now) {
            assert_eq!(
                now.0, now.1,
                "the VM's migrations against the scheduler's by distance"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the paused VM's migration counts never settled: {last:?} then {now:?}"
        );
        last = Some(now);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn metrics_parse_grow_and_pass_promtool() {
    let srv = start(&["--metrics-per-vcpu"]);
    let sock = srv.sock.clone();
    let (text, openmetrics) = rt().block_on(async {
        boot_default(&sock, TICKER2).await;
        // the VM's first exits may all be vCPU 0's: wait until vCPU 1 has
        // left the guest once too (both vCPUs run the ticker)
        let vcpu1 = "vmm_vcpu_kvm_exits_total{vm=\"default\",vcpu=\"1\"}";
        let deadline = Instant::now() + Duration::from_secs(20);
        let a = loop {
            let (s, a) = call_text(&sock, "GET", "/metrics", None).await;
            assert_eq!(s, 200);
            let a = samples(&a);
            if sample(&a, vcpu1) > 0.0 {
                break a;
            }
            assert!(Instant::now() < deadline, "vCPU 1 never left the guest");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let e0 = sample(&a, "vmm_vm_kvm_exits_total{vm=\"default\"}");
        assert!(e0 > 0.0);
        assert_eq!(sample(&a, "vmm_vm_running{vm=\"default\"}"), 1.0);
        // The shared scheduler's counters carry no VM label.
        assert!(sample(&a, "vmm_sched_switches_total") > 0.0);
        assert_eq!(sample(&a, "vmm_sched_tasks"), 2.0);
        assert_eq!(sample(&a, "vmm_sched_groups"), 1.0);
        // TICKER2 asks for no RT policy: no runqueue ever holds a
        // pushable RT task, so the RT overload mask never changes
        assert_eq!(sample(&a, "vmm_sched_rto_updates_total"), 0.0);
        progresses(&sock, "default", e0 as u64).await;
        let (_, b) = call_text(&sock, "GET", "/metrics", None).await;
        let bs = samples(&b);
        assert!(sample(&bs, "vmm_vm_kvm_exits_total{vm=\"default\"}") > e0);
        assert!(sample(&bs, "vmm_api_request_duration_seconds_count") > 0.0);
        // The scheduler's view: run delay per VM and per vCPU, and a
        // wake-to-run histogram whose buckets add up. Both vCPUs waited
        // in a runqueue before their first run, and the VM's run delay is
        // its vCPUs' (one snapshot of each vCPU feeds both).
        let delay = sample(&bs, "vmm_vm_run_delay_seconds_total{vm=\"default\"}");
        let per_vcpu: Vec<f64> = (0..2)
            .map(|k| {
                sample(
                    &bs,
                    &format!("vmm_vcpu_run_delay_seconds_total{{vm=\"default\",vcpu=\"{k}\"}}"),
                )
            })
            .collect();
        assert!(per_vcpu.iter().all(|d| *d > 0.0), "{per_vcpu:?}");
        let sum: f64 = per_vcpu.iter().sum();
        assert!(
            (delay - sum).abs() <= 1e-9 * delay,
            "{delay} != {per_vcpu:?}"
        );
        let wakeups = sample(&bs, "vmm_vm_wakeups_total{vm=\"default\"}");
        assert!(wakeups > 0.0);
        // every wakeup ends in a switch-in, but for the (at most 2) woken
        // vCPUs still waiting at the scrape
        let runs = sample(&bs, "vmm_vm_runs_total{vm=\"default\"}");
        assert!(runs + 2.0 >= wakeups, "runs {runs}, wakeups {wakeups}");
        // The ticker's exits are its port writes (REPORT, SLEEP).
        assert!(sample(&bs, "vmm_vm_exits_total{vm=\"default\",reason=\"io\"}") > 0.0);
        assert_eq!(
            sample(
                &bs,
                "vmm_vm_exits_total{vm=\"default\",reason=\"shutdown\"}"
            ),
            0.0
        );
        let count = sample(&bs, "vmm_vm_wake_to_run_seconds_count{vm=\"default\"}");
        assert!(count > 0.0);
        let buckets: Vec<f64> = bs
            .iter()
            .filter(|(k, _)| k.starts_with("vmm_vm_wake_to_run_seconds_bucket{"))
            .map(|(_, v)| *v)
            .collect();
        assert!(
            buckets.len() > 2 && buckets.windows(2).all(|w| w[0] <= w[1]),
            "{buckets:?}"
        );
        assert_eq!(
            sample(
                &bs,
                "vmm_vm_wake_to_run_seconds_bucket{le=\"+Inf\",vm=\"default\"}"
            ),
            count
        );
        // OpenMetrics on request.
        let stream = tokio::net::UnixStream::connect(&sock).await.unwrap();
        let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .uri("http://localhost/metrics")
            .header("host", "localhost")
            .header("accept", "application/openmetrics-text; version=1.0.0")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let r = tx.send_request(req).await.unwrap();
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text"));
        let om = r.into_body().collect().await.unwrap().to_bytes();
        let om = String::from_utf8_lossy(&om).into_owned();
        assert!(om.trim_end().ends_with("# EOF"));
        migrations_add_up_once_paused(&sock).await;
        (b, om)
    });
    // Every counter family is named for its _total sample, with help.
    assert!(text.contains("# TYPE vmm_vm_kvm_exits_total counter"));
    drop(srv);
    if !require_tool("promtool", "scripts/setup.sh installs it") {
        return;
    }
    let out = fed(Command::new("promtool").args(["check", "metrics"]), &text);
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    openmetrics_parses(&openmetrics);
}

/// `cmd`'s output with `input` on its standard input (a judge of an
/// exposition: promtool, the OpenMetrics parser).
fn fed(cmd: &mut Command, input: &str) -> std::process::Output {
    use std::io::Write;
    let mut p = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {:?}: {e}", cmd.get_program()));
    p.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    p.wait_with_output().unwrap()
}

/// The OpenMetrics exposition, judged by the Prometheus project's Python
/// client's strict OpenMetrics parser (`python3-prometheus-client`;
/// promtool 2.42's `check metrics` reads only the classic format, where
/// an OpenMetrics counter's family name, without `_total`, reads as a
/// metric with no help text).
fn openmetrics_parses(om: &str) {
    const PY: &str = "/usr/bin/python3";
    let probe = Command::new(PY)
        .args(["-c", "import prometheus_client.openmetrics.parser"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        integration_tests::skip_or_fail(
            "python3-prometheus-client is not installed (scripts/setup.sh installs it)",
        );
        return;
    }
    let script = "import sys\n\
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse\n\
fams = list(parse(sys.stdin.read()))\n\
names = {f.name for f in fams}\n\
assert 'vmm_vm_kvm_exits' in names, sorted(names)\n\
print(len(fams))\n";
    let out = fed(Command::new(PY).args(["-c", script]), om);
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the exposition: {}\n{om}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The host executor names its vCPU threads `vcpuN`, and `/metrics` gives
/// their running time, run delay and runs (switch-ins) as the host
/// kernel's schedstat counts them: a scrape lies between two reads of the
/// threads' own schedstat files, one before it and one after.
#[test]
fn host_executor_names_vcpu_threads_and_reports_their_schedstat() {
    let srv = start(&["--executor", "host"]);
    let sock = srv.sock.clone();
    let pid = srv.child.id();
    rt().block_on(async {
        boot_default(&sock, TICKER2).await;
    });
    let vcpus = || -> Vec<(String, std::path::PathBuf)> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|e| {
                let p = e.ok()?.path();
                let n = std::fs::read_to_string(p.join("comm")).ok()?;
                let n = n.trim();
                n.starts_with("vcpu").then(|| (n.to_string(), p))
            })
            .collect()
    };
    let mut names: Vec<String> = vcpus().into_iter().map(|(n, _)| n).collect();
    names.sort();
    assert_eq!(names, ["vcpu0", "vcpu1"]);
    // (running s, run delay s, runs) summed over the vCPU threads
    let schedstat = || -> (f64, f64, f64) {
        vcpus().iter().fold((0.0, 0.0, 0.0), |(r, d, n), (_, p)| {
            let t = std::fs::read_to_string(p.join("schedstat")).unwrap();
            let v: Vec<f64> = t
                .split_whitespace()
                .map(|x| x.parse::<f64>().unwrap())
                .collect();
            (r + v[0] / 1e9, d + v[1] / 1e9, n + v[2])
        })
    };
    let before = schedstat();
    let m = rt().block_on(async {
        let (s, text) = call_text(&sock, "GET", "/metrics", None).await;
        assert_eq!(s, 200, "{text}");
        samples(&text)
    });
    let after = schedstat();
    let running = sample(&m, "vmm_vm_running_seconds_total{vm=\"default\"}");
    let delay = sample(&m, "vmm_vm_run_delay_seconds_total{vm=\"default\"}");
    let runs = sample(&m, "vmm_vm_runs_total{vm=\"default\"}");
    // the exposition rounds to a few significant digits at most
    let tol = 1e-6;
    assert!(
        before.0 > 0.0 && before.0 - tol <= running && running <= after.0 + tol,
        "running {running} s not within the threads' {before:?} .. {after:?}"
    );
    assert!(
        before.1 - tol <= delay && delay <= after.1 + tol,
        "run delay {delay} s not within the threads' {before:?} .. {after:?}"
    );
    assert!(
        before.2 > 0.0 && before.2 <= runs && runs <= after.2,
        "runs {runs} not within the threads' {before:?} .. {after:?}"
    );
    drop(srv);
}
