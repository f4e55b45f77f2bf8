//! Runs of `vmm bench` that its command-line tests share
//! (`tests/tests/vcpus_bench_settings.rs`).

use crate::vmm;

/// A short cyclic run of 1 VM x `vcpus` vCPUs with `flag` (a flag and
/// its value) if any: its JSON report.
pub fn cyclic_report(
    dir: &std::path::Path,
    vcpus: &str,
    flag: Option<[&str; 2]>,
) -> serde_json::Value {
    let json = dir.join(format!(
        "{}.json",
        flag.map_or_else(|| "default".to_string(), |f| f.concat())
    ));
    let mut args = vec![
        "bench",
        "cyclic",
        "--vms",
        "1",
        "--vcpus",
        vcpus,
        "--duration",
        "0.3",
        "--json",
        json.to_str().unwrap(),
    ];
    args.extend(flag.iter().flatten());
    let o = vmm(&args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

/// One `vmm bench WORKLOAD --vms VMS --vcpus VCPUS --reps 2` comparison
/// along `flag` (`--compare-kicks`, ...): checks its table against
/// `labels` (the baseline, its A/A row, the other value) and returns the
/// six reports.
pub fn axis_comparison(
    workload: &str,
    (vms, vcpus): (&str, &str),
    duration: &str,
    flag: &str,
    labels: &[&str],
) -> Vec<serde_json::Value> {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("c.json");
    let o = vmm(&[
        "bench",
        workload,
        "--vms",
        vms,
        "--vcpus",
        vcpus,
        "--duration",
        duration,
        flag,
        "--reps",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    crate::comparison::check_comparison(&v, labels, 2);
    let reports = v["reports"].as_array().unwrap().clone();
    assert_eq!(reports.len(), 6, "{v}");
    reports
}

/// Each of `cases` is refused: exit 2, its message on stderr.
pub fn refused(cases: &[(Vec<&str>, &str)]) {
    for (args, msg) in cases {
        let o = vmm(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {err}");
    }
}
