//! # vmm
//!
//! The `vmm` command line: a KVM virtual machine monitor whose vCPUs are
//! placed and scheduled by [`vcpu_sched`], on hosts described by
//! [`topology`]. This crate parses what the user asks for and hands it to
//! the crates that do it:
//!
//! | crate | what |
//! |---|---|
//! | [`vmm_machine`] | the machine: KVM VM, vCPUs, memory, boot, ACPI, CPUID, devices, micro-guests, the vCPU body |
//! | [`vmm_api`] | `vmm serve`: the Cloud Hypervisor-compatible API, its VM controller and metrics |
//! | [`vmm_lab`] | `vmm bench`'s engine: the seeds' workloads as micro-guests on KVM |
//! | [`vcpu_sched`] | the scheduler, its executors, its synthetic workloads (`vmm sched-bench`) and placement (`vmm plan`, `--pin`, `--rt`) |
//! | `vmm-sim` | the simulator's own binary, which `vmm sim` runs |
//!
//! | module | what |
//! |---|---|
//! | [`args`] | the flag values every part parses (a leaf) |
//! | [`cli`] | one module per subcommand |
//! | [`config`] | `vmm run` flags and TOML files |
//! | [`exit`] | exit codes: the one table of whose fault an error is (0, 1, 2, 124) |
//!
//! The architecture is described in `docs/architecture.md`.

pub mod args;
pub mod cli;
pub mod config;
pub mod exit;
