//! Every command in README.md and docs/*.md is run by a test, at a small
//! size.
//!
//! The commands are taken from the fenced code blocks (`sh`, `bash` or no
//! language; and `$ `-prompted lines in any block) of the README and
//! docs/*.md: continuation lines are joined, trailing `# comments` dropped,
//! and a line is a command when it starts with `vmm `, `target/debug/vmm`,
//! `target/release/vmm`, `scripts/`, `guest/`, `vmm/scripts/`, `cargo ` or
//! `HWLOC_`.
//!
//! [`TABLE`] says how each one is run. Either by this test — verbatim, or
//! with only the size flags ([`SIZE_FLAGS`]) reduced, output paths
//! ([`OUTPUT_FLAGS`]) sent into a temporary directory, and placeholders of
//! templates (`...`, `$w`, `W`, `OLD/vmm`) expanded as the entry lists them;
//! [`check_form`] verifies that mechanically — or, for the few that are a
//! whole suite or long by nature, by another named mechanism, with the
//! reason. A documented command missing from the table fails the test, and
//! so does a table entry that no longer appears in the docs.
//!
//! `vmm`, `target/debug/vmm` and `target/release/vmm` all run the binary
//! under test ([`integration_tests::vmm_bin`]); the commands run in a
//! temporary directory in which `.cache/guest` is the guest image cache,
//! scripts in the repository root. Linux boots need the guest kernel and
//! fail (not skip) without it: run guest/build.sh (scripts/test.sh does,
//! before the tests).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use integration_tests::guest::{guest_cache, guest_images};
use integration_tests::{vmm_bin, workspace_root};
use table::TABLE;

#[path = "doc_commands/table.rs"]
mod table;

/// Flags whose value may be reduced (or which may be added, to reduce a
/// default): run length, repetitions, and workload size.
const SIZE_FLAGS: &[&str] = &[
    "--duration",
    "-d",
    "--reps",
    "--vms",
    "--vcpus",
    "--timeout",
    "--tasks",
    "--groups",
    "--group-size",
    "--pings",
    "--interval",
    "--neighbours",
];

/// Size flags without a value (scripts' small modes).
const SIZE_SWITCHES: &[&str] = &["--small"];

/// Flags naming an output path: sent into the temporary directory.
const OUTPUT_FLAGS: &[&str] = &["--json", "-o", "--out"];

/// Environment variables a run may set: the binary under test instead of a
/// fresh release build, and the scripts' small modes.
const ALLOWED_ENV: &[&str] = &[
    "VMM_BIN",
    "RESULTS_MD",
    "DEMO_DURATION",
    "DEMO_REPS",
    "DEMO_PINGS",
];

/// The small run length used for benchmark commands, in seconds.
const SMALL: &str = "0.1";

/// How one documented command is run.
enum How {
    /// Run by this test, in each of these forms.
    Run(&'static [Form]),
    /// Not run here: `by` names what runs it, `why` says why not here.
    Elsewhere { by: &'static str, why: &'static str },
}

/// One way this test runs a documented command.
struct Form {
    /// Placeholders of a template, in order: each replaces the next
    /// occurrence of that whole word of the documented command with the
    /// given words (possibly none).
    expand: &'static [(&'static str, &'static str)],
    /// The command as run (by bash). `{tmp}` is the temporary directory.
    run: &'static str,
    /// Environment (names from [`ALLOWED_ENV`]); `{vmm}` is the binary.
    env: &'static [(&'static str, &'static str)],
    /// Files written (relative to the temporary directory) before the run.
    files: &'static [(&'static str, &'static str)],
    /// What must hold besides exit status 0.
    expect: Expect,
}

enum Expect {
    /// Exit status 0.
    Ok,
    /// Exit 0 and stdout contains this.
    Stdout(&'static str),
    /// Exit 0 and stdout contains each of these.
    StdoutAll(&'static [&'static str]),
    /// Exit 0 and stdout, with every `(...)` attribute group removed, is
    /// this hwloc synthetic string.
    Synthetic(&'static str),
    /// `scripts/results.sh --small --out {tmp}/results`: exit 0, and every
    /// command in a results block of the docs is the one the run recorded
    /// for that block, modulo size flags and output paths.
    Results,
}

const fn run(run: &'static str) -> Form {
    Form {
        expand: &[],
        run,
        env: &[],
        files: &[],
        expect: Expect::Ok,
    }
}

// ---------------------------------------------------------------------
// Extraction.

/// Where a command was found.
#[derive(Debug, Clone)]
struct Found {
    file: String,
    line: usize,
    /// The `<!-- results:begin NAME -->` block it is in, if any.
    block: Option<String>,
}

const PREFIXES: &[&str] = &[
    "vmm ",
    "target/debug/vmm",
    "target/release/vmm",
    "scripts/",
    "guest/",
    "vmm/scripts/",
    "cargo ",
    "HWLOC_",
];

fn doc_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut v = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("reading docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    v.extend(docs);
    v
}

/// Cuts a trailing `# comment` (a `#` at the start or after whitespace,
/// outside quotes).
fn strip_comment(s: &str) -> &str {
    let (mut sq, mut dq) = (false, false);
    let mut prev_ws = true;
    for (i, c) in s.char_indices() {
        match c {
            '\'' if !dq => sq = !sq,
            '"' if !sq => dq = !dq,
            '#' if !sq && !dq && prev_ws => return &s[..i],
            _ => {}
        }
        prev_ws = c.is_whitespace();
    }
    s
}

fn normalise(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The commands of one markdown text, with their line numbers and the
/// results block (generated by scripts/results.sh) they are in.
fn extract(text: &str) -> Vec<(usize, String, Option<String>)> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    let mut pending: Option<(usize, String)> = None;
    let mut block: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if fence.is_none() {
            if let Some(rest) = t.strip_prefix("<!-- results:begin ") {
                block = Some(rest.trim_end_matches("-->").trim().to_string());
            } else if t.starts_with("<!-- results:end -->") {
                block = None;
            }
        }
        if let Some(info) = t.strip_prefix("```") {
            fence = match fence {
                None => Some(info.trim().to_string()),
                Some(_) => None,
            };
            pending = None;
            continue;
        }
        let Some(lang) = &fence else { continue };
        let shell = matches!(lang.as_str(), "" | "sh" | "bash");
        let (start, mut cur) = match pending.take() {
            Some((n, s)) => (n, s + " " + line.trim()),
            None => (i + 1, line.trim().to_string()),
        };
        if let Some(s) = cur.strip_suffix('\\') {
            cur = s.to_string();
            pending = Some((start, cur));
            continue;
        }
        let cmd = match cur.strip_prefix("$ ") {
            Some(c) => c,
            None if shell => cur.as_str(),
            None => continue,
        };
        let cmd = normalise(strip_comment(cmd));
        // A directory listing (`guest/   the guest kernel config`) is not
        // a command: the first word must be longer than the prefix.
        let first = cmd.split(' ').next().unwrap_or("");
        if PREFIXES
            .iter()
            .any(|p| cmd.starts_with(p) && (!p.ends_with('/') || first.len() > p.len()))
        {
            out.push((start, cmd, block.clone()));
        }
    }
    out
}

/// Every documented command, with where it appears.
fn documented() -> BTreeMap<String, Vec<Found>> {
    let root = workspace_root();
    let mut m: BTreeMap<String, Vec<Found>> = BTreeMap::new();
    for f in doc_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let rel = f.strip_prefix(&root).unwrap().display().to_string();
        for (line, cmd, block) in extract(&text) {
            m.entry(cmd).or_default().push(Found {
                file: rel.clone(),
                line,
                block,
            });
        }
    }
    m
}

// ---------------------------------------------------------------------
// The mechanical check: a run form is its documented command modulo size
// flags, output paths and the entry's listed expansions.

/// Splits like a shell: whitespace separates words; quotes group and are
/// kept (so that words compare as written).
fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut sq, mut dq, mut any) = (false, false, false);
    for c in s.chars() {
        match c {
            '\'' if !dq => {
                sq = !sq;
                cur.push(c);
                any = true;
            }
            '"' if !sq => {
                dq = !dq;
                cur.push(c);
                any = true;
            }
            c if c.is_whitespace() && !sq && !dq => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    assert!(!sq && !dq, "unbalanced quotes in {s:?}");
    if any {
        out.push(cur);
    }
    out
}

/// Seconds of a size value: `2`, `0.1`, `10m`, `500ms`, `90s`, `1h`.
fn size_value(v: &str) -> Option<f64> {
    let v = v.trim_matches('"');
    for (suf, mul) in [("ms", 1e-3), ("s", 1.0), ("m", 60.0), ("h", 3600.0)] {
        if let Some(n) = v.strip_suffix(suf) {
            if let Ok(x) = n.parse::<f64>() {
                return Some(x * mul);
            }
        }
    }
    v.parse().ok()
}

/// The words without size flags and output flags (and their values), and
/// the size flags' values.
fn strip_allowed(w: &[String]) -> (Vec<String>, BTreeMap<String, String>) {
    let mut rest = Vec::new();
    let mut sizes = BTreeMap::new();
    let mut i = 0;
    while i < w.len() {
        let a = w[i].as_str();
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f, Some(v.to_string())),
            _ => (a, None),
        };
        if SIZE_SWITCHES.contains(&flag) {
            sizes.insert(flag.to_string(), String::new());
            i += 1;
        } else if SIZE_FLAGS.contains(&flag) || OUTPUT_FLAGS.contains(&flag) {
            let v = match inline {
                Some(v) => v,
                None => {
                    i += 1;
                    w.get(i).cloned().unwrap_or_default()
                }
            };
            if SIZE_FLAGS.contains(&flag) {
                sizes.insert(flag.to_string(), v);
            }
            i += 1;
        } else {
            rest.push(w[i].clone());
            i += 1;
        }
    }
    (rest, sizes)
}

/// Applies a form's expansions to the documented command's words.
fn expand(doc: &str, expansions: &[(&str, &str)]) -> Result<Vec<String>, String> {
    let mut w = words(doc);
    let mut from = 0;
    for (ph, with) in expansions {
        let Some(i) = (from..w.len()).find(|&i| w[i] == *ph) else {
            return Err(format!(
                "placeholder {ph:?} not found (in order) in {doc:?}"
            ));
        };
        let rep = words(with);
        let n = rep.len();
        w.splice(i..i + 1, rep);
        from = i + n;
    }
    Ok(w)
}

/// Checks that `form` runs `doc` modulo the allowed differences.
fn check_form(doc: &str, form: &Form) -> Result<(), String> {
    let expanded = expand(doc, form.expand)?;
    let (d, dsizes) = strip_allowed(&expanded);
    let (r, rsizes) = strip_allowed(&words(form.run));
    if d != r {
        return Err(format!(
            "the run form differs from the documented command beyond size flags and output paths:\n  doc: {}\n  run: {}",
            d.join(" "),
            r.join(" ")
        ));
    }
    for (flag, dv) in &dsizes {
        let Some(rv) = rsizes.get(flag) else {
            return Err(format!(
                "{flag} {dv} is documented but dropped in {:?}",
                form.run
            ));
        };
        if let (Some(a), Some(b)) = (size_value(dv), size_value(rv)) {
            if b > a {
                return Err(format!("{flag}: {rv} is larger than the documented {dv}"));
            }
        }
    }
    for (k, _) in form.env {
        if !ALLOWED_ENV.contains(k) {
            return Err(format!("environment variable {k} is not an allowed one"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------
// Running.

/// One command at a time: the machine is small, and timing-sensitive
/// commands must not share it with each other.
static SERIAL: Mutex<()> = Mutex::new(());

fn needs_kernel(form: &Form) -> bool {
    form.run.contains(".cache/guest/")
        || form.files.iter().any(|(_, c)| c.contains(".cache/guest/"))
}

fn strip_attributes(s: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            c if depth == 0 => out.push(c),
            _ => {}
        }
    }
    normalise(&out)
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// Runs one form in `tmp`; returns the wall time.
fn run_form(doc: &str, form: &Form, tmp: &Path) -> Duration {
    let vmm = vmm_bin();
    let root = workspace_root();
    let mut cmd = form.run.replace("{tmp}", &tmp.display().to_string());
    // vmm never replaces a result file: an earlier form's is removed, as a
    // user running the documented commands one after another would.
    let ws = words(&cmd);
    for pair in ws.windows(2) {
        if matches!(pair[0].as_str(), "--json" | "--plot") {
            let out = Path::new(&pair[1]);
            if out.starts_with(tmp) {
                let _ = std::fs::remove_file(out);
                let _ = std::fs::remove_file(out.with_extension("csv"));
            }
        }
    }
    let first = words(&cmd)[0].clone();
    if ["vmm", "target/debug/vmm", "target/release/vmm"].contains(&first.as_str()) {
        cmd = format!("{}{}", shell_quote(&vmm), &cmd[first.len()..]);
    }
    let script = ["scripts/", "vmm/scripts/", "guest/"]
        .iter()
        .any(|p| first.starts_with(p));
    for (name, content) in form.files {
        std::fs::write(tmp.join(name), content).unwrap();
    }
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(&cmd)
        .current_dir(if script { root.as_path() } else { tmp })
        .stdin(Stdio::null());
    for (k, v) in form.env {
        c.env(
            k,
            v.replace("{vmm}", &vmm.display().to_string())
                .replace("{results_md}", env!("CARGO_BIN_EXE_results_md")),
        );
    }
    let t0 = Instant::now();
    let out = c.output().expect("running bash");
    let took = t0.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ctx = || {
        let tail = |s: &str| {
            let l: Vec<&str> = s.lines().collect();
            l[l.len().saturating_sub(30)..].join("\n")
        };
        format!(
            "documented: {doc}\nran: {cmd}\nexit {:?} after {:.1} s\n--- stdout (tail) ---\n{}\n--- stderr (tail) ---\n{}",
            out.status.code(),
            took.as_secs_f64(),
            tail(&stdout),
            tail(&stderr)
        )
    };
    assert!(out.status.success(), "{}", ctx());
    match form.expect {
        Expect::Ok => {}
        Expect::Stdout(s) => assert!(stdout.contains(s), "stdout lacks {s:?}:\n{}", ctx()),
        Expect::StdoutAll(all) => {
            for s in all {
                assert!(stdout.contains(s), "stdout lacks {s:?}:\n{}", ctx());
            }
        }
        Expect::Synthetic(s) => assert_eq!(strip_attributes(&stdout), s, "{}", ctx()),
        Expect::Results => results_blocks_match(&tmp.join("results")),
    }
    took
}

/// The commands in the docs' results blocks are the ones scripts/results.sh
/// ran for those blocks (its `--small` run in `out`), modulo size flags,
/// output paths and the binary's path; and the run wrote every block.
fn results_blocks_match(out: &Path) {
    let meta = std::fs::read_to_string(out.join("data/results-meta.txt")).unwrap();
    let cmds: BTreeMap<&str, &str> = meta
        .lines()
        .filter_map(|l| l.strip_prefix("cmd."))
        .filter_map(|l| l.split_once('='))
        .collect();
    let mut errors = Vec::new();
    for (doc, at) in documented() {
        for f in at {
            let Some(block) = &f.block else { continue };
            let Some(ran) = cmds.get(block.as_str()) else {
                errors.push(format!(
                    "{}:{}: results block {block} was not run by scripts/results.sh",
                    f.file, f.line
                ));
                continue;
            };
            let strip = |c: &str| {
                let w = words(c);
                let (rest, _) = strip_allowed(&w[1..]);
                (w[0].ends_with("vmm"), rest)
            };
            let (dv, d) = strip(&doc);
            let (rv, r) = strip(ran);
            if !(dv && rv && d == r) {
                errors.push(format!(
                    "{}:{}: results block {block}: the doc's command differs from what scripts/results.sh runs beyond size flags and output paths:\n  doc: {doc}\n  ran: {ran}",
                    f.file, f.line
                ));
            }
        }
    }
    for f in ["results-scheduler.md", "results-vcpus.md"] {
        let t = std::fs::read_to_string(out.join(f)).unwrap();
        assert!(
            !t.contains("Not generated yet"),
            "{f}: a results block was not generated"
        );
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// Runs every form of the table for which `pick` holds, in table order.
fn run_table(pick: impl Fn(&Form) -> bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join(".cache")).unwrap();
    std::os::unix::fs::symlink(guest_cache(), tmp.path().join(".cache/guest")).unwrap();
    let t0 = Instant::now();
    for (doc, how) in TABLE {
        let How::Run(forms) = how else { continue };
        for form in forms.iter().filter(|f| pick(f)) {
            let took = run_form(doc, form, tmp.path());
            eprintln!("doc_commands: {:.1} s: {}", took.as_secs_f64(), form.run);
        }
    }
    eprintln!("doc_commands: {:.1} s in all", t0.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------
// Tests.

#[test]
fn every_documented_command_is_in_the_table_and_run_as_documented() {
    let docs = documented();
    assert!(docs.len() > 20, "too few commands found: {docs:?}");
    let mut errors = Vec::new();
    let mut seen = BTreeMap::new();
    for (doc, how) in TABLE {
        let key = normalise(doc);
        if seen.insert(key.clone(), ()).is_some() {
            errors.push(format!("table entry twice: {doc}"));
        }
        if !docs.contains_key(&key) {
            errors.push(format!(
                "table entry no longer in README.md or docs/*.md (update the table): {doc}"
            ));
        }
        match how {
            How::Run(forms) => {
                assert!(!forms.is_empty());
                for f in *forms {
                    if let Err(e) = check_form(&key, f) {
                        errors.push(format!("{doc}:\n  {e}"));
                    }
                }
            }
            How::Elsewhere { by, why } => {
                assert!(!by.is_empty() && !why.is_empty());
            }
        }
    }
    for (cmd, at) in &docs {
        // Commands in generated results blocks: scripts/results.sh (its
        // entry below) runs them; `results_blocks_match` checks each.
        if at.iter().all(|f| f.block.is_some()) {
            continue;
        }
        if !seen.contains_key(cmd) {
            let at: Vec<String> = at
                .iter()
                .map(|f| format!("{}:{}", f.file, f.line))
                .collect();
            errors.push(format!(
                "documented command not in tests/tests/doc_commands.rs TABLE ({}): {cmd}",
                at.join(", ")
            ));
        }
    }
    let elsewhere = TABLE
        .iter()
        .filter(|(_, h)| matches!(h, How::Elsewhere { .. }))
        .count();
    // 15: the suite-level commands (cargo test, clippy, guest builds, the
    // fuzz gate, the proptest suite) that CI's scripts/test.sh runs itself,
    // and the full-size benchmarks (480 simulated CPUs) whose small forms
    // other tests run.
    assert!(
        elsewhere <= 15,
        "{elsewhere} commands not run here: keep that list short"
    );
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn extraction_joins_continuations_and_drops_comments() {
    let md = "text\n```sh\nvmm run --a 1 \\\n    --b \"x # y\"   # a comment\n# only a comment\nfor w in a b; do\n  vmm bench $w\ndone\n```\n```rust\nvmm not_this\n```\n```text\n$ vmm bench runq\nvmm not_this_either\n```\n";
    let got: Vec<String> = extract(md).into_iter().map(|(_, c, _)| c).collect();
    assert_eq!(
        got,
        [
            "vmm run --a 1 --b \"x # y\"",
            "vmm bench $w",
            "vmm bench runq"
        ]
    );
}

#[test]
fn the_check_allows_only_size_flags_outputs_and_listed_expansions() {
    let doc = "vmm bench runq --vms 8 --duration 2 --json out.json";
    assert!(check_form(
        doc,
        &run("vmm bench runq --vms 2 --duration 0.1 --json /t/o.json")
    )
    .is_ok());
    assert!(check_form(
        doc,
        &run("vmm bench runq --vms 2 --duration 0.1 --json o --reps 1")
    )
    .is_ok());
    // Larger, dropped, or another flag changed.
    assert!(check_form(doc, &run("vmm bench runq --vms 16 --duration 0.1 --json o")).is_err());
    assert!(check_form(doc, &run("vmm bench runq --duration 0.1 --json o")).is_err());
    assert!(check_form(
        doc,
        &run("vmm bench cyclic --vms 2 --duration 0.1 --json o")
    )
    .is_err());
    assert!(check_form(
        doc,
        &run("vmm bench runq --vms 2 --duration 0.1 --json o --check")
    )
    .is_err());
    let t = "vmm bench W --executor workers|threads [--x]";
    let f = Form {
        expand: &[("W", "runq"), ("workers|threads", "threads"), ("[--x]", "")],
        ..run("vmm bench runq --executor threads")
    };
    assert!(check_form(t, &f).is_ok());
    let f = Form {
        expand: &[("W", "runq")],
        ..run("vmm bench runq --executor threads")
    };
    assert!(check_form(t, &f).is_err());
}

/// Every command of the table that needs no guest kernel, at its small size.
#[test]
fn documented_commands_run() {
    run_table(|f| !needs_kernel(f));
}

/// The documented Linux boots. They need the guest kernel: without it this
/// fails, saying to run guest/build.sh (scripts/test.sh runs it first).
#[test]
fn documented_linux_boots_run() {
    guest_images();
    run_table(needs_kernel);
}
