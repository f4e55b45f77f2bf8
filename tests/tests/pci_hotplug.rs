//! ACPI PCI hotplug under `vmm serve`: a Linux guest booted with no
//! device at all gets a virtio-net and a virtio-blk while it runs, uses
//! them, and gives them back.
//!
//! The guest kernel is the judge (its user space cannot run under
//! kvm_pvm), and the network namespace the test makes keeps every packet
//! in:
//! * acpiphp registers the DSDT's slots (`acpiphp: Slot [1] registered`);
//! * `vm.add-net` while the kernel boots: `ip=` waits up to 12 s for its
//!   `eth0`, which the card hot-added after the boot's bus scan becomes
//!   (the hotplug event raised until the guest's GED driver takes it);
//!   `IP-Config: Complete` with
//!   the MAC given, and `ping` from the namespace gets every reply over it;
//! * `vm.add-disk` (Kata's body: `queue_size` 1024, one queue per vCPU)
//!   answers `{id, bdf}`; the guest enumerates the function at that
//!   address, assigns its BAR, and virtio_blk sizes the disk;
//! * `vm.remove-device`: the guest unbinds the driver and ejects the slot
//!   (`x_vmm.pci_devices` no longer lists it), which closes the image: the
//!   same image is hot-added again, read-write (an exclusive lock, which a
//!   still-open image would refuse), and the guest sizes it again;
//! * a vsock hot-added (its socket made; one per VM) and removed (the
//!   socket goes with the device), and a virtio-fs hot-added on a
//!   virtiofsd the test starts (the guest's driver hands it the rings) and
//!   removed;
//! * removing the net ejects it too, and the guest stops answering pings;
//! * bad requests name their field (an unknown id, a missing image).

use std::path::Path;
use std::time::{Duration, Instant};

use integration_tests::disk::mkfs_ext4;
use integration_tests::guest::guest_images;
use integration_tests::netns::{Netns, GUEST_IP, HOST_IP, TAP};
use integration_tests::serve::{call, rt, wait_ejected, wait_for_log, Server};
use integration_tests::vmm_bin;
use serde_json::{json, Value};

const MAC: &str = "52:54:00:ab:cd:42";

fn config(kernel: &Path, cmdline: &str, console: &Path) -> String {
    json!({
        "cpus": {"boot_vcpus": 2, "max_vcpus": 2},
        // shared: virtiofsd maps guest RAM (vm.add-fs)
        "memory": {"size": 256u64 << 20, "shared": true},
        "payload": {"kernel": kernel, "cmdline": cmdline},
        "serial": {"mode": "File", "file": console},
        "console": {"mode": "Off"},
        "x_vmm": {"placement": {"policy": "none"}},
    })
    .to_string()
}

/// The functions `vm.info` lists on the guest's buses now.
async fn pci_devices(sock: &Path) -> Vec<Value> {
    let (_, v) = call(sock, "GET", "/api/v1/vm.info", None).await;
    v["x_vmm"]["pci_devices"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits until `needle` appears `n` times in the file at `log`.
async fn wait_count(log: &Path, needle: &str, n: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.matches(needle).count() >= n {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{needle:?} not seen {n} times in 300 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A disk hot-added with the body Kata's hotplugAddBlockDevice sends,
/// bad requests, then the disk removed (ejected, its image closed) and
/// the same image added again read-write.
async fn disk_round_trip(sock: &Path, ttys: &Path, img: &Path, work: &Path) {
    // A disk, with the body Kata's hotplugAddBlockDevice sends.
    let disk = json!({"path": img, "readonly": false, "image_type": "Raw",
        "vhost_user": false, "direct": false, "num_queues": 2, "queue_size": 1024,
        "iommu": false})
    .to_string();
    let (s, v) = call(sock, "PUT", "/api/v1/vm.add-disk", Some(&disk)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v, json!({"id": "_disk0", "bdf": "0000:00:02.0"}));
    let log = wait_count(ttys, "[vda] 65536 512-byte logical blocks", 1).await;
    for want in [
        "pci 0000:00:02.0: [1af4:1042] type 00 class 0x018000",
        "pci 0000:00:02.0: BAR 0 [mem 0xc0010000-0xc001ffff]: assigned",
    ] {
        assert!(log.contains(want), "no {want:?} in the log:\n{log}");
    }
    let (_, v) = call(sock, "GET", "/api/v1/vm.info", None).await;
    assert_eq!(v["config"]["disks"][0]["id"], "_disk0", "{v}");
    assert_eq!(v["config"]["net"][0]["id"], "_net0", "{v}");

    // Bad removals and adds name what is wrong.
    let (s, v) = call(
        sock,
        "PUT",
        "/api/v1/vm.remove-device",
        Some(r#"{"id":"nope"}"#),
    )
    .await;
    assert_eq!(s, 404, "{v}");
    assert!(v["error"].as_str().unwrap().contains("_disk0"), "{v}");
    let missing = json!({"path": work.join("absent.img")}).to_string();
    let (s, v) = call(sock, "PUT", "/api/v1/vm.add-disk", Some(&missing)).await;
    assert_eq!((s, v["field"].as_str()), (400, Some("path")), "{v}");

    // The disk goes back: the guest ejects it, which closes the image.
    let (s, v) = call(
        sock,
        "PUT",
        "/api/v1/vm.remove-device",
        Some(r#"{"id":"_disk0"}"#),
    )
    .await;
    assert_eq!(s, 204, "{v}");
    wait_ejected(sock, "0000:00:02.0", Duration::from_secs(120)).await;
    let (_, v) = call(sock, "GET", "/api/v1/vm.info", None).await;
    assert!(
        v["config"]["disks"].as_array().is_none_or(|d| d.is_empty()),
        "{v}"
    );
    // Closed: the same image, read-write, goes in again, and the
    // guest sizes it again.
    let (s, v) = call(sock, "PUT", "/api/v1/vm.add-disk", Some(&disk)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["bdf"], "0000:00:02.0", "{v}");
    wait_count(ttys, "512-byte logical blocks", 2).await;
}

/// A vsock and a virtio-fs hot-added and removed: the vsock's socket is
/// made at the add and removed when the guest ejects the device; the fs's
/// virtiofsd serves the guest's driver (`DRIVER_OK` hands it the rings).
async fn vsock_and_fs(sock: &Path, ttys: &Path, work: &Path, srv: &Server) {
    let vsock = work.join("vsock.sock");
    let body = json!({"cid": 3, "socket": vsock}).to_string();
    let (s, v) = call(sock, "PUT", "/api/v1/vm.add-vsock", Some(&body)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v, json!({"id": "_vsock0", "bdf": "0000:00:03.0"}));
    assert!(vsock.exists(), "the vsock socket is made at the add");
    wait_count(ttys, "pci 0000:00:03.0: [1af4:1053]", 1).await;
    // One vsock per VM.
    let (s, v) = call(sock, "PUT", "/api/v1/vm.add-vsock", Some(&body)).await;
    assert_eq!((s, v["field"].as_str()), (400, Some("cid")), "{v}");
    let rm = r#"{"id":"_vsock0"}"#;
    let (s, v) = call(sock, "PUT", "/api/v1/vm.remove-device", Some(rm)).await;
    assert_eq!(s, 204, "{v}");
    wait_ejected(sock, "0000:00:03.0", Duration::from_secs(120)).await;
    assert!(!vsock.exists(), "the socket goes with the device");

    let Some(bin) = integration_tests::virtiofsd::virtiofsd() else {
        integration_tests::skip_or_fail(
            "virtiofsd is not installed (apt-get install qemu-system-common, which \
             scripts/setup.sh does): vm.add-fs not tried",
        );
        return;
    };
    let root = integration_tests::virtiofsd::shared_root(work);
    let fs_sock = work.join("virtiofsd.sock");
    let _backend =
        integration_tests::virtiofsd::Backend::start(&bin, &root, &fs_sock, &work.join("fsd.log"));
    let body =
        json!({"tag": "hot", "socket": fs_sock, "num_queues": 1, "queue_size": 1024}).to_string();
    let (s, v) = call(sock, "PUT", "/api/v1/vm.add-fs", Some(&body)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v, json!({"id": "_fs0", "bdf": "0000:00:03.0"}));
    wait_count(ttys, "pci 0000:00:03.0: [1af4:105a]", 1).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !srv
        .log()
        .contains("virtio device activated device=virtio-fs:_fs0")
    {
        assert!(std::time::Instant::now() < deadline, "{}", srv.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, v) = call(sock, "GET", "/api/v1/vm.info", None).await;
    assert_eq!(
        v["x_vmm"]["device_backends"],
        json!([{"device": "virtio-fs:_fs0", "state": "Ok"}]),
        "{v}"
    );
    let rm = r#"{"id":"_fs0"}"#;
    let (s, v) = call(sock, "PUT", "/api/v1/vm.remove-device", Some(rm)).await;
    assert_eq!(s, 204, "{v}");
    wait_ejected(sock, "0000:00:03.0", Duration::from_secs(120)).await;
    let (_, v) = call(sock, "GET", "/api/v1/vm.info", None).await;
    assert_eq!(v["x_vmm"]["device_backends"], json!([]), "{v}");
}

#[test]
fn a_running_guest_gets_a_net_and_a_disk_and_gives_them_back() {
    let g = guest_images();
    let work = tempfile::tempdir().unwrap();
    let img = mkfs_ext4(work.path());
    let ns = Netns::new("hotplug");
    let mut srv = Server::spawn(ns.exec(vmm_bin().to_str().unwrap()), "host", &["-v"]);
    let sock = srv.sock.clone();
    let ttys = work.path().join("ttyS0.log");
    // root= names a device that never appears: the kernel keeps waiting,
    // alive, with its network up.
    let cmdline = format!(
        "root=/dev/vdz rootwait ip={GUEST_IP}::{HOST_IP}:255.255.255.0::eth0:off loglevel=8"
    );
    let cfg = config(&g.vmlinux, &cmdline, &ttys);
    rt().block_on(async {
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.create", Some(&cfg)).await;
        assert_eq!(s, 204, "{v}");
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.boot", None).await;
        assert_eq!(s, 204, "{v}\n{}", srv.log());
        assert!(pci_devices(&sock).await.is_empty(), "a device at boot");
        // After the boot's bus scan (which would find a card put in
        // earlier) and before the kernel's ip= gives up waiting for eth0:
        // the card arrives through the hotplug event.
        let log = wait_for_log(
            &sock,
            &ttys,
            "pnp: PnP ACPI: found",
            Duration::from_secs(600),
        )
        .await;
        assert!(log.contains("acpiphp: Slot [31] registered"), "{log}");
        assert!(
            !log.contains("pci 0000:00:01.0"),
            "a device at boot:\n{log}"
        );
        let net = json!({"tap": TAP, "mac": MAC}).to_string();
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.add-net", Some(&net)).await;
        assert_eq!(s, 200, "{v}\n{}", srv.log());
        assert_eq!(v, json!({"id": "_net0", "bdf": "0000:00:01.0"}));
        let up = format!("hwaddr={MAC}, ipaddr={GUEST_IP},");
        let log = wait_for_log(&sock, &ttys, &up, Duration::from_secs(600)).await;
        for want in [
            "pci 0000:00:01.0: [1af4:1041] type 00 class 0x020000",
            "IP-Config: Complete:",
        ] {
            assert!(log.contains(want), "no {want:?} in the log:\n{log}");
        }
        assert!(
            ns.wait_reachable(Duration::from_secs(60)),
            "no ping answered in 60 s"
        );
        let (rtts, summary) = ns.ping(20, "0.05");
        assert_eq!(rtts.len(), 20, "{summary}");

        disk_round_trip(&sock, &ttys, &img, work.path()).await;

        vsock_and_fs(&sock, &ttys, work.path(), &srv).await;

        // The net goes back: ejected, and the guest no longer answers.
        let (s, v) = call(
            &sock,
            "PUT",
            "/api/v1/vm.remove-device",
            Some(r#"{"id":"_net0"}"#),
        )
        .await;
        assert_eq!(s, 204, "{v}");
        wait_ejected(&sock, "0000:00:01.0", Duration::from_secs(120)).await;
        let (rtts, _) = ns.ping(3, "0.2");
        assert!(rtts.is_empty(), "an ejected card answered: {rtts:?}");
        let (s, _) = call(&sock, "PUT", "/api/v1/vmm.shutdown", None).await;
        assert_eq!(s, 204);
    });
    assert_eq!(
        srv.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        srv.log()
    );
}
