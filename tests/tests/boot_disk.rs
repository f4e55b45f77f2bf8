//! virtio-blk judged by the guest kernel's ext4 driver and by e2fsck.
//!
//! An ext4 image is built here with `mke2fs -d` (e2fsprogs, not this
//! project). The minimal kernel boots with `root=/dev/vda` and no initrd:
//! its own log must say `VFS: Mounted root (ext4 filesystem)`, which it
//! prints only after reading the superblock, the group descriptors and the
//! root directory through the virtio-blk driver. The first boot mounts it
//! read-only from a `readonly=on` disk on the host 1:1 runner; the second
//! read-write under `--sched vcpu_sched` with 2 vCPUs and 2 queues; the
//! third read-write, and the VMM is then killed with SIGKILL the moment
//! the mount is printed. The image
//! must still pass `e2fsck -fn` (journal replay is left to the next
//! mount, as after any crash).
//!
//! Guest user space cannot run under kvm_pvm, so the kernel panics when it
//! finds no init after the mount; the test stops the VMM before that.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use integration_tests::disk::{e2fsck, mkfs_ext4};
use integration_tests::guest::{guest_images, run_vmm};
use integration_tests::vmm_bin;

const MOUNTED: &str = "VFS: Mounted root (ext4 filesystem)";
/// `--until` takes a regular expression: the same line, escaped.
const MOUNTED_RE: &str = r"VFS: Mounted root \(ext4 filesystem\)";

fn args<'a>(kernel: &'a str, disk: &'a str, cmdline: &'a str) -> Vec<&'a str> {
    vec![
        "-v",
        "run",
        "--kernel",
        kernel,
        "--memory",
        "512M",
        "--guest",
        "package:1 l3:1 l2:1 core:1 pu:1",
        "--disk",
        disk,
        "--cmdline",
        cmdline,
        "--until",
        MOUNTED_RE,
        "--timeout",
        "10m",
    ]
}

#[test]
fn the_guest_mounts_an_ext4_root_and_e2fsck_passes_after_sigkill() {
    let g = guest_images();
    let kernel = g.vmlinux.to_string_lossy().into_owned();
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs_ext4(dir.path());
    e2fsck(&img);

    // Read-only: the disk refuses writes, the kernel mounts it read-only.
    let disk = format!("path={},readonly=on", img.display());
    let r = run_vmm(
        &args(&kernel, &disk, "root=/dev/vda ro loglevel=8"),
        Duration::from_secs(11 * 60),
    );
    eprintln!("read-only boot: {:.1} s", r.elapsed.as_secs_f64());
    assert_eq!(r.status, Some(0), "{}", r.context());
    assert!(r.console.contains(MOUNTED), "{}", r.context());
    assert!(
        r.console.contains("virtio_blk virtio0: [vda]"),
        "{}",
        r.context()
    );
    e2fsck(&img);

    // Read-write under vcpu_sched, 2 vCPUs: one queue each, and every
    // completion's interrupt reaches a vCPU that may sleep in the
    // scheduler, outside KVM_RUN.
    let disk = format!("path={}", img.display());
    let mut a = args(&kernel, &disk, "root=/dev/vda rw loglevel=8");
    a.splice(2..2, ["--sched", "vcpu_sched"]);
    let guest = a.iter().position(|x| *x == "--guest").unwrap() + 1;
    a[guest] = "package:1 l3:1 l2:1 core:2 pu:1";
    let r = run_vmm(&a, Duration::from_secs(11 * 60));
    eprintln!(
        "read-write boot under vcpu_sched: {:.1} s",
        r.elapsed.as_secs_f64()
    );
    assert_eq!(r.status, Some(0), "{}", r.context());
    assert!(r.console.contains(MOUNTED), "{}", r.context());
    assert!(
        r.console
            .contains("virtio_blk virtio0: 2/0/0 default/read/poll queues"),
        "{}",
        r.context()
    );
    e2fsck(&img);

    // Read-write, then SIGKILL at the mount.
    let disk = format!("path={}", img.display());
    let mut child = Command::new(vmm_bin())
        .args(args(&kernel, &disk, "root=/dev/vda rw loglevel=8"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let mounted = loop {
        match lines.next() {
            Some(Ok(l)) => {
                let hit = l.contains(MOUNTED);
                seen.push(l);
                if hit {
                    break true;
                }
            }
            _ => break false,
        }
        if start.elapsed() > Duration::from_secs(11 * 60) {
            break false;
        }
    };
    // std's Child::kill sends SIGKILL: no chance to flush or unmount.
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        mounted,
        "no mount line; console tail:\n{}",
        seen[seen.len().saturating_sub(30)..].join("\n")
    );
    e2fsck(&img);
}
