//! Booting guests with the real `vmm` binary, and judging what they print.
//!
//! Everything here is independent of the code under test: expectations come
//! from hwloc's own view of a synthetic topology string (`lstopo-no-graphics
//! -i SPEC --of xml`), and the guest kernel's log is parsed with plain string
//! handling following the formats of Linux 6.1.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{vmm_bin, workspace_root};

/// The guest images built by `guest/build.sh`.
#[derive(Clone, Debug)]
pub struct GuestImages {
    /// The minimal kernel, uncompressed ELF.
    pub vmlinux: PathBuf,
    /// The same kernel as a bzImage.
    pub bzimage: PathBuf,
    /// The initramfs with the project's `/init`.
    pub initramfs: PathBuf,
}

/// The cache directory of the guest images.
pub fn guest_cache() -> PathBuf {
    std::env::var("GUEST_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join(".cache/guest"))
}

/// The minimal guest images, or a panic that says how to build them. Tests
/// that need them fail rather than skip: the README's test command builds
/// them first.
pub fn guest_images() -> GuestImages {
    let c = guest_cache();
    let g = GuestImages {
        vmlinux: c.join("kernel/vmlinux"),
        bzimage: c.join("kernel/bzImage"),
        initramfs: c.join("initramfs.cpio.gz"),
    };
    for p in [&g.vmlinux, &g.initramfs] {
        assert!(
            p.is_file(),
            "guest image {} is missing: run guest/build.sh first (scripts/test.sh does)",
            p.display()
        );
    }
    g
}

/// Debian's stock cloud kernel (uncompressed), fetched by
/// `guest/stock-kernel.sh`.
pub fn stock_kernel() -> PathBuf {
    let p = guest_cache().join("stock/vmlinux");
    assert!(
        p.is_file(),
        "{} is missing: run guest/stock-kernel.sh first",
        p.display()
    );
    p
}

/// What a `vmm run` produced.
#[derive(Debug)]
pub struct VmmRun {
    /// Exit status (None if killed by a signal).
    pub status: Option<i32>,
    /// The console (stdout).
    pub console: String,
    /// stderr.
    pub stderr: String,
    /// Wall time.
    pub elapsed: Duration,
}

impl VmmRun {
    /// A summary for assertion messages: status, stderr, console tail.
    pub fn context(&self) -> String {
        let tail: Vec<&str> = self.console.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "status {:?} after {:.1} s\n--- stderr ---\n{}\n--- console (last 40 lines) ---\n{}",
            self.status,
            self.elapsed.as_secs_f64(),
            self.stderr,
            tail.join("\n")
        )
    }
}

/// Asserts the way `vmm` reports bad input: exit status 2, exactly one line
/// on stderr (`error: ...`) containing every one of `needles`, no panic.
pub fn assert_input_error(r: &VmmRun, needles: &[&str]) {
    assert_eq!(r.status, Some(2), "{}", r.context());
    assert!(!r.stderr.contains("panicked"), "{}", r.context());
    let lines: Vec<&str> = r.stderr.trim().lines().collect();
    assert_eq!(lines.len(), 1, "one line expected:\n{}", r.context());
    assert!(lines[0].starts_with("error: "), "{}", r.context());
    for n in needles {
        assert!(lines[0].contains(n), "missing {n:?}:\n{}", r.context());
    }
}

/// Runs `vmm ARGS`, capturing stdout and stderr, killing it after `limit`
/// (a safety net above the run's own `--timeout`).
pub fn run_vmm(args: &[&str], limit: Duration) -> VmmRun {
    let start = Instant::now();
    let mut child = Command::new(vmm_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting vmm");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let to = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let te = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for vmm") {
            break s.code();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    VmmRun {
        status,
        console: String::from_utf8_lossy(&to.join().unwrap()).replace('\r', ""),
        stderr: String::from_utf8_lossy(&te.join().unwrap()).into_owned(),
        elapsed: start.elapsed(),
    }
}

/// Parses a Linux cpulist (`0-3,8`).
pub fn parse_cpulist(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for item in s.trim().split(',').filter(|x| !x.is_empty()) {
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().unwrap(), b.parse().unwrap());
                out.extend(a..=b);
            }
            None => out.push(item.parse().unwrap()),
        }
    }
    out
}

/// Strips a printk timestamp (`[   1.234] `) from a console line.
pub fn strip_timestamp(line: &str) -> &str {
    let t = line.trim_start();
    if t.starts_with('[') {
        if let Some(end) = t.find("] ") {
            return &t[end + 2..];
        }
    }
    t
}

/// One sched domain of one CPU, as `sched_verbose` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    /// `SMT`, `CLS`, `MC`, `DIE`/`PKG`, `NODE`, `NUMA`.
    pub level: String,
    /// The CPUs it spans.
    pub span: Vec<u32>,
}

/// Every CPU's sched domains (innermost first), from the last
/// `CPUn attaching sched-domain(s):` block of each CPU.
pub fn parse_sched_domains(log: &str) -> BTreeMap<u32, Vec<Domain>> {
    let mut out: BTreeMap<u32, Vec<Domain>> = BTreeMap::new();
    let mut current: Option<u32> = None;
    for line in log.lines() {
        let l = strip_timestamp(line);
        if let Some(rest) = l.strip_prefix("CPU") {
            if let Some(n) = rest.strip_suffix(" attaching sched-domain(s):") {
                if let Ok(cpu) = n.trim().parse() {
                    current = Some(cpu);
                    out.insert(cpu, Vec::new());
                    continue;
                }
            }
            if rest.contains("attaching NULL sched-domain") {
                current = None;
                continue;
            }
        }
        let t = l.trim_start();
        if let (Some(cpu), true) = (current, t.starts_with("domain-")) {
            // domain-1: span=0-3 level=MC
            let span = t
                .split_whitespace()
                .find_map(|w| w.strip_prefix("span="))
                .map(parse_cpulist);
            let level = t
                .split_whitespace()
                .find_map(|w| w.strip_prefix("level="))
                .map(str::to_string);
            if let (Some(span), Some(level)) = (span, level) {
                out.get_mut(&cpu).unwrap().push(Domain { level, span });
            }
        } else if current.is_some() && !t.starts_with("groups:") && !t.starts_with("domain-") {
            current = None;
        }
    }
    out
}

/// `SRAT: PXM p -> APIC 0x.. -> Node n` lines: (pxm, apic, node).
pub fn parse_srat(log: &str) -> Vec<(u32, u32, u32)> {
    let mut out = Vec::new();
    for line in log.lines() {
        let l = strip_timestamp(line);
        let Some(rest) = l.strip_prefix("SRAT: PXM ") else {
            continue;
        };
        let parts: Vec<&str> = rest.split_whitespace().collect();
        // ["0", "->", "APIC", "0x04", "->", "Node", "1"]
        if parts.len() >= 7 && parts[2] == "APIC" && parts[5] == "Node" {
            let pxm = parts[0].parse().unwrap();
            let apic = u32::from_str_radix(parts[3].trim_start_matches("0x"), 16).unwrap();
            let node = parts[6].parse().unwrap();
            out.push((pxm, apic, node));
        }
    }
    out
}

/// `Initmem setup node N [mem 0xA-0xB]`: node -> (first, last) address.
pub fn parse_node_memory(log: &str) -> BTreeMap<u32, (u64, u64)> {
    let mut out = BTreeMap::new();
    for line in log.lines() {
        let l = strip_timestamp(line);
        let Some(rest) = l.strip_prefix("Initmem setup node ") else {
            continue;
        };
        let (node, range) = rest.split_once(" [mem ").unwrap();
        let range = range.trim_end_matches(']');
        let (a, b) = range.split_once('-').unwrap();
        let h = |x: &str| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap();
        out.insert(node.trim().parse().unwrap(), (h(a), h(b)));
    }
    out
}

/// `smp: Brought up N nodes, M CPUs`: (nodes, cpus).
pub fn parse_brought_up(log: &str) -> Option<(u32, u32)> {
    log.lines().find_map(|line| {
        let l = strip_timestamp(line);
        let rest = l.strip_prefix("smp: Brought up ")?;
        let w: Vec<&str> = rest.split_whitespace().collect();
        // ["2", "nodes,", "8", "CPUs"] or ["1", "node,", "2", "CPUs"]
        Some((w.first()?.parse().ok()?, w.get(2)?.parse().ok()?))
    })
}

/// One record of the `/init` topology block (`VMMTOPO ...`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopoRecord {
    /// `system`, `cpu`, `node`.
    pub kind: String,
    /// key=value pairs.
    pub fields: BTreeMap<String, String>,
}

impl TopoRecord {
    /// A field.
    pub fn get(&self, k: &str) -> &str {
        self.fields.get(k).map(|s| s.as_str()).unwrap_or("")
    }
}

/// The `/init` block, if the guest printed a complete one (see
/// guest/README.md for the format).
pub fn parse_init_block(log: &str) -> Option<Vec<TopoRecord>> {
    let mut recs = None::<Vec<TopoRecord>>;
    for line in log.lines() {
        let l = strip_timestamp(line.trim_end_matches('\r'));
        let Some(rest) = l.strip_prefix("VMMTOPO ") else {
            continue;
        };
        let mut words = rest.split(' ');
        let kind = words.next().unwrap_or("").to_string();
        let fields: BTreeMap<String, String> = words
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match kind.as_str() {
            "BEGIN" => recs = Some(Vec::new()),
            "END" => {
                let r = recs.take()?;
                let n: usize = fields.get("records")?.parse().ok()?;
                return (n == r.len()).then_some(r);
            }
            _ => {
                if let Some(r) = recs.as_mut() {
                    r.push(TopoRecord { kind, fields });
                }
            }
        }
    }
    None
}

/// What hwloc says a synthetic topology looks like: for each PU (in
/// logical order, which is Linux's CPU order for our guests), the PUs of
/// its core, L2, L3, die, package and NUMA node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HwlocView {
    /// Number of PUs.
    pub pus: u32,
    /// PU -> sets by object type (`Core`, `L2Cache`, `L3Cache`, `Die`,
    /// `Package`, `NUMANode`).
    pub sets: BTreeMap<String, Vec<Vec<u32>>>,
    /// The NUMA nodes' PU sets, in node order.
    pub nodes: Vec<Vec<u32>>,
}

impl HwlocView {
    /// PUs sharing `kind` with `pu` (itself alone if the level is absent).
    pub fn set_of(&self, kind: &str, pu: u32) -> Vec<u32> {
        self.sets
            .get(kind)
            .and_then(|v| v.iter().find(|s| s.contains(&pu)).cloned())
            .unwrap_or_else(|| vec![pu])
    }
    /// The node of `pu`.
    pub fn node_of(&self, pu: u32) -> u32 {
        self.nodes
            .iter()
            .position(|s| s.contains(&pu))
            .map(|i| i as u32)
            .unwrap_or(0)
    }
}

fn parse_hwloc_cpuset(s: &str) -> Vec<u32> {
    // "0x0000000f" or "0x000000ff,0xffffffff" (most significant word first).
    let words: Vec<&str> = s.split(',').collect();
    let mut out = Vec::new();
    for (i, w) in words.iter().rev().enumerate() {
        let v = u32::from_str_radix(w.trim_start_matches("0x"), 16).unwrap_or(0);
        for b in 0..32 {
            if v & (1 << b) != 0 {
                out.push(i as u32 * 32 + b);
            }
        }
    }
    out
}

/// Asks hwloc (`lstopo-no-graphics -i SPEC --of xml`) about a synthetic
/// topology.
pub fn hwloc_view(spec: &str) -> HwlocView {
    let out = Command::new("lstopo-no-graphics")
        .args(["-i", spec, "--of", "xml", "-"])
        .output()
        .expect("running lstopo-no-graphics (apt install hwloc)");
    assert!(
        out.status.success(),
        "lstopo-no-graphics -i {spec:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let xml = String::from_utf8_lossy(&out.stdout);
    let mut v = HwlocView::default();
    for tag in xml.split("<object ").skip(1) {
        let attr = |name: &str| -> Option<String> {
            let key = format!("{name}=\"");
            let start = tag.find(&key)? + key.len();
            let end = tag[start..].find('"')?;
            Some(tag[start..start + end].to_string())
        };
        let (Some(kind), Some(cpuset)) = (attr("type"), attr("cpuset")) else {
            continue;
        };
        let set = parse_hwloc_cpuset(&cpuset);
        match kind.as_str() {
            "PU" => v.pus += 1,
            "NUMANode" => v.nodes.push(set.clone()),
            _ => {}
        }
        v.sets.entry(kind).or_default().push(set);
    }
    v
}

/// The sched-domain spans Linux 6.1 builds for `pu`, from hwloc's view:
/// the distinct, growing spans of SMT (core), CLS (L2, only when `cls`),
/// MC (L3), the NUMA node, and the whole machine when there are several
/// nodes with one remote distance, each kept only if it is larger than the
/// one below and has more than one CPU. (Linux drops a level whose span
/// equals its child's; in 6.1 the x86 `DIE` level spans the NUMA node.)
pub fn expected_spans(v: &HwlocView, pu: u32, cls: bool) -> Vec<Vec<u32>> {
    let mut levels = vec![v.set_of("Core", pu)];
    if cls {
        levels.push(v.set_of("L2Cache", pu));
    }
    levels.push(v.set_of("L3Cache", pu));
    let node = v.node_of(pu);
    levels.push(v.nodes.get(node as usize).cloned().unwrap_or_default());
    if v.nodes.len() > 1 {
        levels.push((0..v.pus).collect());
    }
    let mut out: Vec<Vec<u32>> = Vec::new();
    for mut l in levels {
        l.sort_unstable();
        if l.len() < 2 || out.last().is_some_and(|p| p.len() >= l.len()) {
            continue;
        }
        out.push(l);
    }
    out
}

/// The x2APIC IDs a guest of this shape should get, computed here from
/// hwloc's per-level arities: one bit field per level (thread, core, L2,
/// L3, die, package), each `ceil(log2(max children))` wide — the usual x86
/// encoding, written independently of the topology crate.
pub fn expected_apic_ids(v: &HwlocView) -> Vec<u32> {
    // Per PU: its index within each parent level.
    let order = ["Core", "L2Cache", "L3Cache", "Die", "Package"];
    let bits = |n: u32| {
        if n <= 1 {
            0
        } else {
            32 - (n - 1).leading_zeros()
        }
    };
    let mut ids = vec![0u32; v.pus as usize];
    let mut shift = 0;
    let mut child: Vec<Vec<u32>> = (0..v.pus).map(|p| vec![p]).collect();
    for kind in order {
        let parents: Vec<Vec<u32>> = match v.sets.get(kind) {
            Some(s) => s.clone(),
            None => child.clone(), // absent level: each child is its own parent
        };
        // Index of each child within its parent, in order.
        let mut max_children = 1;
        let mut index_of_child: Vec<(Vec<u32>, u32)> = Vec::new();
        for p in &parents {
            let mut kids: Vec<&Vec<u32>> = child
                .iter()
                .filter(|c| c.iter().all(|x| p.contains(x)))
                .collect();
            kids.sort_by_key(|c| c[0]);
            max_children = max_children.max(kids.len() as u32);
            for (i, k) in kids.into_iter().enumerate() {
                index_of_child.push((k.clone(), i as u32));
            }
        }
        for (k, i) in index_of_child {
            for pu in k {
                ids[pu as usize] |= i << shift;
            }
        }
        shift += bits(max_children);
        child = parents;
    }
    // Packages: index among all packages.
    let mut pk: Vec<Vec<u32>> = child;
    pk.sort_by_key(|c| c[0]);
    for (i, p) in pk.iter().enumerate() {
        for &pu in p {
            ids[pu as usize] |= (i as u32) << shift;
        }
    }
    ids
}

/// Whether `path` exists, for messages.
pub fn describe_path(p: &Path) -> String {
    format!(
        "{} ({})",
        p.display(),
        if p.exists() { "exists" } else { "missing" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
[   24.4] smp: Brought up 2 nodes, 8 CPUs
[    1.06] SRAT: PXM 0 -> APIC 0x00 -> Node 0
[    1.09] SRAT: PXM 1 -> APIC 0x104 -> Node 1
[    1.25] Initmem setup node 0 [mem 0x0000000000001000-0x000000000fffffff]
[   25.0] CPU0 attaching sched-domain(s):
[   25.0]  domain-0: span=0-1 level=SMT
[   25.0]   groups: 0:{ span=0 }, 1:{ span=1 }
[   25.0]   domain-1: span=0-3 level=MC
[   25.0]    groups: 0:{ span=0-1 cap=2048 }, 2:{ span=2-3 cap=2048 }
[   25.1]    domain-2: span=0-7 level=NUMA
[   25.1]     groups: 0:{ span=0-3 cap=4096 }, 4:{ span=4-7 cap=4096 }
[   25.2] CPU1 attaching sched-domain(s):
[   25.2]  domain-0: span=0-1 level=SMT
[   26.9] root domain span: 0-7 (max cpu_capacity = 1024)
VMMTOPO BEGIN version=1
VMMTOPO system cpus=2 nodes=1
VMMTOPO cpu id=0 thread_siblings_list=0-1
[ 2.0] random kernel line
VMMTOPO cpu id=1 thread_siblings_list=0-1
VMMTOPO END records=3
";

    #[test]
    fn parses_the_kernel_log() {
        assert_eq!(parse_brought_up(LOG), Some((2, 8)));
        assert_eq!(parse_srat(LOG), vec![(0, 0, 0), (1, 0x104, 1)]);
        assert_eq!(parse_node_memory(LOG)[&0], (0x1000, 0xfff_ffff));
        let d = parse_sched_domains(LOG);
        assert_eq!(d[&0].len(), 3);
        assert_eq!(d[&0][1].span, vec![0, 1, 2, 3]);
        assert_eq!(d[&0][2].level, "NUMA");
        assert_eq!(d[&1].len(), 1);
        let b = parse_init_block(LOG).unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(b[2].get("id"), "1");
        assert!(parse_init_block("VMMTOPO BEGIN\nVMMTOPO END records=2\n").is_none());
        assert_eq!(parse_cpulist("0-2,5"), vec![0, 1, 2, 5]);
        assert_eq!(parse_hwloc_cpuset("0x00000001,0x80000000"), vec![31, 32]);
    }

    #[test]
    fn hwloc_expectations() {
        let v = hwloc_view("package:2 [numa] l3:1 l2:2 core:1 pu:2");
        assert_eq!(v.pus, 8);
        assert_eq!(v.nodes, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert_eq!(
            expected_spans(&v, 5, true),
            vec![vec![4, 5], vec![4, 5, 6, 7], (0..8).collect()]
        );
        assert_eq!(expected_apic_ids(&v), (0..8).collect::<Vec<_>>());
        // Non-power-of-two: 3 L2s per L3 take 2 bits, so package 1 starts at 8.
        let v = hwloc_view("package:2 l3:1 l2:3 core:1 pu:2");
        assert_eq!(
            expected_apic_ids(&v),
            vec![0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13]
        );
        // Dies, one node each.
        let v = hwloc_view("package:2 die:3 [numa] l3:1 l2:2 core:1 pu:2");
        assert_eq!(v.nodes.len(), 6);
        assert_eq!(expected_apic_ids(&v)[4], 1 << 2);
        assert_eq!(expected_apic_ids(&v)[12], 1 << 4);
        assert_eq!(
            expected_spans(&v, 0, true),
            vec![vec![0, 1], vec![0, 1, 2, 3], (0..24).collect()]
        );
    }
}
