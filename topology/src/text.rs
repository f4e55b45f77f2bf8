//! Small text helpers shared by messages and renderings.
//!
//! WHAT: counts with their noun (`2 cores`) and byte sizes in binary units
//! (`32 MiB`).
//! WHY: the models (`host`, `guest`), the input checks (`limits`) and the
//! renderings all word things the same way; these helpers used to live in
//! `render`, which made every model import the module that renders it (an
//! import circle).
//! HOW: a leaf module that imports nothing from this crate.

/// `1 core`, `2 cores`: a count with its noun in the right number.
pub fn plural(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// Formats a byte count with a binary unit (`32 MiB`, `1.5 GiB`).
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if (v - v.round()).abs() < 1e-9 {
        format!("{} {}", v.round() as u64, UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes() {
        assert_eq!(human_bytes(32 << 20), "32 MiB");
        assert_eq!(human_bytes(1310720), "1.2 MiB");
        assert_eq!(human_bytes(512), "512 B");
    }

    #[test]
    fn counts_take_the_right_noun() {
        assert_eq!(plural(1u32, "core", "cores"), "1 core");
        assert_eq!(plural(0u32, "core", "cores"), "0 cores");
        assert_eq!(plural(12u64, "index", "indexes"), "12 indexes");
    }
}
