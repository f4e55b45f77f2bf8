//! `vmm serve` request bodies: any bytes as a `vm.create` body (a
//! VmConfig) and as a `vm.resize` body. Parsing returns a value or a 400
//! naming the problem; an accepted VmConfig goes through everything
//! `vm.create` decides without KVM (shape, guest topology, placement by
//! the planner or the given affinity) on a 2-node host, which must
//! return a plan or an error naming a field, never panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use topology::HostTopology;
use vcpu_sched::placement::pack::FreeMap;
use vmm_api::api::{VmConfig, VmResize};
use vmm_api::{admit, parse_body};

fn host() -> &'static HostTopology {
    static H: OnceLock<HostTopology> = OnceLock::new();
    H.get_or_init(|| {
        topology::load("package:2 [numa] l3:2 l2:2 core:2 pu:2").expect("fuzz host topology")
    })
}

fuzz_target!(|data: &[u8]| {
    match parse_body::<VmConfig>(data) {
        Ok(cfg) => {
            let topo = host();
            let mut free = FreeMap::new(topo);
            match admit(&cfg, "fuzz", topo, &mut free) {
                Ok((shape, plan)) => {
                    assert!(!shape.is_empty());
                    if let Some(p) = plan {
                        assert_eq!(p.dense.len(), p.os.len());
                        assert!(p.dense.iter().all(|&d| (d as usize) < topo.num_cpus()));
                    }
                }
                Err(e) => assert!(!e.error.is_empty(), "an error without a message"),
            }
        }
        Err(e) => {
            assert_eq!(e.status, 400, "{e:?}");
            assert!(!e.error.is_empty());
        }
    }
    if let Err(e) = parse_body::<VmResize>(data) {
        assert_eq!(e.status, 400, "{e:?}");
    }
});
