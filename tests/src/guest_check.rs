//! The checks shared by the boot tests: one [`BootCase`] is a guest shape
//! and how to boot it; [`check_boot`] judges the run against hwloc's view
//! of the shape (see [`crate::guest`]).

use std::path::Path;

use crate::guest::{
    expected_apic_ids, expected_spans, hwloc_view, parse_brought_up, parse_cpulist,
    parse_init_block, parse_node_memory, parse_sched_domains, parse_srat, HwlocView, VmmRun,
};

/// Is `/dev/kvm` kvm_pvm (where guest userspace cannot run)?
pub fn host_is_pvm() -> bool {
    Path::new("/sys/module/kvm_pvm").exists()
}

/// The host CPU vendor, which the guest gets unless `--vendor` says
/// otherwise.
pub fn host_vendor() -> &'static str {
    let s = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if s.contains("AuthenticAMD") {
        "amd"
    } else {
        "intel"
    }
}

/// One boot to check.
#[derive(Clone, Debug)]
pub struct BootCase<'a> {
    /// hwloc synthetic string.
    pub spec: &'a str,
    /// RAM in MiB.
    pub memory_mib: u64,
    /// `--vendor`, if any.
    pub vendor: Option<&'a str>,
    /// More `vmm run` arguments.
    pub extra: &'a [&'a str],
}

impl<'a> BootCase<'a> {
    /// The guest's CPUID vendor.
    pub fn vendor(&self) -> &'a str {
        match self.vendor {
            Some(v) => v,
            None => host_vendor(),
        }
    }

    /// The `vmm run` arguments: the kernel log at debug level with
    /// `sched_verbose`, stopped at the root domain under kvm_pvm, at the end
    /// of the `/init` block elsewhere.
    pub fn args(&self, kernel: &Path, initrd: Option<&Path>) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "run".into(),
            "--kernel".into(),
            kernel.display().to_string(),
            "--memory".into(),
            format!("{}M", self.memory_mib),
            "--guest".into(),
            self.spec.into(),
            "--cmdline".into(),
            "loglevel=8 sched_verbose".into(),
            "--timeout".into(),
            "14m".into(),
            "--until".into(),
            if host_is_pvm() {
                "root domain span".into()
            } else {
                "VMMTOPO END".into()
            },
        ];
        if let Some(i) = initrd {
            a.push("--initrd".into());
            a.push(i.display().to_string());
        }
        if let Some(v) = self.vendor {
            a.push("--vendor".into());
            a.push(v.into());
        }
        a.extend(self.extra.iter().map(|s| s.to_string()));
        a
    }
}

/// Node memory ranges the VMM documents: equal shares (multiples of 2 MiB,
/// the rest to the last node) laid out from 0, skipping 3-4 GiB.
/// Returns (first, last) address per node.
pub fn expected_node_memory(total: u64, nodes: u64) -> Vec<(u64, u64)> {
    let share = (total / nodes) / (2 << 20) * (2 << 20);
    let mut out = Vec::new();
    let mut addr = 0u64;
    for n in 0..nodes {
        let size = if n == nodes - 1 {
            total - share * (nodes - 1)
        } else {
            share
        };
        let first = addr;
        let mut left = size;
        while left > 0 {
            if (0xc000_0000..1 << 32).contains(&addr) {
                addr = 1 << 32;
            }
            let room = if addr < 0xc000_0000 {
                0xc000_0000 - addr
            } else {
                u64::MAX
            };
            let take = left.min(room);
            addr += take;
            left -= take;
        }
        out.push((first, addr - 1));
    }
    out
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
}

/// Checks a finished boot of `case` (see the module docs of the boot tests).
pub fn check_boot(case: &BootCase<'_>, r: &VmmRun) {
    let ctx = || r.context();
    assert_eq!(r.status, Some(0), "vmm run failed\n{}", ctx());
    assert!(!r.stderr.contains("panicked"), "{}", ctx());
    let log = &r.console;
    assert!(
        !log.contains("Kernel panic"),
        "the guest kernel panicked\n{}",
        ctx()
    );
    let v = hwloc_view(case.spec);
    let nodes = v.nodes.len().max(1) as u32;

    // smp: Brought up N nodes, M CPUs.
    let (bn, bc) =
        parse_brought_up(log).unwrap_or_else(|| panic!("no 'smp: Brought up'\n{}", ctx()));
    assert_eq!((bn, bc), (nodes, v.pus), "smp line\n{}", ctx());

    // SRAT: every expected APIC ID, on its PU's node.
    let ids = expected_apic_ids(&v);
    let srat = parse_srat(log);
    if nodes > 1 {
        assert_eq!(srat.len(), v.pus as usize, "SRAT lines\n{}", ctx());
        for (pu, &apic) in ids.iter().enumerate() {
            let (pxm, _, node) = srat
                .iter()
                .find(|s| s.1 == apic)
                .copied()
                .unwrap_or_else(|| panic!("no SRAT line for APIC {apic:#x} (PU {pu})\n{}", ctx()));
            assert_eq!(
                node,
                v.node_of(pu as u32),
                "node of APIC {apic:#x}\n{}",
                ctx()
            );
            assert_eq!(pxm, node, "PXM of APIC {apic:#x}\n{}", ctx());
        }
    }

    // Sched domains of every CPU. Linux 6.1 builds a CLS (L2) level only
    // from Intel's leaf 4; with AMD CPUID it has no L2 cluster ID.
    let cls = case.vendor() == "intel";
    let doms = parse_sched_domains(log);
    for cpu in 0..v.pus {
        let got = doms
            .get(&cpu)
            .unwrap_or_else(|| panic!("no sched domains for CPU{cpu}\n{}", ctx()));
        let spans: Vec<Vec<u32>> = got.iter().map(|d| d.span.clone()).collect();
        let want = expected_spans(&v, cpu, cls);
        assert_eq!(
            spans,
            want,
            "CPU{cpu} sched-domain spans ({got:?})\n{}",
            ctx()
        );
        for d in got {
            let expect_level = if d.span == sorted(v.set_of("Core", cpu)) {
                Some("SMT")
            } else if cls && d.span == sorted(v.set_of("L2Cache", cpu)) {
                Some("CLS")
            } else if d.span == sorted(v.set_of("L3Cache", cpu)) {
                Some("MC")
            } else if nodes > 1 && d.span.len() == v.pus as usize {
                Some("NUMA")
            } else if Some(&d.span)
                == v.nodes
                    .get(v.node_of(cpu) as usize)
                    .map(|n| sorted(n.clone()))
                    .as_ref()
            {
                // The node: 6.1's x86 DIE level spans the node (NODE when
                // a node is smaller than a package; PKG in newer kernels).
                Some("DIE|NODE|PKG")
            } else {
                None
            };
            if let Some(l) = expect_level {
                assert!(
                    l.split('|').any(|x| x == d.level),
                    "CPU{cpu} level of span {:?} is {}, expected {l}\n{}",
                    d.span,
                    d.level,
                    ctx()
                );
            }
        }
    }

    // Memory of each node.
    let mem = parse_node_memory(log);
    let want = expected_node_memory(case.memory_mib << 20, nodes as u64);
    assert_eq!(mem.len(), want.len(), "Initmem lines\n{}", ctx());
    for (n, &(first, last)) in want.iter().enumerate() {
        let (gf, gl) = mem[&(n as u32)];
        // Page 0 is never usable RAM.
        assert_eq!(gf, first.max(0x1000), "node {n} start\n{}", ctx());
        assert_eq!(gl, last, "node {n} end\n{}", ctx());
    }

    // The /init block: required where userspace runs.
    match parse_init_block(log) {
        Some(block) => check_init_block(case, &v, &block, ctx),
        None => assert!(
            host_is_pvm(),
            "no complete /init block, and this host's KVM runs guest userspace\n{}",
            ctx()
        ),
    }
}

/// Checks an `/init` block found in `log` against `case` (panics with the
/// reason when it does not match).
pub fn check_init_block_in(case: &BootCase<'_>, log: &str) {
    let v = hwloc_view(case.spec);
    let block = parse_init_block(log).expect("a complete /init block");
    check_init_block(case, &v, &block, || log.to_string());
}

fn check_init_block(
    case: &BootCase<'_>,
    v: &HwlocView,
    block: &[crate::guest::TopoRecord],
    ctx: impl Fn() -> String,
) {
    let nodes = v.nodes.len().max(1);
    let sys = block
        .iter()
        .find(|r| r.kind == "system")
        .expect("system record");
    assert_eq!(sys.get("cpus"), v.pus.to_string(), "{}", ctx());
    assert_eq!(sys.get("nodes"), nodes.to_string(), "{}", ctx());
    let packages: Vec<Vec<u32>> = {
        let mut p = v.sets.get("Package").cloned().unwrap_or_default();
        p.sort_by_key(|s| s[0]);
        p
    };
    let mut cores = std::collections::BTreeSet::new();
    for r in block.iter().filter(|r| r.kind == "cpu") {
        let id: u32 = r.get("id").parse().unwrap();
        let list = |k: &str| sorted(parse_cpulist(r.get(k)));
        assert_eq!(
            r.get("node"),
            v.node_of(id).to_string(),
            "cpu{id} node\n{}",
            ctx()
        );
        assert_eq!(
            list("thread_siblings_list"),
            sorted(v.set_of("Core", id)),
            "cpu{id} SMT\n{}",
            ctx()
        );
        assert_eq!(
            list("l2_shared_cpu_list"),
            sorted(v.set_of("L2Cache", id)),
            "cpu{id} L2\n{}",
            ctx()
        );
        assert_eq!(
            list("l3_shared_cpu_list"),
            sorted(v.set_of("L3Cache", id)),
            "cpu{id} L3\n{}",
            ctx()
        );
        assert_eq!(
            list("core_siblings_list"),
            sorted(v.set_of("Package", id)),
            "cpu{id} package\n{}",
            ctx()
        );
        let pkg = packages.iter().position(|p| p.contains(&id)).unwrap_or(0);
        assert_eq!(
            r.get("physical_package_id"),
            pkg.to_string(),
            "cpu{id} package id\n{}",
            ctx()
        );
        if v.sets.contains_key("Die") {
            assert_eq!(
                list("die_cpus_list"),
                sorted(v.set_of("Die", id)),
                "cpu{id} die\n{}",
                ctx()
            );
        }
        cores.insert((pkg, r.get("core_id").to_string()));
    }
    let want_cores = v
        .sets
        .get("Core")
        .map(|c| c.len())
        .unwrap_or(v.pus as usize);
    assert_eq!(
        cores.len(),
        want_cores,
        "distinct (package, core_id)\n{}",
        ctx()
    );
    let remote = case
        .extra
        .windows(2)
        .find(|w| w[0] == "--numa-distance")
        .map(|w| w[1].to_string())
        .unwrap_or_else(|| "21".into());
    let share_kb = (case.memory_mib << 10) / nodes as u64;
    for r in block.iter().filter(|r| r.kind == "node") {
        let id: usize = r.get("id").parse().unwrap();
        if let Some(set) = v.nodes.get(id) {
            assert_eq!(
                sorted(parse_cpulist(r.get("cpulist"))),
                sorted(set.clone()),
                "node{id} cpus\n{}",
                ctx()
            );
        }
        let row: Vec<String> = (0..nodes)
            .map(|j| {
                if j == id {
                    "10".to_string()
                } else {
                    remote.clone()
                }
            })
            .collect();
        assert_eq!(
            r.get("distance"),
            row.join(","),
            "node{id} distances\n{}",
            ctx()
        );
        let mt: u64 = r.get("memtotal_kb").parse().unwrap_or(0);
        assert!(
            mt <= share_kb + 4096 && mt >= share_kb * 6 / 10,
            "node{id} MemTotal {mt} kB for a {share_kb} kB share\n{}",
            ctx()
        );
    }
}

/// The count after `key` (such as `parked=`) on the first line of `log`
/// that contains `marker` (a closing line's message); panics saying what
/// is missing.
pub fn logged_count(log: &str, marker: &str, key: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no line with {marker:?} in:\n{log}"));
    let at = line
        .find(key)
        .unwrap_or_else(|| panic!("no {key} in {line}"));
    line[at + key.len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {line}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::VmmRun;

    /// The block the guest's `/init` printed for 2 sockets x 2 cores x 2
    /// threads on 2 nodes under QEMU TCG with 1 GiB
    /// (.cache/guest/qemu-check/tcg-2x2x2-vmlinux.log, by guest/qemu-check.sh).
    const QEMU_BLOCK: &str = "\
VMMTOPO BEGIN version=1
VMMTOPO system cpus=8 online=0-7 possible=0-7 present=0-7 nodes=2 node_online=0-1 kernel=6.1.192 uptime_s=1.74
VMMTOPO cpu id=0 node=0 physical_package_id=0 die_id=0 cluster_id=0 core_id=0 thread_siblings_list=0-1 core_siblings_list=0-3 die_cpus_list=0-3 cluster_cpus_list=0-1 l2_shared_cpu_list=0-1 l3_shared_cpu_list=0-3
VMMTOPO cpu id=1 node=0 physical_package_id=0 die_id=0 cluster_id=0 core_id=0 thread_siblings_list=0-1 core_siblings_list=0-3 die_cpus_list=0-3 cluster_cpus_list=0-1 l2_shared_cpu_list=0-1 l3_shared_cpu_list=0-3
VMMTOPO cpu id=2 node=0 physical_package_id=0 die_id=0 cluster_id=2 core_id=1 thread_siblings_list=2-3 core_siblings_list=0-3 die_cpus_list=0-3 cluster_cpus_list=2-3 l2_shared_cpu_list=2-3 l3_shared_cpu_list=0-3
VMMTOPO cpu id=3 node=0 physical_package_id=0 die_id=0 cluster_id=2 core_id=1 thread_siblings_list=2-3 core_siblings_list=0-3 die_cpus_list=0-3 cluster_cpus_list=2-3 l2_shared_cpu_list=2-3 l3_shared_cpu_list=0-3
VMMTOPO cpu id=4 node=1 physical_package_id=1 die_id=0 cluster_id=4 core_id=0 thread_siblings_list=4-5 core_siblings_list=4-7 die_cpus_list=4-7 cluster_cpus_list=4-5 l2_shared_cpu_list=4-5 l3_shared_cpu_list=4-7
VMMTOPO cpu id=5 node=1 physical_package_id=1 die_id=0 cluster_id=4 core_id=0 thread_siblings_list=4-5 core_siblings_list=4-7 die_cpus_list=4-7 cluster_cpus_list=4-5 l2_shared_cpu_list=4-5 l3_shared_cpu_list=4-7
VMMTOPO cpu id=6 node=1 physical_package_id=1 die_id=0 cluster_id=6 core_id=1 thread_siblings_list=6-7 core_siblings_list=4-7 die_cpus_list=4-7 cluster_cpus_list=6-7 l2_shared_cpu_list=6-7 l3_shared_cpu_list=4-7
VMMTOPO cpu id=7 node=1 physical_package_id=1 die_id=0 cluster_id=6 core_id=1 thread_siblings_list=6-7 core_siblings_list=4-7 die_cpus_list=4-7 cluster_cpus_list=6-7 l2_shared_cpu_list=6-7 l3_shared_cpu_list=4-7
VMMTOPO node id=0 cpulist=0-3 distance=10,21 memtotal_kb=509380
VMMTOPO node id=1 cpulist=4-7 distance=21,10 memtotal_kb=516304
VMMTOPO END records=11
";

    fn ci_case(spec: &str) -> BootCase<'_> {
        BootCase {
            spec,
            memory_mib: 1024,
            vendor: None,
            extra: &[],
        }
    }

    /// A real console log: the minimal kernel under kvm_pvm, 512 MiB,
    /// `package:2 [numa] l3:1 l2:2 core:1 pu:2`, stopped at the root domain.
    const PVM_LOG: &str = include_str!("testdata/pvm-2s-smt-2node.log");

    fn pvm_run() -> VmmRun {
        VmmRun {
            status: Some(0),
            console: PVM_LOG.to_string(),
            stderr: String::new(),
            elapsed: std::time::Duration::from_secs(1),
        }
    }

    #[test]
    fn kernel_log_check_accepts_the_right_shape() {
        let case = BootCase {
            memory_mib: 512,
            vendor: Some("amd"),
            ..ci_case("package:2 [numa] l3:1 l2:2 core:1 pu:2")
        };
        if host_is_pvm() {
            check_boot(&case, &pvm_run());
        } else {
            // Elsewhere the /init block is required; the log has none.
            let r = std::panic::catch_unwind(|| check_boot(&case, &pvm_run()));
            assert!(r.is_err());
        }
    }

    #[test]
    #[should_panic(expected = "expected DIE|NODE|PKG")]
    fn kernel_log_check_rejects_other_caches() {
        // One LLC per 2 cores instead of per package.
        let case = BootCase {
            memory_mib: 512,
            vendor: Some("amd"),
            ..ci_case("package:2 [numa] l3:2 l2:1 core:1 pu:2")
        };
        check_boot(&case, &pvm_run());
    }

    #[test]
    #[should_panic(expected = "node 0 end")]
    fn kernel_log_check_rejects_other_memory() {
        let case = BootCase {
            memory_mib: 1024,
            vendor: Some("amd"),
            ..ci_case("package:2 [numa] l3:1 l2:2 core:1 pu:2")
        };
        check_boot(&case, &pvm_run());
    }

    #[test]
    #[should_panic(expected = "smp line")]
    fn kernel_log_check_rejects_other_counts() {
        let case = BootCase {
            memory_mib: 512,
            vendor: Some("amd"),
            ..ci_case("package:2 [numa] l3:1 l2:3 core:1 pu:2")
        };
        check_boot(&case, &pvm_run());
    }

    #[test]
    fn init_block_check_accepts_the_right_shape() {
        check_init_block_in(
            &ci_case("package:2 [numa] l3:1 l2:2 core:1 pu:2"),
            QEMU_BLOCK,
        );
    }

    #[test]
    #[should_panic(expected = "SMT")]
    fn init_block_check_rejects_another_shape() {
        // Same CPU count, no SMT: the siblings lists cannot match.
        check_init_block_in(
            &ci_case("package:2 [numa] l3:1 l2:4 core:1 pu:1"),
            QEMU_BLOCK,
        );
    }

    #[test]
    #[should_panic(expected = "distances")]
    fn init_block_check_rejects_other_distances() {
        let case = BootCase {
            extra: &["--numa-distance", "32"],
            ..ci_case("package:2 [numa] l3:1 l2:2 core:1 pu:2")
        };
        check_init_block_in(&case, QEMU_BLOCK);
    }

    #[test]
    fn node_memory_layout() {
        assert_eq!(
            expected_node_memory(512 << 20, 2),
            vec![(0, (256 << 20) - 1), (256 << 20, (512 << 20) - 1)]
        );
        let g = 1u64 << 30;
        assert_eq!(
            expected_node_memory(8 * g, 2),
            vec![(0, 5 * g - 1), (5 * g, 9 * g - 1)]
        );
    }
}
