//! The micro-guest port protocol: any sequence of port writes a guest can
//! make (port, value, access size) from a VM of any vCPU count decodes to a
//! request or a typed error, never a panic; an accepted write is a 4-byte
//! write to a named port, and a WAKE names an existing vCPU.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vmm_machine::micro::proto::{decode, port_name, Request};

fuzz_target!(|data: &[u8]| {
    let Some((&vcpus, rest)) = data.split_first() else {
        return;
    };
    let vcpus = vcpus as usize; // 0 included: decode must not assume one
    for w in rest.chunks_exact(7) {
        let port = u16::from_le_bytes([w[0], w[1]]);
        let value = u32::from_le_bytes([w[2], w[3], w[4], w[5]]);
        let size = w[6];
        match decode(port, value, size, vcpus) {
            Ok(req) => {
                assert!(
                    port_name(port).is_some(),
                    "request on unnamed port {port:#x}"
                );
                assert_eq!(size, 4, "accepted a {size}-byte access");
                if let Request::Wake(t) = req {
                    assert!((t as usize) < vcpus, "WAKE {t} of {vcpus} vCPUs");
                }
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
});
