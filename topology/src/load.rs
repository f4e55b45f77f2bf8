//! The one way in: hwloc.
//!
//! A topology SPEC is one of
//! - `host`: the live machine, as hwloc sees it (allowed CPUs only);
//! - a preset name (`genoa-2s`, see [`crate::presets`]);
//! - an hwloc synthetic string (`package:2 [numa] l3:12 l2:8 core:1 pu:2`);
//! - the path of an hwloc XML export;
//! - the path of a CPUID dump directory (`puN` files plus
//!   `hwloc-cpuid-info`), read by hwloc's own x86 CPUID parser.
//!
//! A CPUID dump is read by running `lstopo-no-graphics` with
//! `HWLOC_CPUID_PATH` set and loading its XML output. hwloc only takes that
//! path from the environment, and changing this process's environment while
//! other threads may read it is not sound, so the parse happens in a child
//! process. It is still hwloc's parser doing the work; [`crate::dump_read`]
//! checks the directory first, since that parser falls back to this
//! machine's own CPUID on a dump it cannot use.

use std::path::{Path, PathBuf};

use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::TypeFilter;
use hwlocality::topology::export::synthetic::SyntheticExportFlags;
use hwlocality::Topology;

// Defined beside the dump checks; kept under these paths for callers.
pub use crate::dump_read::{cpuid_dump_to_xml, lstopo_on_dump};
use crate::error::{Result, TopologyError};
use crate::host::{CacheInfo, Caches, HostTopology, NodeInfo, RawCpu};
use crate::limits;
use crate::presets;

/// What a topology SPEC string names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopologySpec {
    /// The live host.
    Host,
    /// A named preset.
    Preset(&'static presets::Preset),
    /// An hwloc synthetic description.
    Synthetic(String),
    /// An hwloc XML file.
    Xml(PathBuf),
    /// A CPUID dump directory.
    CpuidDump(PathBuf),
}

impl TopologySpec {
    /// Classifies a SPEC string. Paths win over synthetic strings; anything
    /// with a `:` that is not a path is treated as a synthetic description.
    pub fn parse(spec: &str) -> Result<Self> {
        let s = spec.trim();
        if s.is_empty() {
            return Err(synthetic_error(spec, "it is empty"));
        }
        if s == "host" {
            return Ok(TopologySpec::Host);
        }
        if let Some(p) = presets::find(s) {
            return Ok(TopologySpec::Preset(p));
        }
        let path = Path::new(s);
        if let Ok(meta) = std::fs::metadata(path) {
            if meta.is_dir() {
                return Ok(TopologySpec::CpuidDump(path.to_path_buf()));
            }
            if meta.is_file() {
                return Ok(TopologySpec::Xml(path.to_path_buf()));
            }
            return Err(TopologyError::Xml {
                path: path.to_path_buf(),
                reason: format!(
                    "it is {}; give an hwloc XML file or a CPUID dump directory",
                    limits::file_kind(&meta)
                ),
            });
        }
        if s.contains(':') && !s.contains('/') {
            return Ok(TopologySpec::Synthetic(s.to_string()));
        }
        if s.contains('/') || s.to_ascii_lowercase().ends_with(".xml") {
            return Err(TopologyError::Xml {
                path: path.to_path_buf(),
                reason: "no such file or directory".into(),
            });
        }
        Err(TopologyError::Synthetic {
            spec: spec.to_string(),
            reason: "it is not `host`, a preset, an existing XML file or CPUID dump \
                     directory, nor a synthetic description (which has `type:count` items)"
                .into(),
            presets: presets::names(),
        })
    }

    /// Loads the topology this SPEC names.
    pub fn load(&self) -> Result<HostTopology> {
        match self {
            TopologySpec::Host => load_host(),
            TopologySpec::Preset(p) => {
                let mut t = load_synthetic(p.synthetic)?;
                t = t.with_source(p.name);
                Ok(t)
            }
            TopologySpec::Synthetic(s) => load_synthetic(s),
            TopologySpec::Xml(p) => load_xml(p),
            TopologySpec::CpuidDump(p) => load_cpuid_dump(p),
        }
    }
}

/// Parses and loads a SPEC in one go.
pub fn load(spec: &str) -> Result<HostTopology> {
    TopologySpec::parse(spec)?.load()
}

fn synthetic_error(spec: &str, reason: impl Into<String>) -> TopologyError {
    // Echo a long description only in part.
    let spec = match spec.char_indices().nth(100) {
        Some((i, _)) => format!("{}...", &spec[..i]),
        None => spec.to_string(),
    };
    TopologyError::Synthetic {
        spec,
        reason: reason.into(),
        presets: presets::names(),
    }
}

/// An hwloc error in words. hwlocality's own message prints the errno
/// with Rust's debug formatting (`Some(Errno { code: 5, .. })`).
fn hwloc_words(e: &hwlocality::errors::RawHwlocError) -> String {
    match e.errno {
        Some(errno) => format!("{} failed: {errno}", e.api),
        None => format!("{} failed", e.api),
    }
}

/// A builder that keeps instruction caches, as `lstopo` does, so that every
/// source describes the same levels.
fn builder() -> hwlocality::topology::builder::TopologyBuilder {
    let b = Topology::builder();
    match b.with_cpu_icache_type_filter(TypeFilter::KeepAll) {
        Ok(b) => b,
        Err(_) => Topology::builder(),
    }
}

/// The live host, restricted to the CPUs this process may use.
pub fn load_host() -> Result<HostTopology> {
    let topo = builder()
        .build()
        .map_err(|e| TopologyError::Host(hwloc_words(&e)))?;
    from_hwloc("host", &topo)
}

/// An hwloc synthetic description, checked against the [limits] first.
pub fn load_synthetic(spec: &str) -> Result<HostTopology> {
    let trimmed = spec.trim();
    // hwloc accepts some odd inputs silently, and builds whatever size it
    // is asked for: count the CPUs from the arities first.
    let want = limits::check_synthetic(trimmed).map_err(|r| synthetic_error(spec, r))?;
    let topo = builder()
        .from_synthetic(trimmed)
        .map_err(|_| {
            synthetic_error(
                spec,
                "hwloc rejected it (check the type names, that the last item is pu:N, \
                 and the attributes: size=, memory= and indexes= are the known ones)",
            )
        })?
        .build()
        .map_err(|e| {
            synthetic_error(
                spec,
                format!("hwloc could not build it ({})", hwloc_words(&e)),
            )
        })?;
    check_built(&topo).map_err(|r| synthetic_error(spec, r))?;
    let got = topo.objects_with_type(ObjectType::PU).count() as u64;
    if got != want.cpus {
        return Err(synthetic_error(
            spec,
            format!(
                "it describes {} CPUs but hwloc built {got}; check the indexes= lists",
                want.cpus
            ),
        ));
    }
    from_hwloc(trimmed, &topo)
}

/// Checks a topology hwloc built from user input against the [limits]
/// before it is converted (which is where large inputs would cost time).
fn check_built(topo: &Topology) -> std::result::Result<(), String> {
    let cpus = topo.objects_with_type(ObjectType::PU).count();
    if cpus > limits::MAX_CPUS {
        return Err(format!(
            "it has {cpus} CPUs; the limit is {}",
            limits::MAX_CPUS
        ));
    }
    let nodes = topo.objects_with_type(ObjectType::NUMANode).count();
    if nodes > limits::MAX_NODES {
        return Err(format!(
            "it has {nodes} NUMA nodes; the limit is {}",
            limits::MAX_NODES
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for pu in topo.objects_with_type(ObjectType::PU) {
        let Some(os) = pu.os_index() else {
            return Err("a CPU (PU) has no OS index".into());
        };
        if os as u64 >= limits::MAX_OS_INDEX {
            return Err(format!(
                "CPU P#{os} has too large an OS index; the limit is {}",
                limits::MAX_OS_INDEX - 1
            ));
        }
        if !seen.insert(os) {
            return Err(format!("CPU P#{os} appears twice"));
        }
    }
    for n in topo.objects_with_type(ObjectType::NUMANode) {
        // hwloc's synthetic export assert()s on a node without an OS index
        // (found by the topology_xml fuzz target)
        let Some(os) = n.os_index() else {
            return Err("a NUMA node has no OS index".into());
        };
        {
            if os as u64 >= limits::MAX_NODE_OS_INDEX {
                return Err(format!(
                    "NUMA node P#{os} has too large an OS index; the limit is {}",
                    limits::MAX_NODE_OS_INDEX - 1
                ));
            }
            // A node's nodeset is itself. hwloc does not check this when
            // it reads XML, and its synthetic export assert()s on it
            // (aborting the process; found by the topology_xml fuzz target).
            let own = n
                .nodeset()
                .is_some_and(|set| set.weight() == Some(1) && set.is_set(os));
            if !own {
                return Err(format!(
                    "NUMA node P#{os} has a nodeset that does not name it alone"
                ));
            }
        }
    }
    Ok(())
}

/// An hwloc XML export: a regular file of at most
/// [`limits::MAX_XML_BYTES`] that looks like hwloc XML.
pub fn load_xml(path: &Path) -> Result<HostTopology> {
    let err = |reason: String| TopologyError::Xml {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = limits::read_capped(path, limits::MAX_XML_BYTES).map_err(err)?;
    let text = std::str::from_utf8(&bytes).map_err(|_| {
        err("it is not text (not UTF-8); give an XML export from `lstopo --of xml`".into())
    })?;
    let body = text.trim_start_matches('\u{feff}').trim_start();
    if body.is_empty() {
        return Err(err(
            "it is empty; give an XML export from `lstopo --of xml`".into(),
        ));
    }
    if !body.starts_with('<') || !text.contains("<topology") || text.contains('\0') {
        return Err(err(
            "it does not look like an hwloc XML topology (no <topology> element); \
             give an XML export from `lstopo --of xml`"
                .into(),
        ));
    }
    check_xml_objects(text).map_err(err)?;
    let topo = builder()
        .from_xml(text)
        .map_err(|_| err("hwloc could not parse it as an XML topology".into()))?
        .build()
        .map_err(|e| err(format!("hwloc could not build it ({})", hwloc_words(&e))))?;
    check_built(&topo).map_err(err)?;
    from_hwloc(&path.display().to_string(), &topo)
}

/// Every `<object>` with a `cpuset` (`nodeset`) also has a
/// `complete_cpuset` (`complete_nodeset`): hwloc 2.9 reads an object
/// without one and then dereferences the missing set while building, a
/// segmentation fault (found by the `topology_xml` fuzz target).
fn check_xml_objects(text: &str) -> std::result::Result<(), String> {
    // The text is UTF-8 (checked above). Another declared encoding makes
    // libxml2 fail with EILSEQ, an error hwlocality does not expect: it
    // panics (found by the `topology_xml` fuzz target).
    if let Some(decl) = text
        .trim_start_matches('\u{feff}')
        .trim_start()
        .strip_prefix("<?xml")
        .and_then(|d| d.split("?>").next())
    {
        if let Some(enc) = decl.split("encoding=").nth(1) {
            let enc = enc.trim_start_matches(['"', '\'']);
            let enc: String = enc
                .chars()
                .take_while(|c| !matches!(c, '"' | '\''))
                .collect();
            if !enc.eq_ignore_ascii_case("utf-8") && !enc.eq_ignore_ascii_case("us-ascii") {
                return Err(format!(
                    "it declares encoding \"{enc}\"; hwloc XML is UTF-8 \
                     (give an XML export from `lstopo --of xml`)"
                ));
            }
        }
    }
    check_xml_text(text)?;
    for (i, tag) in text.split("<object").skip(1).enumerate() {
        let tag = tag.split('>').next().unwrap_or("");
        for attr in tag.split_whitespace() {
            let Some((name, value)) = attr.split_once('=') else {
                continue;
            };
            if name.ends_with("cpuset") || name.ends_with("nodeset") {
                let value = value.trim_matches(['"', '\'', '/']);
                if !is_hwloc_bitmap(value) {
                    return Err(format!(
                        "<object> number {} has {name}=\"{value}\", which is not a set \
                         (hex words like 0x0000000f, separated by commas); \
                         give an XML export from `lstopo --of xml`",
                        i + 1
                    ));
                }
            }
        }
        for set in ["cpuset", "nodeset"] {
            let has = |name: &str| {
                tag.split_whitespace()
                    .any(|a| a.split('=').next() == Some(name))
            };
            if has(set) && !has(&format!("complete_{set}")) {
                return Err(format!(
                    "<object> number {} has a {set} but no complete_{set}; \
                     give an XML export from `lstopo --of xml`",
                    i + 1
                ));
            }
        }
    }
    Ok(())
}

/// hwloc's set syntax: comma-separated hex words (`0x` optional), the
/// first of which may be `0xf...f` (an infinite set). A word before a
/// comma may be empty (hwloc writes a zero word of a large set that way,
/// as in `0x00000001,,0x0`); the last may not.
fn is_hwloc_bitmap(v: &str) -> bool {
    let words: Vec<&str> = v.split(',').collect();
    let last = words.len() - 1;
    words.iter().enumerate().all(|(i, &w)| {
        if i == 0 && w == "0xf...f" {
            return true;
        }
        if w.is_empty() {
            return i != last;
        }
        let hex = w
            .strip_prefix("0x")
            .or_else(|| w.strip_prefix("0X"))
            .unwrap_or(w);
        !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// hwloc XML keeps its data in attributes: text between elements is only
/// whitespace, except inside the elements that hold lists of numbers
/// (`<indexes>`, `<u64values>`) or user data. Stray text around a subtree
/// with a malformed set made hwloc 2.9 dereference a null pointer while
/// loading (found by the `topology_xml` fuzz target); `lstopo` crashes on
/// the same file.
fn check_xml_text(text: &str) -> std::result::Result<(), String> {
    const TEXT_ELEMENTS: [&str; 3] = ["indexes", "u64values", "userdata"];
    // A small scanner: a tag ends at the first `>` outside quotes (an
    // attribute value may hold `>`); comments and the declaration are tags.
    let mut open_text = false; // the last tag opened a text element
    let (mut in_tag, mut quote) = (false, None::<char>);
    let (mut tag, mut stray) = (String::new(), String::new());
    let mut ntags = 0usize;
    for c in text.chars() {
        if in_tag && tag.starts_with("!--") {
            // a comment ends at `-->`, whatever it holds
            if c == '>' && tag.len() >= 5 && tag.ends_with("--") {
                in_tag = false;
                ntags += 1;
                open_text = false;
            } else {
                tag.push(c);
            }
            continue;
        }
        if in_tag {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '>') => {
                    in_tag = false;
                    ntags += 1;
                    let name = tag
                        .trim_start_matches(['/', '?', '!'])
                        .split(|c: char| c.is_whitespace() || c == '/')
                        .next()
                        .unwrap_or("");
                    let opening = !tag.starts_with(['/', '?', '!']) && !tag.ends_with('/');
                    open_text = opening && TEXT_ELEMENTS.contains(&name);
                    continue;
                }
                _ => {}
            }
            tag.push(c);
        } else if c == '<' {
            let t = stray.trim();
            if !t.is_empty() && !open_text {
                let shown: String = t.chars().take(20).collect();
                return Err(format!(
                    "it has text \"{shown}\" between elements (after tag number {ntags}, \
                     <{}>); hwloc XML keeps its data in attributes: give an XML export \
                     from `lstopo --of xml`",
                    tag.chars().take(40).collect::<String>()
                ));
            }
            stray.clear();
            tag.clear();
            in_tag = true;
        } else {
            stray.push(c);
        }
    }
    Ok(())
}

/// A CPUID dump directory, parsed by hwloc's x86 backend (see module docs)
/// after the checks of [`crate::dump_read`], which make sure the backend
/// reads the dump and not this machine.
pub fn load_cpuid_dump(dir: &Path) -> Result<HostTopology> {
    let err = |reason: String| TopologyError::CpuidDump {
        path: dir.to_path_buf(),
        reason,
    };
    let xml = cpuid_dump_to_xml(dir).map_err(err)?;
    let topo = builder()
        .from_xml(&xml)
        .map_err(|_| err("hwloc could not read lstopo's XML output".into()))?
        .build()
        .map_err(|e| err(format!("hwloc could not build it ({})", hwloc_words(&e))))?;
    check_built(&topo).map_err(err)?;
    from_hwloc(&dir.display().to_string(), &topo)
}

fn cache_info(obj: &TopologyObject) -> Option<CacheInfo> {
    match obj.attributes() {
        Some(ObjectAttributes::Cache(c)) => Some(CacheInfo {
            size: c.size().map_or(0, |s| s.get()),
            line_size: c.line_size().map_or(64, |s| s.get() as u32),
            ways: match c.associativity() {
                hwlocality::object::attributes::CacheAssociativity::Ways(w) => w.get() as u32,
                _ => 0,
            },
        }),
        _ => None,
    }
}

/// Converts an hwloc topology into the dense model.
fn from_hwloc(source: &str, topo: &Topology) -> Result<HostTopology> {
    // NUMA nodes, in logical order.
    let numa: Vec<&TopologyObject> = topo.objects_with_type(ObjectType::NUMANode).collect();
    let mut nodes: Vec<NodeInfo> = numa
        .iter()
        .map(|n| NodeInfo {
            os_index: n.os_index().unwrap_or(0) as u32,
            memory: match n.attributes() {
                Some(ObjectAttributes::NUMANode(a)) => a.local_memory().map_or(0, |m| m.get()),
                _ => 0,
            },
        })
        .collect();
    if nodes.is_empty() {
        nodes.push(NodeInfo {
            os_index: 0,
            memory: 0,
        });
    }

    let mut raw = Vec::new();
    let mut caches = Caches::default();
    for (i, pu) in topo.objects_with_type(ObjectType::PU).enumerate() {
        let os = pu
            .os_index()
            .ok_or_else(|| TopologyError::Unsupported("a PU has no OS index".into()))?
            as u32;
        let anc = |ty: ObjectType| pu.ancestors().find(|a| a.object_type() == ty);
        let key = |o: Option<&TopologyObject>| o.map(|o| o.global_persistent_index());
        let root = topo.root_object().global_persistent_index();
        let package = key(anc(ObjectType::Package)).unwrap_or(root);
        let die = key(anc(ObjectType::Die)).unwrap_or(package);
        let core_obj = anc(ObjectType::Core);
        let core = key(core_obj).unwrap_or(pu.global_persistent_index());
        let l2_obj = anc(ObjectType::L2Cache);
        let l3_obj = anc(ObjectType::L3Cache);
        let l2 = key(l2_obj).unwrap_or(core);
        let llc = key(l3_obj).or(key(l2_obj)).unwrap_or(die);
        // The node whose cpuset holds this PU; the first one wins where
        // several do (DDR before HBM on Xeon Max, for instance).
        let node = numa
            .iter()
            .position(|n| n.cpuset().is_some_and(|s| s.is_set(os as usize)))
            .unwrap_or(0) as u32;
        if i == 0 {
            caches = Caches {
                l1d: anc(ObjectType::L1Cache).and_then(cache_info),
                l1i: anc(ObjectType::L1ICache).and_then(cache_info),
                l2: l2_obj.and_then(cache_info),
                l3: l3_obj.and_then(cache_info),
            };
        }
        raw.push(RawCpu {
            os_index: os,
            core,
            l2,
            llc,
            die,
            node,
            package,
        });
    }

    let distances = numa_distances(topo, &numa);
    let mut t = HostTopology::from_raw(source, &raw, nodes, distances, caches)?;
    t.set_synthetic(topo.export_synthetic(SyntheticExportFlags::empty()).ok());
    Ok(t)
}

/// The first distance matrix that covers exactly the NUMA nodes, reordered
/// to the nodes' logical order.
fn numa_distances(topo: &Topology, numa: &[&TopologyObject]) -> Option<Vec<u32>> {
    let n = numa.len();
    if n == 0 {
        return None;
    }
    let all = topo.distances(None).ok()?;
    for d in all {
        if d.num_objects() != n {
            continue;
        }
        let objs: Vec<Option<&TopologyObject>> = d.objects().collect();
        let idx: Option<Vec<usize>> = numa
            .iter()
            .map(|node| {
                objs.iter().position(|o| {
                    o.is_some_and(|o| o.global_persistent_index() == node.global_persistent_index())
                })
            })
            .collect();
        let Some(idx) = idx else { continue };
        let raw = d.distances();
        let mut out = Vec::with_capacity(n * n);
        for &a in &idx {
            for &b in &idx {
                out.push(raw[a * n + b] as u32);
            }
        }
        return Some(out);
    }
    None
}

impl HostTopology {
    fn with_source(mut self, source: &str) -> Self {
        self.rename(source);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_load_with_expected_shape() {
        let g = load("genoa-2s").unwrap();
        assert_eq!(g.source(), "genoa-2s");
        let s = g.shape();
        assert_eq!(
            (s.packages, s.nodes, s.llcs, s.cores, s.cpus),
            (2, 2, 24, 192, 384)
        );
        // Linux numbering: CPU i and i+192 are siblings.
        assert_eq!(g.os_index(0), 0);
        assert_eq!(g.os_index(1), 192);
        assert!(g.share_smt(0, 1));
        assert_eq!(g.caches().l3.unwrap().size, 32 << 20);
        assert_eq!(g.distance(0, 1), 21);

        let gnr = load("gnr-2s").unwrap().shape();
        assert_eq!(
            (gnr.packages, gnr.llcs, gnr.cores, gnr.cpus),
            (2, 2, 240, 480)
        );
        for p in presets::PRESETS {
            let t = load(p.name).unwrap();
            assert_eq!(t.num_packages(), 2, "{}", p.name);
            assert_eq!(t.num_nodes(), 2, "{}", p.name);
        }
    }

    #[test]
    fn synthetic_with_dies_and_nodes_per_die() {
        let t = load("package:2 die:3 [numa] l3:1 l2:2 core:1 pu:2").unwrap();
        let s = t.shape();
        assert_eq!(
            (s.packages, s.dies, s.nodes, s.llcs, s.cores, s.cpus),
            (2, 6, 6, 6, 12, 24)
        );
        assert_eq!(t.llcs_of_node(1), &[1]);
    }

    #[test]
    fn missing_levels_collapse() {
        // No caches at all: L2 = core, LLC = package.
        let t = load("package:2 core:4 pu:2").unwrap();
        assert_eq!(t.num_l2s(), 8);
        assert_eq!(t.num_llcs(), 2);
        assert_eq!(t.num_nodes(), 1);
    }

    #[test]
    fn xml_text_between_elements() {
        let ok = "<topology><!-- a > b, don't --><object type=\"PU\" x=\"a>b\"/>\n \
                  <distances2><indexes length=\"2\">0 1</indexes></distances2></topology>";
        assert_eq!(check_xml_text(ok), Ok(()));
        let bad = "<topology> (<object type=\"PU\"/></topology>";
        assert!(check_xml_text(bad).unwrap_err().contains("text \"(\""));
        let after_close = "<topology><indexes>0</indexes>junk</topology>";
        assert!(check_xml_text(after_close)
            .unwrap_err()
            .contains("\"junk\""));
    }

    #[test]
    fn hwloc_set_syntax() {
        for ok in [
            "0x0",
            "0x0000000f",
            "f",
            "0x00000001,,0x0",
            "0xf...f,0x3",
            "0x1,0x2",
        ] {
            assert!(is_hwloc_bitmap(ok), "{ok}");
        }
        for bad in ["", "0x000000;f", "5x0000000c", "0x", "0x1,", ",", "0xg"] {
            assert!(!is_hwloc_bitmap(bad), "{bad}");
        }
    }

    #[test]
    fn spec_classification_and_errors() {
        assert_eq!(TopologySpec::parse("host").unwrap(), TopologySpec::Host);
        assert!(matches!(
            TopologySpec::parse("GENOA-2s").unwrap(),
            TopologySpec::Preset(_)
        ));
        for bad in [
            "",
            "genoa",
            "package:",
            "package:0 pu:1",
            "package:2 bogus",
            "pkg:2 pu:1",
            "package:2 core:x",
        ] {
            let e = load(bad).unwrap_err().to_string();
            assert!(e.contains("malformed topology description"), "{bad:?}: {e}");
        }
        let e = load("/nonexistent/dir/").unwrap_err().to_string();
        assert!(
            e.contains("malformed topology description") || e.contains("cannot"),
            "{e}"
        );
    }

    #[test]
    fn live_host_loads() {
        let t = load_host().unwrap();
        assert!(t.num_cpus() >= 1);
        assert_eq!(t.distance(0, 0), 10);
    }
}
