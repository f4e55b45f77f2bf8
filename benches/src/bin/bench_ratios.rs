//! Prints baseline/fix ratios from criterion's saved estimates:
//! `cargo run -p benches --release --bin bench_ratios -- [CRITERION_DIR]`
//! (default `$CARGO_TARGET_DIR/criterion` or `target/criterion`).

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| {
        format!(
            "{}/criterion",
            std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into())
        )
    });
    let lines = benches::ratios(std::path::Path::new(&dir));
    if lines.is_empty() {
        eprintln!("no criterion estimates under {dir}; run `cargo bench -p benches` first");
        std::process::exit(1);
    }
    for l in lines {
        println!("{l}");
    }
}
