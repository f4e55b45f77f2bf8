//! The server's life: socket, runtime, signals, and the end.
//!
//! WHAT: [`serve`] claims the socket ([`socket`]), starts
//! the [`Controller`] (KVM, the shared scheduler), accepts connections
//! and hands each request to [`http::handle`] until
//! `vmm.shutdown`, SIGTERM or SIGINT; then it stops every VM and removes
//! the socket if it is still the one it made.
//! WHY: the one place where the parts meet.
//! HOW: a 2-thread tokio runtime; hyper HTTP/1.1 per connection. A
//! client has [`HEADER_TIMEOUT`] to send a request's headers (a client
//! that stalls mid-headers loses its connection, not the server a slot),
//! at most [`MAX_CONNECTIONS`] connections are open at once (one more
//! waits in the socket's backlog until one closes; each wait is counted),
//! and a failed `accept` (EMFILE: no file
//! descriptor left) pauses the accept loop for [`ACCEPT_PAUSE`] instead
//! of spinning on the error, while open connections go on being served.
//! At the end the runtime is shut down with a timeout, so that a
//! blocking-pool thread stuck on something (a file, a VM that does not
//! stop) cannot keep the process from exiting.

use std::sync::Arc;
use std::time::Duration;

use super::controller::Controller;
use super::fds;
use super::http;
use super::options::{ServeError, ServeOptions};
use super::socket;

/// How long the runtime's blocking threads get to finish at exit.
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// How long a client may take to send a request's headers, from the
/// connection's start or the end of the previous response.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The most connections open at once: far above what one orchestrator
/// uses, far below a default file-descriptor limit of 1,024 (VMs need
/// descriptors too).
pub const MAX_CONNECTIONS: usize = 256;
/// How long the accept loop waits after `accept` failed.
pub const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Runs the server until `vmm.shutdown` or SIGTERM/SIGINT, then stops
/// every VM and removes the socket.
pub fn serve(opts: ServeOptions) -> Result<(), ServeError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| ServeError::Io("starting the tokio runtime".into(), e))?;
    let r = rt.block_on(serve_async(opts));
    rt.shutdown_timeout(EXIT_GRACE);
    r
}

async fn serve_async(opts: ServeOptions) -> Result<(), ServeError> {
    let path = opts.socket.clone();
    socket::claim(&path)?;
    let ctl = Arc::new(Controller::new(opts)?);
    let (listener, bound) = socket::bind(&path)?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| ServeError::Io("SIGTERM handler".into(), e))?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| ServeError::Io("SIGINT handler".into(), e))?;
    tracing::info!(socket = %path.display(), "serving");
    eprintln!("vmm serve: listening on {}", path.display());
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        tokio::select! {
            // A slot first, then a connection: at the cap, new clients
            // wait in the socket's backlog until one closes (a stalled
            // one within HEADER_TIMEOUT), instead of being turned away.
            (slot, a) = async {
                if slots.available_permits() == 0 {
                    ctl.api_metrics().at_cap();
                    tracing::debug!(max = MAX_CONNECTIONS, "connection cap reached: waiting for a slot");
                }
                let slot = slots.clone().acquire_owned().await;
                (slot, listener.accept().await)
            } => match (slot, a) {
                (Ok(slot), Ok((stream, _))) => connection(&ctl, slot, stream),
                (_, Err(e)) => {
                    // EMFILE and its kin stay until a descriptor frees:
                    // retrying at once would spin. Pause this loop only.
                    ctl.api_metrics().accept_failed();
                    tracing::warn!(error = %e, pause_ms = ACCEPT_PAUSE.as_millis() as u64, "accept failed");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                }
                // the semaphore is never closed
                (Err(_), Ok(_)) => break,
            },
            _ = ctl.shutdown_requested().notified() => { tracing::info!("vmm.shutdown"); break; }
            _ = term.recv() => { tracing::info!("SIGTERM"); break; }
            _ = int.recv() => { tracing::info!("SIGINT"); break; }
        }
    }
    drop(listener);
    let removed = bound.release();
    ctl.stop_all().await;
    if removed {
        eprintln!("vmm serve: stopped every VM, removed {}", path.display());
    } else {
        eprintln!(
            "vmm serve: stopped every VM; left {} alone: it is no longer this server's socket",
            path.display()
        );
    }
    Ok(())
}

/// Serves one accepted connection on its own task, holding its slot.
fn connection(
    ctl: &Arc<Controller>,
    slot: tokio::sync::OwnedSemaphorePermit,
    stream: tokio::net::UnixStream,
) {
    let c = ctl.clone();
    tokio::spawn(async move {
        c.api_metrics().connections(1);
        // Reads with recvmsg: descriptors sent with a request (SCM_RIGHTS)
        // wait in the connection's stash for it (see `fds`).
        let stream = fds::FdStream::new(stream);
        let svc = {
            let (c, stash) = (c.clone(), stream.stash());
            hyper::service::service_fn(move |req| http::handle(c.clone(), stash.clone(), req))
        };
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
            .await;
        c.api_metrics().connections(-1);
        drop(slot);
    });
}
