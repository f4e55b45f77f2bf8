//! The shared hot types are where the docs say: each alone on its
//! [`CACHE_PAD`]-byte block, so no two of them share a cache line pair.

use std::mem::{align_of, size_of};

use crate::CACHE_PAD;

fn padded<T>(name: &str) {
    assert_eq!(align_of::<T>(), CACHE_PAD, "{name} alignment");
    assert_eq!(
        size_of::<T>() % CACHE_PAD,
        0,
        "{name} size {}",
        size_of::<T>()
    );
}

#[test]
fn hot_types_are_padded() {
    use crate::cpupri::{CpuPriCount, CpuPriMask, CpuPriSlot};
    use crate::group_load::{GroupSum, NodeLoad};
    use crate::idle::{GlobalIdle, IdleLlcCount, LlcIdle};
    use crate::rq::{CpuHot, RqLock, WakeListHead};
    use crate::rto::{FlatRootDomain, RootDomainRead, RtoNodeCount, RtoNodeFlag, RtoNodeMask};
    use crate::shared_rq::Shard;
    use crate::stats::CpuStats;
    padded::<CpuPriCount>("CpuPriCount");
    padded::<CpuPriMask>("CpuPriMask");
    padded::<CpuPriSlot>("CpuPriSlot");
    padded::<RtoNodeCount>("RtoNodeCount");
    padded::<RtoNodeFlag>("RtoNodeFlag");
    padded::<RtoNodeMask>("RtoNodeMask");
    padded::<RootDomainRead>("RootDomainRead");
    padded::<FlatRootDomain>("FlatRootDomain");
    padded::<Shard>("Shard");
    padded::<LlcIdle>("LlcIdle");
    padded::<IdleLlcCount>("IdleLlcCount");
    padded::<GlobalIdle>("GlobalIdle");
    padded::<GroupSum>("GroupSum");
    padded::<NodeLoad>("NodeLoad");
    padded::<RqLock>("RqLock");
    padded::<CpuHot>("CpuHot");
    padded::<WakeListHead>("WakeListHead");
    padded::<CpuStats>("CpuStats");
    padded::<crate::tasks::Task>("Task");
}

#[test]
fn small_hot_types_fit_one_block() {
    use crate::cpupri::{CpuPriCount, CpuPriMask, CpuPriSlot};
    use crate::rq::{CpuHot, WakeListHead};
    // one block each: no field spills into a neighbour's block
    assert_eq!(size_of::<CpuPriCount>(), CACHE_PAD);
    assert_eq!(size_of::<CpuPriSlot>(), CACHE_PAD);
    assert_eq!(
        size_of::<CpuPriMask>(),
        CACHE_PAD,
        "a 1024-CPU mask is 128 bytes"
    );
    assert_eq!(size_of::<WakeListHead>(), CACHE_PAD);
    assert_eq!(size_of::<CpuHot>(), CACHE_PAD);
}

#[test]
fn baseline_layouts_pack_hot_and_cold_together() {
    use crate::cpupri::FlatVec;
    // the baseline cpupri level is not padded: count and mask share a line
    // and consecutive levels touch
    assert_eq!(align_of::<FlatVec>(), 8);
    assert_eq!(size_of::<FlatVec>(), 8 + 128);
    let off_mask = std::mem::offset_of!(FlatVec, mask);
    assert!(off_mask < 64, "count and first mask word on one line");
    use crate::rto::FlatRootDomain;
    let c = std::mem::offset_of!(FlatRootDomain, rto_count);
    let s = std::mem::offset_of!(FlatRootDomain, span);
    assert!(
        c / 64 == s / 64,
        "rto_count shares its line with the read-mostly span"
    );
}
