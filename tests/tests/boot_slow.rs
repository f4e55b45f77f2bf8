//! The slow, opt-in boot suite: more shapes, the bzImage path, and Debian's
//! stock kernel. Each test boots a guest and judges its kernel log exactly
//! as `boot_topology.rs` does (see `integration_tests::guest_check`).
//!
//! Run it (one boot at a time; under kvm_pvm each takes about a minute,
//! the stock kernel several):
//!
//! ```sh
//! guest/build.sh && guest/stock-kernel.sh
//! cargo build -p vmm
//! cargo test -p integration-tests --test boot_slow -- --ignored --test-threads=1 --nocapture
//! ```

use std::path::Path;
use std::time::Duration;

use integration_tests::guest::{guest_images, run_vmm, stock_kernel};
use integration_tests::guest_check::{check_boot, BootCase};

fn boot(case: &BootCase<'_>, kernel: &Path, initrd: Option<&Path>) {
    let args = case.args(kernel, initrd);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run_vmm(&args, Duration::from_secs(15 * 60));
    eprintln!(
        "boot of {:?} ({}) took {:.1} s (wall, to the stop)",
        case.spec,
        kernel.display(),
        r.elapsed.as_secs_f64()
    );
    check_boot(case, &r);
}

fn minimal(case: &BootCase<'_>) {
    let g = guest_images();
    boot(case, &g.vmlinux, Some(&g.initramfs));
}

/// 3 dies per package, each die its own LLC of 2 cores; a node per package.
#[test]
#[ignore = "slow: boots a guest; run with --ignored"]
fn three_dies_per_package() {
    minimal(&BootCase {
        spec: "package:2 [numa] die:3 l3:1 l2:1 core:2 pu:1",
        memory_mib: 768,
        vendor: None,
        extra: &[],
    });
}

/// 3 SMT cores per package: the core field is 2 bits wide, so package 1
/// starts at APIC ID 8 and IDs 6, 7 are unused.
#[test]
#[ignore = "slow: boots a guest; run with --ignored"]
fn non_power_of_two_cores() {
    minimal(&BootCase {
        spec: "package:2 [numa] l3:1 l2:3 core:1 pu:2",
        memory_mib: 768,
        vendor: None,
        extra: &[],
    });
}

/// 2 dies per package and a NUMA node per die (4 nodes): the package is
/// not a sched-domain level in Linux 6.1, the node is.
#[test]
#[ignore = "slow: boots a guest; run with --ignored"]
fn one_node_per_die() {
    minimal(&BootCase {
        spec: "package:2 die:2 [numa] l3:1 l2:2 core:1 pu:1",
        memory_mib: 1024,
        vendor: None,
        extra: &["--numa-distance", "32"],
    });
}

/// Two cores per L2 with Intel CPUID encoding: Linux 6.1 builds the CLS
/// (cluster) level from Intel's leaf 4 only.
#[test]
#[ignore = "slow: boots a guest; run with --ignored"]
fn shared_l2_clusters_intel() {
    minimal(&BootCase {
        spec: "package:2 [numa] l3:1 l2:2 core:2 pu:1",
        memory_mib: 512,
        vendor: Some("intel"),
        extra: &[],
    });
}

/// The same minimal kernel as a bzImage: the decompressor path.
#[test]
#[ignore = "slow: boots a guest; run with --ignored"]
fn bzimage() {
    let g = guest_images();
    boot(
        &BootCase {
            spec: "package:2 [numa] l3:1 l2:2 core:1 pu:2",
            memory_mib: 512,
            vendor: None,
            extra: &[],
        },
        &g.bzimage,
        Some(&g.initramfs),
    );
}

/// Debian's stock cloud kernel (guest/stock-kernel.sh), the CI shape.
#[test]
#[ignore = "slow: boots Debian's stock kernel (minutes); run with --ignored"]
fn stock_debian_kernel() {
    let g = guest_images();
    boot(
        &BootCase {
            spec: "package:2 [numa] l3:1 l2:2 core:1 pu:2",
            memory_mib: 1024,
            vendor: None,
            extra: &[],
        },
        &stock_kernel(),
        Some(&g.initramfs),
    );
}
