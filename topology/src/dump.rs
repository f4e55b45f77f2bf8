//! CPUID dumps in hwloc's format, and reading hwloc's synthetic output.
//!
//! A dump directory holds `hwloc-cpuid-info` (first line
//! `Architecture: x86`) and one file `puN` per logical CPU with lines
//!
//! ```text
//! <mask> <eax> <ebx> <ecx> <edx> => <eax> <ebx> <ecx> <edx>
//! ```
//!
//! in hex, where bit 0 of the mask says EAX is an input and bit 2 that ECX
//! is one (5 for indexed leaves, 1 otherwise). hwloc's x86 backend reads
//! such a directory when `HWLOC_CPUID_PATH` names it, which makes hwloc's own
//! parser the judge of what a guest is shown.

use std::fmt::Write as _;
use std::path::Path;

use crate::cpuid::{CpuidSet, Vendor, FLAG_INDEX};
use crate::error::{Result, TopologyError};
use crate::guest::GuestTopology;

/// Renders one CPU's entries as a `puN` file.
pub fn format_pu(set: &CpuidSet) -> String {
    let mut out = String::from("# mask e[abcd]x => e[abcd]x\n");
    for e in set.entries() {
        let mask = if e.flags & FLAG_INDEX != 0 { 5 } else { 1 };
        let index = if e.flags & FLAG_INDEX != 0 {
            e.index
        } else {
            0
        };
        let _ = writeln!(
            out,
            "{mask:x} {:x} 0 {index:x} 0 => {:x} {:x} {:x} {:x}",
            e.function, e.eax, e.ebx, e.ecx, e.edx
        );
    }
    out
}

/// The file that marks a directory as a dump this library wrote: only such
/// a directory (or an empty or new one) is written into, and only its
/// `puN` files are ever removed.
pub const DUMP_MARKER: &str = ".vmm-cpuid-dump";

/// Checks that `dir` may take a dump: absent, empty, or one this library
/// wrote (it holds [`DUMP_MARKER`]). Anything else, a user's own dump or
/// files, is refused untouched; the message says what to give instead.
pub fn check_dump_dir(dir: &Path) -> std::result::Result<(), String> {
    let meta = match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot look at it: {e}")),
        Ok(m) => m,
    };
    if !meta.is_dir() {
        return Err(format!(
            "it is {}, not a directory; give a new or empty directory",
            crate::user_file::kind(&meta)
        ));
    }
    let mut entries = std::fs::read_dir(dir).map_err(|e| format!("cannot list it: {e}"))?;
    if entries.next().is_none() || dir.join(DUMP_MARKER).is_file() {
        return Ok(());
    }
    Err(format!(
        "it holds files that vmm did not write (no {DUMP_MARKER} marker), which it would \
         replace; give a new or empty directory (vmm rewrites only a dump it wrote)"
    ))
}

/// Writes the CPUID of every vCPU of `guest`, computed from `base` in
/// `vendor`'s encoding, as an hwloc CPUID dump in `dir` (created if needed;
/// an existing one must pass [`check_dump_dir`]), with its
/// [`DUMP_MARKER`].
pub fn write_cpuid_dump(
    guest: &GuestTopology,
    base: &CpuidSet,
    vendor: Vendor,
    dir: &Path,
) -> Result<()> {
    check_dump_dir(dir).map_err(|m| TopologyError::Output(format!("{}: {m}", dir.display())))?;
    std::fs::create_dir_all(dir)
        .map_err(|e| TopologyError::io(format!("creating {}", dir.display()), e))?;
    let marker = dir.join(DUMP_MARKER);
    std::fs::write(
        &marker,
        "An hwloc CPUID dump written by `vmm topology cpuid-dump`; vmm may rewrite it.\n",
    )
    .map_err(|e| TopologyError::io(format!("writing {}", marker.display()), e))?;
    // Stale puN files from a bigger guest would be read as extra CPUs.
    let entries = std::fs::read_dir(dir)
        .map_err(|e| TopologyError::io(format!("reading {}", dir.display()), e))?;
    for ent in entries.flatten() {
        let name = ent.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("pu") && name[2..].chars().all(|c| c.is_ascii_digit()) {
            let _ = std::fs::remove_file(ent.path());
        }
    }
    let info = dir.join("hwloc-cpuid-info");
    std::fs::write(&info, "Architecture: x86\n")
        .map_err(|e| TopologyError::io(format!("writing {}", info.display()), e))?;
    for i in 0..guest.num_vcpus() {
        let set = guest.cpuid(i, base, vendor);
        let p = dir.join(format!("pu{i}"));
        std::fs::write(&p, format_pu(&set))
            .map_err(|e| TopologyError::io(format!("writing {}", p.display()), e))?;
    }
    Ok(())
}

/// One level of an hwloc synthetic description: its type and arity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntheticLevel {
    /// hwloc's type name (`Package`, `L3Cache`, `Core`, ...).
    pub kind: String,
    /// Children per parent.
    pub arity: u32,
}

/// Parses what `lstopo --of synthetic` prints (or a synthetic string) into
/// its normal levels, dropping attributes and memory (`[NUMANode]`) items.
pub fn parse_synthetic(s: &str) -> Vec<SyntheticLevel> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut tok = String::new();
    let flush = |tok: &mut String, out: &mut Vec<SyntheticLevel>| {
        if let Some((k, n)) = tok.split_once(':') {
            let digits: String = n.chars().take_while(|c| c.is_ascii_digit()).collect();
            if let Ok(arity) = digits.parse() {
                out.push(SyntheticLevel {
                    kind: k.to_string(),
                    arity,
                });
            }
        }
        tok.clear();
    };
    for ch in s.chars() {
        match ch {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            c if c.is_whitespace() && depth == 0 => flush(&mut tok, &mut out),
            c if depth == 0 => tok.push(c),
            _ => {}
        }
    }
    flush(&mut tok, &mut out);
    out
}

/// Total number of objects of `kind` (case-insensitive, with hwloc's short
/// names accepted: `l3` = `L3Cache`, `pu`, `package`) in a parsed description.
pub fn total_of(levels: &[SyntheticLevel], kind: &str) -> u32 {
    let norm = |k: &str| {
        let k = k.to_ascii_lowercase();
        match k.as_str() {
            "l3" | "l3cache" | "l3u" => "l3cache".to_string(),
            "l2" | "l2cache" | "l2u" => "l2cache".to_string(),
            "socket" => "package".to_string(),
            other => other.to_string(),
        }
    };
    let want = norm(kind);
    let mut total = 1u32;
    let mut found = false;
    for l in levels {
        total = total.saturating_mul(l.arity);
        if norm(&l.kind) == want {
            found = true;
            break;
        }
    }
    if found {
        total
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lstopo_output() {
        let s = "[NUMANode] Package:2 Die:3 L3Cache:1(size=16777216) L2Cache:3(size=4194304) Core:1 L1dCache:2(size=32768) L1iCache:1(size=32768) PU:1";
        let l = parse_synthetic(s);
        assert_eq!(
            l[0],
            SyntheticLevel {
                kind: "Package".into(),
                arity: 2
            }
        );
        assert_eq!(total_of(&l, "package"), 2);
        assert_eq!(total_of(&l, "Die"), 6);
        assert_eq!(total_of(&l, "l3"), 6);
        assert_eq!(total_of(&l, "L2Cache"), 18);
        assert_eq!(total_of(&l, "Core"), 18);
        assert_eq!(total_of(&l, "PU"), 36);
        assert_eq!(total_of(&l, "Group"), 0);
        let g = parse_synthetic(
            "Package:2 [NUMANode(memory=1)] L3Cache:12(size=1) Core:8 PU:2(indexes=2*192:1*2)",
        );
        assert_eq!(total_of(&g, "pu"), 384);
    }

    #[test]
    fn pu_file_format() {
        let g = GuestTopology::from_spec("package:1 core:2 pu:1").unwrap();
        let base = crate::cpuid::host_cpuid();
        let v = base.vendor().unwrap_or(Vendor::Intel);
        let txt = format_pu(&g.cpuid(1, &base, v));
        assert!(txt.lines().any(|l| l.starts_with("1 1 0 0 0 => ")), "{txt}");
        assert!(txt.lines().any(|l| l.starts_with("5 b 0 1 0 => ")), "{txt}");
        let dir = tempfile::tempdir().unwrap();
        write_cpuid_dump(&g, &base, v, dir.path()).unwrap();
        assert!(dir.path().join("pu1").exists());
        assert!(!dir.path().join("pu2").exists());
    }
}
