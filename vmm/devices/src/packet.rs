//! A raw `AF_PACKET` socket bound to one host interface: the peer side of
//! a tap in tests and benchmarks. It sends whole Ethernet frames out of
//! the interface (a tap hands them to the VMM that holds it) and receives
//! the frames the interface gets (what the VMM wrote to the tap),
//! leaving out the copies of its own sends.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// `ETH_P_ALL` in network byte order, as `socket` and `bind` take it.
fn eth_p_all() -> u16 {
    (libc::ETH_P_ALL as u16).to_be()
}

/// Why a packet socket cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum PacketError {
    /// No interface of that name.
    #[error("interface {0}: no such network interface (create the tap first: ip tuntap add {0} mode tap; ip link set {0} up)")]
    Missing(String),
    /// The host refused (usually: no `CAP_NET_RAW`).
    #[error("interface {name}: {what}: {source} (raw packet sockets need root or CAP_NET_RAW)")]
    Host {
        /// The interface.
        name: String,
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
}

/// A packet socket bound to one interface.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    name: String,
}

impl PacketSocket {
    /// Binds to interface `name`; receives wait at most `timeout`.
    pub fn bind(name: &str, timeout: Duration) -> Result<Self, PacketError> {
        let cname =
            std::ffi::CString::new(name).map_err(|_| PacketError::Missing(name.to_string()))?;
        // SAFETY: a NUL-terminated string that lives across the call.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if index == 0 {
            return Err(PacketError::Missing(name.to_string()));
        }
        let host = |what, source| PacketError::Host {
            name: name.to_string(),
            what,
            source,
        };
        // SAFETY: plain socket creation; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                i32::from(eth_p_all()),
            )
        };
        if raw < 0 {
            return Err(host("socket(AF_PACKET)", io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a descriptor this function just opened and owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_ll is plain data; all zeros is a valid value.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = eth_p_all();
        sa.sll_ifindex = index as i32;
        // SAFETY: `sa` is a valid sockaddr_ll of the size passed.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::addr_of!(sa).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r < 0 {
            return Err(host("bind", io::Error::last_os_error()));
        }
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: timeout.subsec_micros() as libc::suseconds_t,
        };
        // SAFETY: `tv` is a valid timeval of the size passed.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                std::ptr::addr_of!(tv).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        if r < 0 {
            return Err(host("SO_RCVTIMEO", io::Error::last_os_error()));
        }
        Ok(Self {
            fd,
            name: name.to_string(),
        })
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends one Ethernet frame out of the interface.
    pub fn send(&self, frame: &[u8]) -> io::Result<usize> {
        // SAFETY: the buffer is valid for its length; the socket is bound,
        // so no address is needed.
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Receives one frame that arrived on the interface into `buf`
    /// (copies of this host's own sends are skipped); `None` when the
    /// timeout passed first.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: as in `bind`.
            let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: `buf` and `sa` are valid for the sizes passed.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    std::ptr::addr_of_mut!(sa).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                return match err.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Ok(None),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(err),
                };
            }
            if sa.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            return Ok(Some(n as usize));
        }
    }
}
