//! virtio-console driven as a driver drives it: output reaches the
//! writer, input from a pipe reaches the receive buffers, and a receive
//! chain the device cannot write into needs a reset.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use vm_memory::{Bytes, GuestAddress};

use super::console::Console;
use super::status;
use super::tests::{Driver, F_WRITE};

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const RX: u64 = 0x4_0000;
const TX: u64 = 0x5_0000;

fn console() -> (Driver, Shared, std::fs::File) {
    let out = Shared::default();
    let (r, w) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut d = Driver::with(Box::new(Console::new(
        Box::new(out.clone()),
        Some(OwnedFd::from(r)),
    )));
    d.msix();
    d.setup(16);
    d.queue_at(0, 16, RX);
    d.queue_at(1, 16, TX);
    d.driver_ok();
    assert_eq!(d.status() & status::NEEDS_RESET, 0);
    (d, out, std::fs::File::from(OwnedFd::from(w)))
}

#[test]
fn output_reaches_the_writer_and_input_the_guest() {
    let (mut d, out, mut input) = console();
    // Output: two readable buffers in one chain.
    d.mem
        .write_slice(b"hello, ", GuestAddress(0x6_0000))
        .unwrap();
    d.mem
        .write_slice(b"hvc0\n", GuestAddress(0x6_1000))
        .unwrap();
    d.desc(TX, 0, 0x6_0000, 7, super::tests::F_NEXT, 1);
    d.desc(TX, 1, 0x6_1000, 5, 0, 0);
    d.post_at(1, TX, 0, 0);
    assert!(d.wait(|d| d.used_at(TX) == 1));
    assert_eq!(&out.0.lock().unwrap()[..], b"hello, hvc0\n");

    // Input: bytes written to the pipe before and after the buffer is
    // posted both arrive.
    input.write_all(b"ab").unwrap();
    d.desc(RX, 0, 0x7_0000, 64, F_WRITE, 0);
    d.post_at(0, RX, 0, 0);
    assert!(d.wait(|d| d.used_at(RX) == 1), "the first input arrives");
    let len: u32 = d.mem.read_obj(GuestAddress(RX + 0x2000 + 8)).unwrap();
    let mut got = vec![0u8; len as usize];
    d.mem.read_slice(&mut got, GuestAddress(0x7_0000)).unwrap();
    assert_eq!(got, b"ab");
    d.desc(RX, 1, 0x7_1000, 64, F_WRITE, 0);
    d.post_at(0, RX, 1, 1);
    input.write_all(b"cd").unwrap();
    assert!(
        d.wait(|d| d.used_at(RX) == 2),
        "input after the post arrives"
    );
    let mut got = [0u8; 2];
    d.mem.read_slice(&mut got, GuestAddress(0x7_1000)).unwrap();
    assert_eq!(&got, b"cd");
}

#[test]
fn a_readable_receive_buffer_needs_a_reset() {
    let (mut d, _out, mut input) = console();
    input.write_all(b"x").unwrap();
    d.desc(RX, 0, 0x7_0000, 64, 0, 0);
    d.post_at(0, RX, 0, 0);
    assert!(d.faulted(), "a device-readable receive buffer is refused");
}
