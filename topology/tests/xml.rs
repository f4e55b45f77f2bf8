//! Loading hwloc XML exports, including their NUMA distance matrices.
//!
//! The fixture was made with hwloc's own tools:
//! `lstopo-no-graphics --input "package:2 [numa] l3:1 core:2 pu:1" --of xml`
//! then `hwloc-annotate in.xml out.xml -- none -- distances FILE` with a
//! 10/32 latency matrix.

#[test]
fn xml_with_distances() {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/two-nodes-distance-32.xml"
    );
    let t = topology::load(p).unwrap();
    assert_eq!(t.num_nodes(), 2);
    assert_eq!(t.num_cpus(), 4);
    assert_eq!(t.distances(), &[10, 32, 32, 10]);
    assert_eq!(t.node_of(3), 1);
    // A guest mirroring one CPU per node keeps the host's distances.
    let g = topology::GuestTopology::from_host_cpus(&t, &[0, 2]).unwrap();
    assert_eq!(g.distance(0, 1), 32);
}

/// Found by the `topology_xml` fuzz target (CI, 2026-11-28): the fixture
/// with a bit flipped in its distances. A matrix that is not SLIT-shaped
/// (10 on the diagonal, 11..=255 elsewhere) is refused with the entry and
/// the rule; before, it reached the guest's SLIT, which Linux drops.
#[test]
fn distances_that_are_not_slit_shaped_are_refused() {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/two-nodes-distance-32.xml"
    );
    let text = std::fs::read_to_string(p).unwrap();
    // hwloc checks the element's length attribute against its text.
    let with = |values: &str| {
        let old = "<u64values length=\"12\">10 32 32 10 </u64values>";
        assert!(text.contains(old));
        let new = format!(
            "<u64values length=\"{}\">{values} </u64values>",
            values.len() + 1
        );
        text.replace(old, &new)
    };
    let dir = tempfile::tempdir().unwrap();
    for (values, entry) in [
        ("10 32 32 11", "from node 1 to node 1 is 11"),
        ("20 32 32 10", "from node 0 to node 0 is 20"),
        ("10 10 32 10", "from node 0 to node 1 is 10"),
        ("10 32 256 10", "from node 1 to node 0 is 256"),
    ] {
        let f = dir.path().join("d.xml");
        std::fs::write(&f, with(values)).unwrap();
        let e = topology::load(f.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains(entry), "{values}: {e}");
        assert!(e.contains("10 from a node to itself"), "{values}: {e}");
    }
    // 255 (unreachable) is a valid SLIT entry.
    let f = dir.path().join("ok.xml");
    std::fs::write(&f, with("10 255 32 10")).unwrap();
    let t = topology::load(f.to_str().unwrap()).unwrap();
    assert_eq!(t.distances(), &[10, 255, 32, 10]);
}

#[test]
fn broken_xml_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.xml");
    std::fs::write(&p, "<topology>not really").unwrap();
    let e = topology::load(p.to_str().unwrap()).unwrap_err().to_string();
    assert!(e.contains("cannot load hwloc XML topology"), "{e}");
}

/// Found by the `topology_xml` fuzz target: the fixture with one bit
/// flipped, an XML topology that hwloc's consistency check rejects (it
/// abort()s the process when hwlocality's debug assertions are on). It must
/// load or be refused with an error, and a guest built from whatever loads
/// must have unique x2APIC IDs.
#[test]
fn fuzzed_inconsistent_xml_does_not_abort() {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/fuzz-inconsistent.xml"
    );
    match topology::load(p) {
        Ok(t) => {
            let all: Vec<u32> = (0..t.num_cpus() as u32).collect();
            if let Ok(g) = topology::GuestTopology::from_host_cpus(&t, &all) {
                let mut ids: Vec<u32> = g.cpus().iter().map(|c| c.apic_id).collect();
                ids.sort_unstable();
                ids.dedup();
                assert_eq!(ids.len(), g.num_vcpus());
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// Found by the `topology_xml` fuzz target: a NUMA node whose os_index (2)
/// is not in its nodeset (0x2, node 1). hwloc reads it, then assert()s in
/// its synthetic export, which aborted the process in every build. The
/// loader now refuses it with an error.
#[test]
fn fuzzed_node_outside_its_nodeset_is_an_error() {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/fuzz-node-nodeset.xml"
    );
    // The fuzzer also garbled a set ("5x0000000c"), which the loader now
    // refuses first; with that set repaired, the node is refused.
    let e = topology::load(p).unwrap_err().to_string();
    assert!(e.contains("\"5x0000000c\", which is not a set"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let fixed = dir.path().join("nodeset.xml");
    let text = std::fs::read_to_string(p).unwrap();
    std::fs::write(&fixed, text.replace("5x0000000c", "0x0000000c")).unwrap();
    let e = topology::load(fixed.to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("NUMA node P#2 has a nodeset"), "{e}");
}

/// Found by the `topology_xml` fuzz target: an object with a `cpuset` but
/// no `complete_cpuset` (a misspelt attribute) made hwloc dereference a
/// null set while building (a segmentation fault). The loader now refuses
/// it first.
#[test]
fn fuzzed_object_without_complete_cpuset_is_an_error() {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/fuzz-no-complete-cpuset.xml"
    );
    let e = topology::load(p).unwrap_err().to_string();
    assert!(e.contains("has a cpuset but no complete_cpuset"), "{e}");
}

/// Found by the `topology_xml` fuzz target: `encoding="UTF-7"` in the XML
/// declaration made libxml2 fail with EILSEQ, which hwlocality answers
/// with a panic. The loader now refuses encodings other than UTF-8.
#[test]
fn fuzzed_foreign_encoding_is_an_error() {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/fuzz-utf7.xml");
    let e = topology::load(p).unwrap_err().to_string();
    assert!(e.contains("declares encoding \"UTF-7\""), "{e}");
}

/// Found by the `topology_xml` fuzz target: a NUMA node without an
/// `os_index` made hwloc's synthetic export assert() (an abort). Refused.
#[test]
fn fuzzed_node_without_os_index_is_an_error() {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/fuzz-node-no-index.xml"
    );
    let e = topology::load(p).unwrap_err().to_string();
    assert!(e.contains("a NUMA node has no OS index"), "{e}");
}

/// Found by the `topology_xml` fuzz target: a file whose cores differ in
/// threads (here a misspelt attribute leaves one core with two PUs and
/// the others with one; a hybrid host has such cores for real). The
/// guest's AMD leaf 0x8000_001E reported the guest-wide threads per core
/// on every vCPU; it now reports each vCPU's own core, as the leaf means.
#[test]
fn fuzzed_cores_of_different_sizes_report_their_own_threads() {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/fuzz-uneven-smt.xml"
    );
    let host = topology::load(p).expect("hwloc reads it");
    let all: Vec<u32> = (0..host.num_cpus() as u32).collect();
    let g = topology::GuestTopology::from_host_cpus(&host, &all).expect("a guest");
    let base = topology::CpuidSet::default();
    let mut sizes = std::collections::BTreeSet::new();
    for i in 0..g.num_vcpus() {
        let set = g.cpuid(i, &base, topology::Vendor::Amd);
        let e = set.get(0x8000_001E, 0).expect("leaf 0x8000_001E");
        let threads = ((e.ebx >> 8) & 0xff) as usize + 1;
        assert_eq!(threads, g.smt_siblings(i).len().max(1), "vCPU {i}");
        sizes.insert(threads);
    }
    assert!(
        sizes.len() > 1,
        "the file's cores differ in size: {sizes:?}"
    );
}

/// Found by the `topology_xml` fuzz target: stray text before a subtree
/// (` (`) together with a malformed set (`allowed_cpuset="0x000000;f"`)
/// made hwloc 2.9 dereference a null pointer while loading (`lstopo`
/// crashes on the same file). The loader refuses each of the two first.
#[test]
fn fuzzed_stray_text_and_malformed_set_are_errors() {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/fuzz-stray-text-bad-set.xml"
    );
    let e = topology::load(p).unwrap_err().to_string();
    assert!(e.contains("text \"(\" between elements"), "{e}");
    let text = std::fs::read_to_string(p).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let no_stray = dir.path().join("set.xml");
    std::fs::write(&no_stray, text.replacen(" (  <object", "    <object", 1)).unwrap();
    let e = topology::load(no_stray.to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("allowed_cpuset=\"0x000000;f\", which is not a set"),
        "{e}"
    );
}
