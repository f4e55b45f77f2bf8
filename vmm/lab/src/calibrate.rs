//! How fast the guests' compute loop runs on this host.
//!
//! WHAT: [`iters_per_us`], the loop iterations per microsecond of the
//! micro-guests' compute loop, measured once per process.
//! WHY: workloads ask for bursts in microseconds; the guest counts loop
//! iterations, and their speed differs between hosts (and by orders of
//! magnitude under kvm_pvm emulation).
//! HOW: a one-vCPU guest runs the loop once and exits through a port; the
//! loop grows until it takes 20 ms, the best of three runs minus an empty
//! run is the measurement.

use std::sync::OnceLock;
use std::time::Instant;

use super::{guests, BenchError};
use vmm_machine::micro::{MicroError, MicroHost, MicroVm, MicroVmSpec};

/// Loop iterations of the guest's compute loop per microsecond, measured
/// once per process.
pub fn iters_per_us(host: &MicroHost) -> Result<f64, BenchError> {
    static CAL: OnceLock<f64> = OnceLock::new();
    if let Some(v) = CAL.get() {
        return Ok(*v);
    }
    let time = |iters: u64| -> Result<f64, BenchError> {
        let mut vm = MicroVm::build(
            host,
            &MicroVmSpec::new("calibrate", 1, guests::compute_once(iters)?),
        )?;
        let mut v = vm.vcpus.remove(0);
        let io = vm.io.clone();
        let t0 = Instant::now();
        loop {
            match v.run(&*io).map_err(MicroError::from)? {
                vmm_machine::vcpu::VcpuExit::Io { .. } => break,
                vmm_machine::vcpu::VcpuExit::Kicked => continue,
                other => {
                    return Err(BenchError::Failed(format!(
                        "calibration guest stopped with {other:?}"
                    )))
                }
            }
        }
        Ok(t0.elapsed().as_secs_f64() * 1e6)
    };
    // Grow the loop until it takes 20 ms (the guest may be emulated).
    let mut n: u64 = 10_000;
    while n < 1 << 40 && time(n)? < 20_000.0 {
        n *= 4;
    }
    let empty = time(1)?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        best = best.min((time(n)? - empty).max(1.0));
    }
    let v = n as f64 / best;
    let _ = CAL.set(v);
    tracing::info!(
        "guest compute loop: {v:.3} iterations per us ({n} iterations took {best:.0} us)"
    );
    Ok(v)
}
