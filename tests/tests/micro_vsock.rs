//! virtio-vsock end to end: a micro-guest echo server
//! (`vmm_machine::micro::vsock`) on a real KVM vCPU, the test as the host
//! on the device's Unix sockets (the hybrid vsock protocol).
//!
//! * host to guest: `CONNECT <port>\n`, `OK <port>\n`, then every byte
//!   sent comes back, checked byte for byte;
//! * many connections at once (32 threads, each its own pattern);
//! * a slow host reader and far more data than the credit (2 MiB through
//!   64 KiB windows): the echo is complete and intact;
//! * a host close: the guest answers the device's `SHUTDOWN` with `RST`
//!   (counted in guest memory) and the other connections go on;
//! * guest to host: the guest connects to `<socket>_<port>` and echoes
//!   what the host sends there;
//! * the socket file: refused when it exists, removed with the VM.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_machine::micro::devices::MicroDevice;
use vmm_machine::micro::vsock::{self, VsockMode};
use vmm_machine::micro::{MicroHost, MicroVm, MicroVmSpec, DATA_ADDR};
use vmm_machine::vcpu_body::{ExecOptions, ExecutorKind, Placement, Running, VmSet};

const CID: u64 = 3;

/// A running one-vCPU micro-guest with the vsock echo program.
struct EchoVm {
    run: Option<Running>,
    set: Arc<VmSet>,
    memory: vm_memory::GuestMemoryMmap,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl EchoVm {
    /// Starts it; `before` runs once the socket path is known and before
    /// the VM is built (to bind a host listener for `connect`).
    fn start(mode: VsockMode, before: impl FnOnce(&Path)) -> Self {
        vmm_machine::vcpu::install_kick_signal().expect("kick signal");
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("v.sock");
        before(&socket);
        let host = MicroHost::open().expect("/dev/kvm");
        let code = vsock::program(mode).expect("program");
        let mut spec = MicroVmSpec::new("vsock", 1, code);
        spec.devices = vec![MicroDevice::Vsock {
            cid: CID,
            socket: socket.clone(),
        }];
        let vm = MicroVm::build(&host, &spec).expect("build micro-guest");
        let memory = vm.memory.clone();
        let set = VmSet::new(vec![vm.into_guest(vec![Placement::default()])]).expect("set");
        let topo = Arc::new(topology::load("host").expect("host topology"));
        let mut o = ExecOptions::new(topo, vcpu_sched::exec::CpuMapping::Host);
        o.kind = ExecutorKind::Host;
        let run = Running::start(&o, set.clone()).expect("start");
        Self {
            run: Some(run),
            set,
            memory,
            socket,
            _dir: dir,
        }
    }

    fn counter(&self, off: u64) -> u64 {
        vmm_machine::micro::read_u64(&self.memory, DATA_ADDR + off).unwrap_or(0)
    }

    /// Waits up to 10 s for counter `off` to reach `n`.
    fn wait_counter(&self, off: u64, n: u64) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if self.counter(off) >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// A host connection to guest port `port`: the stream after `OK`.
    fn connect(&self, port: u32) -> UnixStream {
        connect(&self.socket, port)
    }

    /// Stops the VM; asserts it did not fail (a bad used entry, the
    /// device's `NEEDS_RESET`, a bad access).
    fn stop(mut self) {
        if let Some(r) = self.run.take() {
            r.stop(Duration::from_secs(20)).expect("stop");
        }
        let vm = &self.set.vms()[0];
        assert!(
            vm.failure().is_none(),
            "the guest failed: {:?}",
            vm.failure()
        );
    }
}

impl Drop for EchoVm {
    fn drop(&mut self) {
        if let Some(r) = self.run.take() {
            let _ = r.stop(Duration::from_secs(20));
        }
    }
}

fn connect(socket: &Path, port: u32) -> UnixStream {
    let mut s = UnixStream::connect(socket).expect("connect to the vsock socket");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    writeln!(s, "CONNECT {port}").unwrap();
    // The line byte by byte: nothing after it may be taken.
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while b[0] != b'\n' {
        assert_eq!(s.read(&mut b).expect("the OK line"), 1, "closed: {line:?}");
        line.push(b[0]);
    }
    let line = String::from_utf8(line).unwrap();
    let port: u32 = line
        .strip_prefix("OK ")
        .and_then(|p| p.trim_end().parse().ok())
        .unwrap_or_else(|| panic!("not an OK line: {line:?}"));
    assert!(port > 0);
    s
}

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// Sends `data` on `s` from another thread and reads the echo here, in
/// reads of `chunk` bytes with `pause` between them: every byte back,
/// in order.
fn echo_through(s: UnixStream, data: Vec<u8>, chunk: usize, pause: Duration) -> Vec<u8> {
    let mut w = s.try_clone().unwrap();
    let n = data.len();
    let writer = std::thread::spawn(move || w.write_all(&data).map(|()| data));
    let mut got = Vec::with_capacity(n);
    let mut r = s;
    let mut buf = vec![0u8; chunk];
    while got.len() < n {
        let k = r.read(&mut buf).expect("reading the echo");
        assert!(k > 0, "EOF after {} of {n} bytes", got.len());
        got.extend_from_slice(&buf[..k]);
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
    let sent = writer.join().unwrap().expect("writing");
    assert!(got == sent, "the echo differs from what was sent");
    got
}

#[test]
fn the_host_connects_and_gets_every_byte_back() {
    let vm = EchoVm::start(VsockMode::Echo, |_| {});
    let s = vm.connect(5000);
    assert!(vm.wait_counter(vsock::ACCEPTED, 1));
    // A small message, then 200 KiB (many packets, several credit windows).
    let mut small = s.try_clone().unwrap();
    small.write_all(b"hello vsock").unwrap();
    let mut b = [0u8; 11];
    small.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello vsock");
    echo_through(s, pattern(200 * 1024, 1), 8192, Duration::ZERO);
    assert_eq!(vm.counter(vsock::BYTES), 11 + 200 * 1024);
    assert!(vm.counter(vsock::PACKETS) >= (200 * 1024 / vsock::MAX_PAYLOAD));
    vm.stop();
}

#[test]
fn many_connections_echo_at_once() {
    const N: usize = 32;
    const BYTES: usize = 96 * 1024;
    let vm = EchoVm::start(VsockMode::Echo, |_| {});
    let socket = vm.socket.clone();
    let threads: Vec<_> = (0..N)
        .map(|i| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let s = connect(&socket, 7000 + i as u32);
                echo_through(s, pattern(BYTES, i as u32), 4096, Duration::ZERO).len()
            })
        })
        .collect();
    let total: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(total, N * BYTES);
    assert_eq!(vm.counter(vsock::ACCEPTED), N as u64);
    assert_eq!(vm.counter(vsock::BYTES), (N * BYTES) as u64);
    vm.stop();
}

#[test]
fn a_slow_reader_gets_an_intact_echo_of_more_than_the_credit() {
    let vm = EchoVm::start(VsockMode::Echo, |_| {});
    let s = vm.connect(80);
    // 2 MiB through the 64 KiB credit window, read 1 KiB per millisecond
    // at most.
    let n = 2 << 20;
    echo_through(s, pattern(n, 77), 1024, Duration::from_micros(500));
    assert_eq!(vm.counter(vsock::BYTES), n as u64);
    vm.stop();
}

#[test]
fn a_host_close_resets_that_connection_and_the_others_go_on() {
    let vm = EchoVm::start(VsockMode::Echo, |_| {});
    let mut keep = vm.connect(1);
    let gone = vm.connect(2);
    gone.try_clone().unwrap().write_all(b"bye").unwrap();
    let mut b = [0u8; 3];
    (&gone).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"bye");
    drop(gone);
    assert!(
        vm.wait_counter(vsock::RESETS, 1),
        "the guest answered the shutdown with a reset"
    );
    keep.write_all(b"still here").unwrap();
    let mut b = [0u8; 10];
    keep.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"still here");
    // A third connection after all that.
    let s = vm.connect(3);
    echo_through(s, pattern(10_000, 3), 4096, Duration::ZERO);
    assert_eq!(vm.counter(vsock::RESETS), 1);
    assert_eq!(vm.counter(vsock::ACCEPTED), 3);
    vm.stop();
}

#[test]
fn the_guest_connects_to_a_host_port_and_echoes_what_it_sends() {
    const CONNS: u16 = 4;
    let mut listener = None;
    let vm = EchoVm::start(
        VsockMode::Connect {
            port: 6000,
            conns: CONNS,
        },
        |socket| {
            let p = format!("{}_6000", socket.display());
            listener = Some(UnixListener::bind(p).expect("bind the host port"));
        },
    );
    let l = listener.expect("listener");
    let streams: Vec<UnixStream> = (0..CONNS).map(|_| l.accept().unwrap().0).collect();
    assert!(vm.wait_counter(vsock::CONNECTED, u64::from(CONNS)));
    for (i, s) in streams.into_iter().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        echo_through(s, pattern(50_000, 100 + i as u32), 4096, Duration::ZERO);
    }
    assert_eq!(vm.counter(vsock::BYTES), u64::from(CONNS) * 50_000);
    // A request to a port nobody listens on is reset.
    assert_eq!(vm.counter(vsock::REFUSED), 0);
    vm.stop();
}

#[test]
fn a_guest_request_to_a_closed_port_is_reset() {
    let vm = EchoVm::start(
        VsockMode::Connect {
            port: 6001,
            conns: 2,
        },
        |_| {},
    );
    assert!(vm.wait_counter(vsock::REFUSED, 2), "both refused");
    assert_eq!(vm.counter(vsock::CONNECTED), 0);
    vm.stop();
}

#[test]
fn the_socket_must_not_exist_and_goes_with_the_vm() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("taken");
    std::fs::write(&socket, b"a user's file").unwrap();
    let host = MicroHost::open().expect("/dev/kvm");
    let mut spec = MicroVmSpec::new("v", 1, vsock::program(VsockMode::Echo).unwrap());
    spec.devices = vec![MicroDevice::Vsock {
        cid: CID,
        socket: socket.clone(),
    }];
    let Err(err) = MicroVm::build(&host, &spec).map(drop) else {
        panic!("built")
    };
    let err = err.to_string();
    assert!(err.contains("exists"), "{err}");
    assert_eq!(std::fs::read(&socket).unwrap(), b"a user's file");
    spec.devices = vec![MicroDevice::Vsock {
        cid: 2,
        socket: dir.path().join("free"),
    }];
    let Err(err) = MicroVm::build(&host, &spec).map(drop) else {
        panic!("built")
    };
    let err = err.to_string();
    assert!(err.contains("3 or more"), "{err}");
    assert!(!dir.path().join("free").exists());

    let vm = EchoVm::start(VsockMode::Echo, |_| {});
    let path = vm.socket.clone();
    assert!(path.exists());
    let mut r = BufReader::new(vm.connect(9));
    r.get_mut().write_all(b"x\n").unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "x\n");
    vm.stop();
    assert!(!path.exists(), "the socket file is removed with the VM");
}
