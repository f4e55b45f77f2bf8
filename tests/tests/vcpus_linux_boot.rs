//! Boots the CI guest kernel with its vCPUs scheduled by `vcpu_sched`
//! (`vmm run --sched vcpu_sched`) and checks, as `boot_topology.rs` does
//! for `--sched host`, that the kernel brings up every CPU and prints the
//! sched-domain spans of the topology asked for. Halted vCPUs must give
//! up their CPU for this to finish: 8 vCPUs share the 2 host CPUs.

use std::time::Duration;

use integration_tests::guest::{guest_images, run_vmm};
use integration_tests::guest_check::{check_boot, logged_count, BootCase};

#[test]
fn ci_shape_boots_under_vcpu_sched() {
    let g = guest_images();
    let case = BootCase {
        spec: "package:2 [numa] l3:1 l2:2 core:1 pu:2",
        memory_mib: 512,
        vendor: None,
        // -v: the run's closing line with the block watch's counts
        extra: &["--sched", "vcpu_sched", "-v"],
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
    check_block_watch(&r.stderr);
}

/// The same boot with halted vCPUs parked inside KVM (`--halt-park on`):
/// the kernel still brings up every CPU (each AP waits for its SIPI on
/// its park thread) and prints the same spans, and the closing line
/// shows vCPUs parked and woken by KVM.
#[test]
fn ci_shape_boots_with_halted_vcpus_parked_inside_kvm() {
    let g = guest_images();
    let case = BootCase {
        spec: "package:2 [numa] l3:1 l2:2 core:1 pu:2",
        memory_mib: 512,
        vendor: None,
        extra: &["--sched", "vcpu_sched", "--halt-park", "on", "-v"],
    };
    let args = case.args(&g.vmlinux, Some(&g.initramfs));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run_vmm(&args, Duration::from_secs(15 * 60));
    eprintln!(
        "boot of {:?} under vcpu_sched, halted vCPUs parked, took {:.1} s",
        case.spec,
        r.elapsed.as_secs_f64()
    );
    check_boot(&case, &r);
    for key in ["parked=", "park_woken="] {
        assert!(
            logged_count(&r.stderr, "vcpu_sched run done", key) > 0,
            "{key}0: nothing was parked or woken by KVM:\n{}",
            r.stderr
        );
    }
}

/// The workers' block watch found vCPUs halted inside `KVM_RUN` (their
/// worker blocked) and kicked them out, or, where the host refuses perf
/// events, the run said so and the poller did it alone.
fn check_block_watch(stderr: &str) {
    if stderr.contains("cannot watch the workers' context switches") {
        // CI runs as root: there the watch must work
        assert!(
            !integration_tests::tools::in_ci(),
            "perf events refused under CI: the block watch was off"
        );
        eprintln!("perf events refused on this host: the block watch was off");
        return;
    }
    let count = |key: &str| logged_count(stderr, "vcpu_sched run done", key);
    let (switches, kicked) = (count("watch_switches="), count("watch_kicked="));
    eprintln!("block watch: {switches} worker switch-outs, {kicked} halted vCPUs kicked");
    assert!(
        kicked > 0 && switches >= kicked,
        "8 vCPUs halting on 2 workers, but the watch kicked {kicked} of {switches} switch-outs:\n{stderr}"
    );
}
