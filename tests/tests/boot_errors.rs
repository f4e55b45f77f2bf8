//! `vmm run` error paths and small end-to-end runs, driven through the real
//! binary: bad input gets one clear line and exit status 2, guest failures
//! exit non-zero with a report, a clean reset exits 0. Nothing panics.
//!
//! The "kernels" here are tiny ELF executables built by
//! [`integration_tests::tiny_kernel`]; only the timeout test boots the real
//! minimal guest kernel (for two seconds).

use std::path::{Path, PathBuf};
use std::time::Duration;

use integration_tests::guest::{assert_input_error, guest_images, run_vmm, VmmRun};
use integration_tests::tiny_kernel;

const SHAPE: &str = "package:1 core:1 pu:1";

fn run(args: &[&str]) -> VmmRun {
    run_vmm(args, Duration::from_secs(120))
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn missing_kernel() {
    let r = run(&[
        "run",
        "--kernel",
        "/nonexistent/vmlinux",
        "--memory",
        "256M",
        "--guest",
        SHAPE,
    ]);
    assert_input_error(&r, &["--kernel /nonexistent/vmlinux", "no such file"]);
    let dir = tempfile::tempdir().unwrap();
    let k = write(dir.path(), "k", &tiny_kernel(&[0xf4]));
    let r = run(&[
        "run",
        "--kernel",
        s(&k),
        "--initrd",
        "/nonexistent/initrd",
        "--memory",
        "256M",
        "--guest",
        SHAPE,
    ]);
    assert_input_error(&r, &["--initrd /nonexistent/initrd", "no such file"]);
}

#[test]
fn not_a_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let text = write(dir.path(), "notes.txt", b"hello, I am not a kernel\n");
    let r = run(&[
        "run",
        "--kernel",
        s(&text),
        "--memory",
        "256M",
        "--guest",
        SHAPE,
    ]);
    assert_input_error(
        &r,
        &[
            "not a Linux kernel",
            "a text file starting with \"hello, I am not a kernel\"",
        ],
    );
    let gz = write(dir.path(), "x.gz", b"\x1f\x8b\x08\x00\x00\x00");
    let r = run(&[
        "run",
        "--kernel",
        s(&gz),
        "--memory",
        "256M",
        "--guest",
        SHAPE,
    ]);
    assert_input_error(&r, &["not a Linux kernel", "gzip"]);
    // The vmm binary itself: an x86-64 ELF, but not a vmlinux.
    let me = integration_tests::vmm_bin();
    let r = run(&[
        "run",
        "--kernel",
        s(&me),
        "--memory",
        "256M",
        "--guest",
        SHAPE,
    ]);
    assert_input_error(&r, &["not a Linux kernel"]);
    // A directory.
    let r = run(&[
        "run",
        "--kernel",
        s(dir.path()),
        "--memory",
        "256M",
        "--guest",
        SHAPE,
    ]);
    assert_input_error(&r, &["a directory"]);
}

/// A kernel path that exists but is no regular file is the user's fault
/// too (exit 2, as a missing one), refused before it is opened: here a
/// Unix socket (tests may run as root, so permission bits would not stop
/// a read). The same for `--initrd`. `/dev/null` is a device, not a
/// kernel file (FIFOs and `/dev/zero`: `input_files.rs`).
#[test]
fn unreadable_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kernel.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let r = run(&[
        "run",
        "--kernel",
        s(&sock),
        "--memory",
        "256M",
        "--guest",
        SHAPE,
    ]);
    assert_input_error(&r, &["kernel.sock", "a socket, not a regular file"]);
    let k = write(dir.path(), "k", &tiny_kernel(&[0xf4]));
    let r = run(&[
        "run",
        "--kernel",
        s(&k),
        "--initrd",
        s(&sock),
        "--memory",
        "256M",
        "--guest",
        SHAPE,
    ]);
    assert_input_error(
        &r,
        &["--initrd", "kernel.sock", "a socket, not a regular file"],
    );
    let r = run(&[
        "run",
        "--kernel",
        "/dev/null",
        "--memory",
        "256M",
        "--guest",
        SHAPE,
    ]);
    assert_input_error(
        &r,
        &[
            "--kernel /dev/null",
            "a character device, not a regular file",
        ],
    );
}

/// A bad topology string is the user's fault in every command that takes
/// one: exit 2, one line.
#[test]
fn bad_topology_string_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let k = write(dir.path(), "k", &tiny_kernel(&[0xf4]));
    let bad = "package:two core:1";
    for args in [
        &["run", "--kernel", s(&k), "--memory", "256M", "--guest", bad][..],
        &["topology", "show", "--topology", bad][..],
        &["topology", "guest", "--guest", bad][..],
        &["sched-bench", "runq", "--topology", bad][..],
        &["bench", "runq", "--topology", bad][..],
    ] {
        let r = run(args);
        assert_input_error(&r, &["malformed topology description"]);
    }
}

#[test]
fn memory_too_small() {
    let dir = tempfile::tempdir().unwrap();
    let k = write(dir.path(), "k", &tiny_kernel(&[0xf4]));
    let r = run(&[
        "run",
        "--kernel",
        s(&k),
        "--memory",
        "16M",
        "--guest",
        SHAPE,
    ]);
    assert_input_error(&r, &["--memory 16M is too small", "the minimum is 64M"]);
    // More nodes need more memory.
    let r = run(&[
        "run",
        "--kernel",
        s(&k),
        "--memory",
        "100M",
        "--guest",
        "package:4 [numa] core:1 pu:1",
    ]);
    assert_input_error(&r, &["the minimum is 128M"]);
    // Kernel + initrd larger than the RAM: the error names what is needed.
    let big = dir.path().join("big.cpio");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(100 << 20).unwrap();
    let r = run(&[
        "run",
        "--kernel",
        s(&k),
        "--initrd",
        s(&big),
        "--memory",
        "64M",
        "--guest",
        SHAPE,
    ]);
    assert_input_error(
        &r,
        &["too small for this kernel and initrd", "need at least 149M"],
    );
}

#[test]
fn malformed_spec() {
    let dir = tempfile::tempdir().unwrap();
    let k = write(dir.path(), "k", &tiny_kernel(&[0xf4]));
    for spec in ["package:two core:1", "cores=4", ""] {
        let r = run(&[
            "run",
            "--kernel",
            s(&k),
            "--memory",
            "256M",
            "--guest",
            spec,
        ]);
        assert_input_error(&r, &["--guest", "malformed topology description"]);
    }
}

#[test]
fn unpinnable_shape() {
    let dir = tempfile::tempdir().unwrap();
    let k = write(dir.path(), "k", &tiny_kernel(&[0xf4]));
    // No test host has 64 NUMA nodes.
    let r = run(&[
        "run",
        "--kernel",
        s(&k),
        "--memory",
        "4G",
        "--guest",
        "package:64 [numa] core:1 pu:1",
        "--pin",
        "auto",
    ]);
    assert_input_error(
        &r,
        &["--pin auto", "the guest needs 64 NUMA nodes", "--pin none"],
    );
    // An explicit list of the wrong length.
    let r = run(&[
        "run",
        "--kernel",
        s(&k),
        "--memory",
        "256M",
        "--guest",
        "package:1 core:2 pu:1",
        "--pin",
        "0",
    ]);
    assert_input_error(&r, &["--pin lists 1 CPU but the guest has 2 vCPUs"]);
    // A CPU this process may not use.
    let r = run(&[
        "run",
        "--kernel",
        s(&k),
        "--memory",
        "256M",
        "--guest",
        SHAPE,
        "--pin",
        "100000",
    ]);
    assert_input_error(
        &r,
        &["--pin", "host CPU 100000 is not one this process may use"],
    );
}

#[test]
fn bad_values_name_their_flag() {
    let dir = tempfile::tempdir().unwrap();
    let k = write(dir.path(), "k", &tiny_kernel(&[0xf4]));
    let base = [
        "run",
        "--kernel",
        s(&k),
        "--memory",
        "256M",
        "--guest",
        SHAPE,
    ];
    for (extra, needle) in [
        (&["--rt", "fifo:200"][..], "--rt"),
        (&["--rt", "idle"][..], "--rt"),
        (&["--pin", "fast"][..], "--pin"),
        (&["--timeout", "soon"][..], "--timeout"),
        (&["--until", "(unclosed"][..], "--until"),
        (&["--vendor", "cyrix"][..], "--vendor"),
        (&["--compat", "maybe"][..], "--compat"),
        (&["--numa-distance", "300"][..], "--numa-distance"),
        (&["--memory", "12X"][..], "--memory"),
    ] {
        let mut args = base.to_vec();
        if extra[0] == "--memory" {
            args.retain(|a| *a != "--memory" && *a != "256M");
        }
        args.extend_from_slice(extra);
        let r = run(&args);
        assert_input_error(&r, &[needle]);
    }
    let r = run(&["run", "--memory", "256M", "--guest", SHAPE]);
    assert_input_error(&r, &["--kernel", "missing"]);
}

#[test]
fn config_file_fields() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "k", &tiny_kernel(&[0xf4]));
    let cfg = write(
        dir.path(),
        "vm.toml",
        b"kernel = \"k\"\nmemory = \"256M\"\nguest = \"package:1 core:1 pu:1\"\ncpus = 4\n",
    );
    let r = run(&["run", "--config", s(&cfg)]);
    assert_input_error(&r, &["unknown field `cpus`", "line 4"]);
    let cfg = write(
        dir.path(),
        "vm2.toml",
        b"kernel = \"k\"\nmemory = \"lots\"\nguest = \"package:1 core:1 pu:1\"\n",
    );
    let r = run(&["run", "--config", s(&cfg)]);
    assert_input_error(&r, &["memory (in ", "not a size"]);
}

/// COM1 output, then an i8042 reset: console text, exit 0. Also through a
/// config file with a relative kernel path, a flag overriding it, and the
/// console going to a file.
#[test]
fn serial_output_and_reset() {
    // mov dx,0x3f8; for each byte: mov al,b; out dx,al; then mov al,0xfe; out 0x64,al; hlt
    let mut code = vec![0x66, 0xba, 0xf8, 0x03];
    for b in b"tiny kernel says hi\n" {
        code.extend_from_slice(&[0xb0, *b, 0xee]);
    }
    code.extend_from_slice(&[0xb0, 0xfe, 0xe6, 0x64, 0xf4]);
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "k", &tiny_kernel(&code));
    let cfg = write(
        dir.path(),
        "vm.toml",
        b"kernel = \"k\"\nmemory = 128\nguest = \"package:2 [numa] core:1 pu:1\"\ntimeout = 60\n",
    );
    let r = run(&["run", "--config", s(&cfg)]);
    assert_eq!(r.status, Some(0), "{}", r.context());
    assert_eq!(r.console, "tiny kernel says hi\n", "{}", r.context());
    let log = dir.path().join("console.log");
    let r = run(&[
        "run",
        "--config",
        s(&cfg),
        "--console",
        s(&log),
        "--memory",
        "1G",
    ]);
    assert_eq!(r.status, Some(0), "{}", r.context());
    assert_eq!(r.console, "");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "tiny kernel says hi\n"
    );
}

/// A guest that triple-faults (ud2 with no usable IDT): exit 1, the report
/// names the vCPU and shows its registers.
#[test]
fn triple_fault_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let k = write(dir.path(), "k", &tiny_kernel(&[0x0f, 0x0b]));
    let r = run(&[
        "run",
        "--kernel",
        s(&k),
        "--memory",
        "128M",
        "--guest",
        SHAPE,
        "--timeout",
        "60s",
    ]);
    assert_eq!(r.status, Some(1), "{}", r.context());
    assert!(
        r.stderr.contains("vCPU 0 shut down (triple fault)"),
        "{}",
        r.context()
    );
    assert!(
        r.stderr.contains("RIP=0x0000000001000000"),
        "{}",
        r.context()
    );
    assert!(!r.stderr.contains("panicked"), "{}", r.context());
}

/// `--until` stops a guest that would run forever; `--timeout` gives up on
/// one that does not finish, with a clear message and status 124.
#[test]
fn until_and_timeout() {
    let mut code = vec![0x66, 0xba, 0xf8, 0x03];
    for b in b"ready\nspinning\n" {
        code.extend_from_slice(&[0xb0, *b, 0xee]);
    }
    code.extend_from_slice(&[0xeb, 0xfe]); // jmp $
    let dir = tempfile::tempdir().unwrap();
    let k = write(dir.path(), "k", &tiny_kernel(&code));
    let r = run(&[
        "run",
        "--kernel",
        s(&k),
        "--memory",
        "128M",
        "--guest",
        "package:1 core:2 pu:1",
        "--until",
        "^spin",
        "--timeout",
        "60s",
    ]);
    assert_eq!(r.status, Some(0), "{}", r.context());
    assert!(r.elapsed < Duration::from_secs(30), "{}", r.context());
    let r = run(&[
        "run",
        "--kernel",
        s(&k),
        "--memory",
        "128M",
        "--guest",
        SHAPE,
        "--until",
        "never",
        "--timeout",
        "2s",
    ]);
    assert_eq!(r.status, Some(124), "{}", r.context());
    assert!(
        r.stderr.contains("--timeout 2s: the guest did not"),
        "{}",
        r.context()
    );
}

/// The real minimal kernel, stopped by `--timeout` long before it is done.
#[test]
fn real_kernel_timeout() {
    let g = guest_images();
    let r = run(&[
        "run",
        "--kernel",
        s(&g.vmlinux),
        "--memory",
        "256M",
        "--guest",
        "package:1 core:2 pu:1",
        "--timeout",
        "2s",
    ]);
    assert_eq!(r.status, Some(124), "{}", r.context());
    assert!(!r.stderr.contains("panicked"), "{}", r.context());
}

/// ACPI poweroff (the FADT's sleep control register, S5) and the 0xcf9
/// reset register both end the VM cleanly.
#[test]
fn acpi_poweroff_and_pci_reset() {
    let dir = tempfile::tempdir().unwrap();
    // mov dx, 0x600; mov al, SLP_EN | SLP_TYP=5; out dx, al; hlt
    let off = write(
        dir.path(),
        "off",
        &tiny_kernel(&[0x66, 0xba, 0x00, 0x06, 0xb0, 0x34, 0xee, 0xf4]),
    );
    let r = run(&[
        "run",
        "--kernel",
        s(&off),
        "--memory",
        "128M",
        "--guest",
        SHAPE,
        "-v",
    ]);
    assert_eq!(r.status, Some(0), "{}", r.context());
    assert!(
        r.stderr.contains("the guest powered off"),
        "{}",
        r.context()
    );
    // mov dx, 0xcf9; mov al, 6; out dx, al; hlt
    let rst = write(
        dir.path(),
        "rst",
        &tiny_kernel(&[0x66, 0xba, 0xf9, 0x0c, 0xb0, 0x06, 0xee, 0xf4]),
    );
    let r = run(&[
        "run",
        "--kernel",
        s(&rst),
        "--memory",
        "128M",
        "--guest",
        SHAPE,
        "-v",
    ]);
    assert_eq!(r.status, Some(0), "{}", r.context());
    assert!(
        r.stderr.contains("the guest reset the machine"),
        "{}",
        r.context()
    );
}
