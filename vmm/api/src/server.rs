//! The server's life: socket, runtime, signals, and the end.
//!
//! WHAT: [`serve`] claims the socket ([`socket`]), starts
//! the [`Controller`] (KVM, the shared scheduler), accepts connections
//! and hands each request to [`http::handle`] until
//! `vmm.shutdown`, SIGTERM or SIGINT; then it stops every VM and removes
//! the socket if it is still the one it made.
//! WHY: the one place where the parts meet.
//! HOW: a 2-thread tokio runtime; hyper HTTP/1.1 per connection. At the
//! end the runtime is shut down with a timeout, so that a blocking-pool
//! thread stuck on something (a file, a VM that does not stop) cannot
//! keep the process from exiting.

use std::sync::Arc;
use std::time::Duration;

use super::controller::Controller;
use super::http;
use super::options::{ServeError, ServeOptions};
use super::socket;

/// How long the runtime's blocking threads get to finish at exit.
const EXIT_GRACE: Duration = Duration::from_secs(2);

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
    loop {
        tokio::select! {
            a = listener.accept() => {
                let Ok((stream, _)) = a else { continue };
                let c = ctl.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| http::handle(c.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
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
