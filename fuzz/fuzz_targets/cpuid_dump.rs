//! The CPUID-dump writer and reader round trip: a guest of a shape drawn
//! from the input, written as an hwloc CPUID dump in either vendor's
//! encoding, must read back (through hwloc's x86 parser) as the same number
//! of packages, cores and CPUs; and a dump whose files hold arbitrary bytes
//! must be read or refused, never crash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use topology::{CpuidSet, GuestTopology, Vendor};

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let n = |i: usize, max: u8| (data[i] % max) as u32 + 1;
    let (packages, l3, l2, cores, pus) = (n(0, 2), n(1, 3), n(2, 3), n(3, 3), n(4, 2));
    let vendor = if data[5] & 1 == 0 {
        Vendor::Intel
    } else {
        Vendor::Amd
    };
    let spec = format!("package:{packages} l3:{l3} l2:{l2} core:{cores} pu:{pus}");
    let g = GuestTopology::from_spec(&spec).expect("a small synthetic guest");
    let dir = tempfile::tempdir().expect("temp dir");
    let base = CpuidSet::new(Vec::new());
    topology::dump::write_cpuid_dump(&g, &base, vendor, dir.path()).expect("write");
    let rest = &data[6..];
    if rest.is_empty() {
        let back = topology::load::load_cpuid_dump(dir.path())
            .unwrap_or_else(|e| panic!("{spec} ({vendor}) does not read back: {e}"));
        let s = back.shape();
        assert_eq!(s.cpus, g.num_vcpus(), "{spec} ({vendor}): CPUs");
        assert_eq!(s.packages as u32, packages, "{spec} ({vendor}): packages");
        assert_eq!(
            s.cores as u32,
            packages * l3 * l2 * cores,
            "{spec} ({vendor}): cores"
        );
    } else {
        // the reader on damaged files: overwrite pu0 with the rest
        std::fs::write(dir.path().join("pu0"), rest).expect("write pu0");
        let _ = topology::load::load_cpuid_dump(dir.path());
    }
});
