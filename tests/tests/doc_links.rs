//! Every relative link in the project's Markdown (README.md, docs/, the
//! crates' and data directories' READMEs) names a file or directory that
//! exists, and every `#anchor` names a heading of its target, as GitHub
//! renders it. A section dropped by a careless edit once left two anchors
//! other pages linked to pointing nowhere; this catches that.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use integration_tests::workspace_root;

/// The Markdown files checked: README.md, then every `.md` under docs/
/// and every README.md of a top-level directory, recursively.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, all_md: bool, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    walk(&p, all_md, out);
                }
            } else if (all_md && name.ends_with(".md")) || name == "README.md" {
                out.push(p);
            }
        }
    }
    let mut v = vec![root.join("README.md")];
    walk(&root.join("docs"), true, &mut v);
    for top in [
        "vcpu_sched",
        "vmm",
        "topology",
        "guest",
        "benches",
        "tests",
        "fuzz",
    ] {
        walk(&root.join(top), false, &mut v);
    }
    v.sort();
    v.dedup();
    v
}

/// The text outside fenced code blocks.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, inline code marks and
/// punctuation dropped (letters, digits, `-` and `_` kept), spaces made
/// `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text's headings (a repeated heading's later
/// ones get `-1`, `-2`, ... as on GitHub).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in prose(text).lines() {
        let t = line.trim_start_matches('#');
        if t.len() == line.len() || !t.starts_with(' ') {
            continue;
        }
        let s = slug(t);
        let n = seen.entry(s.clone()).or_insert(0);
        out.insert(if *n == 0 {
            s.clone()
        } else {
            format!("{s}-{n}")
        });
        *n += 1;
    }
    out
}

/// Every `](target)` of a text: its link targets.
fn links(text: &str) -> Vec<String> {
    let p = prose(text);
    let mut out = Vec::new();
    let mut rest = p.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            let t = &rest[..end];
            if !t.is_empty() && !t.contains(char::is_whitespace) {
                out.push(t.to_string());
            }
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn slugs_and_links_parse_as_github_renders_them() {
    assert_eq!(slug(" Lazy kicks"), "lazy-kicks");
    assert_eq!(
        slug(" Wake order: credit without wakeup preemption"),
        "wake-order-credit-without-wakeup-preemption"
    );
    assert_eq!(slug(" `vmm sim`: the model"), "vmm-sim-the-model");
    let a = anchors("# A\n## B b\n```\n# not a heading\n```\n## B b\n#no\n");
    assert_eq!(
        a,
        ["a", "b-b", "b-b-1"]
            .into_iter()
            .map(String::from)
            .collect()
    );
    assert_eq!(
        links("see [x](a.md#b) and [y](https://e.org)\n```\n[z](c.md)\n```\n"),
        ["a.md#b", "https://e.org"]
    );
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = workspace_root();
    let files = markdown_files(&root);
    assert!(files.len() > 10, "found only {files:?}");
    let mut cache: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut bad = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let dir = f.parent().unwrap();
        for l in links(&text) {
            // other schemes (https:, mailto:) are not checked here
            if l.split_once(':')
                .is_some_and(|(s, _)| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphabetic()))
            {
                continue;
            }
            let (path, anchor) = match l.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (l.as_str(), None),
            };
            let target = if path.is_empty() {
                f.clone()
            } else {
                dir.join(path)
            };
            let shown = f.strip_prefix(&root).unwrap_or(f).display().to_string();
            if !target.exists() {
                bad.push(format!("{shown}: {l}: no such file"));
                continue;
            }
            let Some(a) = anchor else { continue };
            if target.extension().is_none_or(|e| e != "md") {
                continue;
            }
            let set = cache
                .entry(target.clone())
                .or_insert_with(|| anchors(&std::fs::read_to_string(&target).unwrap_or_default()));
            if !set.contains(a) {
                bad.push(format!("{shown}: {l}: no heading with that anchor"));
            }
        }
    }
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}
