//! The table of `doc_commands.rs`: every documented command, and how
//! the test runs it (or what runs it elsewhere, and why).

use super::{run, Expect, Form, How, SMALL};

/// What follows README.md's `vmm serve ... &`: wait for the socket, then
/// its curl lines (create, boot, info, metrics, shutdown), then the server.
pub(crate) const SERVE_CURLS: &str = r#"& S={tmp}/vmm.sock; for i in $(seq 200); do [ -S $S ] && break; sleep 0.05; done; curl -sS --unix-socket $S -X PUT http://localhost/api/v1/vm.create -d '{"cpus":{"boot_vcpus":2}}'; curl -sS --unix-socket $S -X PUT http://localhost/api/v1/vm.boot; curl -sS --unix-socket $S http://localhost/api/v1/vm.info; curl -sS --unix-socket $S http://localhost/metrics; curl -sS --unix-socket $S -X PUT http://localhost/api/v1/vmm.shutdown; wait"#;
/// README.md's `vmm serve` example as run.
pub(crate) const SERVE_RUN: &str = r#"vmm serve --api-socket {tmp}/vmm.sock --topology "package:1 l3:2 l2:2 core:1 pu:2" & S={tmp}/vmm.sock; for i in $(seq 200); do [ -S $S ] && break; sleep 0.05; done; curl -sS --unix-socket $S -X PUT http://localhost/api/v1/vm.create -d '{"cpus":{"boot_vcpus":2}}'; curl -sS --unix-socket $S -X PUT http://localhost/api/v1/vm.boot; curl -sS --unix-socket $S http://localhost/api/v1/vm.info; curl -sS --unix-socket $S http://localhost/metrics; curl -sS --unix-socket $S -X PUT http://localhost/api/v1/vmm.shutdown; wait"#;

/// The documented commands (whitespace-normalised, as extracted) and how
/// each is run. Forms run in table order; the HWLOC_ lines use the dump the
/// line before them wrote.
pub(crate) const TABLE: &[(&str, How)] = &[
    // ---- README.md ----
    (
        "scripts/demo.sh",
        How::Run(&[Form {
            env: &[
                ("VMM_BIN", "{vmm}"),
                ("DEMO_DURATION", SMALL),
                ("DEMO_REPS", "1"),
                ("DEMO_PINGS", "5"),
            ],
            // the messaging comparison, then both schedulers' pings, all
            // answered
            expect: Expect::StdoutAll(&[
                "noise band",
                "vcpu_sched: rtt ms:",
                "(5 replies of 5)",
                "host 1:1: rtt ms:",
            ]),
            ..run("scripts/demo.sh")
        }]),
    ),
    (
        "scripts/test.sh",
        How::Elsewhere {
            by: "CI: .ci/run execs scripts/test.sh",
            why: "the whole suite, this test included",
        },
    ),
    (
        "vmm topology show",
        How::Run(&[Form {
            expect: Expect::Stdout("PU"),
            ..run("vmm topology show")
        }]),
    ),
    (
        "vmm topology show -t genoa-2s -f synthetic",
        How::Run(&[Form {
            expect: Expect::Stdout("Package:2"),
            ..run("vmm topology show -t genoa-2s -f synthetic")
        }]),
    ),
    (
        "vmm topology show -t \"package:2 [numa] l3:4 l2:4 core:1 pu:2\"",
        How::Run(&[run(
            "vmm topology show -t \"package:2 [numa] l3:4 l2:4 core:1 pu:2\"",
        )]),
    ),
    (
        "vmm topology guest -g \"package:2 die:3 l3:1 l2:4 core:1 pu:2\"",
        How::Run(&[run(
            "vmm topology guest -g \"package:2 die:3 l3:1 l2:4 core:1 pu:2\"",
        )]),
    ),
    (
        "vmm topology cpuid-dump -g genoa-2s -o /tmp/dump --vendor intel",
        How::Run(&[run(
            "vmm topology cpuid-dump -g genoa-2s -o {tmp}/dump --vendor intel",
        )]),
    ),
    (
        "HWLOC_CPUID_PATH=/tmp/dump HWLOC_COMPONENTS=x86,stop lstopo-no-graphics --of synthetic",
        How::Run(&[Form {
            expand: &[("HWLOC_CPUID_PATH=/tmp/dump", "HWLOC_CPUID_PATH={tmp}/dump")],
            expect: Expect::Synthetic(
                "[NUMANode] Package:2 L3Cache:12 L2Cache:8 L1dCache:1 L1iCache:1 Core:1 PU:2",
            ),
            ..run("HWLOC_CPUID_PATH={tmp}/dump HWLOC_COMPONENTS=x86,stop lstopo-no-graphics --of synthetic")
        }]),
    ),
    (
        "vmm topology presets",
        How::Run(&[Form {
            expect: Expect::Stdout("gnr-2s"),
            ..run("vmm topology presets")
        }]),
    ),
    (
        "vmm run --kernel .cache/guest/kernel/vmlinux --initrd .cache/guest/initramfs.cpio.gz --memory 1G --guest \"package:2 [numa] l3:1 l2:2 core:1 pu:2\" --cmdline \"loglevel=8 sched_verbose\" --until \"root domain span\" --timeout 10m",
        How::Run(&[Form {
            expect: Expect::Stdout("root domain span"),
            ..run("vmm run --kernel .cache/guest/kernel/vmlinux --initrd .cache/guest/initramfs.cpio.gz --memory 1G --guest \"package:2 [numa] l3:1 l2:2 core:1 pu:2\" --cmdline \"loglevel=8 sched_verbose\" --until \"root domain span\" --timeout 5m")
        }]),
    ),
    (
        "vmm sched-bench runq --topology genoa-2s --compare seeds --duration 2",
        How::Run(&[run(
            "vmm sched-bench runq --topology genoa-2s --compare seeds --duration 0.1 --reps 1 --groups 2 --tasks 2",
        )]),
    ),
    (
        "vmm sched-bench cyclic --compare \"none;only:l2wake\" --json out.json",
        How::Run(&[run(
            "vmm sched-bench cyclic --compare \"none;only:l2wake\" --json {tmp}/out.json --duration 0.1 --reps 1",
        )]),
    ),
    (
        "vmm sched-bench messaging --topology gnr-2s --mitigations all --check",
        How::Run(&[run(
            "vmm sched-bench messaging --topology gnr-2s --mitigations all --check --duration 0.1 --groups 2 --group-size 2",
        )]),
    ),
    (
        "vmm bench runq --compare seeds --vms 8 --vcpus 8 --duration 2",
        How::Run(&[run(
            "vmm bench runq --compare seeds --vms 2 --vcpus 2 --duration 0.5 --reps 1",
        )]),
    ),
    (
        "vmm bench transcode --topology gnr-2s --vms 60 --vcpus 8 --mitigations all --check",
        How::Run(&[run(
            "vmm bench transcode --topology gnr-2s --vms 2 --vcpus 2 --mitigations all --check --duration 1",
        )]),
    ),
    (
        // The 8-vCPU boot under vcpu_sched takes minutes here; the same
        // command shape with the CI guest is tests/tests/vcpus_linux_boot.rs.
        "vmm run --sched vcpu_sched --kernel ... --guest ...",
        How::Run(&[Form {
            expand: &[
                ("...", ".cache/guest/kernel/vmlinux --initrd .cache/guest/initramfs.cpio.gz --memory 256M"),
                ("...", "\"package:1 l3:1 l2:1 core:1 pu:2\" --until \"smp: Brought up\" --timeout 5m"),
            ],
            expect: Expect::Stdout("smp: Brought up"),
            ..run("vmm run --sched vcpu_sched --kernel .cache/guest/kernel/vmlinux --initrd .cache/guest/initramfs.cpio.gz --memory 256M --guest \"package:1 l3:1 l2:1 core:1 pu:2\" --until \"smp: Brought up\" --timeout 5m")
        }]),
    ),
    (
        "vmm serve --api-socket /tmp/vmm.sock --topology \"package:1 l3:2 l2:2 core:1 pu:2\" &",
        // The server in the background, then the README's curl lines.
        How::Run(&[Form {
            expand: &[("/tmp/vmm.sock", "{tmp}/vmm.sock"), ("&", SERVE_CURLS)],
            expect: Expect::Stdout("\"state\":\"Running\""),
            ..run(SERVE_RUN)
        }]),
    ),
    (
        "vmm plan --topology genoa-2s --guest \"package:1 l3:1 l2:4 core:1 pu:2\" --vms 40 --format json",
        How::Run(&[Form {
            expect: Expect::Stdout("\"host_cpus\""),
            ..run("vmm plan --topology genoa-2s --guest \"package:1 l3:1 l2:4 core:1 pu:2\" --vms 40 --format json")
        }]),
    ),
    (
        "cargo test --workspace",
        How::Elsewhere {
            by: "scripts/test.sh (`cargo test --workspace`), run by CI",
            why: "the whole suite, this test included",
        },
    ),
    (
        "cargo clippy --workspace --all-targets -- -D warnings",
        How::Elsewhere {
            by: "scripts/test.sh (`cargo clippy --workspace --all-targets --quiet -- -D warnings`), run by CI",
            why: "lints the whole workspace; a cargo inside cargo test",
        },
    ),
    (
        "scripts/ab-bench.sh OLD/vmm NEW/vmm transcode 10 -- --topology host",
        How::Run(&[Form {
            // One pair (REPS 10 -> 1) of the binary under test against itself.
            expand: &[("OLD/vmm", "$VMM_BIN"), ("NEW/vmm", "$VMM_BIN"), ("10", "1")],
            env: &[("VMM_BIN", "{vmm}")],
            expect: Expect::Stdout("B/A: mean"),
            ..run("scripts/ab-bench.sh $VMM_BIN $VMM_BIN transcode 1 -- --topology host --vms 2 --vcpus 2 --duration 1")
        }]),
    ),
    // ---- docs/reliability.md ----
    (
        "scripts/fuzz.sh --ci",
        How::Elsewhere {
            by: "scripts/test.sh runs `scripts/fuzz.sh --ci` (the same gate), run by CI",
            why: "builds the fuzz crate with nightly and ASan, minutes",
        },
    ),
    (
        "cargo test -p vcpu_sched --test core_props",
        How::Elsewhere {
            by: "scripts/test.sh (`cargo test --workspace`), run by CI",
            why: "a cargo inside cargo test",
        },
    ),
    // ---- docs/boot-times.md ----
    (
        "cargo build -p vmm && guest/build.sh && guest/stock-kernel.sh",
        How::Elsewhere {
            by: "scripts/test.sh runs `cargo build --workspace` and guest/build.sh (CI); \
                 guest/stock-kernel.sh only for the opt-in tests/tests/boot_slow.rs",
            why: "a kernel build (many minutes) and a download of Debian's kernel package",
        },
    ),
    (
        "vmm/scripts/boot-times.sh 2",
        How::Elsewhere {
            by: "by hand, to refresh docs/boot-times.md; its boots are the shapes of \
                 tests/tests/boot_topology.rs and boot_slow.rs",
            why: "boots every shape of the table, twice, with both kernels: tens of minutes",
        },
    ),
    (
        "target/debug/vmm -v run --kernel .cache/guest/kernel/vmlinux --initrd .cache/guest/initramfs.cpio.gz --memory 512M --guest \"package:2 [numa] l3:1 l2:2 core:1 pu:2\" --cmdline \"loglevel=8 sched_verbose\" --until \"root domain span\" --timeout 20m >/dev/null",
        How::Run(&[run(
            "target/debug/vmm -v run --kernel .cache/guest/kernel/vmlinux --initrd .cache/guest/initramfs.cpio.gz --memory 512M --guest \"package:2 [numa] l3:1 l2:2 core:1 pu:2\" --cmdline \"loglevel=8 sched_verbose\" --until \"root domain span\" --timeout 5m >/dev/null",
        )]),
    ),
    // ---- docs/guest-images.md ----
    (
        "guest/qemu-check.sh --sockets S --cores C --threads T [--memory MiB]",
        How::Elsewhere {
            by: "by hand, where QEMU is installed",
            why: "needs qemu-system-x86_64, which scripts/setup.sh does not install",
        },
    ),
    (
        "guest/qemu-check.sh --accel kvm --kernel .cache/guest/kernel/vmlinux --memory 256",
        How::Elsewhere {
            by: "by hand, where QEMU is installed",
            why: "needs qemu-system-x86_64, which scripts/setup.sh does not install",
        },
    ),
    (
        "vmm run --kernel .cache/guest/kernel/vmlinux --initrd .cache/guest/initramfs.cpio.gz -m 256M -g \"package:2 [numa] l3:1 l2:2 core:1 pu:2\" --cmdline \"loglevel=8 sched_verbose\" --until 'CPU7 attaching sched-domain' --timeout 10m",
        How::Run(&[Form {
            expect: Expect::Stdout("CPU7 attaching sched-domain"),
            ..run("vmm run --kernel .cache/guest/kernel/vmlinux --initrd .cache/guest/initramfs.cpio.gz -m 256M -g \"package:2 [numa] l3:1 l2:2 core:1 pu:2\" --cmdline \"loglevel=8 sched_verbose\" --until 'CPU7 attaching sched-domain' --timeout 5m")
        }]),
    ),
    (
        "vmm run --kernel .cache/guest/kernel/vmlinux --memory 256M --guest \"package:1 core:1 pu:1\" --disk path=.cache/guest/root.img,readonly=on --cmdline \"root=/dev/vda ro\" --until \"VFS: Mounted root\" --timeout 10m",
        // tests/tests/boot_disk.rs boots read-write too, kills the VMM and
        // runs e2fsck
        How::Run(&[Form {
            expect: Expect::Stdout("VFS: Mounted root (ext4 filesystem) readonly"),
            ..run("vmm run --kernel .cache/guest/kernel/vmlinux --memory 256M --guest \"package:1 core:1 pu:1\" --disk path=.cache/guest/root.img,readonly=on --cmdline \"root=/dev/vda ro\" --until \"VFS: Mounted root\" --timeout 10m")
        }]),
    ),
    (
        "scripts/blk-bench.sh",
        // tests/tests/micro_blk.rs checks what the micro-guest driver does;
        // this is the benchmark's plumbing, at its smallest
        How::Run(&[Form {
            env: &[("VMM_BIN", "{vmm}")],
            expect: Expect::Stdout("qd32-x4.txt"),
            ..run("scripts/blk-bench.sh --out {tmp}/blk --duration 0.1 --reps 1")
        }]),
    ),
    (
        "scripts/blk-engine-bench.sh",
        // tests/tests/micro_blk.rs checks the engine comparison's rows and
        // each engine's integrity; this is the benchmark's plumbing, at
        // its smallest
        How::Run(&[Form {
            env: &[("VMM_BIN", "{vmm}")],
            expect: Expect::Stdout("write-qd32.txt"),
            ..run("scripts/blk-engine-bench.sh --out {tmp}/engines --duration 0.1 --reps 1")
        }]),
    ),
    (
        "scripts/net-pps-bench.sh --reps 3 --duration 1",
        // tests/tests/micro_net.rs checks what the micro-guest driver does;
        // this is the benchmark's plumbing (namespace, taps, six tables),
        // at its smallest
        How::Run(&[Form {
            env: &[("VMM_BIN", "{vmm}")],
            expect: Expect::Stdout("echo-x4.txt"),
            ..run("scripts/net-pps-bench.sh --out {tmp}/pps --duration 0.1 --reps 1")
        }]),
    ),
    (
        "scripts/net-demo.sh --pings 20 --console virtio",
        // tests/tests/boot_net.rs pings 1,000 times under both schedulers
        How::Run(&[Form {
            env: &[("VMM_BIN", "{vmm}")],
            expect: Expect::Stdout("20 received, 0% packet loss"),
            ..run("scripts/net-demo.sh --pings 20 --console virtio")
        }]),
    ),
    (
        "guest/build-disk.sh /tmp/root.img",
        How::Run(&[Form {
            expand: &[("/tmp/root.img", "{tmp}/root.img")],
            expect: Expect::Stdout("ext4, label vmmroot"),
            ..run("guest/build-disk.sh {tmp}/root.img")
        }]),
    ),
    // ---- docs/devices.md ----
    (
        "vmm -v run --kernel .cache/guest/kernel/vmlinux --initrd .cache/guest/initramfs.cpio.gz --memory 1G --guest \"package:2 [numa] l3:1 l2:1 core:1 pu:1\" --platform num_pci_segments=2 --rng pci_segment=1 --cmdline \"loglevel=8\" --until \"IPI shorthand broadcast\" --timeout 12m",
        // tests/tests/boot_devices.rs checks every PCI line of this boot
        How::Run(&[Form {
            expect: Expect::Stdout("pci_bus 0001:00: on NUMA node 1"),
            ..run("vmm -v run --kernel .cache/guest/kernel/vmlinux --initrd .cache/guest/initramfs.cpio.gz --memory 1G --guest \"package:2 [numa] l3:1 l2:1 core:1 pu:1\" --platform num_pci_segments=2 --rng pci_segment=1 --cmdline \"loglevel=8\" --until \"IPI shorthand broadcast\" --timeout 12m")
        }]),
    ),
    (
        "scripts/net-neighbours.sh --sched vcpu_sched --neighbours 6 --pings 60 --interval 1",
        // the guest's boot, then 2 spinning neighbours on the one
        // scheduler, and pings that all come back
        How::Run(&[Form {
            env: &[("VMM_BIN", "{vmm}")],
            expect: Expect::Stdout("5 received, 0% packet loss"),
            ..run("scripts/net-neighbours.sh --sched vcpu_sched --neighbours 2 --pings 5 --interval 1")
        }]),
    ),
    (
        "scripts/io-placement-bench.sh",
        // tests/tests/micro_blk.rs checks that --io-cpus puts each I/O
        // thread where asked; this is the benchmark's plumbing (namespace,
        // taps, three tables), at its smallest
        How::Run(&[Form {
            env: &[("VMM_BIN", "{vmm}")],
            expect: Expect::Stdout("net-echo.txt"),
            ..run("scripts/io-placement-bench.sh --out {tmp}/iop --duration 0.1 --reps 1")
        }]),
    ),
    // ---- docs/scheduler.md ----
    (
        "cargo test -p vcpu_sched",
        How::Elsewhere {
            by: "scripts/test.sh (`cargo test --workspace`), run by CI",
            why: "a part of the whole suite, this test included",
        },
    ),
    (
        "cargo test -p vcpu_sched --lib random_ops_soak -- --ignored",
        How::Elsewhere {
            by: "`cargo test --workspace` runs random_ops_keep_every_invariant, the same driver at a shorter length",
            why: "an opt-in longer soak (~40 s); a cargo inside cargo test",
        },
    ),
    (
        "vmm sched-bench messaging --topology genoa-2s --mitigations all --duration 5 --check",
        How::Run(&[run(
            "vmm sched-bench messaging --topology genoa-2s --mitigations all --duration 0.1 --check --groups 2 --group-size 2",
        )]),
    ),
    (
        "vmm sched-bench runq --topology gnr-2s --compare seeds --reps 3 --duration 3 --json out.json",
        How::Run(&[run(
            "vmm sched-bench runq --topology gnr-2s --compare seeds --reps 1 --duration 0.1 --json {tmp}/out.json --groups 2 --tasks 2",
        )]),
    ),
    (
        "vmm sched-bench cyclic --compare \"none;only:l2wake\"",
        How::Run(&[run(
            "vmm sched-bench cyclic --compare \"none;only:l2wake\" --duration 0.1 --reps 1",
        )]),
    ),
    // ---- docs/simulator.md ----
    (
        "vmm sim messaging --topology gnr-2s --compare seeds --c2c --lockstat",
        How::Elsewhere {
            by: "tests/tests/sim_cli.rs (vmm sim --compare, --c2c, --lockstat on a 16-CPU topology)",
            why: "480 simulated CPUs x 8 rows is a benchmark, minutes in a debug build even at 0.1 s",
        },
    ),
    // ---- docs/results-scheduler.md ----
    (
        "cargo bench -p benches",
        How::Elsewhere {
            by: "compiled (not run) by scripts/test.sh's `cargo clippy --all-targets`; run by hand",
            why: "criterion's full measurement: about 6 minutes",
        },
    ),
    (
        "cargo run -p benches --release --bin bench_ratios",
        How::Elsewhere {
            by: "by hand after `cargo bench -p benches`; benches::ratios is unit-tested in benches/src/lib.rs",
            why: "reads the estimates a full `cargo bench` run leaves",
        },
    ),
    (
        "scripts/ab-bench.sh OLD/vmm NEW/vmm transcode 10 -- --topology host --vms 8 --vcpus 8 --duration 2 --mitigations none",
        How::Run(&[Form {
            // One pair (REPS 10 -> 1) of the binary under test against itself.
            expand: &[("OLD/vmm", "$VMM_BIN"), ("NEW/vmm", "$VMM_BIN"), ("10", "1")],
            env: &[("VMM_BIN", "{vmm}")],
            expect: Expect::Stdout("B/A: mean"),
            ..run("scripts/ab-bench.sh $VMM_BIN $VMM_BIN transcode 1 -- --topology host --vms 2 --vcpus 2 --duration 1 --mitigations none")
        }]),
    ),
    // ---- docs/results-vcpus.md ----
    (
        // Every command inside a results block of the docs is checked
        // against the one this run records (see `results_blocks_match`).
        "scripts/results.sh",
        How::Run(&[Form {
            env: &[("VMM_BIN", "{vmm}"), ("RESULTS_MD", "{results_md}")],
            expect: Expect::Results,
            ..run("scripts/results.sh --small --out {tmp}/results")
        }]),
    ),
    (
        "vmm bench runq --vms 2 --vcpus 4 --duration 1 --mitigations all --per-vcpu",
        How::Run(&[Form {
            expect: Expect::Stdout("vm1/vcpu3"),
            ..run("vmm bench runq --vms 2 --vcpus 4 --duration 0.5 --mitigations all --per-vcpu")
        }]),
    ),
    // ---- docs/topology.md ----
    (
        "vmm topology cpuid-dump --guest \"package:2 die:3 l3:1 l2:4 core:1 pu:2\" --out /tmp/d --vendor amd",
        How::Run(&[run(
            "vmm topology cpuid-dump --guest \"package:2 die:3 l3:1 l2:4 core:1 pu:2\" --out {tmp}/d --vendor amd",
        )]),
    ),
    (
        "HWLOC_CPUID_PATH=/tmp/d HWLOC_COMPONENTS=x86,stop lstopo-no-graphics --no-io --of synthetic",
        How::Run(&[Form {
            expand: &[("HWLOC_CPUID_PATH=/tmp/d", "HWLOC_CPUID_PATH={tmp}/d")],
            // As the doc's comment line under it says.
            expect: Expect::Synthetic(
                "[NUMANode] Package:2 Die:3 L3Cache:1 L2Cache:4 L1dCache:1 L1iCache:1 Core:1 PU:2",
            ),
            ..run("HWLOC_CPUID_PATH={tmp}/d HWLOC_COMPONENTS=x86,stop lstopo-no-graphics --no-io --of synthetic")
        }]),
    ),
    (
        "cargo test -p integration-tests --test topology_judge",
        How::Elsewhere {
            by: "scripts/test.sh's `cargo test --workspace` runs that test target (CI)",
            why: "a cargo inside cargo test; the target itself is part of the suite",
        },
    ),
    // ---- docs/vmm.md ----
    (
        "vmm run --config vm.toml --pin auto",
        How::Run(&[Form {
            // vm.toml is the reader's file: this one boots the CI guest, in
            // a shape --pin auto can place on 2 host cores, to its first
            // console line (relative paths are relative to the file).
            files: &[(
                "vm.toml",
                "kernel = \".cache/guest/kernel/vmlinux\"\n\
                 initrd = \".cache/guest/initramfs.cpio.gz\"\n\
                 memory = \"256M\"\n\
                 guest = \"package:1 l3:1 l2:2 core:1 pu:1\"\n\
                 until = \"Linux version\"\n\
                 timeout = \"5m\"\n",
            )],
            expect: Expect::Stdout("Linux version"),
            ..run("vmm run --config vm.toml --pin auto")
        }]),
    ),
    // ---- docs/api.md ----
    (
        "scripts/serve-demo.sh",
        How::Run(&[Form {
            env: &[("VMM_BIN", "{vmm}")],
            expect: Expect::Stdout("server stopped, socket removed"),
            ..run("scripts/serve-demo.sh")
        }]),
    ),
    (
        "vmm plan --topology genoa-2s --guest \"package:1 l3:1 l2:4 core:1 pu:2\" --vms 40",
        How::Run(&[Form {
            expect: Expect::Stdout("host_cpu"),
            ..run("vmm plan --topology genoa-2s --guest \"package:1 l3:1 l2:4 core:1 pu:2\" --vms 40")
        }]),
    ),
    (
        "vmm plan --topology gnr-2s --guest \"package:2 [numa] l3:1 l2:4 core:1 pu:1\" --vms 25 --rt 50 --format json",
        How::Run(&[Form {
            expect: Expect::Stdout("\"rt_priority\": 50"),
            ..run("vmm plan --topology gnr-2s --guest \"package:2 [numa] l3:1 l2:4 core:1 pu:1\" --vms 25 --rt 50 --format json")
        }]),
    ),
];
