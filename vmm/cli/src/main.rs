//! The `vmm` command line. See `vmm --help`.

use std::process::ExitCode;

fn main() -> ExitCode {
    // The origin of `vmm run --timeout`.
    vmm::cli::args::mark_start();
    // A long `vmm serve` creates and destroys VMs: keep its heap steady.
    let _ = vmm_machine::memory::steady_heap();
    let cli = match vmm::cli::parse() {
        Ok(c) => c,
        Err(code) => return code,
    };
    vmm::cli::init_tracing(cli.verbose);
    match vmm::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            let code = ExitCode::from(vmm::exit::status_for_error(&e));
            // One line: the chain of contexts, outermost first.
            eprintln!("error: {}", vmm::exit::one_line(&e));
            code
        }
    }
}
