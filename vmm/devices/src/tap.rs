//! Host tap devices, the back end of virtio-net.
//!
//! A tap is opened by name (one file per queue pair, through
//! `/dev/net/tun` with `TUNSETIFF`) or taken as file descriptors the
//! caller already opened (Kata passes them over the API socket). Each
//! file gets `IFF_VNET_HDR` with a 12-byte header, the layout of
//! `virtio_net_hdr_v1`, so packets and their offload metadata pass
//! between the guest and the host stack without translation.
//!
//! Nothing here creates an interface: a name that is not an existing tap
//! is refused, naming the command that creates one. (`TUNSETIFF` on a
//! free name would create a tap that vanishes with this process, which
//! hides a typo instead of reporting it.)

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// The virtio-net header both sides use (`virtio_net_hdr_v1`).
pub const VNET_HDR_LEN: usize = 12;

/// Why a tap cannot be used. Each names the tap and the fix.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// The name is not a valid interface name.
    #[error("tap name {0:?}: an interface name is 1 to 15 bytes, without '/', ' ', ':' or ','")]
    BadName(String),
    /// No interface of that name.
    #[error(
        "tap {0}: no such network interface; create it first \
         (ip tuntap add {0} mode tap multi_queue) or give fd= of an open tap"
    )]
    Missing(String),
    /// An interface, but not a tap.
    #[error(
        "{0} is a network interface but not a tap (it has no tun_flags); give the name of a tap"
    )]
    NotATap(String),
    /// A single-queue tap asked for several queues.
    #[error(
        "tap {name}: {queues} queue pairs asked, but the tap was created without multi_queue; \
         give num_queues=2 (one pair) or recreate it: ip tuntap add {name} mode tap multi_queue"
    )]
    NotMultiQueue {
        /// The tap.
        name: String,
        /// Queue pairs asked for.
        queues: u16,
    },
    /// The host refused an open or an ioctl.
    #[error("tap {name}: {what}: {source} (is it in use by another process, or is CAP_NET_ADMIN missing?)")]
    Host {
        /// The tap (or the fd).
        name: String,
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// A passed file descriptor is not an open tap.
    #[error("fd {fd}: not an open tap device ({source}); pass a file descriptor of /dev/net/tun attached to a tap")]
    BadFd {
        /// The descriptor.
        fd: RawFd,
        /// What the host said.
        source: io::Error,
    },
}

/// One queue of a tap: a file in non-blocking mode with the vnet header on.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
}

/// `struct ifreq` with the flags member, as `TUNSETIFF` and `TUNGETIFF` use it.
#[repr(C)]
#[derive(Clone, Copy)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

impl IfReq {
    fn new(name: &str, flags: libc::c_int) -> Self {
        let mut r = Self {
            name: [0; libc::IFNAMSIZ],
            flags: flags as libc::c_short,
            _pad: [0; 22],
        };
        r.name[..name.len()].copy_from_slice(name.as_bytes());
        r
    }
}

fn check_name(name: &str) -> Result<(), TapError> {
    let bad = name.is_empty()
        || name.len() >= libc::IFNAMSIZ
        || name == "."
        || name == ".."
        || name
            .bytes()
            .any(|b| matches!(b, b'/' | b' ' | b':' | b',' | 0));
    if bad {
        return Err(TapError::BadName(name.to_string()));
    }
    Ok(())
}

/// `tun_flags` of interface `name` from sysfs: `None` if it is not a tap
/// or tun, `Err` if there is no such interface.
fn tun_flags(name: &str) -> Result<Option<u32>, TapError> {
    let dir = Path::new("/sys/class/net").join(name);
    if !dir.exists() {
        return Err(TapError::Missing(name.to_string()));
    }
    let Ok(text) = std::fs::read_to_string(dir.join("tun_flags")) else {
        return Ok(None);
    };
    let t = text.trim().trim_start_matches("0x");
    Ok(u32::from_str_radix(t, 16).ok())
}

impl Tap {
    /// Opens `queues` files of the existing tap `name`.
    pub fn open_named(name: &str, queues: u16) -> Result<Vec<Tap>, TapError> {
        check_name(name)?;
        let flags = tun_flags(name)?.ok_or_else(|| TapError::NotATap(name.to_string()))?;
        if flags & libc::IFF_TAP as u32 == 0 {
            return Err(TapError::NotATap(name.to_string()));
        }
        let multi = flags & libc::IFF_MULTI_QUEUE as u32 != 0;
        if queues > 1 && !multi {
            return Err(TapError::NotMultiQueue {
                name: name.to_string(),
                queues,
            });
        }
        let mut ifflags = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
        if multi {
            ifflags |= libc::IFF_MULTI_QUEUE;
        }
        (0..queues.max(1))
            .map(|_| {
                let host = |what| {
                    move |source| TapError::Host {
                        name: name.to_string(),
                        what,
                        source,
                    }
                };
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags_nonblock()
                    .open("/dev/net/tun")
                    .map_err(host("opening /dev/net/tun"))?;
                let mut req = IfReq::new(name, ifflags);
                // SAFETY: TUNSETIFF reads (and writes back) a struct ifreq;
                // `req` is one, laid out as the kernel expects, and lives
                // across the call.
                let r = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) };
                if r < 0 {
                    return Err(host("attaching to the tap (TUNSETIFF)")(
                        io::Error::last_os_error(),
                    ));
                }
                let tap = Tap {
                    file,
                    name: name.to_string(),
                };
                tap.set_vnet_hdr_len()?;
                Ok(tap)
            })
            .collect()
    }

    /// The name of the tap `fd` is attached to, if it is an open tap
    /// with the vnet header (`TUNGETIFF` answers, `IFF_TAP` and
    /// `IFF_VNET_HDR` set); changes nothing on the descriptor.
    pub fn check_fd(fd: BorrowedFd<'_>) -> Result<String, TapError> {
        let raw = fd.as_raw_fd();
        let mut req = IfReq::new("", 0);
        // SAFETY: TUNGETIFF writes a struct ifreq into `req`, which is one
        // and outlives the call; `raw` is open for the call (borrowed).
        let r = unsafe { libc::ioctl(raw, libc::TUNGETIFF, &mut req) };
        if r < 0 {
            return Err(TapError::BadFd {
                fd: raw,
                source: io::Error::last_os_error(),
            });
        }
        let end = req
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(req.name.len());
        let name = String::from_utf8_lossy(&req.name[..end]).into_owned();
        if req.flags as libc::c_int & libc::IFF_TAP == 0
            || req.flags as libc::c_int & libc::IFF_VNET_HDR == 0
        {
            return Err(TapError::BadFd {
                fd: raw,
                source: io::Error::other(format!("{name} is not a tap opened with IFF_VNET_HDR")),
            });
        }
        Ok(name)
    }

    /// Takes ownership of `fd`, which must be an open tap (`TUNGETIFF`
    /// answers), see [`Tap::check_fd`]; it is made non-blocking and gets
    /// the vnet header.
    pub fn from_fd(fd: OwnedFd) -> Result<Tap, TapError> {
        let name = Self::check_fd(fd.as_fd())?;
        let raw = fd.as_raw_fd();
        // SAFETY: F_GETFL/F_SETFL on a descriptor this function owns.
        let r = unsafe {
            let fl = libc::fcntl(raw, libc::F_GETFL);
            if fl < 0 {
                fl
            } else {
                libc::fcntl(raw, libc::F_SETFL, fl | libc::O_NONBLOCK)
            }
        };
        if r < 0 {
            return Err(TapError::BadFd {
                fd: raw,
                source: io::Error::last_os_error(),
            });
        }
        let tap = Tap {
            file: File::from(fd),
            name,
        };
        tap.set_vnet_hdr_len()?;
        Ok(tap)
    }

    /// Takes raw descriptor `fd`, which the caller hands over (it must not
    /// be used or closed elsewhere afterwards).
    ///
    /// # Safety
    /// `fd` must be an open descriptor owned by the caller and not used
    /// by anything else from now on.
    pub unsafe fn from_raw_fd(fd: RawFd) -> Result<Tap, TapError> {
        // SAFETY: the caller hands `fd` over (see the function's contract).
        Self::from_fd(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn host_err(&self, what: &'static str) -> TapError {
        TapError::Host {
            name: self.name.clone(),
            what,
            source: io::Error::last_os_error(),
        }
    }

    fn set_vnet_hdr_len(&self) -> Result<(), TapError> {
        let len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads an int through the pointer, which
        // points at `len` for the whole call.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), libc::TUNSETVNETHDRSZ, &len) };
        if r < 0 {
            return Err(self.host_err("setting the vnet header size (TUNSETVNETHDRSZ)"));
        }
        Ok(())
    }

    /// Tells the tap which offloads the guest takes on receive
    /// (`TUN_F_*`): packets it hands us may then be large or carry a
    /// partial checksum.
    pub fn set_offload(&self, flags: u32) -> Result<(), TapError> {
        // SAFETY: TUNSETOFFLOAD takes its flags by value; no memory is
        // passed.
        let r = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                libc::c_ulong::from(flags),
            )
        };
        if r < 0 {
            return Err(self.host_err("setting offloads (TUNSETOFFLOAD)"));
        }
        Ok(())
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads one packet (with its vnet header) into `buf`; `None` when
    /// there is none now.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        use std::io::Read;
        match (&self.file).read(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sends one packet (with its vnet header).
    pub fn send(&self, packet: &[u8]) -> io::Result<usize> {
        use std::io::Write;
        (&self.file).write(packet)
    }
}

impl Tap {
    /// A datagram socket standing in for a tap (one read, one packet, as
    /// a tap gives them): for tests and fuzz targets, which have no
    /// network namespace to make taps in.
    pub fn from_socket(s: std::os::unix::net::UnixDatagram) -> std::io::Result<Self> {
        s.set_nonblocking(true)?;
        Ok(Self {
            file: File::from(OwnedFd::from(s)),
            name: "socket-tap".into(),
        })
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_before_anything_is_opened() {
        for bad in ["", "a/b", "has space", "x:y", "a,b", "sixteen-chars-xx"] {
            let e = Tap::open_named(bad, 1).unwrap_err();
            assert!(matches!(e, TapError::BadName(_)), "{bad}: {e}");
        }
    }

    #[test]
    fn a_missing_tap_names_the_command_that_creates_it() {
        let e = Tap::open_named("vmmnotap0", 1).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("no such network interface") && m.contains("ip tuntap add vmmnotap0"),
            "{m}"
        );
    }

    #[test]
    fn an_interface_that_is_not_a_tap_is_refused() {
        // The loopback exists everywhere and is no tap.
        let e = Tap::open_named("lo", 1).unwrap_err();
        assert!(matches!(e, TapError::NotATap(_)), "{e}");
    }

    #[test]
    fn a_file_that_is_not_a_tap_is_refused_as_an_fd() {
        let f = File::open("/dev/null").unwrap();
        let e = Tap::from_fd(OwnedFd::from(f)).unwrap_err();
        assert!(e.to_string().contains("not an open tap"), "{e}");
    }
}
