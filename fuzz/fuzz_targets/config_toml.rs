//! `vmm run --config FILE`: any bytes as the TOML file. Loading must return
//! a value or an error naming the file, never panic.
#![no_main]

use std::io::Write as _;

use libfuzzer_sys::fuzz_target;
use vmm::config::FileConfig;

fuzz_target!(|data: &[u8]| {
    let mut f = tempfile::Builder::new()
        .suffix(".toml")
        .tempfile()
        .expect("temp file");
    f.write_all(data).expect("write");
    match FileConfig::load(f.path()) {
        Ok(_) => assert!(std::str::from_utf8(data).is_ok(), "non-UTF-8 accepted"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("--config"), "error without its field: {msg}");
        }
    }
});
