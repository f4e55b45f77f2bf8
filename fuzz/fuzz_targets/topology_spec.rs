//! Topology SPECs (synthetic descriptions and preset names) through to a
//! guest: whatever the loader accepts must give a guest whose x2APIC IDs,
//! CPUID leaves and ACPI tables are consistent (see `vmm_fuzz`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use topology::GuestTopology;

fuzz_target!(|data: &[u8]| {
    let Ok(spec) = std::str::from_utf8(data) else {
        return;
    };
    if vmm_fuzz::touches_machine(spec) {
        return;
    }
    let Ok(g) = GuestTopology::from_spec(spec) else {
        return;
    };
    // every accepted shape, but keep an iteration short: the CPUID checks
    // are quadratic in vCPUs
    if g.num_vcpus() <= 512 {
        vmm_fuzz::check_guest(&g);
    } else {
        vmm_fuzz::check_apic_ids(&g);
        vmm_fuzz::check_acpi(&g);
    }
});
