//! The ACPI CPU hotplug controller: which of a VM's possible vCPUs the
//! guest may use, and the registers through which the DSDT's AML
//! ([`crate::acpi::cpu_hotplug`]) learns of changes.
//!
//! WHAT: every possible vCPU (`max_vcpus`) exists in KVM from boot; the
//! first `boot_vcpus` are *present*. `vm.resize` marks more of them
//! present (each with an *insert* event) or asks the guest to give some
//! back (a *remove* event), then raises the Generic Event Device's
//! interrupt ([`GED_GSI`](crate::layout::GED_GSI)). The guest's `_EVT`
//! runs the scan method, which walks the vCPUs through the selector,
//! `Notify`s each one with an event (1: device check, 3: eject request)
//! and acknowledges it. Linux then brings a hot-added CPU up (INIT/SIPI
//! to a vCPU that was waiting for one since boot), or offlines a removed
//! one and calls its `_EJ0`, which clears its present bit.
//!
//! WHY this split: creating KVM vCPUs and scheduler tasks in a running
//! VM would make the executors' vCPU sets grow while they run; a vCPU
//! that the guest never started costs a task that sleeps in the
//! wait-for-SIPI state (see [`crate::vcpu_body::linux`]), so all of
//! them are made at boot and hotplug is only what the guest is told.
//!
//! HOW (the registers, at [`CPU_HOTPLUG_PORT`](crate::layout::CPU_HOTPLUG_PORT)):
//!
//! | offset | size | access | meaning |
//! |---|---|---|---|
//! | 0 | 4 | R/W | selector: the vCPU index the status byte refers to |
//! | 4 | 1 | R | status: bit 0 present, bit 1 insert pending, bit 2 remove pending |
//! | 4 | 1 | W | command: bit 1 acknowledges the insert, bit 2 the remove, bit 3 ejects |
//!
//! Other offsets read as zero and ignore writes; a selector past the
//! last vCPU reads status 0 and ignores commands. The idea (a selector
//! plus a per-CPU status/command register, scanned by AML) is the one of
//! QEMU's `docs/specs/acpi_cpu_hotplug.rst` and Cloud Hypervisor's CPU
//! manager; the register layout here is this VMM's own.

use std::sync::Mutex;

use tracing::{info, warn};
use vmm_sys_util::eventfd::EventFd;

/// Status bit: the vCPU is present (`_STA` 0xf).
pub const STATUS_PRESENT: u8 = 1 << 0;
/// Status bit: an insert event is pending; writing it acknowledges.
pub const STATUS_INSERTING: u8 = 1 << 1;
/// Status bit: a remove event is pending; writing it acknowledges.
pub const STATUS_REMOVING: u8 = 1 << 2;
/// Command bit: eject the selected vCPU (its `_EJ0`).
pub const COMMAND_EJECT: u8 = 1 << 3;

/// Offset of the selector register.
pub const REG_SELECTOR: u16 = 0;
/// Offset of the status/command register.
pub const REG_STATUS: u16 = 4;

/// Errors of [`CpuHotplug::resize`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HotplugError {
    /// Asked for 0 or for more vCPUs than the VM can have.
    #[error("{desired} vCPUs asked for, but this VM can have 1 to {max}")]
    OutOfRange {
        /// Asked for.
        desired: usize,
        /// `max_vcpus`.
        max: usize,
    },
    /// The guest's interrupt could not be raised.
    #[error("raising the hotplug interrupt: {0}")]
    Interrupt(String),
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    present: bool,
    inserting: bool,
    removing: bool,
}

#[derive(Debug)]
struct State {
    selector: u32,
    cpus: Vec<Slot>,
}

/// The controller of one VM (see the module docs).
#[derive(Debug)]
pub struct CpuHotplug {
    state: Mutex<State>,
    irq: EventFd,
}

impl CpuHotplug {
    /// `max` possible vCPUs, the first `present` of them present, raising
    /// `irq` (an irqfd on the GED's GSI) on each change.
    pub fn new(max: usize, present: usize, irq: EventFd) -> Self {
        let cpus = (0..max)
            .map(|i| Slot {
                present: i < present.max(1),
                ..Slot::default()
            })
            .collect();
        Self {
            state: Mutex::new(State { selector: 0, cpus }),
            irq,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Possible vCPUs.
    pub fn max(&self) -> usize {
        self.lock().cpus.len()
    }

    /// vCPUs the guest may use now: present ones, less those it was asked
    /// to give back.
    pub fn present(&self) -> usize {
        self.lock()
            .cpus
            .iter()
            .filter(|c| c.present && !c.removing)
            .count()
    }

    /// Which vCPUs are present (for logs and tests).
    pub fn present_map(&self) -> Vec<bool> {
        self.lock().cpus.iter().map(|c| c.present).collect()
    }

    /// Makes `desired` vCPUs usable: marks the lowest absent ones present
    /// (insert events), or asks the guest to give the highest present ones
    /// back (remove events; they stay present until the guest ejects
    /// them), and interrupts the guest if anything changed. Returns how
    /// many vCPUs got an event.
    pub fn resize(&self, desired: usize) -> Result<usize, HotplugError> {
        let changed = {
            let mut s = self.lock();
            let max = s.cpus.len();
            if desired == 0 || desired > max {
                return Err(HotplugError::OutOfRange { desired, max });
            }
            let mut usable = s.cpus.iter().filter(|c| c.present && !c.removing).count();
            let mut changed = 0;
            // Growing: first take back pending removals, then insert.
            for c in s.cpus.iter_mut() {
                if usable >= desired {
                    break;
                }
                if c.present && c.removing {
                    c.removing = false;
                    usable += 1;
                } else if !c.present {
                    *c = Slot {
                        present: true,
                        inserting: true,
                        removing: false,
                    };
                    usable += 1;
                    changed += 1;
                }
            }
            // Shrinking: vCPU 0 is never removed.
            for c in s.cpus.iter_mut().skip(1).rev() {
                if usable <= desired {
                    break;
                }
                if c.present && !c.removing {
                    c.removing = true;
                    c.inserting = false;
                    usable -= 1;
                    changed += 1;
                }
            }
            changed
        };
        if changed > 0 {
            info!(desired, changed, "CPU hotplug: interrupting the guest");
            self.irq
                .write(1)
                .map_err(|e| HotplugError::Interrupt(e.to_string()))?;
        }
        Ok(changed)
    }

    /// A read of `data.len()` bytes at `offset` into the register block.
    pub fn read(&self, offset: u16, data: &mut [u8]) {
        let s = self.lock();
        let mut regs = [0u8; 8];
        regs[..4].copy_from_slice(&s.selector.to_le_bytes());
        if let Some(c) = s.cpus.get(s.selector as usize) {
            let bit = |on: bool, b: u8| if on { b } else { 0 };
            regs[4] = bit(c.present, STATUS_PRESENT)
                | bit(c.inserting, STATUS_INSERTING)
                | bit(c.removing, STATUS_REMOVING);
        }
        for (i, b) in data.iter_mut().enumerate() {
            *b = regs.get(offset as usize + i).copied().unwrap_or(0);
        }
    }

    /// A write of `data` at `offset` into the register block.
    pub fn write(&self, offset: u16, data: &[u8]) {
        let mut s = self.lock();
        for (i, &v) in data.iter().enumerate() {
            match offset as usize + i {
                o @ 0..=3 => {
                    let mut sel = s.selector.to_le_bytes();
                    sel[o] = v;
                    s.selector = u32::from_le_bytes(sel);
                }
                4 => command(&mut s, v),
                _ => {}
            }
        }
    }
}

/// A write to the status/command register of the selected vCPU.
fn command(s: &mut State, v: u8) {
    let sel = s.selector as usize;
    let Some(c) = s.cpus.get_mut(sel) else {
        return;
    };
    if v & STATUS_INSERTING != 0 {
        c.inserting = false;
    }
    if v & STATUS_REMOVING != 0 {
        c.removing = false;
    }
    if v & COMMAND_EJECT != 0 {
        if sel == 0 {
            warn!("the guest tried to eject vCPU 0; ignored");
        } else if c.present {
            *c = Slot::default();
            info!(vcpu = sel, "CPU hotplug: the guest ejected the vCPU");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(max: usize, present: usize) -> CpuHotplug {
        CpuHotplug::new(max, present, EventFd::new(libc::EFD_NONBLOCK).unwrap())
    }

    fn status(h: &CpuHotplug, i: u32) -> u8 {
        h.write(REG_SELECTOR, &i.to_le_bytes());
        let mut b = [0u8];
        h.read(REG_STATUS, &mut b);
        b[0]
    }

    #[test]
    fn grow_sets_insert_events_and_interrupts() {
        let h = hp(4, 1);
        assert_eq!(h.present(), 1);
        assert_eq!(h.resize(3), Ok(2));
        assert_eq!(h.irq.read().unwrap(), 1);
        assert_eq!(h.present(), 3);
        assert_eq!(status(&h, 0), STATUS_PRESENT);
        assert_eq!(status(&h, 1), STATUS_PRESENT | STATUS_INSERTING);
        assert_eq!(status(&h, 3), 0);
        // The scan acknowledges the insert.
        h.write(REG_SELECTOR, &1u32.to_le_bytes());
        h.write(REG_STATUS, &[STATUS_INSERTING]);
        assert_eq!(status(&h, 1), STATUS_PRESENT);
        // Nothing to do: no interrupt.
        assert_eq!(h.resize(3), Ok(0));
        assert!(h.irq.read().is_err());
    }

    #[test]
    fn shrink_asks_and_eject_removes_but_never_vcpu_0() {
        let h = hp(3, 3);
        assert_eq!(h.resize(1), Ok(2));
        assert_eq!(h.present(), 1);
        assert_eq!(status(&h, 2), STATUS_PRESENT | STATUS_REMOVING);
        h.write(REG_STATUS, &[STATUS_REMOVING | COMMAND_EJECT]);
        assert_eq!(status(&h, 2), 0);
        assert_eq!(h.present_map(), vec![true, true, false]);
        h.write(REG_SELECTOR, &0u32.to_le_bytes());
        h.write(REG_STATUS, &[COMMAND_EJECT]);
        assert_eq!(status(&h, 0), STATUS_PRESENT);
        // Growing again takes back the pending removal first.
        assert_eq!(h.resize(2), Ok(0));
        assert_eq!(status(&h, 1), STATUS_PRESENT);
    }

    #[test]
    fn bad_sizes_and_garbage_writes_are_harmless() {
        let h = hp(2, 1);
        assert_eq!(
            h.resize(3),
            Err(HotplugError::OutOfRange { desired: 3, max: 2 })
        );
        assert!(h.resize(0).is_err());
        // A selector past the end, odd sizes and offsets.
        h.write(
            REG_SELECTOR,
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        );
        let mut b = [0u8; 16];
        h.read(0, &mut b);
        assert_eq!(&b[..5], &[0xff, 0xff, 0xff, 0xff, 0]);
        h.write(7, &[0xff; 12]);
        h.write(REG_STATUS, &[0xff]);
        h.write(REG_SELECTOR, &[1]);
        assert_eq!(status(&h, 1), 0);
        assert_eq!(h.present(), 1);
    }
}
