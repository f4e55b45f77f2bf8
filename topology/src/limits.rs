//! Limits on what a user may hand this crate, and the checks that enforce
//! them before hwloc sees the input.
//!
//! hwloc trusts its input: a synthetic `pu:100000` makes it build (and us
//! render) a hundred thousand objects, an `indexes=` list with repeats is
//! quietly collapsed, and a device node given as an XML file can make the
//! binding panic. So every user-supplied SPEC is checked here first:
//!
//! * at most [`MAX_CPUS`] logical CPUs (PUs) and [`MAX_NODES`] NUMA nodes.
//!   Real hosts stay well inside: 2-socket servers have up to 512 CPUs and
//!   8-socket ones about 1,900. Note that the `vcpu_sched` scheduler's
//!   `CpuMask` holds `vcpu_sched::MAX_CPUS` (1024) CPUs, so the scheduler
//!   and its benches accept a smaller subset of what this crate can show;
//!   they check that bound themselves.
//! * OS indexes (`indexes=` lists, XML `os_index`) below [`MAX_OS_INDEX`]
//!   for CPUs and [`MAX_NODE_OS_INDEX`] for NUMA nodes (Linux's own
//!   `NR_CPUS`/`MAX_NUMNODES` ceilings), since hwloc sizes bitmaps by them;
//! * a synthetic description of at most [`MAX_SPEC_BYTES`] and
//!   [`MAX_LEVELS`] levels;
//! * an XML file that is a regular file of at most [`MAX_XML_BYTES`] that
//!   looks like XML;
//! * a CPUID dump directory of at most [`MAX_CPUS`] `puN` files, each a
//!   regular file of at most [`MAX_DUMP_FILE_BYTES`].

use std::path::Path;

use crate::text::plural;

/// The most logical CPUs (PUs) a loaded topology may have.
pub const MAX_CPUS: usize = 4096;
/// The most NUMA nodes a loaded topology may have.
pub const MAX_NODES: usize = 256;
/// CPU OS indexes must be below this (Linux's largest `NR_CPUS` on x86).
pub const MAX_OS_INDEX: u64 = 8192;
/// NUMA node OS indexes must be below this (Linux's `MAX_NUMNODES`).
pub const MAX_NODE_OS_INDEX: u64 = 1024;
/// The longest synthetic description accepted, in bytes.
pub const MAX_SPEC_BYTES: usize = 64 << 10;
/// The most levels (`type:count` items) in a synthetic description.
pub const MAX_LEVELS: usize = 32;
/// The largest hwloc XML file accepted (16 MiB; the XML export of a real
/// 8-socket host, I/O devices included, is a few MiB).
pub const MAX_XML_BYTES: u64 = 16 << 20;
/// The largest file accepted in a CPUID dump directory (real ones are a
/// few KiB).
pub const MAX_DUMP_FILE_BYTES: u64 = 1 << 20;

/// What a synthetic description amounts to, counted from its arities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntheticCounts {
    /// Logical CPUs (the product of all arities).
    pub cpus: u64,
    /// NUMA nodes (attached `[numa]` items times the width of the level
    /// they hang from; 1 when there is none, as hwloc adds one).
    pub nodes: u64,
}

/// Splits a synthetic string into items at blanks outside `(..)` and `[..]`.
fn items(spec: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = None;
    for (i, c) in spec.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!("there is an unmatched `{c}`"));
                }
            }
            _ => {}
        }
        if c.is_whitespace() && depth == 0 {
            if let Some(s) = start.take() {
                out.push(&spec[s..i]);
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if depth != 0 {
        return Err("a `(` or `[` is never closed".into());
    }
    if let Some(s) = start {
        out.push(&spec[s..]);
    }
    Ok(out)
}

/// The value of `indexes=` in an attribute list `a=b c=d`, if any.
fn indexes_attr(attrs: &str) -> Option<&str> {
    attrs
        .split(' ')
        .filter_map(|a| a.strip_prefix("indexes="))
        .next_back()
}

/// Checks an `indexes=` value for a level of `total` objects, the way hwloc
/// reads it, but failing where hwloc would silently drop or collapse it.
fn check_indexes(item: &str, value: &str, total: u64, limit: u64) -> Result<(), String> {
    let in_item = |m: String| format!("in `{item}`: {m}");
    if value.is_empty() {
        return Err(in_item("the list is empty".into()));
    }
    if value.chars().all(|c| c.is_ascii_digit() || c == ',') {
        return check_index_list(value, total, limit).map_err(in_item);
    }
    if value.starts_with(|c: char| c.is_ascii_digit()) {
        return check_interleaving(value, total).map_err(in_item);
    }
    // Interleaving by level types (`indexes=core:pu`): hwloc checks those
    // and the loaded topology is checked afterwards.
    Ok(())
}

/// An explicit list (`0,2,1,3`): exactly one distinct OS index below
/// `limit` per object of the level.
fn check_index_list(value: &str, total: u64, limit: u64) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    let mut n = 0u64;
    for v in value.split(',') {
        let x: u64 = v
            .parse()
            .map_err(|_| "give one number per object, separated by commas (e.g. 0,2,1,3)")?;
        if x >= limit {
            return Err(format!(
                "index {x} is too large; the limit is {}",
                limit - 1
            ));
        }
        if !seen.insert(x) {
            return Err(format!(
                "index {x} is given twice; each object needs its own index"
            ));
        }
        n += 1;
    }
    if n != total {
        return Err(format!(
            "the list has {} but the level has {}; give exactly one index per object",
            plural(n, "index", "indexes"),
            plural(total, "object", "objects")
        ));
    }
    Ok(())
}

/// An interleaving `step*count:step*count:...`: computes the indexes as
/// hwloc does (adding the innermost loop it adds) and checks that they
/// number every object of the level exactly once.
fn check_interleaving(value: &str, total: u64) -> Result<(), String> {
    let mut loops = Vec::new();
    for part in value.split(':') {
        let (s, n) = part
            .split_once('*')
            .ok_or("an interleaving is STEP*COUNT:STEP*COUNT..., e.g. 2*4:1*2")?;
        let (s, n): (u64, u64) = match (s.parse(), n.parse()) {
            (Ok(s), Ok(n)) if s > 0 && n > 0 => (s, n),
            _ => {
                return Err(format!(
                    "`{part}` is not STEP*COUNT with two whole numbers above 0"
                ))
            }
        };
        if s > total || n > total {
            return Err(format!("`{part}` exceeds the level's {total} objects"));
        }
        loops.push((s, n));
    }
    let nbs = loops.iter().try_fold(1u64, |a, &(_, n)| a.checked_mul(n));
    let minstep = loops
        .iter()
        .map(|&(s, _)| s)
        .min()
        .unwrap_or(total)
        .min(total);
    match nbs {
        Some(nbs) if nbs == total => {}
        Some(nbs) if nbs < total && total % nbs == 0 && minstep == total / nbs => {
            loops.push((1, total / nbs));
        }
        _ => {
            return Err(format!(
                "the counts multiply to {}, not to the level's {total} objects",
                nbs.map_or("too much".to_string(), |n| n.to_string())
            ))
        }
    }
    let mut idx = vec![0u64; total as usize];
    let mut mul = 1u64;
    for &(step, nb) in &loops {
        for (j, x) in idx.iter_mut().enumerate() {
            *x += ((j as u64 / step) % nb) * mul;
        }
        mul = mul.saturating_mul(nb);
    }
    let mut seen = vec![false; total as usize];
    for &x in &idx {
        if x >= total || std::mem::replace(&mut seen[x as usize], true) {
            return Err("it does not number every object exactly once; check the steps".into());
        }
    }
    Ok(())
}

fn is_numa_type(ty: &str) -> bool {
    let t = ty.to_ascii_lowercase();
    t.starts_with("numa") || t == "node"
}

/// One `type:count(attrs)` item of a synthetic description, split up.
struct LevelItem<'a> {
    ty: &'a str,
    count: u64,
    attrs: &'a str,
}

/// Splits a `type:count` item, with optional `(attributes)`, checking its
/// syntax. A count too large for `u64` reads as `u64::MAX` (and then fails
/// the CPU limit).
fn parse_level_item(item: &str) -> Result<LevelItem<'_>, String> {
    let (ty, rest) = item
        .split_once(':')
        .ok_or_else(|| format!("item `{item}` is not of the form type:count (e.g. core:8)"))?;
    let digits_end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (count, after) = rest.split_at(digits_end);
    if count.is_empty() {
        return Err(format!(
            "item `{item}` has no count after `:`; give a whole number above 0"
        ));
    }
    let attrs = if after.is_empty() {
        ""
    } else if let Some(a) = after.strip_prefix('(').and_then(|a| a.strip_suffix(')')) {
        a
    } else {
        return Err(format!(
            "item `{item}`: the count must be a whole number, optionally followed by \
             attributes in parentheses, as in l3:2(size=32MiB)"
        ));
    };
    let count: u64 = count.parse().unwrap_or(u64::MAX);
    if count == 0 {
        return Err(format!("item `{item}` has a count of 0; counts start at 1"));
    }
    Ok(LevelItem { ty, count, attrs })
}

/// A bracketed item (`[numa]`, `[numa(indexes=0,1)]`): checks that it is a
/// NUMA node and returns its `indexes=` value, if any.
fn parse_attached_item(item: &str) -> Result<Option<&str>, String> {
    let inner = item.strip_prefix('[').unwrap_or(item);
    let inner = inner
        .strip_suffix(']')
        .ok_or_else(|| format!("item `{item}` must end with `]`, as in [numa]"))?;
    let (ty, attrs) = match inner.split_once('(') {
        Some((t, a)) => (t, a.strip_suffix(')').unwrap_or(a)),
        None => (inner, ""),
    };
    if !is_numa_type(ty) {
        return Err(format!(
            "item `{item}`: only NUMA nodes can be attached in brackets, as in [numa]"
        ));
    }
    Ok(indexes_attr(attrs))
}

/// Counts gathered while walking a synthetic description's items.
#[derive(Default)]
struct Walk<'a> {
    /// Objects at the current level.
    width: u64,
    /// `type:count` levels seen.
    levels: usize,
    /// NUMA nodes so far.
    nodes: u64,
    /// `[numa(indexes=..)]` items share one index list over all of them.
    numa_indexes: Option<(&'a str, &'a str)>,
}

impl<'a> Walk<'a> {
    /// Takes one `type:count` level: checks the level and CPU limits, and
    /// its `indexes=` list against the level's width.
    fn level(&mut self, item: &'a str) -> Result<(), String> {
        let LevelItem { ty, count, attrs } = parse_level_item(item)?;
        self.levels += 1;
        if self.levels > MAX_LEVELS {
            return Err(format!("it has more than {MAX_LEVELS} levels"));
        }
        self.width = match self.width.checked_mul(count) {
            Some(w) if w <= MAX_CPUS as u64 => w,
            _ => {
                return Err(format!(
                    "it has more than {MAX_CPUS} CPUs (the counts multiply past that \
                     at `{item}`); the limit is {MAX_CPUS} CPUs"
                ))
            }
        };
        if is_numa_type(ty) {
            self.nodes += self.width;
        }
        if let Some(v) = indexes_attr(attrs) {
            let limit = if is_numa_type(ty) {
                MAX_NODE_OS_INDEX
            } else {
                MAX_OS_INDEX
            };
            check_indexes(item, v, self.width, limit)?;
        }
        Ok(())
    }

    /// Takes one bracketed item: a NUMA node under each object of the
    /// current level.
    fn attached(&mut self, item: &'a str) -> Result<(), String> {
        self.nodes += self.width;
        if let Some(v) = parse_attached_item(item)? {
            self.numa_indexes = Some((item, v));
        }
        Ok(())
    }
}

/// Checks a synthetic description against the limits and counts its CPUs
/// and NUMA nodes, without building anything.
pub fn check_synthetic(spec: &str) -> Result<SyntheticCounts, String> {
    if spec.len() > MAX_SPEC_BYTES {
        return Err(format!(
            "it is {} bytes long; the limit is {MAX_SPEC_BYTES}",
            spec.len()
        ));
    }
    let items = items(spec)?;
    if items.is_empty() {
        return Err("it is empty".into());
    }
    let mut walk = Walk {
        width: 1,
        ..Walk::default()
    };
    for (i, &item) in items.iter().enumerate() {
        if item.starts_with('[') {
            walk.attached(item)?;
        } else if i == 0 && item.starts_with('(') {
            // attributes of the machine
        } else {
            walk.level(item)?;
        }
    }
    if walk.levels == 0 {
        return Err("it has no type:count item; end it with the CPUs, e.g. pu:2".into());
    }
    if walk.nodes > MAX_NODES as u64 {
        return Err(format!(
            "it has {} NUMA nodes; the limit is {MAX_NODES}",
            walk.nodes
        ));
    }
    if let Some((item, v)) = walk.numa_indexes {
        check_indexes(item, v, walk.nodes, MAX_NODE_OS_INDEX)?;
    }
    Ok(SyntheticCounts {
        cpus: walk.width,
        nodes: walk.nodes.max(1),
    })
}

/// Checks that `path` is a regular file of at most `max` bytes and reads
/// it, without blocking on a FIFO or reading a device for ever
/// ([`crate::user_file::read`]).
pub fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    crate::user_file::read(path, max).map_err(|e| e.to_string())
}

/// "a directory", "a character device", ... for messages
/// ([`crate::user_file::kind`]).
pub fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    crate::user_file::kind(meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        let c = check_synthetic("package:2 [numa] l3:12(size=33554432) l2:8 core:1 pu:2").unwrap();
        assert_eq!((c.cpus, c.nodes), (384, 2));
        let c = check_synthetic("package:2 core:4 pu:2").unwrap();
        assert_eq!((c.cpus, c.nodes), (16, 1));
        let c = check_synthetic("[numa] package:2 die:2 [numa] core:1 pu:1").unwrap();
        assert_eq!((c.cpus, c.nodes), (4, 5));
        // Attributes with blanks inside parentheses are one item.
        let c = check_synthetic("l3:2(size=32MiB indexes=1,0) pu:2").unwrap();
        assert_eq!(c.cpus, 4);
        for p in crate::presets::PRESETS {
            check_synthetic(p.synthetic).unwrap();
        }
    }

    #[test]
    fn limits() {
        let e = check_synthetic("pu:16384").unwrap_err();
        assert!(e.contains("the limit is 4096 CPUs"), "{e}");
        let e = check_synthetic("package:99999999999999999999999 pu:2").unwrap_err();
        assert!(e.contains("limit"), "{e}");
        assert!(check_synthetic("pu:4096").is_ok());
        let e = check_synthetic("package:512 [numa] pu:1").unwrap_err();
        assert!(e.contains("512 NUMA nodes; the limit is 256"), "{e}");
        let e = check_synthetic(&"core:1 ".repeat(40)).unwrap_err();
        assert!(e.contains("levels"), "{e}");
    }

    #[test]
    fn indexes() {
        let e = check_synthetic("pu:2(indexes=0,0,0,0)").unwrap_err();
        assert!(e.contains("index 0 is given twice"), "{e}");
        let e = check_synthetic("pu:2(indexes=0,1,2)").unwrap_err();
        assert!(
            e.contains("has 3 indexes but the level has 2 objects"),
            "{e}"
        );
        let e = check_synthetic("pu:2(indexes=0,99999999)").unwrap_err();
        assert!(e.contains("too large"), "{e}");
        assert!(check_synthetic("core:2 pu:2(indexes=0,2,1,3)").is_ok());
        assert!(check_synthetic("core:4 pu:2(indexes=2*4:1*2)").is_ok());
        // hwloc adds the missing innermost loop.
        assert!(check_synthetic("core:4 pu:2(indexes=2*4)").is_ok());
        let e = check_synthetic("core:4 pu:2(indexes=1*4:1*2)").unwrap_err();
        assert!(e.contains("exactly once"), "{e}");
        let e = check_synthetic("core:4 pu:2(indexes=3*3)").unwrap_err();
        assert!(e.contains("multiply"), "{e}");
        let e = check_synthetic("package:2 [numa(indexes=0,0)] pu:1").unwrap_err();
        assert!(e.contains("given twice"), "{e}");
    }

    #[test]
    fn syntax() {
        for (bad, want) in [
            ("package:", "no count"),
            ("package:-1 pu:2", "no count"),
            ("package:0 pu:1", "count of 0"),
            ("package:2 bogus", "type:count"),
            ("package:0x10 pu:1", "whole number"),
            ("package:2 (size=1) pu:1", "type:count"),
            ("l3:1(size=1 pu:1", "never closed"),
            ("pu:1)", "unmatched"),
            ("[core] pu:1", "only NUMA nodes"),
        ] {
            let e = check_synthetic(bad).unwrap_err();
            assert!(e.contains(want), "{bad:?}: {e}");
        }
    }
}
