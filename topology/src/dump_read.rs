//! Reading a CPUID dump directory with hwloc's x86 parser, and making sure
//! that the parser read the dump and not this machine.
//!
//! WHAT: the checks a dump directory must pass before `lstopo` sees it, the
//! `lstopo` child process that parses it, and a check of what came back.
//!
//! WHY: hwloc's x86 backend does not fail on a dump it cannot use. When the
//! first line of `hwloc-cpuid-info` is not exactly `Architecture: x86` (a
//! dump of an Arm or POWER machine, an empty file, Windows line endings), or
//! the `puN` files are not numbered from 0 without gaps, it prints "Ignoring
//! dumped cpuid directory" and reads this machine's own CPUID instead; when
//! `pu0` holds no CPUID it makes bare CPUs, one per file; and it reads the
//! topology leaves of Intel, AMD, Hygon and Zhaoxin parts only. `lstopo`
//! exits 0 in every case, so a dump of another machine was shown as this
//! host's CPUs under the dump's name.
//!
//! HOW: [`check_dump_dir`] checks the directory the way hwloc's backend will
//! read it: the first line of `hwloc-cpuid-info`, the names and numbering
//! of the `puN` files, that each holds a CPUID leaf 1 line in hwloc's
//! format, and that `pu0`'s leaf 0 names a vendor hwloc knows. Then
//! [`check_read_from_dump`] checks lstopo's XML: as many CPUs as `puN`
//! files, and none of the identity of the machine (`OSName`, `HostName`)
//! that the backend records only when it reads live CPUID.

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::Path;
use std::process::Command;

use crate::limits;

/// What the first line of `hwloc-cpuid-info` must be, byte for byte.
const X86_INFO_LINE: &str = "Architecture: x86\n";

/// The CPU vendors (CPUID leaf 0) whose topology leaves hwloc's x86 parser
/// reads.
const KNOWN_VENDORS: [&str; 5] = [
    "GenuineIntel",
    "AuthenticAMD",
    "HygonGenuine",
    "CentaurHauls",
    "  Shanghai  ",
];

/// The hint that ends most messages.
const HINT: &str = "a CPUID dump directory holds hwloc-cpuid-info and one puN file per CPU \
                    (see `vmm topology cpuid-dump`)";

/// Checks a CPUID dump directory, runs hwloc's x86 CPUID parser on it and
/// returns its XML export, checked to describe the dump (not this host).
pub fn cpuid_dump_to_xml(dir: &Path) -> Result<String, String> {
    let cpus = check_dump_dir(dir)?;
    let (xml, stderr) = run_lstopo(dir, "xml")?;
    check_read_from_dump(&xml, cpus, &stderr)?;
    Ok(xml)
}

/// Runs `lstopo-no-graphics --no-io --of FORMAT` with hwloc's x86 backend on
/// a CPUID dump directory: the third-party judge for generated dumps. The
/// directory is not checked: see [`cpuid_dump_to_xml`].
pub fn lstopo_on_dump(dir: &Path, format: &str) -> Result<String, String> {
    run_lstopo(dir, format).map(|(out, _)| out)
}

/// `lstopo_on_dump`, returning what lstopo printed on stderr too.
fn run_lstopo(dir: &Path, format: &str) -> Result<(String, String), String> {
    let out = Command::new("lstopo-no-graphics")
        .env("HWLOC_CPUID_PATH", dir)
        .env("HWLOC_COMPONENTS", "x86,stop")
        .args(["--no-io", "--of", format, "-"])
        .output()
        .map_err(|e| {
            format!(
                "running lstopo-no-graphics failed ({e}); it comes with hwloc: \
                 `apt install hwloc`"
            )
        })?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if !out.status.success() {
        return Err(format!("lstopo-no-graphics failed: {stderr}"));
    }
    let stdout = String::from_utf8(out.stdout)
        .map_err(|e| format!("lstopo printed non-UTF-8 output: {e}"))?;
    Ok((stdout, stderr))
}

/// Checks that lstopo's XML export describes the dump of `cpus` CPUs: the
/// x86 backend adds the machine's `OSName` and `HostName` only when it
/// reads live CPUID, and makes one CPU per `puN` file when it reads a dump.
/// `stderr` is what lstopo printed, quoted when the check fails.
pub fn check_read_from_dump(xml: &str, cpus: usize, stderr: &str) -> Result<(), String> {
    let said = match stderr.lines().find(|l| !l.trim().is_empty()) {
        Some(l) => format!(" (hwloc said: {})", l.trim()),
        None => String::new(),
    };
    if xml.contains("<info name=\"OSName\"") || xml.contains("<info name=\"HostName\"") {
        return Err(format!(
            "hwloc's x86 parser ignored it and read this machine's CPUs instead{said}; \
             {HINT}"
        ));
    }
    let got = xml.matches("<object type=\"PU\"").count();
    if got != cpus {
        return Err(format!(
            "hwloc's x86 parser found {got} CPUs in its {cpus} puN files{said}; \
             each puN file must hold that CPU's CPUID"
        ));
    }
    Ok(())
}

/// Checks a CPUID dump directory as hwloc's x86 backend will read it (see
/// the module docs) and returns its number of CPUs. Every file the backend
/// reads is a regular file of at most [`limits::MAX_DUMP_FILE_BYTES`], and
/// there are at most [`limits::MAX_CPUS`] `puN` files.
pub fn check_dump_dir(dir: &Path) -> Result<usize, String> {
    let pus = list_dump_dir(dir)?;
    check_info_file(&dir.join("hwloc-cpuid-info"))?;
    for i in 0..pus {
        check_pu_file(&dir.join(format!("pu{i}")), i)?;
    }
    Ok(pus)
}

/// How hwloc's backend reads the name of a directory entry that starts
/// with `pu`: it takes the rest with `strtoul` and counts the entry as a
/// CPU when nothing is left over.
#[derive(Debug, PartialEq, Eq)]
enum PuName {
    /// `puN` with `N` in plain decimal.
    Plain(u64),
    /// A name hwloc also reads as a CPU (`pu`, `pu01`, `pu+1`, `pu 1`)
    /// whose number is not plain.
    Odd,
    /// A name hwloc ignores (`pu0.bak`).
    Other,
}

fn pu_name(rest: &str) -> PuName {
    if !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()) {
        if rest.len() > 1 && rest.starts_with('0') {
            return PuName::Odd;
        }
        return PuName::Plain(rest.parse().unwrap_or(u64::MAX));
    }
    let t = rest.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let t = t.strip_prefix(['+', '-']).unwrap_or(t);
    // `strtoul` of an empty string or of digits alone consumes it all.
    if rest.is_empty() || (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())) {
        PuName::Odd
    } else {
        PuName::Other
    }
}

/// Lists `dir`: checks the kind and size of `hwloc-cpuid-info` and of the
/// `puN` files, and that the CPUs are numbered from 0 without gaps, as
/// hwloc's backend requires. Returns the number of CPUs.
fn list_dump_dir(dir: &Path) -> Result<usize, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot list it: {e}"))?;
    let mut pus = Vec::new();
    let mut info = false;
    for e in entries {
        let e = e.map_err(|e| format!("cannot list it: {e}"))?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        let pu = name.strip_prefix("pu").map(pu_name);
        match pu {
            Some(PuName::Odd) => {
                return Err(format!(
                    "hwloc reads {name:?} as a CPU's file, but its number is not plain: \
                     name the files pu0, pu1, ... (no sign, blank or leading zero)"
                ))
            }
            Some(PuName::Plain(_)) => {}
            _ if name == "hwloc-cpuid-info" => info = true,
            _ => continue,
        }
        check_dump_file(&e.path(), &name)?;
        if let Some(PuName::Plain(i)) = pu {
            pus.push(i);
            if pus.len() > limits::MAX_CPUS {
                return Err(format!(
                    "it holds more than {} puN files; the limit is {} CPUs",
                    limits::MAX_CPUS,
                    limits::MAX_CPUS
                ));
            }
        }
    }
    let has_pu0 = pus.contains(&0);
    match (info, has_pu0) {
        (true, true) => {}
        (false, false) => return Err(format!("it holds neither hwloc-cpuid-info nor pu0; {HINT}")),
        (false, true) => return Err(format!("it lacks hwloc-cpuid-info; {HINT}")),
        (true, false) => return Err(format!("it lacks pu0; {HINT}")),
    }
    pus.sort_unstable();
    if let Some(missing) = (0u64..).zip(&pus).find(|(i, &p)| *i != p).map(|(i, _)| i) {
        return Err(format!(
            "its puN files are not numbered from pu0 without gaps: pu{missing} is missing \
             ({} files, the last is pu{}); hwloc's x86 parser needs pu0 to pu{} (and \
             otherwise describes this machine instead)",
            pus.len(),
            pus[pus.len() - 1],
            pus.len() - 1
        ));
    }
    Ok(pus.len())
}

/// One file of the dump that hwloc reads: a regular file (following links)
/// of at most [`limits::MAX_DUMP_FILE_BYTES`].
fn check_dump_file(path: &Path, name: &str) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {name}: {e}"))?;
    if !meta.is_file() {
        return Err(format!(
            "{name} is {}, not a regular file",
            limits::file_kind(&meta)
        ));
    }
    if meta.len() > limits::MAX_DUMP_FILE_BYTES {
        return Err(format!(
            "{name} is {} bytes; a CPUID dump file is at most {} bytes",
            meta.len(),
            limits::MAX_DUMP_FILE_BYTES
        ));
    }
    Ok(())
}

/// The first line of `hwloc-cpuid-info` must be `Architecture: x86`, with
/// its newline: hwloc compares the line byte for byte and otherwise reads
/// this machine's CPUID instead of the dump.
fn check_info_file(path: &Path) -> Result<(), String> {
    let (f, _) = crate::user_file::open(path, limits::MAX_DUMP_FILE_BYTES)
        .map_err(|e| format!("hwloc-cpuid-info: {e}"))?;
    let mut first = Vec::new();
    // hwloc reads at most 31 bytes of the line; a few more word the message.
    BufReader::new(f.take(80))
        .read_until(b'\n', &mut first)
        .map_err(|e| format!("cannot read hwloc-cpuid-info: {e}"))?;
    if first == X86_INFO_LINE.as_bytes() {
        return Ok(());
    }
    let line = String::from_utf8_lossy(&first);
    let (why, fix) = if first.is_empty() {
        (
            "hwloc-cpuid-info is empty".to_string(),
            "write `Architecture: x86` as its first line",
        )
    } else if line == "Architecture: x86" {
        (
            "the line `Architecture: x86` in hwloc-cpuid-info lacks its newline".to_string(),
            "end the line with a newline",
        )
    } else if line == "Architecture: x86\r\n" {
        (
            "hwloc-cpuid-info has Windows line endings (\\r\\n)".to_string(),
            "convert it to Unix line endings (\\n)",
        )
    } else {
        (
            format!("hwloc-cpuid-info says {:?}", line.trim_end_matches('\n')),
            "this is not an x86 CPUID dump as hwloc-gather-cpuid writes them; for a machine \
             of another architecture give an hwloc XML export instead (`lstopo --of xml` on \
             that machine)",
        )
    };
    Err(format!(
        "{why}, but hwloc's x86 parser reads a dump only when the first line of \
         hwloc-cpuid-info is exactly `Architecture: x86` (otherwise it describes this \
         machine instead): {fix}"
    ))
}

/// One line of a `puN` file as hwloc reads it: `MASK EAX EBX ECX EDX =>
/// EAX EBX ECX EDX` in hex, where MASK says which inputs count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DumpLine {
    mask: u32,
    input: [u32; 4],
    output: [u32; 4],
}

impl DumpLine {
    /// Parses a line the way hwloc's `sscanf("%x %x %x %x %x => %x %x %x
    /// %x")` does for well-formed lines; comments (`#`) and anything else
    /// give `None`, and hwloc skips those lines too.
    fn parse(line: &str) -> Option<Self> {
        if line.starts_with('#') {
            return None;
        }
        let spaced = line.replacen("=>", " => ", 1);
        let mut words = spaced.split_whitespace();
        let mut hex = || hex_word(words.next()?);
        let input = [hex()?, hex()?, hex()?, hex()?, hex()?];
        if words.next() != Some("=>") {
            return None;
        }
        let mut hex = || hex_word(words.next()?);
        let output = [hex()?, hex()?, hex()?, hex()?];
        Some(DumpLine {
            mask: input[0],
            input: [input[1], input[2], input[3], input[4]],
            output,
        })
    }

    /// Whether hwloc answers CPUID `leaf` (sub-leaf 0) with this line: the
    /// inputs the mask names must match.
    fn answers(&self, leaf: u32) -> bool {
        (self.mask & 1 == 0 || self.input[0] == leaf) && (self.mask & 4 == 0 || self.input[2] == 0)
    }
}

/// A hex number as `%x` reads it, with or without `0x`.
fn hex_word(w: &str) -> Option<u32> {
    let w = w
        .strip_prefix("0x")
        .or_else(|| w.strip_prefix("0X"))
        .unwrap_or(w);
    u32::from_str_radix(w, 16).ok()
}

/// What a `puN` file answers for CPUID leaves 0 and 1 (the first line that
/// answers each, as hwloc takes it), and how many CPUID lines it has.
#[derive(Debug, Default)]
struct PuLeaves {
    lines: usize,
    leaf0: Option<[u32; 4]>,
    leaf1: Option<[u32; 4]>,
}

/// Reads a `puN` file until it has found leaves 0 and 1.
fn read_pu_leaves(path: &Path, name: &str) -> Result<PuLeaves, String> {
    let (f, _) = crate::user_file::open(path, limits::MAX_DUMP_FILE_BYTES)
        .map_err(|e| format!("{name}: {e}"))?;
    let mut r = BufReader::new(f.take(limits::MAX_DUMP_FILE_BYTES));
    let mut found = PuLeaves::default();
    let mut buf = Vec::new();
    while found.leaf0.is_none() || found.leaf1.is_none() {
        buf.clear();
        let n = r
            .read_until(b'\n', &mut buf)
            .map_err(|e| format!("cannot read {name}: {e}"))?;
        if n == 0 {
            break;
        }
        let Some(line) = DumpLine::parse(&String::from_utf8_lossy(&buf)) else {
            continue;
        };
        found.lines += 1;
        if found.leaf0.is_none() && line.answers(0) {
            found.leaf0 = Some(line.output);
        }
        if found.leaf1.is_none() && line.answers(1) {
            found.leaf1 = Some(line.output);
        }
    }
    Ok(found)
}

/// The vendor string of a leaf 0 answer (EBX, EDX, ECX).
fn vendor_of(leaf0: [u32; 4]) -> String {
    let [_, ebx, ecx, edx] = leaf0;
    let bytes: Vec<u8> = [ebx, edx, ecx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `puN` must hold CPUID lines, among them leaf 1 (the CPU's APIC ID).
/// `pu0` must also hold leaf 0, which hwloc reads once for all CPUs: a
/// highest leaf of at least 1, and a vendor whose topology leaves it reads.
fn check_pu_file(path: &Path, index: usize) -> Result<(), String> {
    let name = format!("pu{index}");
    let found = read_pu_leaves(path, &name)?;
    if found.lines == 0 {
        return Err(format!(
            "{name} holds no CPUID lines (`MASK EAX EBX ECX EDX => EAX EBX ECX EDX` in hex), \
             so it is not a CPUID dump file; {HINT}"
        ));
    }
    if found.leaf1.is_none() {
        return Err(format!(
            "{name} has no line for CPUID leaf 1 (`1 1 0 0 0 => ...`), which holds the \
             CPU's APIC ID; {HINT}"
        ));
    }
    if index > 0 {
        return Ok(());
    }
    let Some(leaf0) = found.leaf0 else {
        return Err(format!(
            "pu0 has no line for CPUID leaf 0 (`1 0 0 0 0 => ...`), which names the vendor \
             and the highest leaf; {HINT}"
        ));
    };
    let vendor = vendor_of(leaf0);
    if !KNOWN_VENDORS.contains(&vendor.as_str()) {
        return Err(format!(
            "pu0 names CPU vendor {vendor:?} (CPUID leaf 0); hwloc's x86 parser reads the \
             topology of GenuineIntel, AuthenticAMD, HygonGenuine, CentaurHauls and \
             \"  Shanghai  \" CPUs only, so it cannot describe this dump"
        ));
    }
    if leaf0[0] < 1 {
        return Err(format!(
            "pu0's CPUID leaf 0 says the highest leaf is {:#x}: the dump holds no \
             topology to read; {HINT}",
            leaf0[0]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dump of `n` CPUs with `vendor` in leaf 0, in hwloc's format.
    fn dump(dir: &Path, n: usize, vendor: &[u8; 12]) {
        let reg = |o: usize| u32::from_le_bytes(vendor[o..o + 4].try_into().unwrap());
        std::fs::write(dir.join("hwloc-cpuid-info"), X86_INFO_LINE).unwrap();
        for i in 0..n {
            let text = format!(
                "# mask e[abcd]x => e[abcd]x\n1 0 0 0 0 => b {:x} {:x} {:x}\n\
                 1 1 0 0 0 => 806f8 {:x} 200000 10000000\n",
                reg(0),
                reg(8),
                reg(4),
                (i as u32) << 24
            );
            std::fs::write(dir.join(format!("pu{i}")), text).unwrap();
        }
    }

    #[test]
    fn pu_names_as_hwloc_reads_them() {
        assert_eq!(pu_name("0"), PuName::Plain(0));
        assert_eq!(pu_name("17"), PuName::Plain(17));
        for odd in ["", "01", "+1", "-1", " 1", "\t2", "00"] {
            assert_eq!(pu_name(odd), PuName::Odd, "{odd:?}");
        }
        for other in ["0.bak", "x", " ", "+", "1 ", "0~"] {
            assert_eq!(pu_name(other), PuName::Other, "{other:?}");
        }
    }

    #[test]
    fn dump_lines_parse_as_hwloc_does() {
        let l = DumpLine::parse("5 b 0 1 0 => 1 2 100 3\n").unwrap();
        assert_eq!(
            (l.mask, l.input, l.output),
            (5, [0xb, 0, 1, 0], [1, 2, 0x100, 3])
        );
        // It answers sub-leaf 1 of leaf 0xB, not sub-leaf 0.
        assert!(!l.answers(0xb));
        assert!(DumpLine::parse("1 0 0 0 0=>0x1f 0X2 3 4").is_some());
        for bad in [
            "# 1 0 0 0 0 => 1 2 3 4",
            "hello world",
            "1 0 0 0 0 1 2 3 4",
            "",
        ] {
            assert_eq!(DumpLine::parse(bad), None, "{bad:?}");
        }
        let leaf0 = DumpLine::parse("1 0 0 0 0 => 1f 756e6547 6c65746e 49656e69").unwrap();
        assert!(leaf0.answers(0) && !leaf0.answers(1));
        assert_eq!(vendor_of(leaf0.output), "GenuineIntel");
        // A line whose mask names no input answers every leaf, as in hwloc.
        assert!(DumpLine::parse("0 0 0 0 0 => 1 2 3 4").unwrap().answers(1));
    }

    #[test]
    fn a_good_dump_passes() {
        let d = tempfile::tempdir().unwrap();
        dump(d.path(), 3, b"GenuineIntel");
        assert_eq!(check_dump_dir(d.path()), Ok(3));
        std::fs::write(d.path().join("pu0.bak"), "not read by hwloc").unwrap();
        assert_eq!(check_dump_dir(d.path()), Ok(3));
    }

    #[test]
    fn another_architecture_is_refused() {
        let d = tempfile::tempdir().unwrap();
        dump(d.path(), 2, b"AuthenticAMD");
        let info = d.path().join("hwloc-cpuid-info");
        for (text, want) in [
            ("Architecture: aarch64\n", "says \"Architecture: aarch64\""),
            ("", "is empty"),
            ("Architecture: x86", "lacks its newline"),
            ("Architecture: x86\r\n", "Windows line endings"),
            ("Architecture: x86_64\n", "says \"Architecture: x86_64\""),
        ] {
            std::fs::write(&info, text).unwrap();
            let e = check_dump_dir(d.path()).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(e.contains("is exactly `Architecture: x86`"), "{e}");
        }
    }

    #[test]
    fn cpus_numbered_with_a_gap_or_oddly_are_refused() {
        let d = tempfile::tempdir().unwrap();
        dump(d.path(), 4, b"GenuineIntel");
        std::fs::remove_file(d.path().join("pu2")).unwrap();
        let e = check_dump_dir(d.path()).unwrap_err();
        assert!(e.contains("pu2 is missing"), "{e}");
        assert!(e.contains("3 files, the last is pu3"), "{e}");
        std::fs::rename(d.path().join("pu3"), d.path().join("pu02")).unwrap();
        let e = check_dump_dir(d.path()).unwrap_err();
        assert!(e.contains("\"pu02\"") && e.contains("not plain"), "{e}");
    }

    #[test]
    fn files_that_are_not_cpuid_dumps_are_refused() {
        let d = tempfile::tempdir().unwrap();
        dump(d.path(), 2, b"GenuineIntel");
        std::fs::write(d.path().join("pu1"), "MIDR_EL1 0x410fd0c1\n").unwrap();
        let e = check_dump_dir(d.path()).unwrap_err();
        assert!(e.contains("pu1 holds no CPUID lines"), "{e}");
        std::fs::write(d.path().join("pu1"), "1 7 0 0 0 => 0 0 0 0\n").unwrap();
        let e = check_dump_dir(d.path()).unwrap_err();
        assert!(e.contains("pu1 has no line for CPUID leaf 1"), "{e}");
        std::fs::write(d.path().join("pu0"), "1 1 0 0 0 => 0 0 0 0\n").unwrap();
        let e = check_dump_dir(d.path()).unwrap_err();
        assert!(e.contains("pu0 has no line for CPUID leaf 0"), "{e}");
    }

    #[test]
    fn unknown_vendors_and_empty_leaf_0_are_refused() {
        let d = tempfile::tempdir().unwrap();
        dump(d.path(), 2, b"AAAAAAAAAAAA");
        let e = check_dump_dir(d.path()).unwrap_err();
        assert!(e.contains("vendor \"AAAAAAAAAAAA\""), "{e}");
        for v in KNOWN_VENDORS {
            dump(d.path(), 2, v.as_bytes().try_into().unwrap());
            assert_eq!(check_dump_dir(d.path()), Ok(2), "{v}");
        }
        let pu0 = std::fs::read_to_string(d.path().join("pu0")).unwrap();
        std::fs::write(d.path().join("pu0"), pu0.replace("=> b ", "=> 0 ")).unwrap();
        let e = check_dump_dir(d.path()).unwrap_err();
        assert!(e.contains("highest leaf is 0x0"), "{e}");
    }

    #[test]
    fn output_that_describes_this_host_is_refused() {
        let from_dump = "<topology>\n<object type=\"Machine\">\n<info name=\"Backend\" \
                         value=\"x86\"/>\n<object type=\"PU\" os_index=\"0\"/>\n\
                         <object type=\"PU\" os_index=\"1\"/>\n</object></topology>";
        assert_eq!(check_read_from_dump(from_dump, 2, ""), Ok(()));
        let e = check_read_from_dump(from_dump, 3, "").unwrap_err();
        assert!(e.contains("found 2 CPUs in its 3 puN files"), "{e}");
        let live = from_dump.replace("x86\"/>", "x86\"/><info name=\"HostName\" value=\"vm\"/>");
        let e = check_read_from_dump(&live, 2, "Ignoring dumped cpuid directory.").unwrap_err();
        assert!(e.contains("read this machine's CPUs instead"), "{e}");
        assert!(
            e.contains("hwloc said: Ignoring dumped cpuid directory."),
            "{e}"
        );
    }
}
