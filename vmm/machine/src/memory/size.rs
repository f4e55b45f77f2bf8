//! Byte counts as users write them, and the host's RAM.

use std::fmt;

use crate::layout::MIB;

/// A byte count printed the way users type it (`512M`, `2G`, `1536K`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanSize(pub u64);

impl fmt::Display for HumanSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
            if b >= 1 << shift && b % (1 << shift) == 0 {
                return write!(f, "{}{unit}", b >> shift);
            }
        }
        if b >= MIB {
            write!(f, "{:.1}M", b as f64 / MIB as f64)
        } else {
            write!(f, "{b}B")
        }
    }
}

/// Parses a memory size: a number with an optional binary unit `K`, `M`,
/// `G` or `T` (`KiB`, `MB`... accepted too, all meaning powers of 1024). A
/// bare number means MiB, as in QEMU's `-m`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(digits_end);
    if num.is_empty() {
        return Err(format!(
            "{s:?} is not a size: give a number with a unit, e.g. 512M or 2G"
        ));
    }
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "m" | "mb" | "mib" => 20,
        "k" | "kb" | "kib" => 10,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "b" => 0,
        other => {
            return Err(format!(
                "{s:?} has an unknown unit {other:?}: use K, M, G or T (e.g. 512M, 2G)"
            ))
        }
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size: give a number with a unit, e.g. 512M"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes >= (1u64 << 52) as f64 {
        return Err(format!("{s:?} is implausibly large"));
    }
    Ok(bytes as u64)
}

/// The host's RAM (`MemTotal` of `/proc/meminfo`), in bytes.
pub fn host_mem_total() -> Option<u64> {
    meminfo("MemTotal:")
}

/// The host's RAM available without swapping (`MemAvailable`), in bytes.
pub fn host_mem_available() -> Option<u64> {
    meminfo("MemAvailable:")
}

fn meminfo(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::GIB;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M").unwrap(), 512 * MIB);
        assert_eq!(parse_size("2G").unwrap(), 2 * GIB);
        assert_eq!(parse_size("2GiB").unwrap(), 2 * GIB);
        assert_eq!(parse_size("1.5G").unwrap(), 1536 * MIB);
        assert_eq!(parse_size("768").unwrap(), 768 * MIB);
        assert_eq!(parse_size("65536K").unwrap(), 64 * MIB);
        assert!(parse_size("12X").unwrap_err().contains("unknown unit"));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999T").is_err());
        assert_eq!(HumanSize(512 * MIB).to_string(), "512M");
        assert_eq!(HumanSize(3 * GIB).to_string(), "3G");
    }
}
