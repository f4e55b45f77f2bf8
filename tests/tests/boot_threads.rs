//! vCPU threads as the host sees them: one thread per vCPU named
//! `vcpu<N>`, pinned by `--pin`, with the `--rt` policy. Read from
//! `/proc/<pid>/task` while a tiny guest spins.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use integration_tests::{tiny_kernel, vmm_bin};

/// (comm, Cpus_allowed_list, policy, rt_priority) of each vcpu thread.
fn vcpu_threads(pid: u32, want: usize) -> Vec<(String, String, u32, u32)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut out = Vec::new();
        if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for t in dir.flatten() {
                let p = t.path();
                let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
                let comm = comm.trim().to_string();
                if !comm.starts_with("vcpu") {
                    continue;
                }
                let status = std::fs::read_to_string(p.join("status")).unwrap_or_default();
                let allowed = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .unwrap_or("")
                    .trim()
                    .to_string();
                let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
                // Fields after the ")" that ends comm: state is field 3.
                let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
                let f: Vec<&str> = rest.split_whitespace().collect();
                // rt_priority is field 40, policy 41 (1-based): rest starts at 3.
                let rt_prio = f.get(40 - 3).and_then(|x| x.parse().ok()).unwrap_or(0);
                let policy = f.get(41 - 3).and_then(|x| x.parse().ok()).unwrap_or(0);
                out.push((comm, allowed, policy, rt_prio));
            }
        }
        // Pinning and the policy are applied before the guest starts, so
        // once all threads exist and are pinned they are final.
        if out.len() == want && out.iter().all(|t| !t.1.contains(['-', ','])) {
            out.sort();
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "vcpu threads did not show up: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn spin_kernel(dir: &Path) -> String {
    let k = dir.join("spin");
    std::fs::write(&k, tiny_kernel(&[0xeb, 0xfe])).unwrap();
    k.display().to_string()
}

#[test]
fn threads_are_named_and_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let k = spin_kernel(dir.path());
    // One LLC of two cores fits any host with two cores in an LLC.
    let mut child = Command::new(vmm_bin())
        .args([
            "run",
            "--kernel",
            &k,
            "--memory",
            "128M",
            "--guest",
            "package:1 l3:1 l2:2 core:1 pu:1",
            "--pin",
            "auto",
            "--timeout",
            "30s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = vcpu_threads(child.id(), 2);
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert_eq!(t[0].0, "vcpu0", "{t:?}");
    assert_eq!(t[1].0, "vcpu1", "{t:?}");
    assert_ne!(t[0].1, t[1].1, "each vCPU on its own host CPU: {t:?}");
    assert!(
        t.iter().all(|x| x.2 == 0),
        "SCHED_OTHER without --rt: {t:?}"
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}

#[test]
fn explicit_pin_list_and_rt_policy() {
    let dir = tempfile::tempdir().unwrap();
    let k = spin_kernel(dir.path());
    // The first CPU this process may use.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let allowed = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    let first: u32 = integration_tests::guest::parse_cpulist(allowed)[0];
    // One vCPU, so the spinning RT thread leaves the other host CPUs alone.
    let mut child = Command::new(vmm_bin())
        .args([
            "run",
            "--kernel",
            &k,
            "--memory",
            "128M",
            "--guest",
            "package:1 core:1 pu:1",
            "--pin",
            &first.to_string(),
            "--rt",
            "rr:3",
            "--timeout",
            "30s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Without the privilege to set RT policies, the run must fail cleanly.
    std::thread::sleep(Duration::from_millis(300));
    if let Some(status) = child.try_wait().unwrap() {
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(status.code(), Some(2), "{err}");
        assert!(err.contains("--rt rr:3: cannot set the policy"), "{err}");
        return;
    }
    let t = vcpu_threads(pid, 1);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(t[0].0, "vcpu0");
    assert_eq!(t[0].1, first.to_string());
    assert_eq!((t[0].2, t[0].3), (2, 3), "SCHED_RR at priority 3: {t:?}");
}
