//! File descriptors that arrive with a request, as `SCM_RIGHTS` ancillary
//! data on the API socket.
//!
//! WHAT: [`FdStream`], a connection's stream for hyper that reads with
//! `recvmsg` and keeps the descriptors that come with the bytes in the
//! connection's [`FdStash`]; [`Received`], what a request takes from it.
//! WHY: CH's `vm.add-net` takes a tap's descriptors this way (Kata's
//! driver opens the taps in the sandbox's network namespace and sends them
//! with the request, `WriteMsgUnix`); CH's HTTP server reads them with
//! `recvmsg` before parsing the request. hyper reads through
//! `AsyncRead`, which knows no ancillary data, hence a stream of our own.
//! HOW: every read of the connection is one `recvmsg` with room for
//! [`MAX_FDS`] descriptors, `MSG_CMSG_CLOEXEC` (no child inherits them).
//! What arrives is kept in the connection's stash, at most [`MAX_FDS`]
//! (the rest closed at once and counted); the request being served when
//! they arrive takes them all ([`FdStash::take`]): hyper reads a request's
//! bytes before it calls the service, and the next request's only after
//! the response (a client that pipelines requests with descriptors is not
//! supported). Every request takes the stash, whatever its route, so a
//! descriptor never outlives the request it came with unless a VM keeps
//! it; and the stash is dropped, closing what is left, with the
//! connection. Each descriptor is an `OwnedFd` from the moment it is
//! received: no path can leak one.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::UnixStream;

/// The most descriptors one request may carry: one per queue pair of the
/// largest virtio-net.
pub const MAX_FDS: usize = vmm_machine::devices::MAX_NET_PAIRS as usize;

/// The descriptors a request came with.
#[derive(Debug, Default)]
pub struct Received {
    /// In the order they were sent.
    pub fds: Vec<OwnedFd>,
    /// More than [`MAX_FDS`] were sent: the rest were closed.
    pub too_many: bool,
}

/// A connection's descriptors received and not yet taken.
#[derive(Debug, Default)]
pub struct FdStash {
    held: Received,
}

impl FdStash {
    /// Keeps `fds` (closing those beyond [`MAX_FDS`]); `truncated`: the
    /// kernel had more than the buffer held (and closed them).
    fn add(&mut self, fds: Vec<OwnedFd>, truncated: bool) {
        for fd in fds {
            if self.held.fds.len() < MAX_FDS {
                self.held.fds.push(fd);
            } else {
                self.held.too_many = true;
            }
        }
        self.held.too_many |= truncated;
    }

    /// Everything received since the last take.
    pub fn take(&mut self) -> Received {
        std::mem::take(&mut self.held)
    }
}

/// One connection's stash, shared by its stream and its service.
pub type SharedStash = Arc<Mutex<FdStash>>;

/// Takes what `stash` holds (a poisoned lock is still read: it holds only
/// descriptors).
pub fn take(stash: &SharedStash) -> Received {
    stash.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// A connection that keeps the descriptors arriving on it.
#[derive(Debug)]
pub struct FdStream {
    inner: UnixStream,
    stash: SharedStash,
}

impl FdStream {
    /// `inner`, with a new empty stash.
    pub fn new(inner: UnixStream) -> Self {
        Self {
            inner,
            stash: SharedStash::default(),
        }
    }

    /// Its stash.
    pub fn stash(&self) -> SharedStash {
        self.stash.clone()
    }
}

/// Room for [`MAX_FDS`] descriptors of control data, 8-byte aligned.
const CONTROL_WORDS: usize = (MAX_FDS * 4 + 64) / 8;

/// One `recvmsg` into `data`: the bytes read, with the descriptors that
/// came with them added to `stash`.
fn recv_with_fds(fd: i32, data: &mut [u8], stash: &SharedStash) -> io::Result<usize> {
    let mut control = [0u64; CONTROL_WORDS];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: a msghdr is plain data; all-zero is its empty value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` points at `iov` (which points at `data`) and at
    // `control`, all alive and writable for the call, with their lengths.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut got = Vec::new();
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR reads its fields.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !c.is_null() {
        // SAFETY: `c` is a header inside `control`, as CMSG_FIRSTHDR and
        // CMSG_NXTHDR return only within msg_controllen.
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: the data of header `c`, inside `control`.
            let p = unsafe { libc::CMSG_DATA(c) };
            let len = h.cmsg_len as usize - (p as usize - c as usize);
            for k in 0..len / std::mem::size_of::<libc::c_int>() {
                // SAFETY: `k` ints fit in the header's data (its length
                // above); the kernel installed each as a new descriptor of
                // this process, which nothing else owns.
                let raw = unsafe { p.cast::<libc::c_int>().add(k).read_unaligned() };
                // SAFETY: see above: a new descriptor, owned here only.
                got.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: `c` is a header of `msg`; CMSG_NXTHDR stays within it.
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    let truncated = msg.msg_flags & libc::MSG_CTRUNC != 0;
    if !got.is_empty() || truncated {
        tracing::debug!(fds = got.len(), truncated, "descriptors received");
        stash
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(got, truncated);
    }
    Ok(n as usize)
}

impl AsyncRead for FdStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match this.inner.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let fd = this.inner.as_raw_fd();
            let stash = &this.stash;
            let dst = buf.initialize_unfilled();
            match this
                .inner
                .try_io(Interest::READABLE, || recv_with_fds(fd, dst, stash))
            {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for FdStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use tokio::io::AsyncReadExt;

    /// Sends `data` with `fds` over `s` (SCM_RIGHTS).
    fn send_with_fds(s: &std::os::unix::net::UnixStream, data: &[u8], fds: &[i32]) {
        let mut control = [0u64; CONTROL_WORDS * 2];
        let mut iov = libc::iovec {
            iov_base: data.as_ptr() as *mut _,
            iov_len: data.len(),
        };
        // SAFETY: plain data, all-zero is empty.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        let bytes = std::mem::size_of_val(fds) as u32;
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE computes a size.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(bytes) } as _;
        // SAFETY: `msg` has room for one header with `fds` (CMSG_SPACE
        // above, within `control`); sendmsg reads `data` and `control`.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c).cast::<i32>(),
                fds.len(),
            );
            assert_eq!(libc::sendmsg(s.as_raw_fd(), &msg, 0), data.len() as isize);
        }
    }

    #[test]
    fn descriptors_arrive_with_their_bytes_and_are_capped() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            b.set_nonblocking(true).unwrap();
            let mut s = FdStream::new(UnixStream::from_std(b).unwrap());
            let stash = s.stash();
            let f = std::fs::File::open("/dev/null").unwrap();
            send_with_fds(&a, b"hello", &[f.as_raw_fd(), f.as_raw_fd()]);
            let mut buf = [0u8; 16];
            let n = s.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"hello");
            let r = take(&stash);
            assert_eq!((r.fds.len(), r.too_many), (2, false));
            assert!(r.fds.iter().all(|d| d.as_fd().as_raw_fd() > 2));
            // Beyond the cap: the rest closed, the request told.
            let many = vec![f.as_raw_fd(); MAX_FDS + 3];
            send_with_fds(&a, b"x", &many);
            (&a).write_all(b"y").unwrap();
            let n = s.read(&mut buf).await.unwrap();
            assert!(n >= 1);
            let r = take(&stash);
            assert!(r.too_many && r.fds.len() <= MAX_FDS, "{}", r.fds.len());
            assert!(take(&stash).fds.is_empty());
        });
    }
}
