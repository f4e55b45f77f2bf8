//! Boots the CI guest kernel with its vCPUs scheduled by `vcpu_sched`
//! (`vmm run --sched vcpu_sched`) and checks, as `boot_topology.rs` does
//! for `--sched host`, that the kernel brings up every CPU and prints the
//! sched-domain spans of the topology asked for. Halted vCPUs must give
//! up their CPU for this to finish: 8 vCPUs share the 2 host CPUs.

use std::time::Duration;

use integration_tests::guest::{guest_images, run_vmm};
use integration_tests::guest_check::{check_boot, BootCase};

#[test]
fn ci_shape_boots_under_vcpu_sched() {
    let g = guest_images();
    let case = BootCase {
        spec: "package:2 [numa] l3:1 l2:2 core:1 pu:2",
        memory_mib: 512,
        vendor: None,
        extra: &["--sched", "vcpu_sched"],
    };
    let args = case.args(&g.vmlinux, Some(&g.initramfs));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run_vmm(&args, Duration::from_secs(15 * 60));
    eprintln!(
        "boot of {:?} under vcpu_sched took {:.1} s (wall, to the stop)",
        case.spec,
        r.elapsed.as_secs_f64()
    );
    check_boot(&case, &r);
}
