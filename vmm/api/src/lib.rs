//! `vmm serve`: a Cloud Hypervisor-compatible REST API over a Unix socket.
//!
//! WHAT: a long-running server (tokio, hyper HTTP/1.1 on a
//! `UnixListener`) that creates, boots, inspects, shuts down and deletes
//! many VMs while others run, speaks CH's paths, verbs, field names and
//! status codes under `/api/v1/`, and serves Prometheus text at
//! `/metrics` ([`metrics`]). Request bodies are in [`api`].
//!
//! Several VMs on CH's one-VM API: the CH paths (`/api/v1/vm.boot`) act on
//! the VM named `default`; `/api/v1/vms/{id}/vm.boot` acts on VM `{id}`
//! (ids: 1-64 of `[A-Za-z0-9_-]`), and `GET /api/v1/vms` lists them.
//!
//! WHY: operators (and Kata's clh driver) drive VMMs through this API; one
//! process for many VMs is what a shared scheduler needs.
//!
//! HOW: as Cloud Hypervisor goes from `api/http` to `ApiRequest` to its
//! VMM, a request goes from [`http`] (routing: method, path and body into
//! an [`ApiRequest`]) to the [`Controller`] (the VM lifecycle, no HTTP
//! type), which keeps the VM table ([`vms`]) behind one lock, taken only
//! to read or flip a record: file checks ([`files`]), boots ([`guests`])
//! and stops run on tokio's blocking pool with the lock let go. The
//! server owns one `VcpuPool`: one `vcpu_sched` scheduler over the
//! server's topology and mitigations, with its workers and clock, started
//! with the server. Each booted VM is a `VmSet` attached to that pool (its
//! vCPUs become tasks, the VM a task group) and detached at shutdown,
//! while the other VMs run on: every VM shares the one scheduler and its
//! fixes. `--executor host` runs each VM on plain 1:1 threads instead
//! (the baseline, no `vcpu_sched`). [`server`] ties the socket
//! ([`socket`]: taken and removed only when provably the server's), the
//! runtime and the signals together.
//!
//! Modules, each importing only those listed before it: [`options`],
//! [`api`] (with [`devices`], its device fields, and [`defaults`], CH's
//! fields it takes only at their defaults, beside it), [`files`], [`fds`] (descriptors received with a request), [`socket`], [`guests`], [`vms`], [`device_ids`], [`metrics`],
//! [`controller`], [`hotplug`] (devices added and removed: the
//! controller's methods for them), [`http`], [`server`].

pub mod admission;
pub mod api;
pub mod controller;
pub mod defaults;
pub mod device_ids;
pub mod devices;
pub mod error;
pub mod fds;
pub mod files;
pub mod guests;
pub mod hotplug;
pub mod http;
pub mod metrics;
pub mod options;
pub mod server;
pub mod socket;
pub mod vms;

pub use admission::admit;
pub use controller::{Answer, ApiRequest, Controller, Outcome};
pub use guests::{ExitCounts, EXIT_REASONS};
pub use http::{parse_body, DEFAULT_VM, MAX_BODY, ROUTES};
pub use options::{ServeError, ServeOptions};
pub use server::serve;
pub use vms::{VmRecord, VmState};
