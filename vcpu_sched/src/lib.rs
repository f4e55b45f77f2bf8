//! # vcpu_sched
//!
//! Places and schedules vCPU threads on host CPUs. (Work in progress: the
//! core arrives with the scheduler issue.)
