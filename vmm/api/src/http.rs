//! The HTTP front end: routing a request to an [`ApiRequest`], and the
//! controller's answer back to a response.
//!
//! WHAT: [`ROUTES`], [`parse`] (method, path, `Accept` and body into an
//! [`ApiRequest`], or the 4xx [`ApiError`] that says why not), the
//! response helpers, and [`handle`], which hyper calls for each request:
//! parse, hand to the [`Controller`], answer, and count the request in the
//! API's own metrics.
//! WHY: Cloud Hypervisor's cut (`api/http` to `ApiRequest` to the VMM):
//! paths, verbs and bodies are HTTP's business, VMs the controller's.
//! HOW: a body is read only for the routes that take one, at most
//! [`MAX_BODY`] bytes and within [`BODY_TIMEOUT`], before the controller
//! (and so its lock) is reached: a slow or endless body holds its own
//! connection, nothing else. No VM logic here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};

use super::api::ApiError;
use super::controller::{Answer, ApiRequest, Controller};
use super::fds::{self, SharedStash};

/// The largest request body.
pub const MAX_BODY: usize = 1 << 20;
/// How long a request body may take to arrive.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The VM the CH paths act on.
pub const DEFAULT_VM: &str = "default";

/// Every route: (method, path under `/api/v1/` or absolute). The OpenAPI
/// document (docs/api.yaml) is checked against this table by a test.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/api/v1/vmm.ping"),
    ("PUT", "/api/v1/vmm.shutdown"),
    ("PUT", "/api/v1/vm.create"),
    ("PUT", "/api/v1/vm.boot"),
    ("GET", "/api/v1/vm.info"),
    ("GET", "/api/v1/vm.counters"),
    ("PUT", "/api/v1/vm.pause"),
    ("PUT", "/api/v1/vm.resume"),
    ("PUT", "/api/v1/vm.shutdown"),
    ("PUT", "/api/v1/vm.reboot"),
    ("PUT", "/api/v1/vm.delete"),
    ("PUT", "/api/v1/vm.resize"),
    ("PUT", "/api/v1/vm.add-net"),
    ("PUT", "/api/v1/vm.add-disk"),
    ("PUT", "/api/v1/vm.add-fs"),
    ("PUT", "/api/v1/vm.add-vsock"),
    ("PUT", "/api/v1/vm.remove-device"),
    ("GET", "/api/v1/vms"),
    ("GET", "/metrics"),
];

/// Cloud Hypervisor's endpoints (API 0.3.0) that this VMM does not
/// implement, with what is missing: answered 501 with the reason, not a
/// bare 404 (docs/api.md has the whole table).
pub const CH_ABSENT: &[(&str, &str)] = &[
    (
        "vm.power-button",
        "there is no ACPI power button; use vm.shutdown",
    ),
    (
        "vm.resize-disk",
        "disks cannot be resized while the VM exists",
    ),
    ("vm.resize-zone", "there are no memory zones"),
    ("vm.add-device", "VFIO passthrough is not implemented"),
    (
        "vm.add-generic-vhost-user",
        "vhost-user devices are not implemented",
    ),
    ("vm.add-pmem", "virtio-pmem is not implemented"),
    ("vm.add-vdpa", "vDPA is not implemented"),
    (
        "vm.add-user-device",
        "vfio-user devices are not implemented",
    ),
    ("vm.snapshot", "snapshots are not implemented"),
    ("vm.coredump", "guest core dumps are not implemented"),
    ("vm.nmi", "NMI injection is not implemented"),
    ("vm.restore", "snapshots are not implemented"),
    ("vm.receive-migration", "live migration is not implemented"),
    ("vm.send-migration", "live migration is not implemented"),
];

type HttpResponse = Response<Full<Bytes>>;

fn json_response(status: u16, body: &serde_json::Value) -> HttpResponse {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn empty(status: u16) -> HttpResponse {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::NO_CONTENT);
    r
}

fn error_response(e: &ApiError) -> HttpResponse {
    json_response(e.status, &serde_json::to_value(e).unwrap_or_default())
}

/// The response to a controller's answer.
fn respond(a: Answer) -> HttpResponse {
    match a {
        Answer::Done => empty(204),
        Answer::Json(v) => json_response(200, &v),
        Answer::Text { body, content_type } => {
            let mut r = Response::new(Full::new(Bytes::from(body)));
            r.headers_mut().insert(
                "content-type",
                hyper::header::HeaderValue::from_static(content_type),
            );
            r
        }
    }
}

/// Splits a path into (VM id, endpoint). `None`: not an API path.
fn route(path: &str) -> Option<(String, String)> {
    let rest = path.strip_prefix("/api/v1/")?;
    if let Some(r) = rest.strip_prefix("vms/") {
        let (id, ep) = r.split_once('/')?;
        return Some((id.to_string(), ep.to_string()));
    }
    Some((DEFAULT_VM.to_string(), rest.to_string()))
}

fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The endpoint label of the request counter: the endpoint of a known
/// route, `other` for anything else (so a scan cannot grow the series).
fn endpoint_label(path: &str) -> String {
    if ROUTES.iter().any(|(_, p)| *p == path) || path.starts_with("/api/v1/vms/") {
        route(path)
            .map(|(_, e)| e)
            .unwrap_or_else(|| path.to_string())
    } else {
        "other".into()
    }
}

/// Reads a body of at most [`MAX_BODY`] bytes, within [`BODY_TIMEOUT`],
/// as `T`.
async fn body_json<T: serde::de::DeserializeOwned>(req: Request<Incoming>) -> Result<T, ApiError> {
    let read = Limited::new(req.into_body(), MAX_BODY).collect();
    let bytes = tokio::time::timeout(BODY_TIMEOUT, read)
        .await
        .map_err(|_| {
            ApiError::status(
                408,
                format!(
                    "request body: not received within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            )
        })?
        .map_err(|e| {
            ApiError::status(413, format!("request body: {e} (at most {MAX_BODY} bytes)"))
        })?
        .to_bytes();
    parse_body(&bytes)
}

/// A request body as `T` (JSON), or a 400 naming the field at fault.
/// Every body the API takes is a JSON object: serde would also read a
/// struct from an array (`[]` as a VmConfig with every field defaulted),
/// which no CH client sends.
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    match bytes.trim_ascii_start().first() {
        Some(b'{') => serde_json::from_slice(bytes).map_err(|e| ApiError::from_json(&e)),
        None => Err(ApiError::status(
            400,
            "request body: empty; send a JSON object",
        )),
        Some(_) => Err(ApiError::status(
            400,
            "request body: not a JSON object; send an object such as {\"cpus\": {...}}",
        )),
    }
}

/// CH's `VmRemoveDevice`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoveDevice {
    /// The device's id (`vm.add-disk`'s answer, or the config's).
    id: String,
}

/// The device endpoints' requests (PUT, each with its body).
async fn device_request(
    ep: &str,
    id: String,
    req: Request<Incoming>,
) -> Result<ApiRequest, ApiError> {
    Ok(match ep {
        // the descriptors are the connection's: `handle` adds them
        "vm.add-net" => ApiRequest::AddNet {
            id,
            net: Box::new(body_json(req).await?),
            fds: fds::Received::default(),
        },
        "vm.add-disk" => ApiRequest::AddDisk {
            id,
            disk: Box::new(body_json(req).await?),
        },
        "vm.add-fs" => ApiRequest::AddFs {
            id,
            fs: Box::new(body_json(req).await?),
        },
        "vm.add-vsock" => ApiRequest::AddVsock {
            id,
            vsock: Box::new(body_json(req).await?),
        },
        _ => {
            let body: RemoveDevice = body_json(req).await?;
            ApiRequest::RemoveDevice {
                id,
                device: body.id,
            }
        }
    })
}

/// Routes a request: its [`ApiRequest`], or the error that says which
/// path, verb, id or body field is wrong.
pub async fn parse(req: Request<Incoming>) -> Result<ApiRequest, ApiError> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    if path == "/metrics" {
        if method != Method::GET {
            return Err(ApiError::status(405, "GET /metrics"));
        }
        let openmetrics = req
            .headers()
            .get("accept")
            .and_then(|a| a.to_str().ok())
            .is_some_and(|a| a.contains("application/openmetrics-text"));
        return Ok(ApiRequest::Metrics { openmetrics });
    }
    if path == "/api/v1/vms" {
        if method != Method::GET {
            return Err(ApiError::status(405, "GET /api/v1/vms"));
        }
        return Ok(ApiRequest::List);
    }
    let Some((id, ep)) = route(&path) else {
        return Err(ApiError::status(404, format!("no such endpoint: {path}")));
    };
    if !valid_id(&id) {
        return Err(ApiError::bad(
            "id",
            format!("{id:?} is not a VM id (1-64 of A-Z a-z 0-9 - _)"),
        ));
    }
    let want = |m: Method| -> Result<(), ApiError> {
        if method == m {
            Ok(())
        } else {
            Err(ApiError::status(
                405,
                format!("{ep} takes {m}, not {method}"),
            ))
        }
    };
    let (get, put) = (Method::GET, Method::PUT);
    Ok(match ep.as_str() {
        "vmm.ping" if path == "/api/v1/vmm.ping" => want(get).map(|_| ApiRequest::Ping)?,
        "vmm.shutdown" if path == "/api/v1/vmm.shutdown" => {
            want(put).map(|_| ApiRequest::VmmShutdown)?
        }
        "vm.create" => {
            want(put)?;
            let config = Box::new(body_json(req).await?);
            ApiRequest::Create { id, config }
        }
        "vm.resize" => {
            want(put)?;
            let resize = body_json(req).await?;
            ApiRequest::Resize { id, resize }
        }
        "vm.add-net" | "vm.add-disk" | "vm.add-fs" | "vm.add-vsock" | "vm.remove-device" => {
            want(put)?;
            device_request(&ep, id, req).await?
        }
        "vm.boot" => want(put).map(|_| ApiRequest::Boot { id })?,
        "vm.info" => want(get).map(|_| ApiRequest::Info { id })?,
        "vm.counters" => want(get).map(|_| ApiRequest::Counters { id })?,
        "vm.pause" => want(put).map(|_| ApiRequest::Pause { id })?,
        "vm.resume" => want(put).map(|_| ApiRequest::Resume { id })?,
        "vm.shutdown" => want(put).map(|_| ApiRequest::Shutdown { id })?,
        "vm.reboot" => want(put).map(|_| ApiRequest::Reboot { id })?,
        "vm.delete" => want(put).map(|_| ApiRequest::Delete { id })?,
        _ => {
            if let Some((_, why)) = CH_ABSENT.iter().find(|(e, _)| *e == ep) {
                return Err(ApiError::status(
                    501,
                    format!("{ep}: Cloud Hypervisor's endpoint, not implemented here: {why}"),
                ));
            }
            return Err(ApiError::status(404, format!("no such endpoint: {path}")));
        }
    })
}

/// The request with the descriptors that came with it (`SCM_RIGHTS`, in
/// `received`): `vm.add-net` takes them; any other request that brought
/// some is refused, and they are closed.
fn with_fds(
    parsed: Result<ApiRequest, ApiError>,
    received: fds::Received,
    path: &str,
) -> Result<ApiRequest, ApiError> {
    let mut r = parsed?;
    if let ApiRequest::AddNet { fds, .. } = &mut r {
        *fds = received;
        return Ok(r);
    }
    if received.fds.is_empty() && !received.too_many {
        return Ok(r);
    }
    Err(ApiError::status(
        400,
        format!(
            "{path}: {} file descriptor(s) came with this request (SCM_RIGHTS), but it takes \
             none; send a tap's descriptors with vm.add-net only (they were closed)",
            received.fds.len()
        ),
    ))
}

/// Answers one request on a connection whose received descriptors are in
/// `stash`. Never panics on input; every failure is a JSON error body.
pub async fn handle(
    ctl: Arc<Controller>,
    stash: SharedStash,
    req: Request<Incoming>,
) -> Result<HttpResponse, std::convert::Infallible> {
    let t0 = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let parsed = parse(req).await;
    // Whatever the route and the outcome, the request takes (and so
    // closes, unless a VM keeps them) the descriptors that came with it,
    // its body read: none is left for the next request.
    let received = fds::take(&stash);
    let reply = match with_fds(parsed, received, &path) {
        Ok(r) => ctl.handle(r).await,
        Err(e) => Err(e),
    };
    let resp = match reply {
        Ok(a) => respond(a),
        Err(e) => {
            tracing::info!(%method, %path, status = e.status, error = %e.error, "api error");
            error_response(&e)
        }
    };
    ctl.api_metrics().observe(
        endpoint_label(&path),
        resp.status().as_u16(),
        t0.elapsed().as_secs_f64(),
    );
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_route_to_a_vm_and_an_endpoint() {
        assert_eq!(
            route("/api/v1/vm.boot"),
            Some((DEFAULT_VM.into(), "vm.boot".into()))
        );
        assert_eq!(
            route("/api/v1/vms/web1/vm.info"),
            Some(("web1".into(), "vm.info".into()))
        );
        assert_eq!(route("/api/v1/vms/web1"), None);
        assert_eq!(route("/metrics"), None);
        assert!(valid_id("a-b_C9") && !valid_id("") && !valid_id("bad%id"));
        assert!(!valid_id(&"x".repeat(65)));
        assert_eq!(endpoint_label("/api/v1/vms/x/vm.boot"), "vm.boot");
        assert_eq!(endpoint_label("/api/v1/vm.boot"), "vm.boot");
        assert_eq!(endpoint_label("/metrics"), "/metrics");
        assert_eq!(endpoint_label("/api/v1/nonsense"), "other");
    }

    #[test]
    fn answers_become_responses() {
        assert_eq!(respond(Answer::Done).status(), 204);
        let r = respond(Answer::Json(serde_json::json!({"a": 1})));
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "application/json");
        let e = error_response(&ApiError::bad("cpus", "no"));
        assert_eq!(e.status(), 400);
    }
}
