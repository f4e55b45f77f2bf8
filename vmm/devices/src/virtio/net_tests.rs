//! virtio-net driven as a driver drives it, over a datagram socket pair
//! standing in for the tap (one read, one packet, as a tap gives them):
//! packets both ways with their 12-byte header, a large packet merged
//! across small receive buffers, the control queue, and the guest
//! errors: a receive buffer the device cannot write, a control command
//! without an ack byte, and malformed transmit packets (dropped and
//! counted, as a NIC drops a bad frame, not a reason to reset).

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress};

use super::net::{Mac, Net};
use super::status;
use super::tests::{Driver, F_NEXT, F_WRITE};
use crate::tap::Tap;

const RX: u64 = 0x4_0000;
const TX: u64 = 0x5_0000;
const CTRL: u64 = 0x6_0000;
const BUF: u64 = 0x8_0000;
/// VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_CTRL_VQ.
const MRG_RXBUF: u32 = 1 << 15;
const CTRL_VQ: u32 = 1 << 17;

fn net() -> (Driver, UnixDatagram, std::sync::Arc<super::net::NetStats>) {
    let (ours, peer) = UnixDatagram::pair().unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let dev = Net::new(
        "net-test",
        vec![Tap::from_socket(ours).unwrap()],
        Mac([2, 0, 0, 0, 0, 1]),
    );
    let stats = dev.stats();
    let mut d = Driver::with(Box::new(dev));
    d.msix();
    d.setup_features(16, MRG_RXBUF | CTRL_VQ);
    d.queue_at(0, 16, RX);
    d.queue_at(1, 16, TX);
    d.queue_at(2, 16, CTRL);
    d.driver_ok();
    assert_eq!(d.status() & status::NEEDS_RESET, 0);
    (d, peer, stats)
}

fn frame(len: usize) -> Vec<u8> {
    let mut p = vec![0u8; 12];
    p.extend((0..len).map(|i| (i * 13 + 1) as u8));
    p
}

#[test]
fn config_space_has_the_mac_and_link_up() {
    let (mut d, _peer, _) = net();
    let mac: Vec<u8> = (0..6).map(|i| d.r(0x2000 + i, 1) as u8).collect();
    assert_eq!(mac, [2, 0, 0, 0, 0, 1]);
    assert_eq!(d.r(0x2006, 2), 1, "VIRTIO_NET_S_LINK_UP");
    assert_eq!(d.r(0x2008, 2), 1, "one queue pair");
}

#[test]
fn packets_cross_both_ways_and_large_ones_merge_buffers() {
    let (mut d, peer, stats) = net();
    // Transmit: header and frame in two buffers of one chain.
    let out = frame(60);
    d.mem.write_slice(&out[..12], GuestAddress(BUF)).unwrap();
    d.mem
        .write_slice(&out[12..], GuestAddress(BUF + 0x100))
        .unwrap();
    d.desc(TX, 0, BUF, 12, F_NEXT, 1);
    d.desc(TX, 1, BUF + 0x100, 60, 0, 0);
    d.post_at(1, TX, 0, 0);
    let mut got = vec![0u8; 2048];
    let n = peer.recv(&mut got).unwrap();
    assert_eq!(&got[..n], &out[..], "the tap gets header and frame");
    assert!(d.wait(|d| d.used_at(TX) == 1));

    // Receive: 3,000 bytes of frame into 2 KiB buffers: two of them,
    // num_buffers = 2, the bytes in order.
    let inp = frame(3000);
    for i in 0..3u16 {
        d.desc(
            RX,
            i,
            BUF + 0x1_0000 + u64::from(i) * 0x1000,
            2048,
            F_WRITE,
            0,
        );
        d.post_at(0, RX, i, i);
    }
    peer.send(&inp).unwrap();
    assert!(d.wait(|d| d.used_at(RX) == 2), "two buffers used");
    assert_eq!(d.used_elem(RX, 0), (0, 2048));
    assert_eq!(d.used_elem(RX, 1), (1, (inp.len() - 2048) as u32));
    let mut back = vec![0u8; inp.len()];
    d.mem
        .read_slice(&mut back[..2048], GuestAddress(BUF + 0x1_0000))
        .unwrap();
    d.mem
        .read_slice(&mut back[2048..], GuestAddress(BUF + 0x1_1000))
        .unwrap();
    let num_buffers = u16::from_le_bytes([back[10], back[11]]);
    assert_eq!(num_buffers, 2);
    assert_eq!(&back[12..], &inp[12..]);

    // A packet that arrives before there is room waits for the buffers.
    let second = frame(100);
    peer.send(&second).unwrap();
    assert!(d.wait(|d| d.used_at(RX) == 3), "the third buffer takes it");
    std::thread::sleep(Duration::from_millis(20));
    let third = frame(200);
    peer.send(&third).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(d.used_at(RX), 3, "no buffer: the packet waits");
    d.desc(RX, 3, BUF + 0x2_0000, 2048, F_WRITE, 0);
    d.post_at(0, RX, 3, 3);
    assert!(d.wait(|d| d.used_at(RX) == 4), "a new buffer takes it");
    assert_eq!(d.used_elem(RX, 3).1 as usize, third.len());
    assert_eq!(d.status() & status::NEEDS_RESET, 0);
    assert_eq!(
        stats.rx_packets.load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}

#[test]
fn malformed_transmits_are_dropped_and_counted() {
    let (mut d, peer, stats) = net();
    // Shorter than its header.
    d.desc(TX, 0, BUF, 8, 0, 0);
    d.post_at(1, TX, 0, 0);
    assert!(d.wait(|d| d.used_at(TX) == 1));
    assert_eq!(
        stats.tx_dropped.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    peer.set_nonblocking(true).unwrap();
    assert!(peer.recv(&mut [0u8; 64]).is_err(), "nothing sent");
    assert_eq!(
        d.status() & status::NEEDS_RESET,
        0,
        "a bad frame is no reset"
    );
}

#[test]
fn a_receive_buffer_the_device_cannot_write_needs_a_reset() {
    let (mut d, peer, _) = net();
    d.desc(RX, 0, BUF, 2048, 0, 0);
    d.post_at(0, RX, 0, 0);
    peer.send(&frame(64)).unwrap();
    assert!(d.faulted());
}

#[test]
fn the_control_queue_acks_pairs_and_refuses_the_rest() {
    let (mut d, _peer, _) = net();
    let cmd = |d: &mut Driver, i: u16, bytes: &[u8]| {
        let at = BUF + 0x100 * u64::from(i);
        d.mem.write_slice(bytes, GuestAddress(at)).unwrap();
        d.mem.write_obj(0xaau8, GuestAddress(at + 0x80)).unwrap();
        d.desc(CTRL, 2 * i, at, bytes.len() as u32, F_NEXT, 2 * i + 1);
        d.desc(CTRL, 2 * i + 1, at + 0x80, 1, F_WRITE, 0);
        d.post_at(2, CTRL, i, 2 * i);
        assert!(d.wait(|d| d.used_at(CTRL) == i + 1));
        d.mem.read_obj::<u8>(GuestAddress(at + 0x80)).unwrap()
    };
    // VIRTIO_NET_CTRL_MQ / VQ_PAIRS_SET 1: OK; 2 (more than it has): ERR.
    assert_eq!(cmd(&mut d, 0, &[4, 0, 1, 0]), 0);
    assert_eq!(cmd(&mut d, 1, &[4, 0, 2, 0]), 1);
    // Anything else (RX mode promiscuous): ERR.
    assert_eq!(cmd(&mut d, 2, &[0, 0, 1]), 1);
    // No ack byte: the driver is broken.
    d.desc(CTRL, 6, BUF, 4, 0, 0);
    d.post_at(2, CTRL, 3, 6);
    assert!(d.faulted());
}
