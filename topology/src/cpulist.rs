//! Linux-style CPU lists: `0-3,8,10-11`.
//!
//! The same format as sysfs `cpulist` files, `taskset -c` and the guest's
//! `shared_cpu_list`, so that what the VMM prints can be compared with what a
//! guest kernel reports, character for character.

use crate::error::{Result, TopologyError};

/// Parses a CPU list such as `0-3,8,10-11` into sorted, unique CPU numbers.
///
/// Whitespace around items is ignored. An empty string is an error: an empty
/// set of CPUs is never what a user meant.
pub fn parse(list: &str) -> Result<Vec<u32>> {
    let err = |reason: String| TopologyError::CpuList {
        list: list.to_string(),
        reason,
    };
    let trimmed = list.trim();
    if trimmed.is_empty() {
        return Err(err("it is empty; give CPUs like 0-3,8".into()));
    }
    let mut out = Vec::new();
    for item in trimmed.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(err("it has an empty item (two commas in a row?)".into()));
        }
        let num = |s: &str| -> Result<u32> {
            s.trim()
                .parse::<u32>()
                .map_err(|_| err(format!("{s:?} is not a CPU number")))
        };
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(err(format!("range {item:?} runs backwards")));
                }
                if b - a > 1 << 20 {
                    return Err(err(format!("range {item:?} is implausibly large")));
                }
                out.extend(a..=b);
            }
            None => out.push(num(item)?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Formats CPU numbers as a compact list (`0-3,8`). The input need not be sorted.
pub fn format(cpus: &[u32]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < v.len() {
        let start = v[i];
        let mut end = start;
        while i + 1 < v.len() && v[i + 1] == end + 1 {
            i += 1;
            end = v[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        assert_eq!(parse("0-3,8,10-11").unwrap(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(format(&[11, 10, 8, 3, 2, 1, 0]), "0-3,8,10-11");
        assert_eq!(format(&[5]), "5");
        assert_eq!(format(&[]), "");
        assert_eq!(parse(" 3 , 1-2 ,1").unwrap(), vec![1, 2, 3]);
    }

    #[test]
    fn errors_name_the_problem() {
        for bad in ["", "1,,2", "a", "3-1", "1-", "-1"] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("malformed CPU list"), "{bad:?}: {e}");
        }
        assert!(parse("3-1").unwrap_err().to_string().contains("backwards"));
    }
}
