//! Boots the minimal guest kernel with a 2-socket topology and checks,
//! from the guest kernel's own log, that it sees the topology asked for.
//!
//! Expectations come from hwloc's view of the same synthetic string and from
//! an x2APIC numbering written here, not from the `topology` crate:
//! * every CPU's sched-domain spans (SMT, CLS = L2 where the kernel builds
//!   it, MC = LLC, node, NUMA), from `sched_verbose`;
//! * the node of every APIC ID (`SRAT: PXM p -> APIC 0x.. -> Node n`), and
//!   that the APIC IDs are the expected ones;
//! * each node's memory (`Initmem setup node N [mem ...]`): equal shares,
//!   back to back;
//! * `smp: Brought up N nodes, M CPUs`.
//!
//! Where guest userspace runs (hardware KVM), the `/init` block is required
//! and checked too: packages, cores, SMT siblings, L2 and L3
//! `shared_cpu_list`, node cpulists, distances and MemTotal. Under kvm_pvm
//! guest userspace cannot run (see docs/vmm.md), so the VM is stopped with
//! `--until` once the kernel has printed its root domain, and the block is
//! checked only if it appears.
//!
//! The slow, opt-in shapes are in `boot_slow.rs`.

use std::time::Duration;

use integration_tests::guest::{guest_images, run_vmm};
use integration_tests::guest_check::{check_boot, BootCase};

#[test]
fn ci_shape_two_sockets_smt_two_nodes() {
    let g = guest_images();
    let case = BootCase {
        spec: "package:2 [numa] l3:1 l2:2 core:1 pu:2",
        memory_mib: 512,
        vendor: None,
        extra: &[],
    };
    let args = case.args(&g.vmlinux, Some(&g.initramfs));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run_vmm(&args, Duration::from_secs(15 * 60));
    eprintln!(
        "boot of {:?} took {:.1} s (wall, to the stop)",
        case.spec,
        r.elapsed.as_secs_f64()
    );
    check_boot(&case, &r);
}
