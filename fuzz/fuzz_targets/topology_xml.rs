//! hwloc XML files through to a guest: the file is checked by the topology
//! crate before hwloc parses it; whatever is accepted must give a
//! consistent guest (see `vmm_fuzz`).
#![no_main]

use std::io::Write as _;

use libfuzzer_sys::fuzz_target;
use topology::GuestTopology;

fuzz_target!(|data: &[u8]| {
    let mut f = tempfile::Builder::new()
        .suffix(".xml")
        .tempfile()
        .expect("temp file");
    f.write_all(data).expect("write");
    let Ok(host) = topology::load::load_xml(f.path()) else {
        return;
    };
    let all: Vec<u32> = (0..host.num_cpus() as u32).collect();
    let Ok(g) = GuestTopology::from_host_cpus(&host, &all) else {
        return;
    };
    if g.num_vcpus() <= 512 {
        vmm_fuzz::check_guest(&g);
    } else {
        vmm_fuzz::check_apic_ids(&g);
    }
});
