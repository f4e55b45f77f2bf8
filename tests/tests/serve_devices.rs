//! `vmm serve` boots a Linux guest with a disk, a network card, a virtio
//! console and an rng, all asked for in `vm.create`'s VmConfig with Cloud
//! Hypervisor's field names, as a CH client sends them.
//!
//! The server runs inside a network namespace that the test makes (with a
//! multi-queue tap), so no packet leaves it. The guest kernel is the
//! judge (guest user space cannot run under kvm_pvm):
//! * its PCI enumeration shows each device with its class, the disk on
//!   PCI segment 1 (`platform.num_pci_segments: 2`);
//! * virtio_blk sizes the read-only disk, and `ip=` configures eth0 with
//!   the given MAC; those lines reach the `console` file through `hvc0`
//!   (which gets the log from its own registration on), while the
//!   `serial` file keeps the whole log, the early boot included;
//! * `ping` from the namespace gets every reply: each one is an RX
//!   interrupt that wakes a vCPU asleep in the server's one scheduler;
//! * `vm.shutdown` closes the image: the same image is then booted again
//!   read-write (an exclusive lock, refused while another VM holds it)
//!   and the kernel mounts it as its ext4 root; `e2fsck -fn` passes after.

use std::path::Path;
use std::time::Duration;

use integration_tests::disk::{e2fsck, mkfs_ext4};
use integration_tests::guest::guest_images;
use integration_tests::netns::{Netns, GUEST_IP, HOST_IP, TAP};
use integration_tests::serve::{call, rt, wait_for_log, Server};
use integration_tests::vmm_bin;
use serde_json::{json, Value};

const MAC: &str = "52:54:00:ab:cd:02";
const PINGS: usize = 50;

/// The VmConfig: 2 vCPUs on any host CPU, 256 MiB, two PCI segments.
fn config(kernel: &Path, cmdline: &str, disk: Value, console: &Path, serial: &Path) -> String {
    json!({
        "cpus": {"boot_vcpus": 2, "max_vcpus": 2,
                 "topology": {"threads_per_core": 1, "cores_per_die": 2, "dies_per_package": 1, "packages": 1}},
        "memory": {"size": 256u64 << 20},
        "payload": {"kernel": kernel, "cmdline": cmdline},
        "platform": {"num_pci_segments": 2},
        "disks": [disk],
        "net": [{"tap": TAP, "mac": MAC, "num_queues": 4}],
        "rng": {"src": "/dev/urandom"},
        "console": {"mode": "File", "file": console},
        "serial": {"mode": "File", "file": serial},
        "x_vmm": {"placement": {"policy": "none"}},
    })
    .to_string()
}

#[test]
fn a_served_linux_guest_gets_a_disk_a_network_a_console_and_an_rng() {
    let g = guest_images();
    let work = tempfile::tempdir().unwrap();
    let img = mkfs_ext4(work.path());
    let ns = Netns::new("serve");
    let mut srv = Server::spawn(ns.exec(vmm_bin().to_str().unwrap()), "host", &[]);
    let sock = srv.sock.clone();
    let (hvc, ttys) = (work.path().join("hvc0.log"), work.path().join("ttyS0.log"));
    // root= names a device that never appears: the kernel keeps waiting,
    // alive, with its network up.
    let cmdline = format!(
        "root=/dev/vdz rootwait ip={GUEST_IP}::{HOST_IP}:255.255.255.0::eth0:off loglevel=8"
    );
    let ro = json!({"path": img, "readonly": true, "pci_segment": 1, "id": "root"});
    let cfg = config(&g.vmlinux, &cmdline, ro, &hvc, &ttys);
    rt().block_on(async {
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.create", Some(&cfg)).await;
        assert_eq!(s, 204, "{v}");
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.boot", None).await;
        assert_eq!(s, 204, "{v}\n{}", srv.log());
        let up = format!("hwaddr={MAC}, ipaddr={GUEST_IP},");
        let log = wait_for_log(&sock, &hvc, &up, Duration::from_secs(10 * 60)).await;
        for want in [
            "virtio_blk virtio",
            "[vda] 65536 512-byte logical blocks",
            "IP-Config: Complete:",
        ] {
            assert!(log.contains(want), "no {want:?} in the hvc0 log:\n{log}");
        }
        // COM1 carries the whole log, the early boot included: the PCI
        // enumeration precedes every driver, hvc0's too.
        let early = std::fs::read_to_string(&ttys).unwrap_or_default();
        for want in [
            "Linux version",
            // virtio 1.x IDs and classes: net (Ethernet), block (mass
            // storage, other), console (communication, other), rng;
            // the disk alone on segment 1.
            "[1af4:1041] type 00 class 0x020000",
            "[1af4:1043] type 00 class 0x078000",
            "[1af4:1044] type 00 class 0xff0000",
            "pci 0001:00:01.0: [1af4:1042] type 00 class 0x018000",
            "console [hvc0] enabled",
        ] {
            assert!(
                early.contains(want),
                "no {want:?} in the serial log:\n{early}"
            );
        }
        assert!(
            ns.wait_reachable(Duration::from_secs(60)),
            "no ping answered in 60 s"
        );
        let (rtts, summary) = ns.ping(PINGS, "0.05");
        assert_eq!(rtts.len(), PINGS, "{summary}");
        let (_, v) = call(&sock, "GET", "/api/v1/vm.info", None).await;
        assert_eq!(v["state"], "Running", "{v}");
        assert_eq!(v["config"]["disks"][0]["readonly"], true, "{v}");
        assert_eq!(v["config"]["net"][0]["mac"], MAC, "{v}");
        assert_eq!(v["config"]["platform"]["num_pci_segments"], 2, "{v}");

        // The disk is closed at shutdown: the same image, read-write
        // (an exclusive lock), boots as the ext4 root of the next VM.
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.shutdown", None).await;
        assert_eq!(s, 204, "{v}");
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.delete", None).await;
        assert_eq!(s, 204, "{v}");
        let rw = json!({"path": img, "pci_segment": 1});
        let cmdline = "root=/dev/vda rw loglevel=8";
        let (hvc2, ttys2) = (
            work.path().join("hvc0-2.log"),
            work.path().join("ttyS0-2.log"),
        );
        let cfg = config(&g.vmlinux, cmdline, rw, &hvc2, &ttys2);
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.create", Some(&cfg)).await;
        assert_eq!(s, 204, "{v}");
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.boot", None).await;
        assert_eq!(s, 204, "{v}\n{}", srv.log());
        let mounted = "VFS: Mounted root (ext4 filesystem) on device 254:0";
        wait_for_log(&sock, &hvc2, mounted, Duration::from_secs(10 * 60)).await;
        let (s, _) = call(&sock, "PUT", "/api/v1/vmm.shutdown", None).await;
        assert_eq!(s, 204);
    });
    assert_eq!(
        srv.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        srv.log()
    );
    e2fsck(&img);
}
