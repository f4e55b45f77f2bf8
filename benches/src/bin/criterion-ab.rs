//! `criterion-ab HOME PASS...`: criterion's saved passes (`--save-baseline
//! PASS`) under HOME, side by side ([`benches::ab`]): the raw data as JSON
//! on stdout, the table on stderr. `scripts/sync-layer-ab.sh` runs it.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        eprintln!("usage: criterion-ab CRITERION_HOME PASS [PASS...]");
        return ExitCode::from(2);
    }
    let home = PathBuf::from(&args[0]);
    let passes = args[1..].to_vec();
    let data = benches::ab::collect(&home, &passes);
    if data.as_object().is_none_or(|o| o.is_empty()) {
        eprintln!(
            "error: no criterion data for passes {} under {}",
            passes.join(", "),
            home.display()
        );
        return ExitCode::from(1);
    }
    eprint!("{}", benches::ab::table(&data, &passes));
    match serde_json::to_string_pretty(&data) {
        Ok(s) => {
            println!("{s}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: serialising the data: {e}");
            ExitCode::from(1)
        }
    }
}
