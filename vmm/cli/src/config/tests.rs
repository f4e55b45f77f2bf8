use std::path::Path;

use super::*;

fn flags() -> RunFlags {
    RunFlags {
        kernel: Some("k".into()),
        memory: Some("512M".into()),
        guest: Some("package:1 core:1 pu:1".into()),
        ..Default::default()
    }
}

#[test]
fn sched_mode() {
    let c = RunConfig::resolve(flags(), None).unwrap();
    assert_eq!(c.sched, SchedMode::Host);
    for v in ["vcpu_sched", "vcpu-sched", "VCPU_SCHED"] {
        let f = RunFlags {
            sched: Some(v.into()),
            ..flags()
        };
        assert_eq!(
            RunConfig::resolve(f, None).unwrap().sched,
            SchedMode::VcpuSched
        );
    }
    let f = RunFlags {
        sched: Some("cfs".into()),
        ..flags()
    };
    let e = RunConfig::resolve(f, None).unwrap_err().to_string();
    assert!(
        e.contains("--sched") && e.contains("host or vcpu_sched"),
        "{e}"
    );
}

#[test]
fn console_and_mitigations() {
    let with = |f: RunFlags| RunConfig::resolve(f, None);
    for (v, t) in [
        ("stdout", ConsoleTarget::Stdout),
        ("-", ConsoleTarget::Stdout),
        ("stderr", ConsoleTarget::Stderr),
        ("c.log", ConsoleTarget::File("c.log".into())),
    ] {
        let f = RunFlags {
            console: Some(v.into()),
            ..flags()
        };
        assert_eq!(with(f).unwrap().console, t, "{v}");
    }
    let f = RunFlags {
        console: Some("c.log".into()),
        console_append: true,
        ..flags()
    };
    assert_eq!(
        with(f).unwrap().console,
        ConsoleTarget::Append("c.log".into())
    );
    let f = RunFlags {
        console_append: true,
        ..flags()
    };
    assert!(with(f).unwrap_err().to_string().contains("--console FILE"));
    let f = RunFlags {
        mitigations: Some("none".into()),
        ..flags()
    };
    assert!(with(f).unwrap_err().to_string().contains("--sched host"));
    let f = RunFlags {
        mitigations: Some("only:l2wake".into()),
        sched: Some("vcpu_sched".into()),
        ..flags()
    };
    assert_ne!(with(f).unwrap().mitigations, vcpu_sched::Mitigations::all());
    assert_eq!(
        with(flags()).unwrap().mitigations,
        vcpu_sched::Mitigations::all()
    );
    let f = RunFlags {
        fair_slice_scaling: Some("none".into()),
        ..flags()
    };
    let e = with(f).unwrap_err().to_string();
    assert!(
        e.starts_with("--fair-slice-scaling: sets how vcpu_sched scales"),
        "{e}"
    );
    let f = RunFlags {
        fair_slice_scaling: Some("none".into()),
        sched: Some("vcpu_sched".into()),
        ..flags()
    };
    assert_eq!(
        with(f).unwrap().fair_slice_scaling,
        vcpu_sched::SliceScaling::None
    );
    let f = RunFlags {
        fair_slice_scaling: Some("linear".into()),
        sched: Some("vcpu_sched".into()),
        ..flags()
    };
    assert!(with(f).unwrap_err().to_string().contains("give log"));
    assert_eq!(
        with(flags()).unwrap().fair_slice_scaling,
        vcpu_sched::SliceScaling::Log
    );
    // the file's key, refused there too without vcpu_sched
    let at = std::path::Path::new("vm.toml");
    let file = |t: &str| toml::from_str::<FileConfig>(t).unwrap();
    let c = RunConfig::resolve(
        flags(),
        Some((
            at,
            file("sched = \"vcpu_sched\"\nfair-slice-scaling = \"none\""),
        )),
    );
    assert_eq!(
        c.unwrap().fair_slice_scaling,
        vcpu_sched::SliceScaling::None
    );
    let e = RunConfig::resolve(flags(), Some((at, file("fair-slice-scaling = \"none\""))))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("fair-slice-scaling (in vm.toml): sets how"),
        "{e}"
    );
    // the periods: flags or keys, with vcpu_sched only, in range
    let c = RunConfig::resolve(
        RunFlags {
            tick_us: Some(4_000),
            sched: Some("vcpu_sched".into()),
            ..flags()
        },
        Some((at, file("sched = \"vcpu_sched\"\nhalt-poll-us = 2000"))),
    )
    .unwrap();
    assert_eq!(
        (c.tick, c.halt_poll),
        (Duration::from_millis(4), Duration::from_millis(2))
    );
    let d = with(flags()).unwrap();
    assert_eq!(
        (d.tick, d.halt_poll),
        (Duration::from_millis(1), Duration::from_millis(1))
    );
    let e = with(RunFlags {
        halt_poll_us: Some(2_000),
        ..flags()
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("--halt-poll-us: sets the period of the halt poller"),
        "{e}"
    );
    let e = with(RunFlags {
        tick_us: Some(50),
        sched: Some("vcpu_sched".into()),
        ..flags()
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("--tick-us") && e.contains("give 100..=100000"),
        "{e}"
    );
    let f = RunFlags {
        pin: Some("".into()),
        ..flags()
    };
    assert!(with(f).unwrap_err().to_string().contains("--pin: empty"));
}

#[test]
fn durations() {
    assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
    assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
    assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("45").unwrap(), Duration::from_secs(45));
    assert!(parse_duration("soon").is_err());
    assert!(parse_duration("5y").is_err());
    assert!(parse_duration("0").unwrap_err().contains("more than zero"));
    assert!(parse_duration("0s").unwrap_err().contains("more than zero"));
    assert!(parse_duration("99999999999h")
        .unwrap_err()
        .contains("too long"));
    assert_eq!(format_duration(Duration::from_secs(600)), "10m");
    assert_eq!(format_duration(Duration::from_secs(90)), "90s");
    assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
}

#[test]
fn flags_alone() {
    let c = RunConfig::resolve(flags(), None).unwrap();
    assert_eq!(c.memory, 512 << 20);
    assert_eq!(c.pin, PinSpec::None);
    assert_eq!(c.console, ConsoleTarget::Stdout);
    assert_eq!(c.compat, CompatArg::Auto);
    let mut f = flags();
    f.memory = None;
    let e = RunConfig::resolve(f, None).unwrap_err().to_string();
    assert!(e.starts_with("--memory: missing"), "{e}");
    let mut f = flags();
    f.rt = Some("fifo:0".into());
    let e = RunConfig::resolve(f, None).unwrap_err().to_string();
    assert!(e.starts_with("--rt:"), "{e}");
    let mut f = flags();
    f.until = Some("(".into());
    let e = RunConfig::resolve(f, None).unwrap_err().to_string();
    assert!(e.starts_with("--until: not a valid regex"), "{e}");
    let mut f = flags();
    f.numa_distance = Some(5);
    assert!(RunConfig::resolve(f, None)
        .unwrap_err()
        .to_string()
        .starts_with("--numa-distance"));
    let mut f = flags();
    f.vendor = Some("via".into());
    assert!(RunConfig::resolve(f, None)
        .unwrap_err()
        .to_string()
        .starts_with("--vendor"));
}

#[test]
fn file_and_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("vm.toml");
    std::fs::write(
        &p,
        r#"
kernel = "vmlinux"
memory = 1024
guest = "package:2 [numa] core:2 pu:2"
numa-distance = 30
pin = "0-7"
timeout = 120
console = "out.log"
"#,
    )
    .unwrap();
    let f = FileConfig::load(&p).unwrap();
    let c = RunConfig::resolve(RunFlags::default(), Some((&p, f.clone()))).unwrap();
    assert_eq!(c.kernel, dir.path().join("vmlinux"));
    assert_eq!(c.memory, 1 << 30);
    assert_eq!(c.numa_distance, Some(30));
    assert_eq!(c.pin, PinSpec::List((0..8).collect()));
    assert_eq!(c.timeout, Some(Duration::from_secs(120)));
    assert_eq!(c.console, ConsoleTarget::File(dir.path().join("out.log")));
    // Flags win.
    let over = RunFlags {
        memory: Some("2G".into()),
        pin: Some("none".into()),
        ..Default::default()
    };
    let c = RunConfig::resolve(over, Some((&p, f))).unwrap();
    assert_eq!(c.memory, 2 << 30);
    assert_eq!(c.pin, PinSpec::None);
}

#[test]
fn file_errors_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("vm.toml");
    std::fs::write(&p, "kernel = \"k\"\nmemroy = \"1G\"\n").unwrap();
    let e = FileConfig::load(&p).unwrap_err().to_string();
    assert!(e.contains("unknown field `memroy`"), "{e}");
    assert!(e.contains("line 2"), "{e}");
    std::fs::write(&p, "kernel = \"k\"\nmemory = \"1Q\"\nguest = \"x:1\"\n").unwrap();
    let f = FileConfig::load(&p).unwrap();
    let e = RunConfig::resolve(RunFlags::default(), Some((&p, f)))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("memory (in "), "{e}");
    assert!(e.contains("unknown unit"), "{e}");
    std::fs::write(&p, "kernel = 5\n").unwrap();
    let e = FileConfig::load(&p).unwrap_err().to_string();
    assert!(e.contains("invalid type"), "{e}");
    assert!(e.contains("line 1, `kernel`"), "{e}");
    assert!(e.contains("expected a file path in quotes"), "{e}");
}

#[test]
fn file_errors_in_plain_words() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("vm.toml");
    for (text, want) in [
        (
            "memory = true\n",
            "line 1, `memory`: invalid type: boolean `true`, expected a size in quotes",
        ),
        (
            "memory = 1.5\n",
            "expected a size in quotes such as \"512M\"",
        ),
        (
            "memory = -1\n",
            "invalid value: integer `-1`, expected a size",
        ),
        (
            "timeout = [1]\n",
            "`timeout`: invalid type: sequence, expected a duration",
        ),
        (
            "numa-distance = -3\n",
            "`numa-distance`: invalid value: integer `-3`, expected a whole number",
        ),
        ("numa-distance = \"x\"\n", "expected a whole number"),
        (
            "\n\npin = 5\n",
            "line 3, `pin`: invalid type: integer `5`, expected text in quotes",
        ),
    ] {
        std::fs::write(&p, text).unwrap();
        let e = FileConfig::load(&p).unwrap_err().to_string();
        assert!(e.contains(want), "{text:?}: {e}");
        for bad in ["untagged", "StrOrInt", "u32", "u64"] {
            assert!(!e.contains(bad), "{text:?}: {e}");
        }
    }
    let e = FileConfig::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("it is a directory"), "{e}");
    let e = FileConfig::load(Path::new("/dev/zero"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a regular file"), "{e}");
    let e = FileConfig::load(&dir.path().join("nope.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.ends_with("nope.toml: no such file"), "{e}");
    std::fs::write(&p, vec![b'#'; 2 << 20]).unwrap();
    let e = FileConfig::load(&p).unwrap_err().to_string();
    assert!(
        e.contains("the limit is 1048576 (1 MiB); give a TOML file"),
        "{e}"
    );
    std::fs::write(&p, b"kernel = \"\xff\"\n").unwrap();
    let e = FileConfig::load(&p).unwrap_err().to_string();
    assert!(e.contains("not UTF-8"), "{e}");
    // Both spellings of a StrOrInt still load.
    std::fs::write(&p, "memory = \"1G\"\ntimeout = 30\n").unwrap();
    let f = FileConfig::load(&p).unwrap();
    assert_eq!(f.memory, Some(StrOrInt::Str("1G".into())));
    assert_eq!(f.timeout, Some(StrOrInt::Int(30)));
}

#[test]
fn devices_in_cloud_hypervisor_syntax() {
    let c = RunConfig::resolve(flags(), None).unwrap();
    assert_eq!(c.devices, vmm_machine::devices::DeviceSpec::none());
    let f = RunFlags {
        rng: Some(String::new()),
        platform: Some("num_pci_segments=2".into()),
        ..flags()
    };
    let d = RunConfig::resolve(f, None).unwrap().devices;
    assert_eq!((d.pci_segments, d.rng), (2, Some(0)));
    // A segment the platform does not have: the flag and the fix named.
    let f = RunFlags {
        rng: Some("pci_segment=1".into()),
        ..flags()
    };
    let e = RunConfig::resolve(f, None).unwrap_err().to_string();
    assert!(
        e.starts_with("--rng") && e.contains("num_pci_segments"),
        "{e}"
    );
    let f = RunFlags {
        platform: Some("num_pci_segments=17".into()),
        ..flags()
    };
    let e = RunConfig::resolve(f, None).unwrap_err().to_string();
    assert!(e.starts_with("--platform") && e.contains("1 to 16"), "{e}");
    // The same in a file.
    let file: FileConfig =
        toml::from_str("rng = \"pci_segment=1\"\nplatform = \"num_pci_segments=2\"").unwrap();
    let d = RunConfig::resolve(flags(), Some((Path::new("vm.toml"), file)))
        .unwrap()
        .devices;
    assert_eq!((d.pci_segments, d.rng), (2, Some(1)));
}

#[test]
fn a_disk_engine_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.img"), [0u8; 512]).unwrap();
    let file: FileConfig =
        toml::from_str("disk = [\"path=a.img,engine=pool\", \"path=a.img,readonly=on\"]").unwrap();
    let at = dir.path().join("vm.toml");
    let d = RunConfig::resolve(flags(), Some((&at, file)))
        .unwrap()
        .devices;
    use vmm_machine::devices::BlockEngine;
    assert_eq!(d.disks[0].engine, BlockEngine::Pool);
    assert_eq!(d.disks[1].engine, BlockEngine::default());
    let file: FileConfig = toml::from_str("disk = [\"path=a.img,engine=aio\"]").unwrap();
    let e = RunConfig::resolve(flags(), Some((&at, file)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("disk") && e.contains("sync, pool, io_uring"),
        "{e}"
    );
}

#[test]
fn vsock_from_the_flag_or_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("v.sock");
    let f = RunFlags {
        vsock: Some(format!("cid=3,socket={}", sock.display())),
        ..flags()
    };
    let v = RunConfig::resolve(f, None).unwrap().devices.vsock.unwrap();
    assert_eq!((v.cid, v.socket, v.pci_segment), (3, sock.clone(), 0));
    // A CID below 3, a path that exists, a segment the platform lacks.
    for (opt, want) in [
        (format!("cid=2,socket={}", sock.display()), "3 or more"),
        (format!("cid=3,socket={}", dir.path().display()), "exists"),
        (
            format!("cid=3,socket={},pci_segment=1", sock.display()),
            "pci_segment=1",
        ),
    ] {
        let f = RunFlags {
            vsock: Some(opt),
            ..flags()
        };
        let e = RunConfig::resolve(f, None).unwrap_err().to_string();
        assert!(e.starts_with("--vsock") && e.contains(want), "{e}");
    }
    // In a file: relative to it.
    let file: FileConfig = toml::from_str("vsock = \"cid=4,socket=vm.vsock\"").unwrap();
    let toml = dir.path().join("vm.toml");
    let v = RunConfig::resolve(flags(), Some((&toml, file)))
        .unwrap()
        .devices
        .vsock
        .unwrap();
    assert_eq!((v.cid, v.socket), (4, dir.path().join("vm.vsock")));
}
