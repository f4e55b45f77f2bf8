//! Workarounds for kvm_pvm, a software KVM without VMX/SVM.
//!
//! kvm_pvm runs an unmodified guest kernel through KVM's x86 instruction
//! emulator, which lacks some instructions Linux uses in ring 0, and it
//! hangs in a few paravirtual paths. The workarounds, in order of
//! preference:
//!
//! 1. **Hide CPU features** in the guest CPUID so the kernel never takes the
//!    path: CX16 (CMPXCHG16B in the slab allocator), SMAP (CLAC/STAC),
//!    POPCNT, XSAVE (XRSTOR64 at FPU init), RDRAND/RDSEED, FSGSBASE, PCID/
//!    INVPCID, PKU, the PMU (whose drivers patch static calls through INT3
//!    after boot), and the PV spinlock kick
//!    (`KVM_FEATURE_PV_UNHALT`, whose `vmcall` kick was seen to spin
//!    forever). kvm_pvm ignores some CPUID bits (XSAVE, POPCNT, ...), so:
//! 2. **Kernel command-line items** clear them inside the guest as well:
//!    `noxsave`, `clearcpuid=` with the feature numbers (numbers work
//!    without `CONFIG_X86_FEATURE_NAMES`), and items that keep the
//!    emulated boot from tripping over its own slowness (`tsc=reliable`,
//!    `nowatchdog`, RCU stall warnings off, `no_timer_check`).
//! 3. **An instruction assist** for the two exits hiding cannot avoid,
//!    both reported as emulation failures with the instruction bytes:
//!    `INT3` (the alternatives self-test executes one): the VMM advances RIP
//!    past the 1-byte instruction and injects #BP, which is exactly what
//!    the instruction does; `FWAIT` (in `fpu__drop()` at every task exit):
//!    with all x87 exceptions masked it is a no-op, so RIP advances by one.
//!
//! [`CompatMode::None`] does none of this: on hardware KVM the assist can
//! never trigger (INT3 does not go through the emulator there), and the
//! CPUID and command line stay untouched.

use std::path::Path;

use topology::cpuid::CpuidSet;
use tracing::info;

use crate::cpuid::{clear_bit, KVM_FEATURES_LEAF, KVM_FEATURE_PV_UNHALT};

/// The user's choice (`--compat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompatArg {
    /// kvm_pvm workarounds if `/sys/module/kvm_pvm` exists.
    #[default]
    Auto,
    /// Always apply the kvm_pvm workarounds.
    Pvm,
    /// Never apply them.
    None,
}

/// The resolved mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompatMode {
    /// Hardware KVM: nothing to work around.
    None,
    /// kvm_pvm workarounds on.
    Pvm,
}

/// Where the kvm_pvm module shows itself.
pub const PVM_SYSFS: &str = "/sys/module/kvm_pvm";

/// Is `/dev/kvm` kvm_pvm?
pub fn pvm_loaded() -> bool {
    Path::new(PVM_SYSFS).exists()
}

impl std::str::FromStr for CompatArg {
    type Err = String;
    /// `auto`, `pvm` or `none` (any case).
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(CompatArg::Auto),
            "pvm" => Ok(CompatArg::Pvm),
            "none" => Ok(CompatArg::None),
            _ => Err(format!("{s:?} is not auto, pvm or none")),
        }
    }
}

impl CompatArg {
    /// Resolves `auto` by looking at the host, and logs the decision.
    pub fn resolve(self) -> CompatMode {
        let mode = match self {
            CompatArg::Auto if pvm_loaded() => CompatMode::Pvm,
            CompatArg::Auto => CompatMode::None,
            CompatArg::Pvm => CompatMode::Pvm,
            CompatArg::None => CompatMode::None,
        };
        match (self, mode) {
            (CompatArg::Auto, CompatMode::Pvm) => info!(
                "--compat auto: {PVM_SYSFS} exists, applying the kvm_pvm workarounds \
                 (hidden CPUID features, extra kernel command line, INT3 assist)"
            ),
            (CompatArg::Auto, CompatMode::None) => {
                info!("--compat auto: hardware KVM, no workarounds")
            }
            (_, m) => info!("--compat {self:?}: mode {m:?}"),
        }
        mode
    }
}

/// CPUID feature bits hidden under kvm_pvm: (leaf, subleaf, register,
/// bit, Linux feature number for `clearcpuid=`, name).
const HIDDEN: &[(u32, u32, usize, u32, u32, &str)] = &[
    (1, 0, 2, 13, 4 * 32 + 13, "cx16"),
    (1, 0, 2, 17, 4 * 32 + 17, "pcid"),
    (1, 0, 2, 23, 4 * 32 + 23, "popcnt"),
    (1, 0, 2, 26, 4 * 32 + 26, "xsave"),
    (1, 0, 2, 30, 4 * 32 + 30, "rdrand"),
    (7, 0, 1, 0, 9 * 32, "fsgsbase"),
    (7, 0, 1, 10, 9 * 32 + 10, "invpcid"),
    (7, 0, 1, 18, 9 * 32 + 18, "rdseed"),
    (7, 0, 1, 20, 9 * 32 + 20, "smap"),
    (7, 0, 2, 3, 16 * 32 + 3, "pku"),
];

impl CompatMode {
    /// Hides what kvm_pvm cannot run (see the module docs).
    pub fn adjust_cpuid(self, set: &mut CpuidSet) {
        if self == CompatMode::None {
            return;
        }
        for &(leaf, sub, reg, bit, _, _) in HIDDEN {
            clear_bit(set, leaf, sub, reg, bit);
        }
        // OSXSAVE follows XSAVE.
        clear_bit(set, 1, 0, 2, 27);
        clear_bit(set, KVM_FEATURES_LEAF, 0, 0, KVM_FEATURE_PV_UNHALT);
        // No PMU: its drivers patch static calls through INT3 after boot,
        // and probe MSRs one emulated access at a time. Intel: leaf 0xA;
        // AMD: PerfCtrExtCore (0x8000_0001 ECX 23) and PerfMonV2
        // (0x8000_0022 EAX 0).
        if set.get(0xa, 0).is_some() {
            let e = set.entry(0xa, 0);
            (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0);
        }
        clear_bit(set, 0x8000_0001, 0, 2, 23);
        clear_bit(set, 0x8000_0022, 0, 0, 0);
    }

    /// Kernel command-line items this mode adds (before the user's own, so
    /// that the user can override them).
    pub fn cmdline_items(self) -> Vec<String> {
        if self == CompatMode::None {
            return Vec::new();
        }
        let clear: Vec<String> = HIDDEN.iter().map(|h| h.4.to_string()).collect();
        vec![
            "noxsave".into(),
            format!("clearcpuid={}", clear.join(",")),
            // The emulated TSC looks unstable to a watchdog that itself
            // runs 1000x slower than real time.
            "tsc=reliable".into(),
            "nowatchdog".into(),
            "rcupdate.rcu_cpu_stall_suppress=1".into(),
            "no_timer_check".into(),
        ]
    }

    /// Whether the instruction assist (INT3, FWAIT) is on.
    pub fn assist(self) -> bool {
        self == CompatMode::Pvm
    }
}

/// What the assist did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assist {
    /// Skip `len` bytes: the instruction has no effect here.
    Skip {
        /// Instruction length.
        len: u64,
    },
    /// Skip `len` bytes and inject exception `vector` (a trap: RIP already
    /// points after the instruction).
    SkipAndInject {
        /// Instruction length.
        len: u64,
        /// Exception vector.
        vector: u8,
    },
}

/// Decides the assist for an emulation failure on instruction bytes
/// `insn`, or `None` when this is not an instruction the assist handles.
pub fn assist_for(insn: &[u8]) -> Option<Assist> {
    match insn.first() {
        // INT3: a trap-type #BP after the instruction.
        Some(0xcc) => Some(Assist::SkipAndInject { len: 1, vector: 3 }),
        // FWAIT: with no unmasked x87 exception pending (the kernel masks
        // them all), it does nothing.
        Some(0x9b) => Some(Assist::Skip { len: 1 }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology::cpuid::{CpuidEntry, CpuidSet};

    #[test]
    fn pvm_hides_features_none_keeps_them() {
        let base = CpuidSet::new(vec![
            CpuidEntry {
                function: 1,
                ecx: u32::MAX,
                ..Default::default()
            },
            CpuidEntry {
                function: 7,
                flags: 1,
                ebx: u32::MAX,
                ..Default::default()
            },
            CpuidEntry {
                function: KVM_FEATURES_LEAF,
                eax: 0xff,
                ..Default::default()
            },
        ]);
        let mut s = base.clone();
        CompatMode::None.adjust_cpuid(&mut s);
        assert_eq!(s, base);
        assert!(CompatMode::None.cmdline_items().is_empty());
        assert!(!CompatMode::None.assist());
        CompatMode::Pvm.adjust_cpuid(&mut s);
        let ecx = s.get(1, 0).unwrap().ecx;
        for bit in [13, 23, 26, 27] {
            assert_eq!(ecx & (1 << bit), 0, "bit {bit}");
        }
        assert_eq!(s.get(7, 0).unwrap().ebx & (1 << 20), 0);
        assert_eq!(s.get(KVM_FEATURES_LEAF, 0).unwrap().eax, 0x7f);
        let items = CompatMode::Pvm.cmdline_items();
        assert!(items.contains(&"noxsave".to_string()));
        assert!(items.contains(&"clearcpuid=141,145,151,154,158,288,298,306,308,515".to_string()));
    }

    #[test]
    fn int3_assist_only() {
        assert_eq!(
            assist_for(&[0xcc, 0x90]),
            Some(Assist::SkipAndInject { len: 1, vector: 3 })
        );
        assert_eq!(assist_for(&[0x9b]), Some(Assist::Skip { len: 1 }));
        assert_eq!(assist_for(&[0xf3, 0x0f, 0xb8, 0xc0]), None); // popcnt
        assert_eq!(assist_for(&[]), None);
    }
}
