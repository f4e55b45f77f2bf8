//! The six contention fixes, one file each, each opening with WHAT / WHY /
//! HOW. The baseline each one replaces lives with the data structure it
//! changes ([`crate::cpupri`], [`crate::rto`], [`crate::shared_rq`],
//! [`crate::idle`], [`crate::wakelist`] plus the wakeup path in
//! [`crate::sched`], [`crate::group_load`]). Each is switched by one field
//! of [`crate::Mitigations`].

pub mod cpupri;
pub mod grpload;
pub mod l2wake;
pub mod llcidle;
pub mod rto;
pub mod shardrq;
