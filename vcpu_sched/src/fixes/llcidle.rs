//! Fix 4: per-LLC idle tracking.
//!
//! WHAT: The machine-wide idle mask and idle count become one mask and
//! count per LLC ([`LlcIdle`]), kept with that LLC's data, plus one global
//! count of LLCs that have an idle CPU ([`IdleLlcCount`]) which changes only
//! when an LLC goes from 0 to 1 idle CPUs or from 1 to 0.
//!
//! WHY: A CPU enters the idle set when it goes idle and leaves it soon
//! after a tick finds it busy ([`crate::idle`], as Linux's nohz idle set), so with
//! hundreds of CPUs the global mask and count are written hundreds of
//! times per tick period, and every busy CPU's tick reads them to decide
//! whether idle balancing is worth a kick: on 2-socket machines those
//! lines live in transit between the sockets.
//!
//! HOW: A CPU updates its own LLC's count and mask, lines shared only inside
//! the LLC. Only the first CPU of an LLC to go idle and the last to leave
//! touch the global count. "Any idle CPU?" reads the global count;
//! "an idle CPU near X" walks X's LLC, then the LLCs of X's node, then the
//! rest, skipping LLCs whose count is zero. An LLC with a single CPU
//! collapses: its mask bit is the CPU's idle state, and no per-LLC count is
//! kept, since it would only repeat that bit.
//!
//! The global count can be transiently off (an LLC's 0->1 increment may land
//! after another CPU's 1->0 decrement of a later idle period), even below
//! zero; it is exact whenever no CPU is between its per-LLC update and its
//! global update. Readers treat it as a hint, `> 0` meaning "worth a look".
//! The loom tests check both properties.

use crate::cpumask::{AtomicCpuMask, CpuMask};
use crate::sync::{AtomicI32, Ordering};
use crate::task::CpuId;
use crate::topo::TopoMap;

/// One LLC's idle CPUs and their number, on lines of their own.
#[repr(align(128))]
pub struct LlcIdle {
    pub(crate) count: AtomicI32,
    pub(crate) mask: AtomicCpuMask,
    /// A single-CPU LLC keeps no count.
    pub(crate) single: bool,
}

/// The number of LLCs with at least one idle CPU, on its own lines.
#[repr(align(128))]
pub struct IdleLlcCount {
    pub(crate) n: AtomicI32,
}

/// Per-LLC idle tracking for a whole machine.
pub struct LlcIdleSet {
    pub(crate) llcs: Box<[LlcIdle]>,
    pub(crate) nr_idle_llcs: IdleLlcCount,
    /// For each node, its LLCs; for each LLC, its node.
    node_llcs: Box<[Box<[u32]>]>,
    llc_node: Box<[u32]>,
}

impl LlcIdleSet {
    /// Every LLC of `map`; all CPUs idle if `all_idle`.
    pub fn new(map: &TopoMap, all_idle: bool) -> Self {
        let llcs: Box<[LlcIdle]> = (0..map.nllcs() as u32)
            .map(|l| {
                let cpus = map.llc_cpus(l);
                let x = LlcIdle {
                    count: AtomicI32::new(0),
                    mask: AtomicCpuMask::new(),
                    single: cpus.len() == 1,
                };
                if all_idle {
                    for &c in cpus {
                        x.mask.set(c, Ordering::Relaxed);
                    }
                    if !x.single {
                        x.count.store(cpus.len() as i32, Ordering::Relaxed);
                    }
                }
                x
            })
            .collect();
        let mut llc_node = vec![0u32; map.nllcs()];
        for n in 0..map.nnodes() as u32 {
            for &l in map.node_llcs(n) {
                llc_node[l as usize] = n;
            }
        }
        Self {
            nr_idle_llcs: IdleLlcCount {
                n: AtomicI32::new(if all_idle { llcs.len() as i32 } else { 0 }),
            },
            llcs,
            node_llcs: (0..map.nnodes() as u32)
                .map(|n| map.node_llcs(n).to_vec().into_boxed_slice())
                .collect(),
            llc_node: llc_node.into(),
        }
    }

    pub(crate) fn enter(&self, cpu: CpuId, llc: u32) {
        let l = &self.llcs[llc as usize];
        l.mask.set(cpu, Ordering::Release);
        if l.single || l.count.fetch_add(1, Ordering::AcqRel) == 0 {
            self.nr_idle_llcs.n.fetch_add(1, Ordering::AcqRel);
        }
    }

    pub(crate) fn exit(&self, cpu: CpuId, llc: u32) {
        let l = &self.llcs[llc as usize];
        if l.single || l.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.nr_idle_llcs.n.fetch_sub(1, Ordering::AcqRel);
        }
        l.mask.clear(cpu, Ordering::Release);
    }

    #[inline]
    pub(crate) fn any(&self) -> bool {
        self.nr_idle_llcs.n.load(Ordering::Acquire) > 0
    }

    #[inline]
    fn llc_has_idle(&self, llc: u32, within: &CpuMask) -> bool {
        let l = &self.llcs[llc as usize];
        if l.single {
            l.mask.any_in(within, Ordering::Acquire)
        } else {
            l.count.load(Ordering::Acquire) > 0
        }
    }

    /// The CPUs of `within` (inside LLC `llc`) that the LLC's mask names
    /// idle; `None` when its count says none, without reading the mask.
    #[inline]
    pub(crate) fn candidates_in_llc(&self, llc: u32, within: &CpuMask) -> Option<CpuMask> {
        if !self.llc_has_idle(llc, within) {
            return None;
        }
        Some(self.llcs[llc as usize].mask.and(within, Ordering::Acquire))
    }

    pub(crate) fn find_other_llcs(
        &self,
        skip: u32,
        allowed: &CpuMask,
        llc_span: &[CpuMask],
        live: &dyn Fn(CpuId) -> bool,
    ) -> Option<CpuId> {
        let home = self.llc_node[skip as usize] as usize;
        let nodes = self.node_llcs.len();
        for k in 0..nodes {
            for &l in self.node_llcs[(home + k) % nodes].iter() {
                if l == skip {
                    continue;
                }
                let within = allowed.and(&llc_span[l as usize]);
                if within.is_empty() {
                    continue;
                }
                let found = self
                    .candidates_in_llc(l, &within)
                    .and_then(|m| m.iter().find(|&c| live(c)));
                if found.is_some() {
                    return found;
                }
            }
        }
        None
    }

    pub(crate) fn is_idle(&self, cpu: CpuId, llc: u32) -> bool {
        self.llcs[llc as usize].mask.test(cpu, Ordering::Acquire)
    }

    /// The global count of LLCs with idle CPUs (a hint; see the module docs).
    pub fn nr_idle_llcs(&self) -> i32 {
        self.nr_idle_llcs.n.load(Ordering::Acquire)
    }

    /// Count of LLC `llc` (the mask population for a single-CPU LLC).
    pub fn llc_count(&self, llc: u32) -> i32 {
        let l = &self.llcs[llc as usize];
        if l.single {
            l.mask.load(Ordering::Acquire).count() as i32
        } else {
            l.count.load(Ordering::Acquire)
        }
    }

    pub(crate) fn check_consistent(&self, llc_span: &[CpuMask]) -> Result<u32, String> {
        let mut idle_llcs = 0;
        let mut total = 0;
        for (i, l) in self.llcs.iter().enumerate() {
            let m = l.mask.load(Ordering::Acquire);
            if !m.is_subset(&llc_span[i]) {
                return Err(format!("LLC {i} idle mask {m} has CPUs of other LLCs"));
            }
            let n = m.count() as i32;
            if !l.single && l.count.load(Ordering::Acquire) != n {
                return Err(format!(
                    "LLC {i} idle count {} but its mask {m} has {n} CPUs",
                    l.count.load(Ordering::Acquire)
                ));
            }
            idle_llcs += (n > 0) as i32;
            total += n as u32;
        }
        let g = self.nr_idle_llcs.n.load(Ordering::Acquire);
        if g != idle_llcs {
            return Err(format!(
                "global count of LLCs with idle CPUs is {g} but {idle_llcs} LLCs have one"
            ));
        }
        Ok(total)
    }
}
