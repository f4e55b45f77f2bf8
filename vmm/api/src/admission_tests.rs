//! `admit`'s placement without a policy: pinned while the host has room,
//! shared (unpinned) once it has none, refused only when the shape cannot
//! fit the host at all or `pinned` was asked for.

use topology::HostTopology;
use vcpu_sched::placement::pack::FreeMap;

use super::{admit, placement_name};
use crate::api::VmConfig;

fn cfg(json: &str) -> VmConfig {
    serde_json::from_str(json).unwrap()
}

fn host() -> HostTopology {
    // 2 cores of 1 thread: Kata's third 1-vCPU sandbox on a 2-CPU host
    topology::load("package:1 l3:1 l2:2 core:1 pu:1").unwrap()
}

#[test]
fn no_policy_pins_while_cpus_are_free_then_shares() {
    let topo = host();
    let mut free = FreeMap::new(&topo);
    let one = cfg(r#"{"cpus":{"boot_vcpus":1}}"#);
    let mut used = Vec::new();
    for id in ["a", "b"] {
        let (_, plan) = admit(&one, id, &topo, &mut free).unwrap();
        let plan = plan.expect("a free CPU: pinned");
        assert_eq!(placement_name(&one, Some(&plan)), "pinned");
        used.push(plan.dense[0]);
    }
    used.sort();
    assert_eq!(
        used,
        [0, 1],
        "each sandbox on a CPU of its own while there are some"
    );
    // the third: no free CPU left, shared instead of refused
    let (_, plan) = admit(&one, "c", &topo, &mut free).unwrap();
    assert!(plan.is_none());
    assert_eq!(placement_name(&one, None), "shared");
}

#[test]
fn pinned_asked_for_is_still_refused_when_full() {
    let topo = host();
    let mut free = FreeMap::new(&topo);
    let one = cfg(r#"{"cpus":{"boot_vcpus":1}}"#);
    admit(&one, "a", &topo, &mut free).unwrap();
    admit(&one, "b", &topo, &mut free).unwrap();
    let strict = cfg(r#"{"cpus":{"boot_vcpus":1},"x_vmm":{"placement":{"policy":"pinned"}}}"#);
    let e = admit(&strict, "c", &topo, &mut free).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("cpus"), "{e:?}");
}

#[test]
fn a_shape_the_empty_host_cannot_hold_is_refused() {
    let topo = host();
    let mut free = FreeMap::new(&topo);
    let big = cfg(r#"{"cpus":{"boot_vcpus":3}}"#);
    let e = admit(&big, "a", &topo, &mut free).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("cpus"), "{e:?}");
}

#[test]
fn placement_names() {
    let none = cfg(r#"{"cpus":{"boot_vcpus":1},"x_vmm":{"placement":{"policy":"none"}}}"#);
    let topo = host();
    let mut free = FreeMap::new(&topo);
    let (_, plan) = admit(&none, "a", &topo, &mut free).unwrap();
    assert!(plan.is_none());
    assert_eq!(placement_name(&none, None), "none");
    let aff = cfg(r#"{"cpus":{"boot_vcpus":1,"affinity":[{"vcpu":0,"host_cpus":[1]}]}}"#);
    let (_, plan) = admit(&aff, "b", &topo, &mut free).unwrap();
    assert_eq!(placement_name(&aff, plan.as_ref()), "affinity");
}
