//! virtio-blk over a guest that writes anything: the input is the guest's
//! memory (descriptor table at 0, available ring at 0x1000, used ring at
//! 0x2000, buffers anywhere in its 64 KiB) and a queue size. Whatever the
//! chains say (loops, nested indirect tables, buffers outside memory,
//! lengths of 4 GiB, an available index far ahead), serving the queue
//! ends: requests are answered in the used ring or the device asks for a
//! reset, and the image never grows.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vmm_fuzz::virtio_block(data);
});
