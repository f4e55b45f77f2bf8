//! Guest CPUID: what KVM supports, with the topology leaves from the
//! [`topology`] crate and KVM's paravirtual features advertised.
//!
//! The flow for each vCPU:
//! 1. `KVM_GET_SUPPORTED_CPUID` once per VM ([`supported`]), converted to a
//!    [`CpuidSet`];
//! 2. [`topology::GuestTopology::cpuid`] rewrites leaves 0x1/0x4/0xB/0x1F
//!    (Intel) or 0x8000_0001/08/1D/1E (AMD) for that vCPU's APIC ID;
//! 3. [`finish`] sets the hypervisor bit, TSC-deadline, the KVM signature
//!    leaves and the paravirtual features, and lets the compatibility mode
//!    hide what the hypervisor cannot run ([`crate::compat`]);
//! 4. [`to_kvm`] converts back for `KVM_SET_CPUID2`.
//!
//! ## Paravirtual features (leaf 0x4000_0001 EAX)
//!
//! KVM reports what it implements in its own supported CPUID. Everything
//! it reports is passed on, so a Linux guest uses kvm-clock
//! (`KVM_FEATURE_CLOCKSOURCE2` + `CLOCKSOURCE_STABLE_BIT`), PV EOI, PV IPIs,
//! PV TLB flush, PV sched yield, steal time, and PV spinlocks
//! (`KVM_FEATURE_PV_UNHALT`). None of them needs VMM-side setup beyond the
//! in-kernel LAPIC: the guest registers its MSRs itself. The
//! `KVM_HINTS_REALTIME` hint in EDX is left clear: it tells the guest its
//! vCPUs never get preempted, which only an operator can promise.

use kvm_bindings::{kvm_cpuid_entry2, CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Cap, Kvm};
use topology::cpuid::{CpuidEntry, CpuidSet, FLAG_INDEX};

/// KVM's signature leaf.
pub const KVM_SIGNATURE_LEAF: u32 = 0x4000_0000;
/// KVM's feature leaf.
pub const KVM_FEATURES_LEAF: u32 = 0x4000_0001;

/// Bits of leaf 0x4000_0001 EAX, with the names Linux uses.
pub const KVM_FEATURES: &[(u32, &str)] = &[
    (0, "clocksource"),
    (1, "nop-io-delay"),
    (3, "clocksource2"),
    (4, "async-pf"),
    (5, "steal-time"),
    (6, "pv-eoi"),
    (7, "pv-unhalt"),
    (9, "pv-tlb-flush"),
    (10, "async-pf-vmexit"),
    (11, "pv-send-ipi"),
    (12, "poll-control"),
    (13, "pv-sched-yield"),
    (14, "async-pf-int"),
    (15, "msi-ext-dest-id"),
    (16, "hc-map-gpa-range"),
    (17, "migration-control"),
    (24, "clocksource-stable"),
];

/// `KVM_FEATURE_PV_UNHALT`: PV spinlocks' kick.
pub const KVM_FEATURE_PV_UNHALT: u32 = 7;
/// `KVM_FEATURE_MSI_EXT_DEST_ID`: interrupts may target APIC IDs above
/// 255 without an IOMMU.
pub const KVM_FEATURE_MSI_EXT_DEST_ID: u32 = 15;

/// Names of the KVM paravirtual features set in `eax`.
pub fn pv_feature_names(eax: u32) -> Vec<&'static str> {
    KVM_FEATURES
        .iter()
        .filter(|(b, _)| eax & (1 << b) != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// What KVM supports, as a [`CpuidSet`].
pub fn supported(kvm: &Kvm) -> Result<CpuidSet, kvm_ioctls::Error> {
    let c = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)?;
    Ok(from_kvm(&c))
}

/// Converts KVM's representation.
pub fn from_kvm(c: &CpuId) -> CpuidSet {
    CpuidSet::new(
        c.as_slice()
            .iter()
            .map(|e| CpuidEntry {
                function: e.function,
                index: e.index,
                flags: e.flags & FLAG_INDEX,
                eax: e.eax,
                ebx: e.ebx,
                ecx: e.ecx,
                edx: e.edx,
            })
            .collect(),
    )
}

/// Converts to KVM's representation.
pub fn to_kvm(set: &CpuidSet) -> Result<CpuId, vmm_sys_util::fam::Error> {
    let entries: Vec<kvm_cpuid_entry2> = set
        .entries()
        .iter()
        .map(|e| kvm_cpuid_entry2 {
            function: e.function,
            index: e.index,
            flags: e.flags & FLAG_INDEX,
            eax: e.eax,
            ebx: e.ebx,
            ecx: e.ecx,
            edx: e.edx,
            ..Default::default()
        })
        .collect();
    CpuId::from_entries(&entries)
}

/// Host capabilities that decide some CPUID bits.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuidCaps {
    /// The in-kernel LAPIC supports the TSC-deadline timer.
    pub tsc_deadline: bool,
    /// The guest has APIC IDs above 254: advertise the extended
    /// destination ID, without which Linux (no interrupt remapping here)
    /// refuses CPUs whose x2APIC ID does not fit in 8 bits. KVM's in-kernel
    /// IOAPIC and MSI routing decode it.
    pub ext_dest_id: bool,
}

impl CpuidCaps {
    /// Asks KVM.
    pub fn probe(kvm: &Kvm) -> Self {
        Self {
            tsc_deadline: kvm.check_extension(Cap::TscDeadlineTimer),
            ext_dest_id: false,
        }
    }
}

/// Final touches on one vCPU's CPUID (see the module docs).
pub fn finish(set: &mut CpuidSet, caps: CpuidCaps) {
    let l1 = set.entry(1, 0);
    l1.ecx |= 1 << 31; // running under a hypervisor
    if caps.tsc_deadline {
        l1.ecx |= 1 << 24;
    }
    // KVM's signature: max leaf, "KVMKVMKVM\0\0\0". KVM's supported CPUID
    // normally has it already; make sure.
    let sig = set.entry(KVM_SIGNATURE_LEAF, 0);
    sig.eax = sig.eax.max(KVM_FEATURES_LEAF);
    sig.ebx = u32::from_le_bytes(*b"KVMK");
    sig.ecx = u32::from_le_bytes(*b"VMKV");
    sig.edx = u32::from_le_bytes(*b"M\0\0\0");
    // The features leaf is kept as KVM reported it (created empty if KVM
    // reported none).
    let f = set.entry(KVM_FEATURES_LEAF, 0);
    if caps.ext_dest_id {
        f.eax |= 1 << KVM_FEATURE_MSI_EXT_DEST_ID;
    }
    set.sort();
}

/// The PV features a CPUID set advertises.
pub fn pv_features(set: &CpuidSet) -> u32 {
    set.get(KVM_FEATURES_LEAF, 0).map(|e| e.eax).unwrap_or(0)
}

/// Clears `bit` of register `reg` (0=eax, 1=ebx, 2=ecx, 3=edx) of leaf
/// `(function, index)` if the leaf exists.
pub fn clear_bit(set: &mut CpuidSet, function: u32, index: u32, reg: usize, bit: u32) {
    if set.get(function, index).is_some() {
        let e = set.entry(function, index);
        let r = match reg {
            0 => &mut e.eax,
            1 => &mut e.ebx,
            2 => &mut e.ecx,
            _ => &mut e.edx,
        };
        *r &= !(1u32 << bit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_finish() {
        let set = CpuidSet::new(vec![
            CpuidEntry {
                function: 0,
                eax: 0xd,
                ..Default::default()
            },
            CpuidEntry {
                function: 1,
                ..Default::default()
            },
            CpuidEntry {
                function: 0xb,
                index: 1,
                flags: FLAG_INDEX,
                eax: 3,
                ..Default::default()
            },
            CpuidEntry {
                function: KVM_FEATURES_LEAF,
                eax: (1 << 3) | (1 << 5) | (1 << 7) | (1 << 24),
                ..Default::default()
            },
        ]);
        let k = to_kvm(&set).unwrap();
        assert_eq!(k.as_slice().len(), 4);
        assert_eq!(from_kvm(&k), set);
        let mut s = set.clone();
        finish(
            &mut s,
            CpuidCaps {
                tsc_deadline: true,
                ext_dest_id: false,
            },
        );
        let l1 = s.get(1, 0).unwrap();
        assert_ne!(l1.ecx & (1 << 31), 0);
        assert_ne!(l1.ecx & (1 << 24), 0);
        let sig = s.get(KVM_SIGNATURE_LEAF, 0).unwrap();
        let mut name = Vec::new();
        for r in [sig.ebx, sig.ecx, sig.edx] {
            name.extend_from_slice(&r.to_le_bytes());
        }
        assert_eq!(&name[..9], b"KVMKVMKVM");
        assert_eq!(
            pv_feature_names(pv_features(&s)),
            vec![
                "clocksource2",
                "steal-time",
                "pv-unhalt",
                "clocksource-stable"
            ]
        );
        clear_bit(&mut s, KVM_FEATURES_LEAF, 0, 0, KVM_FEATURE_PV_UNHALT);
        assert_eq!(pv_features(&s) & (1 << 7), 0);
        let mut t = set.clone();
        finish(
            &mut t,
            CpuidCaps {
                tsc_deadline: false,
                ext_dest_id: true,
            },
        );
        assert!(pv_feature_names(pv_features(&t)).contains(&"msi-ext-dest-id"));
        assert_eq!(t.get(1, 0).unwrap().ecx & (1 << 24), 0);
        // Clearing a bit of a missing leaf creates nothing.
        clear_bit(&mut s, 7, 0, 1, 20);
        assert!(s.get(7, 0).is_none());
    }

    #[test]
    fn kvm_supported_cpuid_has_pv_leaves() {
        let Some(kvm) = crate::test_kvm::kvm() else {
            return;
        };
        let s = supported(&kvm).unwrap();
        assert!(s.get(0, 0).is_some());
        let sig = s.get(KVM_SIGNATURE_LEAF, 0).expect("KVM signature leaf");
        assert_eq!(sig.ebx, u32::from_le_bytes(*b"KVMK"));
        assert_ne!(pv_features(&s), 0);
    }
}
