//! The device specs' checks and the PCI addresses they give.

use super::*;
use crate::layout::{MMIO_HOLE_START, PCI_ECAM_START};
use vmm_devices::pci::ECAM_SEGMENT_SIZE;

#[test]
fn layouts_split_the_hole_and_follow_nodes() {
    let spec = DeviceSpec {
        pci_segments: 3,
        ..DeviceSpec::default()
    };
    let l = spec.layouts(2);
    assert_eq!(l.len(), 3);
    assert_eq!(l[0].ecam, PCI_ECAM_START);
    assert_eq!(l[2].ecam, PCI_ECAM_START + 2 * ECAM_SEGMENT_SIZE);
    assert_eq!(l[0].mmio, (MMIO_HOLE_START, 128 << 20));
    assert_eq!(l[1].mmio.0, MMIO_HOLE_START + (128 << 20));
    assert!(l[2].mmio.0 + l[2].mmio.1 <= PCI_ECAM_START);
    assert_eq!(
        l.iter().map(|s| s.node).collect::<Vec<_>>(),
        [Some(0), Some(1), Some(0)]
    );
}

#[test]
fn io_threads_follow_the_host_node_of_their_segment() {
    use crate::memory::node_policies;
    let host = topology::load("genoa-2s").unwrap();
    let guest = topology::GuestTopology::from_spec("package:2 [numa] core:2 pu:2").unwrap();
    let spec = DeviceSpec {
        pci_segments: 2,
        ..DeviceSpec::default()
    };
    let layouts = spec.layouts(2);
    // Guest node 0 on host package 1, node 1 on package 0.
    let pins = [192, 193, 194, 195, 0, 1, 2, 3];
    let pol = node_policies(&guest, &host, Some(&pins));
    let cpus = io_cpus(&layouts, &pol, Some(&host));
    let node_of = |c: usize| host.node_of(host.cpu_by_os_index(c as u32).unwrap());
    let s0 = cpus[0].as_ref().expect("segment 0 is placed");
    let s1 = cpus[1].as_ref().expect("segment 1 is placed");
    assert_eq!(s0.len(), host.cpus_of_node(1).len());
    assert!(
        s0.iter().all(|&c| node_of(c) == 1),
        "segment 0 on host node 1"
    );
    assert!(
        s1.iter().all(|&c| node_of(c) == 0),
        "segment 1 on host node 0"
    );
    // Unpinned: nothing is bound, the threads are not placed.
    let pol = node_policies(&guest, &host, None);
    assert_eq!(io_cpus(&layouts, &pol, Some(&host)), vec![None, None]);
}

#[test]
fn impossible_specs_name_the_fix() {
    let spec = |pci_segments, rng| DeviceSpec {
        pci_segments,
        rng,
        ..DeviceSpec::default()
    };
    let e = spec(2, Some(2)).check(1).unwrap_err();
    assert!(
        e.contains("pci_segment=2") && e.contains("num_pci_segments"),
        "{e}"
    );
    let e = spec(0, None).check(1).unwrap_err();
    assert!(e.contains("1 to 16"), "{e}");
    spec(16, Some(15)).check(1).unwrap();
    let disk = |num_queues, pci_segment| DiskSpec {
        queue_size: None,
        path: "a.img".into(),
        readonly: false,
        num_queues,
        pci_segment,
        engine: BlockEngine::default(),
    };
    let with = |d| DeviceSpec {
        disks: vec![d],
        ..spec(2, None)
    };
    let e = with(disk(Some(5), 0)).check(4).unwrap_err();
    assert!(e.contains("num_queues=5") && e.contains("at most 4"), "{e}");
    let e = with(disk(None, 2)).check(4).unwrap_err();
    assert!(
        e.contains("disk a.img") && e.contains("pci_segment=2"),
        "{e}"
    );
    with(disk(Some(4), 1)).check(4).unwrap();
    let e = with(disk(Some(65), 0)).check(1000).unwrap_err();
    assert!(
        e.contains("num_queues=65") && e.contains("at most 64"),
        "{e}"
    );
    assert_eq!(DeviceSpec::disk_queues(&disk(None, 0), 6), 6);
}

#[test]
fn fs_specs_are_checked() {
    let fs = |tag: &str, num_queues, queue_size, pci_segment| FsSpec {
        tag: tag.into(),
        socket: "/run/v.sock".into(),
        num_queues,
        queue_size,
        pci_segment,
    };
    let with = |f| DeviceSpec {
        pci_segments: 2,
        fs: vec![f],
        ..DeviceSpec::default()
    };
    with(fs("kataShared", 1, 1024, 1)).check(1).unwrap();
    let e = with(fs("t", 1, 1024, 2)).check(1).unwrap_err();
    assert!(e.contains("fs tag=t") && e.contains("pci_segment=2"), "{e}");
    let e = with(fs("t", 0, 1024, 0)).check(1).unwrap_err();
    assert!(e.contains("num_queues=0"), "{e}");
    let e = with(fs("t", 1, 1000, 0)).check(1).unwrap_err();
    assert!(e.contains("queue_size=1000"), "{e}");
    let e = with(fs("t", 1, 2048, 0)).check(1).unwrap_err();
    assert!(e.contains("up to") || e.contains("2 to 1024"), "{e}");
    let e = with(fs(&"x".repeat(37), 1, 1024, 0)).check(1).unwrap_err();
    assert!(e.contains("1 to 36 bytes"), "{e}");
}

#[test]
fn net_addresses_follow_the_build_order() {
    let net = |pci_segment| NetSpec {
        tap: TapSource::Name("t".into()),
        mac: None,
        num_queues: None,
        pci_segment,
    };
    let disk = |pci_segment| DiskSpec {
        path: "d".into(),
        readonly: true,
        num_queues: None,
        queue_size: None,
        pci_segment,
        engine: BlockEngine::default(),
    };
    // Kata's sandbox: rng and the root disk on segment 0, no console
    // device, then the net it adds.
    let spec = DeviceSpec {
        pci_segments: 2,
        rng: Some(0),
        disks: vec![disk(0), disk(1)],
        nets: vec![net(0), net(1), net(0)],
        console: Some(0),
        fs: Vec::new(),
        vsock: None,
    };
    assert_eq!(spec.net_address(0), Some((0, 4)));
    assert_eq!(spec.net_address(1), Some((1, 2)));
    assert_eq!(spec.net_address(2), Some((0, 5)));
    assert_eq!(spec.net_address(3), None);
}
