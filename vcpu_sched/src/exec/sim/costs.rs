//! Cost tables: one per preset, each latency cited to a public
//! measurement, and one instruction-cost table shared by every variant.
//!
//! Latencies are one-way core-to-core cache-line transfer times (half a
//! CAS ping-pong round trip) in ns. A table can also come from a file
//! (`vmm sim --costs FILE.toml`, every field of [`CostTable`] by name):
//! `c2c --out DIR` writes `DIR/costs.toml`, the table of the machine it
//! ran on. "measured" means the number is a
//! published measurement of that machine; "estimated" means it stands in
//! from a neighbouring machine, with the reason. Levels a preset does not
//! have (a shared L2 on these parts, a die level on monolithic Intel
//! meshes) take the next level's figure.

/// How far apart two CPUs are, nearest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The same CPU.
    Same,
    /// SMT siblings.
    Smt,
    /// Sharing an L2.
    L2,
    /// Sharing an LLC (CCX on AMD, the mesh of a die on Intel).
    Llc,
    /// The same die, another LLC.
    Die,
    /// The same package, another die.
    Package,
    /// The other socket.
    Remote,
}

/// Transfer latencies of one machine, in ns.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostTable {
    /// An L1 hit.
    pub l1_hit_ns: u64,
    /// SMT sibling.
    pub smt_ns: u64,
    /// Another core sharing the L2.
    pub l2_ns: u64,
    /// Same LLC (CCX, or the mesh of one die).
    pub llc_ns: u64,
    /// Same die, other LLC.
    pub die_ns: u64,
    /// Same package, other die / CCD.
    pub package_ns: u64,
    /// The other socket.
    pub remote_ns: u64,
    /// A line nobody caches (DRAM).
    pub memory_ns: u64,
    /// Independent load misses one core keeps in flight (L1 miss
    /// buffers): consecutive loads of a call overlap in groups of this
    /// many. Estimated from the vendors' optimization manuals: 12 fill
    /// buffers on Skylake-derived cores (Cascade Lake, Ice Lake), 16 on
    /// Golden Cove and later (Sapphire, Granite Rapids), 22 on Zen 3/4.
    pub mlp: u32,
    /// How long a waiter for a held `std` mutex spins before it sleeps in
    /// the kernel (interleaved runs only): `std`'s futex mutex polls the
    /// lock 100 times with a spin-loop hint (PAUSE) between polls. AMD:
    /// 100 PAUSEs measured on this project's AMD EPYC development machine,
    /// 3.2 us (`c2c`'s "100 spin-loop hints" row: 3,194 ns in
    /// docs/data/c2c-2/tables.md; the first figure, 3.2 us, was taken
    /// before `c2c` had the row and kept in no file). Intel: the optimization
    /// manual's PAUSE latency since Skylake, "as many as 140 cycles" (Intel
    /// 64 and IA-32 Architectures Optimization Reference Manual, "Pause
    /// Latency in Skylake Microarchitecture"), at 2.5 GHz: 5.6 us
    /// (estimated: the clock is a round figure of these parts').
    pub lock_spin_ns: u64,
    /// What the releaser of a lock with a sleeping waiter pays for the
    /// wake syscall (interleaved runs only): one syscall, 240 ns measured
    /// with `perf bench syscall basic` on the development machine
    /// (docs/data/core-ops/linux.txt); estimated for every preset (no
    /// bare-metal figure of these parts found; under kvm_pvm a syscall is
    /// emulated, so this errs high).
    pub futex_wake_ns: u64,
    /// From that wake to the sleeper running its call again (interleaved
    /// runs only): one wakeup and context switch, 1,070 ns per switch in a
    /// published bare-metal pipe ping-pong (Linux 6.6, 11th-generation
    /// Core i7, <https://ddumbying.vercel.app/experiments/ctx-switch-overhead>);
    /// estimated for every preset.
    pub wakeup_ns: u64,
    /// What an executor adds to a switch between two tasks on one CPU
    /// (the incoming task's thread woken, the outgoing one parked), ns:
    /// charged before the picked task runs. 0 on every preset: the
    /// model's CPUs are hardware ones, whose switch is the `schedule`
    /// call the model charges. `c2c`'s `costs.toml` sets it for the
    /// machine it ran on, whose executors run each task or CPU as a host
    /// thread (a same-CPU `park`/`unpark` one-way).
    #[serde(default)]
    pub switch_ns: u64,
    /// What the waker pays to wake an idle CPU (on threads: a futex wake
    /// of a sleeping thread, the `unpark`), ns, added to the waking call.
    /// 0 on every preset (an IPI's send has no cited figure here yet).
    #[serde(default)]
    pub kick_ns: u64,
    /// From a kick's arrival at an idle CPU until it runs its `schedule`,
    /// ns: the exit from the shallow idle state every idle CPU is in. 0 on
    /// the presets unless `vmm sim --idle-states c1|deep` asks for their
    /// part's C1 ([`CostTable::c1_exit_of`]: the table the Linux kernel
    /// keeps per part, `intel_idle`'s `exit_latency`, Intel's worst-case
    /// figure; on AMD the C1 (`FFH MWAIT`) entry of the firmware's ACPI
    /// `_CST` that `acpi_idle` lists, estimated). `c2c` measures it for
    /// its own machine's executors as the cross-CPU wakeup of a sleeping
    /// thread less the same-CPU one and the waker's `unpark`.
    #[serde(default)]
    pub idle_exit_ns: u64,
    /// How long a CPU must have been idle (since its last `schedule`
    /// found nothing to run)
    /// before it is taken to be in the part's deepest core idle state,
    /// ns: that state's target residency, the shortest idle period for
    /// which the kernel's idle governor chooses it. The model's governor
    /// is an oracle (it picks the state the idle period turned out to
    /// deserve), which a real one (menu, teo) approximates from history.
    /// 0: no deep state (the presets, unless `vmm sim --idle-states
    /// deep`).
    #[serde(default)]
    pub deep_idle_after_ns: u64,
    /// Exit latency of that deep state, ns, in place of `idle_exit_ns`
    /// (0 with `deep_idle_after_ns`).
    #[serde(default)]
    pub deep_idle_exit_ns: u64,
}

/// The deepest core idle state of a preset's part: (target residency,
/// exit latency), ns ([`CostTable::deep_idle_after_ns`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeepIdle {
    /// Target residency.
    pub after_ns: u64,
    /// Exit latency.
    pub exit_ns: u64,
}

/// `CostTable::lock_spin_ns` on AMD parts (measured, see there).
const AMD_SPIN_NS: u64 = 3_200;
/// ... on Intel parts (estimated, see there).
const INTEL_SPIN_NS: u64 = 5_600;
/// `CostTable::futex_wake_ns` (see there).
const FUTEX_WAKE_NS: u64 = 240;
/// `CostTable::wakeup_ns` (see there).
const WAKEUP_NS: u64 = 1_070;
/// `CostTable::idle_exit_ns`: C1's `exit_latency` in Linux's `intel_idle`
/// tables for Ice Lake, Sapphire Rapids and Granite Rapids Xeons
/// (`icx_cstates`, `spr_cstates`, `gnr_cstates`: 1 us).
const INTEL_C1_NS: u64 = 1_000;
/// ... for Skylake-SP and Cascade Lake Xeons (`skx_cstates`: 2 us).
const SKX_C1_NS: u64 = 2_000;
/// ... on AMD EPYC: the C1 (`ACPI FFH MWAIT 0x0`) latency of the
/// firmware's `_CST`, 1 us as `acpi_idle` lists it (estimated: no
/// measurement of C1 alone found; the deepest state measures 5-15 us,
/// see [`CostTable::deep_idle_of`]).
const AMD_C1_NS: u64 = 1_000;

impl CostTable {
    /// Whether a table (from a file) can drive the model: every cost at
    /// least 1 ns, at least one miss buffer, a DRAM access no cheaper than
    /// an L1 hit. Farther levels may be cheaper than nearer ones (a
    /// machine may measure so); the model does not rely on the order.
    pub fn check(&self) -> Result<(), String> {
        let fields = [
            ("l1_hit_ns", self.l1_hit_ns),
            ("smt_ns", self.smt_ns),
            ("l2_ns", self.l2_ns),
            ("llc_ns", self.llc_ns),
            ("die_ns", self.die_ns),
            ("package_ns", self.package_ns),
            ("remote_ns", self.remote_ns),
            ("memory_ns", self.memory_ns),
            ("lock_spin_ns", self.lock_spin_ns),
            ("futex_wake_ns", self.futex_wake_ns),
            ("wakeup_ns", self.wakeup_ns),
        ];
        for (name, v) in fields {
            if !(1..=10_000_000).contains(&v) {
                return Err(format!("{name} = {v}: give 1..=10000000 ns"));
            }
        }
        for (name, v) in [
            ("switch_ns", self.switch_ns),
            ("kick_ns", self.kick_ns),
            ("idle_exit_ns", self.idle_exit_ns),
            ("deep_idle_after_ns", self.deep_idle_after_ns),
            ("deep_idle_exit_ns", self.deep_idle_exit_ns),
        ] {
            if v > 10_000_000 {
                return Err(format!(
                    "{name} = {v}: give 0..=10000000 ns (0: not charged)"
                ));
            }
        }
        if (self.deep_idle_after_ns == 0) != (self.deep_idle_exit_ns == 0) {
            return Err(format!(
                "deep_idle_after_ns = {} and deep_idle_exit_ns = {}: give both (a deep idle \
                 state's target residency and exit latency) or neither",
                self.deep_idle_after_ns, self.deep_idle_exit_ns
            ));
        }
        if self.mlp == 0 || self.mlp > 256 {
            return Err(format!("mlp = {}: give 1..=256 miss buffers", self.mlp));
        }
        if self.memory_ns < self.l1_hit_ns {
            return Err(format!(
                "memory_ns = {} is below l1_hit_ns = {}: a DRAM access cannot be cheaper than an L1 hit",
                self.memory_ns, self.l1_hit_ns
            ));
        }
        Ok(())
    }

    /// The delay a kick of a CPU idle for `idle_ns` adds before the CPU
    /// runs its `schedule`: the deep state's exit once the CPU has been
    /// idle past that state's target residency, else `idle_exit_ns`.
    pub fn idle_exit(&self, idle_ns: u64) -> u64 {
        if self.deep_idle_after_ns > 0 && idle_ns >= self.deep_idle_after_ns {
            self.deep_idle_exit_ns
        } else {
            self.idle_exit_ns
        }
    }

    /// The table with the deep idle state of `deep` (`None`: none; the
    /// CPUs idle in the shallow state only).
    pub fn with_deep_idle(self, deep: Option<DeepIdle>) -> Self {
        let d = deep.unwrap_or(DeepIdle {
            after_ns: 0,
            exit_ns: 0,
        });
        Self {
            deep_idle_after_ns: d.after_ns,
            deep_idle_exit_ns: d.exit_ns,
            ..self
        }
    }

    /// The exit latency of a preset's part's C1, ns (`vmm sim
    /// --idle-states c1|deep` puts it in the table's `idle_exit_ns`; the
    /// presets themselves charge no idle exit), or `None`.
    pub fn c1_exit_of(preset: &str) -> Option<u64> {
        Some(match preset {
            "gnr-2s" | "spr-2s" | "icx-2s" => INTEL_C1_NS,
            "clx-2s" => SKX_C1_NS,
            "genoa-2s" | "milan-2s" => AMD_C1_NS,
            _ => return None,
        })
    }

    /// The deepest core idle state of a preset's part, from the Linux
    /// kernel's per-part tables (`intel_idle`'s `skx_cstates` for Cascade
    /// Lake, `icx_cstates`, `spr_cstates`, `gnr_cstates`: C6's
    /// `target_residency` and `exit_latency`, the latter Intel's
    /// worst-case figure, measured with Intel's `wult` for Granite
    /// Rapids), or `None`. A Granite Rapids' package-level C6P is left
    /// out: it needs every core of the package idle. gVisor's engineers
    /// measured 150-230 us wakeups from C6 on Sapphire, Emerald and
    /// Granite Rapids and 5-15 us from the deepest state of AMD EPYC
    /// parts "despite similar advertised latencies" (google/gvisor pull
    /// request 14526, 2026-08-31): the AMD presets take 10 us (the middle
    /// of that range, measured) after 800 us (twice the 400 us C2
    /// latency an EPYC 7502P's firmware advertises in ACPI `_CST`,
    /// FreeBSD review D47444, as Linux's `acpi_idle` derives a target
    /// residency from a latency; estimated: firmwares differ).
    pub fn deep_idle_of(preset: &str) -> Option<DeepIdle> {
        let (after_us, exit_us) = match preset {
            "gnr-2s" => (650, 170),
            "spr-2s" => (800, 290),
            "icx-2s" => (600, 170),
            "clx-2s" => (600, 133),
            "genoa-2s" | "milan-2s" => (800, 10),
            _ => return None,
        };
        Some(DeepIdle {
            after_ns: after_us * 1000,
            exit_ns: exit_us * 1000,
        })
    }

    /// The transfer latency at `level`.
    pub fn transfer(&self, level: Level) -> u64 {
        match level {
            Level::Same => self.l1_hit_ns,
            Level::Smt => self.smt_ns,
            Level::L2 => self.l2_ns,
            Level::Llc => self.llc_ns,
            Level::Die => self.die_ns,
            Level::Package => self.package_ns,
            Level::Remote => self.remote_ns,
        }
    }

    /// Every cache latency scaled by `f` (sensitivity runs), L1 hits
    /// included; the lock costs (software and kernel paths, not line
    /// transfers) are kept.
    pub fn scaled(&self, f: f64) -> Self {
        let s = |x: u64| ((x as f64) * f).round().max(1.0) as u64;
        Self {
            l1_hit_ns: s(self.l1_hit_ns),
            smt_ns: s(self.smt_ns),
            l2_ns: s(self.l2_ns),
            llc_ns: s(self.llc_ns),
            die_ns: s(self.die_ns),
            package_ns: s(self.package_ns),
            remote_ns: s(self.remote_ns),
            memory_ns: s(self.memory_ns),
            mlp: self.mlp,
            ..*self
        }
    }

    /// The table of a topology preset (`test` is a round-number table for
    /// the model's own tests), or `None`.
    pub fn for_preset(name: &str) -> Option<Self> {
        Some(match name {
            // Granite Rapids: Xeon 6962P, SNC off, jhan-positron notebook
            // pass2_writeup.md §4.5 (2026-05-25): same socket 55-118 ns,
            // median 86 (measured); other socket median 247 (measured, 4
            // pairs). SMT not found: Ice Lake 8375C's 8 ns stands in
            // (estimated). L1 5 cycles (Chips and Cheese, Xeon 6 memory,
            // 2025-09-26) ~2 ns. DRAM: SPR's ~107 ns stands in (estimated).
            "gnr-2s" => Self::intel(8, 86, 247, 2, 107, 16),
            // Sapphire Rapids 2S: Chips and Cheese, "Core to core latency
            // data on large systems" (2023-11-07): within socket average 59
            // (measured), cross socket average 138 (measured). SMT not found:
            // Ice Lake's 8 stands in (estimated). DRAM ~107 ns (Chips and
            // Cheese, "A peek at Sapphire Rapids", 2023-03-12, measured).
            "spr-2s" => Self::intel(8, 59, 138, 2, 107, 16),
            // Ice Lake-SP 8375C 2S: nviennot/core-to-core-latency README:
            // SMT 8.1, same socket 51, other socket 108 (all measured).
            // DRAM: SPR's 107 stands in (estimated).
            "icx-2s" => Self::intel(8, 51, 108, 2, 107, 12),
            // Cascade Lake Gold 6242 2S: nviennot README: SMT 7.4, same
            // socket 48, other socket 136 (measured). L1 4 cycles (Velten et
            // al., ICPE'22) ~2 ns. DRAM: 107 stands in (estimated).
            "clx-2s" => Self::intel(7, 48, 136, 2, 107, 12),
            // Genoa EPYC 9274F 2S: nviennot issue #132: SMT 9, same CCX
            // 22-25 (24), other CCD 87-104 (95), other socket 187-202 (195)
            // (measured). L1 1.08 ns, DRAM ~110 ns (jhan-positron
            // pass1_outline.md §4.1, EPYC 9654, measured).
            "genoa-2s" => Self::amd(9, 24, 95, 195, 1, 110, 22),
            // Milan EPYC 7R13 2S: nviennot README: SMT 9.8, CCX 23, other
            // CCD on the line's home socket ~108, other socket 197
            // (measured). L1/DRAM: Genoa's stand in (estimated).
            "milan-2s" => Self::amd(10, 23, 108, 197, 1, 110, 22),
            "test" => Self {
                lock_spin_ns: 1_000,
                futex_wake_ns: 200,
                wakeup_ns: 1_000,
                ..Self::amd(5, 20, 60, 100, 1, 200, 4)
            },
            _ => return None,
        })
    }

    fn intel(smt: u64, socket: u64, remote: u64, l1: u64, mem: u64, mlp: u32) -> Self {
        Self {
            mlp,
            l1_hit_ns: l1,
            smt_ns: smt,
            l2_ns: smt,
            llc_ns: socket,
            die_ns: socket,
            package_ns: socket,
            remote_ns: remote,
            memory_ns: mem,
            lock_spin_ns: INTEL_SPIN_NS,
            futex_wake_ns: FUTEX_WAKE_NS,
            wakeup_ns: WAKEUP_NS,
            switch_ns: 0,
            kick_ns: 0,
            idle_exit_ns: 0,
            deep_idle_after_ns: 0,
            deep_idle_exit_ns: 0,
        }
    }

    fn amd(smt: u64, ccx: u64, ccd: u64, remote: u64, l1: u64, mem: u64, mlp: u32) -> Self {
        Self {
            mlp,
            l1_hit_ns: l1,
            smt_ns: smt,
            l2_ns: smt,
            llc_ns: ccx,
            die_ns: ccd,
            package_ns: ccd,
            remote_ns: remote,
            memory_ns: mem,
            lock_spin_ns: AMD_SPIN_NS,
            futex_wake_ns: FUTEX_WAKE_NS,
            wakeup_ns: WAKEUP_NS,
            switch_ns: 0,
            kick_ns: 0,
            idle_exit_ns: 0,
            deep_idle_after_ns: 0,
            deep_idle_exit_ns: 0,
        }
    }
}

/// Instruction time of the scheduler's entry points, ns, on top of their
/// memory accesses, shared by every variant and every preset: the
/// single-threaded, all-hits time per call, calibrated once on the
/// development machine with the `calibrate` bench (2026-11-26, then built
/// with the `sim` feature; now `cargo bench -p benches --bench calibrate`,
/// which links `vcpu_sched_sim`; docs/data/sim/calibrate.txt): the measured time
/// of a call less 2 ns per recorded access (its L1 hit and `per_access_ns`,
/// which the simulator charges on top), the mean of the baseline's and all
/// fixes' values. See docs/simulator.md, "Instruction costs".
#[derive(Clone, Copy, Debug)]
pub struct InstrCosts {
    /// `wake`.
    pub wake_ns: u64,
    /// `schedule`.
    pub schedule_ns: u64,
    /// `tick`.
    pub tick_ns: u64,
    /// Per recorded access (address generation, branches around it).
    pub per_access_ns: u64,
}

/// The one instruction-cost table.
pub const INSTR: InstrCosts = InstrCosts {
    // measured 148 (none) and 154 ns (all), less 2 x 48.5 and 2 x 49.5
    wake_ns: 53,
    // measured 142 and 141 ns, less 2 x 50.1
    schedule_ns: 42,
    // measured 18 and 20 ns, less 2 x 11: its accesses, charged at 2 ns
    // each, already cover the whole call (hits of a tight loop overlap)
    tick_ns: 0,
    per_access_ns: 1,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_pass_the_file_check_and_bad_tables_do_not() {
        for p in [
            "gnr-2s", "spr-2s", "icx-2s", "clx-2s", "genoa-2s", "milan-2s", "test",
        ] {
            CostTable::for_preset(p).unwrap().check().unwrap();
        }
        let ok = CostTable::for_preset("genoa-2s").unwrap();
        let e = CostTable { mlp: 0, ..ok }.check().unwrap_err();
        assert!(e.contains("mlp = 0"), "{e}");
        let e = CostTable { llc_ns: 0, ..ok }.check().unwrap_err();
        assert!(e.contains("llc_ns = 0"), "{e}");
        let e = CostTable { memory_ns: 0, ..ok }.check().unwrap_err();
        assert!(e.contains("memory_ns = 0"), "{e}");
        let e = CostTable {
            l1_hit_ns: 200,
            ..ok
        }
        .check()
        .unwrap_err();
        assert!(e.contains("below l1_hit_ns"), "{e}");
    }

    #[test]
    fn an_idle_cpu_exits_c1_until_the_deep_states_residency() {
        for p in [
            "gnr-2s", "spr-2s", "icx-2s", "clx-2s", "genoa-2s", "milan-2s",
        ] {
            // the presets charge no idle exit by themselves
            assert_eq!(CostTable::for_preset(p).unwrap().idle_exit_ns, 0, "{p}");
            let t = CostTable {
                idle_exit_ns: CostTable::c1_exit_of(p).unwrap(),
                ..CostTable::for_preset(p).unwrap()
            };
            // C1 only, whatever the idle time
            assert!((1_000..=2_000).contains(&t.idle_exit_ns), "{p}");
            assert_eq!(t.idle_exit(0), t.idle_exit_ns);
            assert_eq!(t.idle_exit(u64::MAX), t.idle_exit_ns);
            let d = CostTable::deep_idle_of(p).unwrap();
            let deep = t.with_deep_idle(Some(d));
            deep.check().unwrap();
            assert_eq!(deep.idle_exit(d.after_ns - 1), t.idle_exit_ns, "{p}");
            assert_eq!(deep.idle_exit(d.after_ns), d.exit_ns, "{p}");
            assert!(d.exit_ns > t.idle_exit_ns, "{p}");
            assert_eq!(deep.with_deep_idle(None), t);
        }
        assert_eq!(CostTable::deep_idle_of("test"), None);
        assert_eq!(CostTable::c1_exit_of("test"), None);
        let t = CostTable::for_preset("icx-2s").unwrap();
        let e = CostTable {
            deep_idle_after_ns: 600_000,
            ..t
        }
        .check()
        .unwrap_err();
        assert!(
            e.contains("deep_idle_exit_ns = 0") && e.contains("both"),
            "{e}"
        );
    }

    #[test]
    fn a_table_reads_back_by_field_name_and_refuses_unknown_fields() {
        let t = CostTable::for_preset("icx-2s").unwrap();
        let v = serde_json::to_value(t).unwrap();
        assert_eq!(v["llc_ns"], 51);
        assert_eq!(serde_json::from_value::<CostTable>(v.clone()).unwrap(), t);
        let mut extra = v.clone();
        extra["llc_nss"] = 3.into();
        let e = serde_json::from_value::<CostTable>(extra)
            .unwrap_err()
            .to_string();
        assert!(e.contains("llc_nss"), "{e}");
        // the executor costs and the idle states may be left out (0: not
        // charged)
        let mut older = v.clone();
        for f in [
            "switch_ns",
            "kick_ns",
            "idle_exit_ns",
            "deep_idle_after_ns",
            "deep_idle_exit_ns",
        ] {
            older.as_object_mut().unwrap().remove(f);
        }
        assert_eq!(serde_json::from_value::<CostTable>(older).unwrap(), t);
        let mut missing = v;
        missing.as_object_mut().unwrap().remove("mlp");
        let e = serde_json::from_value::<CostTable>(missing)
            .unwrap_err()
            .to_string();
        assert!(e.contains("mlp"), "{e}");
    }
}
