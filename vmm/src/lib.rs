//! # vmm
//!
//! A KVM virtual machine monitor whose vCPUs are placed and scheduled by
//! [`vcpu_sched`], on hosts described by [`topology`].
//!
//! The binary's entry points live in [`cli`].

pub mod cli;
