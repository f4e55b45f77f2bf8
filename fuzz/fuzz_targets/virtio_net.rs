//! virtio-net over a guest that writes anything (see `vmm_fuzz::virtio_net`):
//! receive, transmit and control queues in fuzzed guest memory, one packet
//! waiting on the host side. Serving ends, and never uses more chains than
//! the driver made available.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vmm_fuzz::virtio_net(data);
});
