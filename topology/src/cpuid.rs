//! Per-vCPU CPUID with the topology and cache leaves rewritten.
//!
//! The VMM starts from what KVM supports (`KVM_GET_SUPPORTED_CPUID`); the
//! `cpuid-dump` command starts from this machine's raw CPUID. Either way the
//! leaves that describe topology and caches are replaced with ones computed
//! from the [`GuestTopology`]'s APIC layout:
//!
//! | vendor | leaves |
//! |---|---|
//! | both | 0x1 (initial APIC ID, logical count, HTT, x2APIC), 0xB |
//! | Intel | 0x4 (cache sharing, cores per package), 0x1F (with dies) |
//! | AMD | 0x8000_0001 ECX (TopologyExtensions, CmpLegacy), 0x8000_0008 ECX, 0x8000_001D, 0x8000_001E |
//!
//! Cache "sharing" counts are reported as the power of two that spans the
//! cache's APIC field (`1 << shift`), as real parts do. Linux and hwloc derive
//! a cache's ID as `apic >> ceil(log2(sharing))` (or `apic / sharing`), and
//! both agree with the layout only when that count is a power of two.
//!
//! AMD has no die level in leaf 0xB, and neither hwloc 2.9 nor Linux 6.1
//! read AMD's own 0x8000_0026. Both do read a die-type level (type 5) in
//! leaf 0xB whatever the vendor, so an AMD guest with several dies per
//! package gets one there; with one die per package, 0xB is what AMD parts
//! report.

use serde::Serialize;

use crate::guest::{ApicLayout, GuestCounts, GuestTopology};
use crate::host::CacheInfo;

/// KVM's `KVM_CPUID_FLAG_SIGNIFCANT_INDEX`: the entry depends on ECX.
pub const FLAG_INDEX: u32 = 1;

/// One CPUID leaf (function) and sub-leaf (index) with its outputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CpuidEntry {
    /// EAX input.
    pub function: u32,
    /// ECX input (meaningful when `flags & FLAG_INDEX`).
    pub index: u32,
    /// [`FLAG_INDEX`] or 0.
    pub flags: u32,
    /// EAX output.
    pub eax: u32,
    /// EBX output.
    pub ebx: u32,
    /// ECX output.
    pub ecx: u32,
    /// EDX output.
    pub edx: u32,
}

/// A CPU vendor encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Vendor {
    /// GenuineIntel.
    Intel,
    /// AuthenticAMD.
    Amd,
}

const INTEL: [u32; 3] = [0x756e_6547, 0x6c65_746e, 0x4965_6e69]; // ebx, ecx, edx
const AMD: [u32; 3] = [0x6874_7541, 0x444d_4163, 0x6974_6e65];

impl std::str::FromStr for Vendor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "intel" => Ok(Vendor::Intel),
            "amd" => Ok(Vendor::Amd),
            _ => Err(format!("unknown vendor {s:?}: use host, intel or amd")),
        }
    }
}

impl std::fmt::Display for Vendor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Vendor::Intel => "intel",
            Vendor::Amd => "amd",
        })
    }
}

/// A set of CPUID entries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CpuidSet {
    entries: Vec<CpuidEntry>,
}

impl CpuidSet {
    /// Wraps entries.
    pub fn new(entries: Vec<CpuidEntry>) -> Self {
        Self { entries }
    }
    /// All entries.
    pub fn entries(&self) -> &[CpuidEntry] {
        &self.entries
    }
    /// Consumes the set.
    pub fn into_entries(self) -> Vec<CpuidEntry> {
        self.entries
    }
    /// The entry the CPU would answer for `(function, index)`.
    pub fn get(&self, function: u32, index: u32) -> Option<&CpuidEntry> {
        self.entries
            .iter()
            .find(|e| e.function == function && (e.flags & FLAG_INDEX == 0 || e.index == index))
    }
    /// Mutable access to an entry, created (zeroed) if missing.
    pub fn entry(&mut self, function: u32, index: u32) -> &mut CpuidEntry {
        let pos = self.entries.iter().position(|e| {
            e.function == function && (e.flags & FLAG_INDEX == 0 || e.index == index)
        });
        match pos {
            Some(p) => &mut self.entries[p],
            None => {
                self.entries.push(CpuidEntry {
                    function,
                    index,
                    ..Default::default()
                });
                self.entries.last_mut().unwrap()
            }
        }
    }
    /// Removes every sub-leaf of `function`.
    pub fn remove(&mut self, function: u32) {
        self.entries.retain(|e| e.function != function);
    }
    /// Adds an entry, replacing one with the same inputs.
    pub fn put(&mut self, e: CpuidEntry) {
        self.entries
            .retain(|x| !(x.function == e.function && x.index == e.index));
        self.entries.push(e);
    }
    /// The vendor from leaf 0, if it is Intel or AMD.
    pub fn vendor(&self) -> Option<Vendor> {
        let l0 = self.get(0, 0)?;
        let regs = [l0.ebx, l0.ecx, l0.edx];
        if regs == INTEL {
            Some(Vendor::Intel)
        } else if regs == AMD {
            Some(Vendor::Amd)
        } else {
            None
        }
    }
    /// Sorts by (function, index): a stable order for dumps and diffs.
    pub fn sort(&mut self) {
        self.entries.sort_by_key(|e| (e.function, e.index));
    }
}

/// Leaves whose output depends on ECX, with how many sub-leaves to read at
/// most when enumerating raw CPUID.
fn indexed_leaf(function: u32) -> Option<u32> {
    match function {
        0x4 | 0x8000_001D => Some(16),
        0x7 | 0x14 | 0x17 | 0x18 | 0x1D | 0x1E | 0x20 | 0x23 | 0x24 => Some(8),
        0xB | 0x1F | 0x8000_0026 => Some(8),
        0xD => Some(64),
        0xF | 0x10 | 0x12 | 0x8000_0020 => Some(8),
        _ => None,
    }
}

/// This machine's raw CPUID, basic and extended ranges, with sub-leaves.
#[cfg(target_arch = "x86_64")]
pub fn host_cpuid() -> CpuidSet {
    use std::arch::x86_64::__cpuid_count;
    let raw = |f: u32, i: u32| {
        let r = __cpuid_count(f, i);
        (r.eax, r.ebx, r.ecx, r.edx)
    };
    let mut out = Vec::new();
    let mut range = |start: u32| {
        let (max, ..) = raw(start, 0);
        if max < start || max > start + 0x100 {
            return;
        }
        for f in start..=max {
            match indexed_leaf(f) {
                None => {
                    let (eax, ebx, ecx, edx) = raw(f, 0);
                    out.push(CpuidEntry {
                        function: f,
                        index: 0,
                        flags: 0,
                        eax,
                        ebx,
                        ecx,
                        edx,
                    });
                }
                Some(n) => {
                    for i in 0..n {
                        let (eax, ebx, ecx, edx) = raw(f, i);
                        let end = match f {
                            0x4 | 0x8000_001D => eax & 0x1f == 0,
                            0xB | 0x1F | 0x8000_0026 => i > 0 && (ecx >> 8) & 0xff == 0,
                            _ => i > 0 && eax == 0 && ebx == 0 && ecx == 0 && edx == 0,
                        };
                        out.push(CpuidEntry {
                            function: f,
                            index: i,
                            flags: FLAG_INDEX,
                            eax,
                            ebx,
                            ecx,
                            edx,
                        });
                        if end {
                            break;
                        }
                    }
                }
            }
        }
    };
    range(0);
    range(0x8000_0000);
    CpuidSet::new(out)
}

/// Cache descriptor in the common layout of Intel leaf 4 and AMD
/// 0x8000_001D (they differ only in EAX[31:26]).
fn cache_regs(
    level: u32,
    kind: u32,
    info: CacheInfo,
    sharing_shift: u32,
    inclusive: bool,
) -> (u32, u32, u32, u32) {
    let line = if info.line_size == 0 {
        64
    } else {
        info.line_size
    };
    let default_ways = if level == 3 { 16 } else { 8 };
    let mut ways = if info.ways == 0 {
        default_ways
    } else {
        info.ways
    };
    let lines = (info.size / line as u64).max(1);
    // Choose an associativity that divides the size exactly, so that
    // line * ways * sets reproduces the size.
    while ways > 1 && lines % ways as u64 != 0 {
        ways -= 1;
    }
    let sets = (lines / ways as u64).max(1) as u32;
    let sharing = (1u32 << sharing_shift).min(4096);
    let eax = kind | (level << 5) | (1 << 8) | ((sharing - 1) << 14);
    let ebx = (line - 1) | ((ways - 1) << 22);
    let ecx = sets - 1;
    let edx = if inclusive { 0b10 } else { 0 };
    (eax, ebx, ecx, edx)
}

/// One cache as the descriptor leaves (Intel 4, AMD 0x8000_001D) list it:
/// level, type (1 data, 2 instruction, 3 unified), geometry, the APIC shift
/// of the CPUs that share it, and whether it is inclusive.
type CacheDesc = (u32, u32, CacheInfo, u32, bool);

/// What one vCPU's rewritten leaves are computed from.
struct LeafInputs {
    /// The vCPU's x2APIC ID.
    apic: u32,
    /// The vCPU's die within its package.
    die: u32,
    layout: ApicLayout,
    counts: GuestCounts,
    /// Largest number of vCPUs in one package.
    per_pkg: u32,
    /// Largest number of vCPUs in one die.
    per_die: u32,
    /// Threads of this vCPU's own core (at least 1).
    core_threads: u32,
    /// L1d, L1i, L2 and L3, in the order the descriptor leaves list them.
    caches: [CacheDesc; 4],
}

impl GuestTopology {
    /// CPUID for vCPU `vcpu`: `base` with the topology and cache leaves
    /// rewritten in `vendor`'s encoding (see the module docs). If `vendor`
    /// differs from `base`'s, the vendor string, family/model signature and
    /// brand string are replaced so that software takes the right code path.
    pub fn cpuid(&self, vcpu: usize, base: &CpuidSet, vendor: Vendor) -> CpuidSet {
        let mut s = base.clone();
        let inp = self.leaf_inputs(vcpu);
        if s.vendor() != Some(vendor) {
            set_vendor_identity(&mut s, vendor);
        }
        raise_max_leaves(&mut s, vendor);
        set_leaf1(&mut s, &inp);
        match vendor {
            Vendor::Intel => intel_leaves(&mut s, &inp),
            Vendor::Amd => amd_leaves(&mut s, &inp),
        }
        s.sort();
        s
    }

    /// Gathers what vCPU `vcpu`'s leaves need from the guest.
    fn leaf_inputs(&self, vcpu: usize) -> LeafInputs {
        let l = *self.layout();
        let caches = *self.caches();
        // A guest's caches are filled from DEFAULT_CACHES where its source
        // has none, so only the L3 can be missing (never, in practice).
        let l3 = caches
            .l3
            .unwrap_or(crate::guest::DEFAULT_CACHES.l3.unwrap());
        LeafInputs {
            apic: self.cpu(vcpu).apic_id,
            die: self.cpu(vcpu).die,
            layout: l,
            counts: *self.counts(),
            per_pkg: self.max_cpus_per_package(),
            per_die: self.max_cpus_per_die(),
            // ThreadsPerComputeUnit of this vCPU's own core: a guest of a
            // host whose cores differ in threads (a hybrid part, or what an
            // XML file says) has cores of more than one size
            core_threads: self.smt_siblings(vcpu).len().max(1) as u32,
            caches: [
                (1, 1, caches.l1d.unwrap(), l.smt_shift(), false),
                (1, 2, caches.l1i.unwrap(), l.smt_shift(), false),
                (2, 3, caches.l2.unwrap(), l.l2_shift(), false),
                (3, 3, l3, l.llc_shift(), true),
            ],
        }
    }

    /// Largest number of vCPUs in one die.
    pub fn max_cpus_per_die(&self) -> u32 {
        let mut counts = std::collections::HashMap::new();
        for c in self.cpus() {
            *counts.entry((c.package, c.die)).or_insert(0u32) += 1;
        }
        counts.values().copied().max().unwrap_or(1)
    }
}

/// Makes `s` claim `vendor`: the vendor string of leaf 0, a family/model
/// signature in leaf 1 and a brand string in 0x8000_0002..4.
fn set_vendor_identity(s: &mut CpuidSet, vendor: Vendor) {
    let (regs, signature, brand) = match vendor {
        // Family 6 model 0x8F (Sapphire Rapids), family 0x19 model
        // 0x11 (Genoa): families that take the modern topology paths.
        Vendor::Intel => (INTEL, 0x0008_06F8, "Intel(R) Xeon(R) CPU (vmm guest)"),
        Vendor::Amd => (AMD, 0x00A1_0F11, "AMD EPYC Processor (vmm guest)"),
    };
    let l0 = s.entry(0, 0);
    l0.ebx = regs[0];
    l0.ecx = regs[1];
    l0.edx = regs[2];
    s.entry(1, 0).eax = signature;
    let mut bytes = [0u8; 48];
    bytes[..brand.len()].copy_from_slice(brand.as_bytes());
    for (k, f) in (0x8000_0002u32..=0x8000_0004).enumerate() {
        let w = |j: usize| {
            let o = k * 16 + j * 4;
            u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]])
        };
        s.put(CpuidEntry {
            function: f,
            index: 0,
            flags: 0,
            eax: w(0),
            ebx: w(1),
            ecx: w(2),
            edx: w(3),
        });
    }
}

/// Raises the highest basic and extended leaves (leaf 0 and 0x8000_0000
/// EAX) so that the leaves written below are in range.
fn raise_max_leaves(s: &mut CpuidSet, vendor: Vendor) {
    let need_basic = match vendor {
        Vendor::Intel => 0x1F,
        Vendor::Amd => 0xB,
    };
    let l0 = s.entry(0, 0);
    l0.eax = l0.eax.max(need_basic);
    let need_ext = match vendor {
        Vendor::Intel => 0x8000_0008,
        Vendor::Amd => 0x8000_001E,
    };
    let e0 = s.entry(0x8000_0000, 0);
    e0.eax = e0.eax.max(need_ext);
}

/// Leaf 1: initial APIC ID, addressable logical CPUs, HTT, x2APIC.
fn set_leaf1(s: &mut CpuidSet, inp: &LeafInputs) {
    let addressable = (1u32 << inp.layout.package_shift()).min(255);
    let l1 = s.entry(1, 0);
    l1.ebx = (l1.ebx & 0x0000_ffff) | ((inp.apic & 0xff) << 24) | (addressable << 16);
    if addressable > 1 {
        l1.edx |= 1 << 28;
    } else {
        l1.edx &= !(1 << 28);
    }
    l1.ecx |= 1 << 21;
}

/// The levels of an extended topology leaf (0xB, 0x1F) as (type, shift,
/// CPU count): SMT, then core up to the die and die up to the package
/// (`with_die`), or core up to the package.
fn ext_levels(inp: &LeafInputs, with_die: bool) -> Vec<(u32, u32, u32)> {
    let l = &inp.layout;
    let mut v = vec![(1, l.smt_shift(), inp.counts.threads_per_core)];
    if with_die {
        v.push((2, l.die_shift(), inp.per_die));
        v.push((5, l.package_shift(), inp.per_pkg));
    } else {
        v.push((2, l.package_shift(), inp.per_pkg));
    }
    v
}

/// Replaces extended topology leaf `leaf` (0xB or 0x1F) with `levels` and
/// the invalid level that ends the list.
fn put_ext_topology(s: &mut CpuidSet, leaf: u32, levels: Vec<(u32, u32, u32)>, apic: u32) {
    s.remove(leaf);
    for (i, &(ty, shift, count)) in levels.iter().enumerate() {
        s.put(CpuidEntry {
            function: leaf,
            index: i as u32,
            flags: FLAG_INDEX,
            eax: shift,
            ebx: count & 0xffff,
            ecx: (ty << 8) | i as u32,
            edx: apic,
        });
    }
    let n = levels.len() as u32;
    s.put(CpuidEntry {
        function: leaf,
        index: n,
        flags: FLAG_INDEX,
        eax: 0,
        ebx: 0,
        ecx: n,
        edx: apic,
    });
}

/// Replaces cache descriptor leaf `leaf` (Intel 4, AMD 0x8000_001D) with
/// `descs` and the null descriptor that ends the list. `eax_high` is OR-ed
/// into each descriptor's EAX (Intel's cores-per-package field).
fn put_cache_leaf(s: &mut CpuidSet, leaf: u32, descs: &[CacheDesc], eax_high: u32) {
    s.remove(leaf);
    for (i, &(level, kind, info, shift, incl)) in descs.iter().enumerate() {
        let (eax, ebx, ecx, edx) = cache_regs(level, kind, info, shift, incl);
        s.put(CpuidEntry {
            function: leaf,
            index: i as u32,
            flags: FLAG_INDEX,
            eax: eax | eax_high,
            ebx,
            ecx,
            edx,
        });
    }
    s.put(CpuidEntry {
        function: leaf,
        index: descs.len() as u32,
        flags: FLAG_INDEX,
        ..Default::default()
    });
}

/// Intel's encoding: 0xB without dies, 0x1F with them, caches in leaf 4;
/// AMD-only leaves and bits off.
fn intel_leaves(s: &mut CpuidSet, inp: &LeafInputs) {
    let l = &inp.layout;
    put_ext_topology(s, 0xB, ext_levels(inp, false), inp.apic);
    put_ext_topology(
        s,
        0x1F,
        ext_levels(inp, inp.counts.dies_per_package > 1),
        inp.apic,
    );
    let cores = ((1u32 << (l.package_shift() - l.smt_shift())) - 1).min(63);
    put_cache_leaf(s, 4, &inp.caches, cores << 26);
    s.remove(0x8000_001D);
    s.remove(0x8000_001E);
    s.remove(0x8000_0026);
    if let Some(e) = s.entries.iter_mut().find(|e| e.function == 0x8000_0001) {
        e.ecx &= !((1 << 22) | (1 << 1));
    }
}

/// AMD's encoding: 0xB (with a die level when there are several),
/// TopologyExtensions and CmpLegacy, 0x8000_0008 ECX, caches in
/// 0x8000_001D and the core/die IDs in 0x8000_001E; Intel-only leaves off.
fn amd_leaves(s: &mut CpuidSet, inp: &LeafInputs) {
    let l = &inp.layout;
    let dies = inp.counts.dies_per_package;
    put_ext_topology(s, 0xB, ext_levels(inp, dies > 1), inp.apic);
    s.remove(0x1F);
    s.remove(4);
    s.remove(0x8000_0026);
    let e = s.entry(0x8000_0001, 0);
    e.ecx |= 1 << 22; // TopologyExtensions
    if inp.per_pkg > 1 {
        e.ecx |= 1 << 1; // CmpLegacy
    } else {
        e.ecx &= !(1 << 1);
    }
    let e = s.entry(0x8000_0008, 0);
    e.ecx = (e.ecx & !0xf0ff) | (l.package_shift().min(15) << 12) | (inp.per_pkg - 1).min(255);
    put_cache_leaf(s, 0x8000_001D, &inp.caches, 0);
    s.put(CpuidEntry {
        function: 0x8000_001E,
        index: 0,
        flags: 0,
        eax: inp.apic,
        ebx: ((inp.core_threads - 1) << 8) | ((inp.apic >> l.smt_shift()) & 0xff),
        ecx: (((dies - 1).min(7)) << 8) | (inp.die & 0xff),
        edx: 0,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(vendor: Vendor) -> CpuidSet {
        let regs = if vendor == Vendor::Intel { INTEL } else { AMD };
        CpuidSet::new(vec![
            CpuidEntry {
                function: 0,
                eax: 0x10,
                ebx: regs[0],
                ecx: regs[1],
                edx: regs[2],
                ..Default::default()
            },
            CpuidEntry {
                function: 1,
                eax: 0x806f8,
                ..Default::default()
            },
            CpuidEntry {
                function: 0x8000_0000,
                eax: 0x8000_0008,
                ..Default::default()
            },
            CpuidEntry {
                function: 0x8000_0008,
                ecx: 0x3_0000,
                ..Default::default()
            },
        ])
    }

    #[test]
    fn intel_leaves() {
        let g = GuestTopology::from_spec("package:2 die:3 l3:1 l2:3 core:1 pu:2").unwrap();
        let s = g.cpuid(7, &base(Vendor::Intel), Vendor::Intel);
        let apic = g.cpu(7).apic_id;
        assert_eq!(apic, 0b01001);
        let l1 = s.get(1, 0).unwrap();
        assert_eq!(l1.ebx >> 24, apic);
        assert_eq!((l1.ebx >> 16) & 0xff, 32);
        assert_ne!(l1.edx & (1 << 28), 0);
        // 0x1F: SMT (shift 1, 2 threads), core (shift 3, 6 per die), die (shift 5, 18 per package).
        let lv = |i| s.get(0x1F, i).copied().unwrap();
        assert_eq!((lv(0).eax, lv(0).ebx, lv(0).ecx), (1, 2, 0x100));
        assert_eq!((lv(1).eax, lv(1).ebx, lv(1).ecx), (3, 6, 0x201));
        assert_eq!((lv(2).eax, lv(2).ebx, lv(2).ecx), (5, 18, 0x502));
        assert_eq!((lv(3).eax, lv(3).ebx, lv(3).ecx), (0, 0, 3));
        assert_eq!(lv(1).edx, apic);
        // 0xB has no die level.
        assert_eq!(s.get(0xB, 1).unwrap().eax, 5);
        assert_eq!(s.get(0xB, 2).unwrap().ecx >> 8, 0);
        // Leaf 4: L2 shared by 2 (one core), L3 by 8 (die), 31 cores per package.
        let l2 = s.get(4, 2).unwrap();
        assert_eq!((l2.eax >> 5) & 7, 2);
        assert_eq!(((l2.eax >> 14) & 0xfff) + 1, 2);
        let l3 = s.get(4, 3).unwrap();
        assert_eq!(((l3.eax >> 14) & 0xfff) + 1, 8);
        assert_eq!(l3.eax >> 26, 15);
        assert_eq!(s.get(4, 4).unwrap().eax & 0x1f, 0);
        assert!(s.get(0, 0).unwrap().eax >= 0x1f);
    }

    #[test]
    fn amd_leaves_and_vendor_switch() {
        let g = GuestTopology::from_spec("genoa-2s").unwrap();
        // An Intel base turned into AMD: vendor string and family change.
        let s = g.cpuid(200, &base(Vendor::Intel), Vendor::Amd);
        assert_eq!(s.vendor(), Some(Vendor::Amd));
        assert_eq!(s.get(1, 0).unwrap().eax, 0x00A1_0F11);
        let apic = g.cpu(200).apic_id;
        // vCPU 200 = package 1, CCD 0, core 4, thread 0.
        assert_eq!(apic, 0x100 | (4 << 1));
        let e = s.get(0x8000_001E, 0).unwrap();
        assert_eq!(e.eax, apic);
        assert_eq!(e.ebx, (1 << 8) | ((apic >> 1) & 0xff));
        assert_eq!(e.ecx, 0);
        assert_ne!(s.get(0x8000_0001, 0).unwrap().ecx & (1 << 22), 0);
        let e8 = s.get(0x8000_0008, 0).unwrap();
        assert_eq!((e8.ecx >> 12) & 0xf, 8);
        assert_eq!(e8.ecx & 0xff, 191);
        assert_eq!(e8.ecx & 0x3_0000, 0x3_0000, "other bits kept");
        let l3 = s.get(0x8000_001D, 3).unwrap();
        assert_eq!(((l3.eax >> 14) & 0xfff) + 1, 16);
        let size = |e: &CpuidEntry| {
            ((e.ebx & 0xfff) + 1) as u64
                * (((e.ebx >> 12) & 0x3ff) + 1) as u64
                * ((e.ebx >> 22) + 1) as u64
                * (e.ecx + 1) as u64
        };
        assert_eq!(size(l3), 32 << 20);
        assert!(s.get(4, 0).is_none());
        assert!(s.get(0x1F, 0).is_none());
        // 0xB: SMT then core to the package.
        assert_eq!(s.get(0xB, 1).unwrap().eax, 8);
        assert_eq!(s.get(0xB, 1).unwrap().ebx, 192);
        assert!(s.get(0x8000_0000, 0).unwrap().eax >= 0x8000_001E);
    }

    #[test]
    fn amd_dies_go_into_leaf_b() {
        let g = GuestTopology::from_spec("package:2 die:3 l3:1 l2:3 core:1 pu:2").unwrap();
        let s = g.cpuid(8, &base(Vendor::Amd), Vendor::Amd);
        assert_eq!(s.get(0xB, 2).unwrap().ecx >> 8, 5);
        assert_eq!(s.get(0x8000_001E, 0).unwrap().ecx, (2 << 8) | 1);
    }

    #[test]
    fn single_cpu_has_no_htt() {
        let g = GuestTopology::from_spec("package:1 core:1 pu:1").unwrap();
        for v in [Vendor::Intel, Vendor::Amd] {
            let s = g.cpuid(0, &base(v), v);
            assert_eq!(s.get(1, 0).unwrap().edx & (1 << 28), 0);
            assert_eq!(s.get(0xB, 0).unwrap().ebx, 1);
        }
    }

    #[test]
    fn host_cpuid_has_basics() {
        let h = host_cpuid();
        assert!(h.get(0, 0).is_some());
        assert!(h.get(1, 0).is_some());
    }
}
