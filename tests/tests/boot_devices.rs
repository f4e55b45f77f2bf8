//! The guest kernel's PCI and virtio drivers judge the VMM's devices.
//!
//! The minimal kernel boots on a 2-node guest with two PCI segments and a
//! virtio-rng on segment 1. Its own log must show: both MMCONFIG windows
//! accepted (reserved by the DSDT's motherboard resources), a host bridge
//! per segment, the virtio device with its IDs, class and BAR on segment
//! 1, that segment on guest NUMA node 1, and the virtio-pci driver taking
//! the device. The VMM's log must show the device activated: the guest's
//! driver negotiated `VERSION_1` and set `DRIVER_OK`.
//!
//! The run stops at `IPI shorthand broadcast` (a late initcall, after
//! every driver's probe). Guest user space cannot run under kvm_pvm, so
//! the kernel's log is the judge.

use std::time::Duration;

use integration_tests::guest::{guest_images, run_vmm};

#[test]
fn pci_segments_and_virtio_rng_as_the_guest_kernel_sees_them() {
    let g = guest_images();
    let kernel = g.vmlinux.to_string_lossy().into_owned();
    let initrd = g.initramfs.to_string_lossy().into_owned();
    let args = [
        "-v",
        "run",
        "--kernel",
        &kernel,
        "--initrd",
        &initrd,
        "--memory",
        "1G",
        "--guest",
        "package:2 [numa] l3:1 l2:1 core:1 pu:1",
        "--platform",
        "num_pci_segments=2",
        "--rng",
        "pci_segment=1",
        "--cmdline",
        "loglevel=8",
        "--until",
        "IPI shorthand broadcast",
        "--timeout",
        "12m",
    ];
    let r = run_vmm(&args, Duration::from_secs(13 * 60));
    eprintln!("boot took {:.1} s", r.elapsed.as_secs_f64());
    assert_eq!(r.status, Some(0), "{}", r.context());
    let log = &r.console;
    for want in [
        "PCI: MMCONFIG at [mem 0xe0000000-0xe00fffff] reserved in ACPI motherboard resources",
        "PCI: MMCONFIG at [mem 0xe0100000-0xe01fffff] reserved in ACPI motherboard resources",
        "ACPI: PCI Root Bridge [PC00] (domain 0000 [bus 00])",
        "ACPI: PCI Root Bridge [PC01] (domain 0001 [bus 00])",
        "pci 0000:00:00.0: [8086:0d57] type 00 class 0x060000",
        "pci_bus 0000:00: on NUMA node 0",
        "pci 0001:00:01.0: [1af4:1044] type 00 class 0xff0000",
        "pci 0001:00:01.0: BAR 0 [mem 0xd0000000-0xd000ffff]",
        "pci_bus 0001:00: on NUMA node 1",
        "virtio-pci 0001:00:01.0: enabling device",
    ] {
        assert!(
            log.contains(want),
            "missing {want:?} in the guest log:\n{}",
            r.context()
        );
    }
    assert!(
        r.stderr
            .contains("virtio device activated device=virtio-rng"),
        "the guest's driver never set DRIVER_OK:\n{}",
        r.context()
    );
}
