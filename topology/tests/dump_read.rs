//! Loading CPUID dump directories: a dump hwloc's x86 parser cannot use is
//! a typed error, never a description of this host.

use std::path::Path;

use topology::{CpuidSet, GuestTopology, TopologyError, Vendor};

/// Whether hwloc's `lstopo-no-graphics` can run (it parses every dump).
/// Under `CI=true` its absence fails the test; elsewhere the test skips.
fn have_lstopo() -> bool {
    let ok = std::process::Command::new("lstopo-no-graphics")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "lstopo-no-graphics is missing (apt install hwloc)"
        );
        eprintln!("skipped: lstopo-no-graphics is not installed (apt install hwloc)");
    }
    ok
}

/// A dump of a 2 x 3-core guest (6 CPUs) in AMD's encoding.
fn write_dump(dir: &Path) {
    let g = GuestTopology::from_spec("package:2 l3:1 l2:3 core:1 pu:1").unwrap();
    topology::dump::write_cpuid_dump(&g, &CpuidSet::new(Vec::new()), Vendor::Amd, dir).unwrap();
}

/// The reason of a `CpuidDump` error for `dir`; any other result fails.
fn dump_error(dir: &Path) -> String {
    match topology::load(dir.to_str().unwrap()) {
        Err(TopologyError::CpuidDump { path, reason }) => {
            assert_eq!(path, dir);
            reason
        }
        Err(e) => panic!("another error: {e}"),
        Ok(t) => panic!("described {}: {}", t.source(), t.shape()),
    }
}

#[test]
fn a_written_dump_reads_back() {
    if !have_lstopo() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    write_dump(d.path());
    let t = topology::load(d.path().to_str().unwrap()).unwrap();
    let s = t.shape();
    assert_eq!((s.packages, s.cores, s.cpus), (2, 6, 6));
}

#[test]
fn another_architecture_is_a_typed_error() {
    if !have_lstopo() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    write_dump(d.path());
    std::fs::write(d.path().join("hwloc-cpuid-info"), "Architecture: ppc64\n").unwrap();
    let e = dump_error(d.path());
    assert!(e.contains("says \"Architecture: ppc64\""), "{e}");
    assert!(e.contains("lstopo --of xml"), "{e}");
}

#[test]
fn bad_cpu_files_are_typed_errors() {
    if !have_lstopo() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    write_dump(d.path());
    std::fs::remove_file(d.path().join("pu1")).unwrap();
    assert!(dump_error(d.path()).contains("pu1 is missing"));
    write_dump(d.path());
    std::fs::write(d.path().join("pu5"), [0xff, 0xfe, 0x00, 0x0a]).unwrap();
    assert!(dump_error(d.path()).contains("pu5 holds no CPUID lines"));
}

/// What the checks guard against, on the hwloc installed here: given a
/// dump of another architecture, hwloc's parser describes this machine,
/// and [`topology::dump_read::check_read_from_dump`] notices.
#[test]
fn hwloc_falls_back_to_this_machine_and_the_check_notices() {
    if !have_lstopo() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    write_dump(d.path());
    let xml = topology::load::lstopo_on_dump(d.path(), "xml").unwrap();
    assert_eq!(
        topology::dump_read::check_read_from_dump(&xml, 6, ""),
        Ok(())
    );
    std::fs::write(d.path().join("hwloc-cpuid-info"), "Architecture: arm\n").unwrap();
    let xml = topology::load::lstopo_on_dump(d.path(), "xml").unwrap();
    let e = topology::dump_read::check_read_from_dump(&xml, 6, "").unwrap_err();
    assert!(e.contains("read this machine's CPUs instead"), "{e}");
}
