//! Every command in README.md and docs/*.md is run by a test, at a small
//! size.
//!
//! The commands are taken from the fenced code blocks (`sh`, `bash` or no
//! language; and `$ `-prompted lines in any block) of the README and
//! docs/*.md: continuation lines are joined, trailing `# comments` dropped,
//! and a line is a command when it starts with `vmm `, `target/debug/vmm`,
//! `target/release/vmm`, `scripts/`, `guest/`, `vmm/scripts/`, `cargo ` or
//! `HWLOC_`.
//!
//! [`TABLE`] says how each one is run. Either by this test — verbatim, or
//! with only the size flags ([`SIZE_FLAGS`]) reduced, output paths
//! ([`OUTPUT_FLAGS`]) sent into a temporary directory, and placeholders of
//! templates (`...`, `$w`, `W`, `OLD/vmm`) expanded as the entry lists them;
//! [`check_form`] verifies that mechanically — or, for the few that are a
//! whole suite or long by nature, by another named mechanism, with the
//! reason. A documented command missing from the table fails the test, and
//! so does a table entry that no longer appears in the docs.
//!
//! `vmm`, `target/debug/vmm` and `target/release/vmm` all run the binary
//! under test ([`integration_tests::vmm_bin`]); the commands run in a
//! temporary directory in which `.cache/guest` is the guest image cache,
//! scripts in the repository root. Linux boots need the guest kernel and
//! fail (not skip) without it: run guest/build.sh (scripts/test.sh does,
//! before the tests).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use integration_tests::guest::{guest_cache, guest_images};
use integration_tests::{vmm_bin, workspace_root};

/// Flags whose value may be reduced (or which may be added, to reduce a
/// default): run length, repetitions, and workload size.
const SIZE_FLAGS: &[&str] = &[
    "--duration",
    "-d",
    "--reps",
    "--vms",
    "--vcpus",
    "--timeout",
    "--tasks",
    "--groups",
    "--group-size",
    "--pings",
    "--interval",
    "--neighbours",
];

/// Size flags without a value (scripts' small modes).
const SIZE_SWITCHES: &[&str] = &["--small"];

/// Flags naming an output path: sent into the temporary directory.
const OUTPUT_FLAGS: &[&str] = &["--json", "-o", "--out"];

/// Environment variables a run may set: the binary under test instead of a
/// fresh release build, and the scripts' small modes.
const ALLOWED_ENV: &[&str] = &[
    "VMM_BIN",
    "RESULTS_MD",
    "DEMO_DURATION",
    "DEMO_REPS",
    "DEMO_PINGS",
];

/// The small run length used for benchmark commands, in seconds.
const SMALL: &str = "0.1";

/// How one documented command is run.
enum How {
    /// Run by this test, in each of these forms.
    Run(&'static [Form]),
    /// Not run here: `by` names what runs it, `why` says why not here.
    Elsewhere { by: &'static str, why: &'static str },
}

/// One way this test runs a documented command.
struct Form {
    /// Placeholders of a template, in order: each replaces the next
    /// occurrence of that whole word of the documented command with the
    /// given words (possibly none).
    expand: &'static [(&'static str, &'static str)],
    /// The command as run (by bash). `{tmp}` is the temporary directory.
    run: &'static str,
    /// Environment (names from [`ALLOWED_ENV`]); `{vmm}` is the binary.
    env: &'static [(&'static str, &'static str)],
    /// Files written (relative to the temporary directory) before the run.
    files: &'static [(&'static str, &'static str)],
    /// What must hold besides exit status 0.
    expect: Expect,
}

enum Expect {
    /// Exit status 0.
    Ok,
    /// Exit 0 and stdout contains this.
    Stdout(&'static str),
    /// Exit 0 and stdout contains each of these.
    StdoutAll(&'static [&'static str]),
    /// Exit 0 and stdout, with every `(...)` attribute group removed, is
    /// this hwloc synthetic string.
    Synthetic(&'static str),
    /// `scripts/results.sh --small --out {tmp}/results`: exit 0, and every
    /// command in a results block of the docs is the one the run recorded
    /// for that block, modulo size flags and output paths.
    Results,
}

const fn run(run: &'static str) -> Form {
    Form {
        expand: &[],
        run,
        env: &[],
        files: &[],
        expect: Expect::Ok,
    }
}

/// What follows README.md's `vmm serve ... &`: wait for the socket, then
/// its curl lines (create, boot, info, metrics, shutdown), then the server.
const SERVE_CURLS: &str = r#"& S={tmp}/vmm.sock; for i in $(seq 200); do [ -S $S ] && break; sleep 0.05; done; curl -sS --unix-socket $S -X PUT http://localhost/api/v1/vm.create -d '{"cpus":{"boot_vcpus":2}}'; curl -sS --unix-socket $S -X PUT http://localhost/api/v1/vm.boot; curl -sS --unix-socket $S http://localhost/api/v1/vm.info; curl -sS --unix-socket $S http://localhost/metrics; curl -sS --unix-socket $S -X PUT http://localhost/api/v1/vmm.shutdown; wait"#;
/// README.md's `vmm serve` example as run.
const SERVE_RUN: &str = r#"vmm serve --api-socket {tmp}/vmm.sock --topology "package:1 l3:2 l2:2 core:1 pu:2" & S={tmp}/vmm.sock; for i in $(seq 200); do [ -S $S ] && break; sleep 0.05; done; curl -sS --unix-socket $S -X PUT http://localhost/api/v1/vm.create -d '{"cpus":{"boot_vcpus":2}}'; curl -sS --unix-socket $S -X PUT http://localhost/api/v1/vm.boot; curl -sS --unix-socket $S http://localhost/api/v1/vm.info; curl -sS --unix-socket $S http://localhost/metrics; curl -sS --unix-socket $S -X PUT http://localhost/api/v1/vmm.shutdown; wait"#;

/// The documented commands (whitespace-normalised, as extracted) and how
/// each is run. Forms run in table order; the HWLOC_ lines use the dump the
/// line before them wrote.
const TABLE: &[(&str, How)] = &[
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

// ---------------------------------------------------------------------
// Extraction.

/// Where a command was found.
#[derive(Debug, Clone)]
struct Found {
    file: String,
    line: usize,
    /// The `<!-- results:begin NAME -->` block it is in, if any.
    block: Option<String>,
}

const PREFIXES: &[&str] = &[
    "vmm ",
    "target/debug/vmm",
    "target/release/vmm",
    "scripts/",
    "guest/",
    "vmm/scripts/",
    "cargo ",
    "HWLOC_",
];

fn doc_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut v = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("reading docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    v.extend(docs);
    v
}

/// Cuts a trailing `# comment` (a `#` at the start or after whitespace,
/// outside quotes).
fn strip_comment(s: &str) -> &str {
    let (mut sq, mut dq) = (false, false);
    let mut prev_ws = true;
    for (i, c) in s.char_indices() {
        match c {
            '\'' if !dq => sq = !sq,
            '"' if !sq => dq = !dq,
            '#' if !sq && !dq && prev_ws => return &s[..i],
            _ => {}
        }
        prev_ws = c.is_whitespace();
    }
    s
}

fn normalise(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The commands of one markdown text, with their line numbers and the
/// results block (generated by scripts/results.sh) they are in.
fn extract(text: &str) -> Vec<(usize, String, Option<String>)> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    let mut pending: Option<(usize, String)> = None;
    let mut block: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if fence.is_none() {
            if let Some(rest) = t.strip_prefix("<!-- results:begin ") {
                block = Some(rest.trim_end_matches("-->").trim().to_string());
            } else if t.starts_with("<!-- results:end -->") {
                block = None;
            }
        }
        if let Some(info) = t.strip_prefix("```") {
            fence = match fence {
                None => Some(info.trim().to_string()),
                Some(_) => None,
            };
            pending = None;
            continue;
        }
        let Some(lang) = &fence else { continue };
        let shell = matches!(lang.as_str(), "" | "sh" | "bash");
        let (start, mut cur) = match pending.take() {
            Some((n, s)) => (n, s + " " + line.trim()),
            None => (i + 1, line.trim().to_string()),
        };
        if let Some(s) = cur.strip_suffix('\\') {
            cur = s.to_string();
            pending = Some((start, cur));
            continue;
        }
        let cmd = match cur.strip_prefix("$ ") {
            Some(c) => c,
            None if shell => cur.as_str(),
            None => continue,
        };
        let cmd = normalise(strip_comment(cmd));
        // A directory listing (`guest/   the guest kernel config`) is not
        // a command: the first word must be longer than the prefix.
        let first = cmd.split(' ').next().unwrap_or("");
        if PREFIXES
            .iter()
            .any(|p| cmd.starts_with(p) && (!p.ends_with('/') || first.len() > p.len()))
        {
            out.push((start, cmd, block.clone()));
        }
    }
    out
}

/// Every documented command, with where it appears.
fn documented() -> BTreeMap<String, Vec<Found>> {
    let root = workspace_root();
    let mut m: BTreeMap<String, Vec<Found>> = BTreeMap::new();
    for f in doc_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let rel = f.strip_prefix(&root).unwrap().display().to_string();
        for (line, cmd, block) in extract(&text) {
            m.entry(cmd).or_default().push(Found {
                file: rel.clone(),
                line,
                block,
            });
        }
    }
    m
}

// ---------------------------------------------------------------------
// The mechanical check: a run form is its documented command modulo size
// flags, output paths and the entry's listed expansions.

/// Splits like a shell: whitespace separates words; quotes group and are
/// kept (so that words compare as written).
fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut sq, mut dq, mut any) = (false, false, false);
    for c in s.chars() {
        match c {
            '\'' if !dq => {
                sq = !sq;
                cur.push(c);
                any = true;
            }
            '"' if !sq => {
                dq = !dq;
                cur.push(c);
                any = true;
            }
            c if c.is_whitespace() && !sq && !dq => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    assert!(!sq && !dq, "unbalanced quotes in {s:?}");
    if any {
        out.push(cur);
    }
    out
}

/// Seconds of a size value: `2`, `0.1`, `10m`, `500ms`, `90s`, `1h`.
fn size_value(v: &str) -> Option<f64> {
    let v = v.trim_matches('"');
    for (suf, mul) in [("ms", 1e-3), ("s", 1.0), ("m", 60.0), ("h", 3600.0)] {
        if let Some(n) = v.strip_suffix(suf) {
            if let Ok(x) = n.parse::<f64>() {
                return Some(x * mul);
            }
        }
    }
    v.parse().ok()
}

/// The words without size flags and output flags (and their values), and
/// the size flags' values.
fn strip_allowed(w: &[String]) -> (Vec<String>, BTreeMap<String, String>) {
    let mut rest = Vec::new();
    let mut sizes = BTreeMap::new();
    let mut i = 0;
    while i < w.len() {
        let a = w[i].as_str();
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f, Some(v.to_string())),
            _ => (a, None),
        };
        if SIZE_SWITCHES.contains(&flag) {
            sizes.insert(flag.to_string(), String::new());
            i += 1;
        } else if SIZE_FLAGS.contains(&flag) || OUTPUT_FLAGS.contains(&flag) {
            let v = match inline {
                Some(v) => v,
                None => {
                    i += 1;
                    w.get(i).cloned().unwrap_or_default()
                }
            };
            if SIZE_FLAGS.contains(&flag) {
                sizes.insert(flag.to_string(), v);
            }
            i += 1;
        } else {
            rest.push(w[i].clone());
            i += 1;
        }
    }
    (rest, sizes)
}

/// Applies a form's expansions to the documented command's words.
fn expand(doc: &str, expansions: &[(&str, &str)]) -> Result<Vec<String>, String> {
    let mut w = words(doc);
    let mut from = 0;
    for (ph, with) in expansions {
        let Some(i) = (from..w.len()).find(|&i| w[i] == *ph) else {
            return Err(format!(
                "placeholder {ph:?} not found (in order) in {doc:?}"
            ));
        };
        let rep = words(with);
        let n = rep.len();
        w.splice(i..i + 1, rep);
        from = i + n;
    }
    Ok(w)
}

/// Checks that `form` runs `doc` modulo the allowed differences.
fn check_form(doc: &str, form: &Form) -> Result<(), String> {
    let expanded = expand(doc, form.expand)?;
    let (d, dsizes) = strip_allowed(&expanded);
    let (r, rsizes) = strip_allowed(&words(form.run));
    if d != r {
        return Err(format!(
            "the run form differs from the documented command beyond size flags and output paths:\n  doc: {}\n  run: {}",
            d.join(" "),
            r.join(" ")
        ));
    }
    for (flag, dv) in &dsizes {
        let Some(rv) = rsizes.get(flag) else {
            return Err(format!(
                "{flag} {dv} is documented but dropped in {:?}",
                form.run
            ));
        };
        if let (Some(a), Some(b)) = (size_value(dv), size_value(rv)) {
            if b > a {
                return Err(format!("{flag}: {rv} is larger than the documented {dv}"));
            }
        }
    }
    for (k, _) in form.env {
        if !ALLOWED_ENV.contains(k) {
            return Err(format!("environment variable {k} is not an allowed one"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------
// Running.

/// One command at a time: the machine is small, and timing-sensitive
/// commands must not share it with each other.
static SERIAL: Mutex<()> = Mutex::new(());

fn needs_kernel(form: &Form) -> bool {
    form.run.contains(".cache/guest/")
        || form.files.iter().any(|(_, c)| c.contains(".cache/guest/"))
}

fn strip_attributes(s: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            c if depth == 0 => out.push(c),
            _ => {}
        }
    }
    normalise(&out)
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// Runs one form in `tmp`; returns the wall time.
fn run_form(doc: &str, form: &Form, tmp: &Path) -> Duration {
    let vmm = vmm_bin();
    let root = workspace_root();
    let mut cmd = form.run.replace("{tmp}", &tmp.display().to_string());
    // vmm never replaces a result file: an earlier form's is removed, as a
    // user running the documented commands one after another would.
    let ws = words(&cmd);
    for pair in ws.windows(2) {
        if matches!(pair[0].as_str(), "--json" | "--plot") {
            let out = Path::new(&pair[1]);
            if out.starts_with(tmp) {
                let _ = std::fs::remove_file(out);
                let _ = std::fs::remove_file(out.with_extension("csv"));
            }
        }
    }
    let first = words(&cmd)[0].clone();
    if ["vmm", "target/debug/vmm", "target/release/vmm"].contains(&first.as_str()) {
        cmd = format!("{}{}", shell_quote(&vmm), &cmd[first.len()..]);
    }
    let script = ["scripts/", "vmm/scripts/", "guest/"]
        .iter()
        .any(|p| first.starts_with(p));
    for (name, content) in form.files {
        std::fs::write(tmp.join(name), content).unwrap();
    }
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(&cmd)
        .current_dir(if script { root.as_path() } else { tmp })
        .stdin(Stdio::null());
    for (k, v) in form.env {
        c.env(
            k,
            v.replace("{vmm}", &vmm.display().to_string())
                .replace("{results_md}", env!("CARGO_BIN_EXE_results_md")),
        );
    }
    let t0 = Instant::now();
    let out = c.output().expect("running bash");
    let took = t0.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ctx = || {
        let tail = |s: &str| {
            let l: Vec<&str> = s.lines().collect();
            l[l.len().saturating_sub(30)..].join("\n")
        };
        format!(
            "documented: {doc}\nran: {cmd}\nexit {:?} after {:.1} s\n--- stdout (tail) ---\n{}\n--- stderr (tail) ---\n{}",
            out.status.code(),
            took.as_secs_f64(),
            tail(&stdout),
            tail(&stderr)
        )
    };
    assert!(out.status.success(), "{}", ctx());
    match form.expect {
        Expect::Ok => {}
        Expect::Stdout(s) => assert!(stdout.contains(s), "stdout lacks {s:?}:\n{}", ctx()),
        Expect::StdoutAll(all) => {
            for s in all {
                assert!(stdout.contains(s), "stdout lacks {s:?}:\n{}", ctx());
            }
        }
        Expect::Synthetic(s) => assert_eq!(strip_attributes(&stdout), s, "{}", ctx()),
        Expect::Results => results_blocks_match(&tmp.join("results")),
    }
    took
}

/// The commands in the docs' results blocks are the ones scripts/results.sh
/// ran for those blocks (its `--small` run in `out`), modulo size flags,
/// output paths and the binary's path; and the run wrote every block.
fn results_blocks_match(out: &Path) {
    let meta = std::fs::read_to_string(out.join("data/results-meta.txt")).unwrap();
    let cmds: BTreeMap<&str, &str> = meta
        .lines()
        .filter_map(|l| l.strip_prefix("cmd."))
        .filter_map(|l| l.split_once('='))
        .collect();
    let mut errors = Vec::new();
    for (doc, at) in documented() {
        for f in at {
            let Some(block) = &f.block else { continue };
            let Some(ran) = cmds.get(block.as_str()) else {
                errors.push(format!(
                    "{}:{}: results block {block} was not run by scripts/results.sh",
                    f.file, f.line
                ));
                continue;
            };
            let strip = |c: &str| {
                let w = words(c);
                let (rest, _) = strip_allowed(&w[1..]);
                (w[0].ends_with("vmm"), rest)
            };
            let (dv, d) = strip(&doc);
            let (rv, r) = strip(ran);
            if !(dv && rv && d == r) {
                errors.push(format!(
                    "{}:{}: results block {block}: the doc's command differs from what scripts/results.sh runs beyond size flags and output paths:\n  doc: {doc}\n  ran: {ran}",
                    f.file, f.line
                ));
            }
        }
    }
    for f in ["results-scheduler.md", "results-vcpus.md"] {
        let t = std::fs::read_to_string(out.join(f)).unwrap();
        assert!(
            !t.contains("Not generated yet"),
            "{f}: a results block was not generated"
        );
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// Runs every form of the table for which `pick` holds, in table order.
fn run_table(pick: impl Fn(&Form) -> bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join(".cache")).unwrap();
    std::os::unix::fs::symlink(guest_cache(), tmp.path().join(".cache/guest")).unwrap();
    let t0 = Instant::now();
    for (doc, how) in TABLE {
        let How::Run(forms) = how else { continue };
        for form in forms.iter().filter(|f| pick(f)) {
            let took = run_form(doc, form, tmp.path());
            eprintln!("doc_commands: {:.1} s: {}", took.as_secs_f64(), form.run);
        }
    }
    eprintln!("doc_commands: {:.1} s in all", t0.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------
// Tests.

#[test]
fn every_documented_command_is_in_the_table_and_run_as_documented() {
    let docs = documented();
    assert!(docs.len() > 20, "too few commands found: {docs:?}");
    let mut errors = Vec::new();
    let mut seen = BTreeMap::new();
    for (doc, how) in TABLE {
        let key = normalise(doc);
        if seen.insert(key.clone(), ()).is_some() {
            errors.push(format!("table entry twice: {doc}"));
        }
        if !docs.contains_key(&key) {
            errors.push(format!(
                "table entry no longer in README.md or docs/*.md (update the table): {doc}"
            ));
        }
        match how {
            How::Run(forms) => {
                assert!(!forms.is_empty());
                for f in *forms {
                    if let Err(e) = check_form(&key, f) {
                        errors.push(format!("{doc}:\n  {e}"));
                    }
                }
            }
            How::Elsewhere { by, why } => {
                assert!(!by.is_empty() && !why.is_empty());
            }
        }
    }
    for (cmd, at) in &docs {
        // Commands in generated results blocks: scripts/results.sh (its
        // entry below) runs them; `results_blocks_match` checks each.
        if at.iter().all(|f| f.block.is_some()) {
            continue;
        }
        if !seen.contains_key(cmd) {
            let at: Vec<String> = at
                .iter()
                .map(|f| format!("{}:{}", f.file, f.line))
                .collect();
            errors.push(format!(
                "documented command not in tests/tests/doc_commands.rs TABLE ({}): {cmd}",
                at.join(", ")
            ));
        }
    }
    let elsewhere = TABLE
        .iter()
        .filter(|(_, h)| matches!(h, How::Elsewhere { .. }))
        .count();
    // 15: the suite-level commands (cargo test, clippy, guest builds, the
    // fuzz gate, the proptest suite) that CI's scripts/test.sh runs itself,
    // and the full-size benchmarks (480 simulated CPUs) whose small forms
    // other tests run.
    assert!(
        elsewhere <= 15,
        "{elsewhere} commands not run here: keep that list short"
    );
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn extraction_joins_continuations_and_drops_comments() {
    let md = "text\n```sh\nvmm run --a 1 \\\n    --b \"x # y\"   # a comment\n# only a comment\nfor w in a b; do\n  vmm bench $w\ndone\n```\n```rust\nvmm not_this\n```\n```text\n$ vmm bench runq\nvmm not_this_either\n```\n";
    let got: Vec<String> = extract(md).into_iter().map(|(_, c, _)| c).collect();
    assert_eq!(
        got,
        [
            "vmm run --a 1 --b \"x # y\"",
            "vmm bench $w",
            "vmm bench runq"
        ]
    );
}

#[test]
fn the_check_allows_only_size_flags_outputs_and_listed_expansions() {
    let doc = "vmm bench runq --vms 8 --duration 2 --json out.json";
    assert!(check_form(
        doc,
        &run("vmm bench runq --vms 2 --duration 0.1 --json /t/o.json")
    )
    .is_ok());
    assert!(check_form(
        doc,
        &run("vmm bench runq --vms 2 --duration 0.1 --json o --reps 1")
    )
    .is_ok());
    // Larger, dropped, or another flag changed.
    assert!(check_form(doc, &run("vmm bench runq --vms 16 --duration 0.1 --json o")).is_err());
    assert!(check_form(doc, &run("vmm bench runq --duration 0.1 --json o")).is_err());
    assert!(check_form(
        doc,
        &run("vmm bench cyclic --vms 2 --duration 0.1 --json o")
    )
    .is_err());
    assert!(check_form(
        doc,
        &run("vmm bench runq --vms 2 --duration 0.1 --json o --check")
    )
    .is_err());
    let t = "vmm bench W --executor workers|threads [--x]";
    let f = Form {
        expand: &[("W", "runq"), ("workers|threads", "threads"), ("[--x]", "")],
        ..run("vmm bench runq --executor threads")
    };
    assert!(check_form(t, &f).is_ok());
    let f = Form {
        expand: &[("W", "runq")],
        ..run("vmm bench runq --executor threads")
    };
    assert!(check_form(t, &f).is_err());
}

/// Every command of the table that needs no guest kernel, at its small size.
#[test]
fn documented_commands_run() {
    run_table(|f| !needs_kernel(f));
}

/// The documented Linux boots. They need the guest kernel: without it this
/// fails, saying to run guest/build.sh (scripts/test.sh runs it first).
#[test]
fn documented_linux_boots_run() {
    guest_images();
    run_table(needs_kernel);
}
