//! The ACPI PCI hotplug controller: the registers through which the
//! DSDT's AML ([`crate::acpi::pci_hotplug`]) learns which slots gained a
//! device or should give one back, and through which the guest ejects.
//!
//! WHAT: `vm.add-disk`/`vm.add-net` put a virtio function in a free slot
//! of a running VM, mark the slot *up* and raise the Generic Event
//! Device's interrupt; `vm.remove-device` marks the slot *down*. The
//! guest's `_EVT` runs the scan, which reads each segment's up and down
//! bitmaps and `Notify`s the slot devices: 1 (device check) makes Linux's
//! acpiphp scan the slot, assign the BAR and bind the driver; 3 (eject
//! request) makes it unbind the driver and call the slot's `_EJ0`, which
//! writes the eject register, and only then does the function leave the
//! bus ([`super::Devices`] takes it out of its segment).
//!
//! WHY the re-raise: the interrupt is an edge on an IOAPIC pin, and an
//! edge that arrives while the guest has not yet bound the GED driver (a
//! device added during boot) is lost. So while an event is unread the
//! controller raises the interrupt again every [`RERAISE_EVERY`] (after
//! [`RERAISE_FOR`], once a second: a paused guest reads it when it
//! resumes); reading a bitmap is the guest's acknowledgement.
//!
//! HOW (the registers, at [`PCI_HOTPLUG_PORT`](crate::layout::PCI_HOTPLUG_PORT), dwords):
//!
//! | offset | access | meaning |
//! |---|---|---|
//! | 0 | R/W | selector: the PCI segment the others refer to |
//! | 4 | R | slots that gained a device (bit = slot); a dword read clears it |
//! | 8 | R | slots whose device the host asks back; a dword read clears it |
//! | 12 | W | eject: the slots whose bit is set leave the bus |
//!
//! Narrower reads return the bytes without clearing; other offsets read
//! zero and ignore writes; a selector past the last segment reads zeros
//! and ejects nothing. The idea (up/down bitmaps, an eject register, a
//! segment selector, a scan that notifies slot devices) is the one of
//! QEMU's ACPI PCI hotplug (`docs/specs/acpi_pci_hotplug.rst`) and Cloud
//! Hypervisor's `PciSegment`/`DeviceManager`; this register layout is
//! this VMM's own.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{debug, warn};
use vmm_sys_util::eventfd::EventFd;

/// Offset of the segment selector.
pub const REG_SEGMENT: u16 = 0;
/// Offset of the up bitmap.
pub const REG_UP: u16 = 4;
/// Offset of the down bitmap.
pub const REG_DOWN: u16 = 8;
/// Offset of the eject register.
pub const REG_EJECT: u16 = 12;
/// How often an unread event raises the interrupt again.
pub const RERAISE_EVERY: Duration = Duration::from_millis(100);
/// How long an unread event raises it that often (then once a second).
pub const RERAISE_FOR: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, Default)]
struct Bitmaps {
    up: u32,
    down: u32,
}

#[derive(Debug)]
struct State {
    selector: u32,
    segments: Vec<Bitmaps>,
    /// A re-raise thread is running.
    reraising: bool,
}

impl State {
    fn unread(&self) -> bool {
        self.segments.iter().any(|b| b.up | b.down != 0)
    }
}

/// The controller of one VM (see the module docs).
#[derive(Debug)]
pub struct PciHotplug {
    state: Arc<Mutex<State>>,
    irq: Arc<EventFd>,
}

fn lock(s: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

impl PciHotplug {
    /// A controller for `segments` PCI segments, raising `irq` (an
    /// irqfd on the GED's GSI).
    pub fn new(segments: u16, irq: EventFd) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                selector: 0,
                segments: vec![Bitmaps::default(); segments.into()],
                reraising: false,
            })),
            irq: Arc::new(irq),
        }
    }

    /// Tells the guest that `slot` of `segment` gained a device.
    pub fn announce_added(&self, segment: u16, slot: usize) {
        self.event(segment, slot, true);
    }

    /// Asks the guest to give back the device in `slot` of `segment`.
    pub fn request_removal(&self, segment: u16, slot: usize) {
        self.event(segment, slot, false);
    }

    /// Events the guest has not read yet (for tests and logs).
    pub fn unread(&self) -> bool {
        lock(&self.state).unread()
    }

    fn event(&self, segment: u16, slot: usize, up: bool) {
        let Some(bit) = u32::checked_shl(1, slot as u32).filter(|_| slot > 0) else {
            return;
        };
        let start = {
            let mut s = lock(&self.state);
            let Some(b) = s.segments.get_mut(usize::from(segment)) else {
                return;
            };
            if up {
                b.up |= bit;
                b.down &= !bit;
            } else {
                b.down |= bit;
                b.up &= !bit;
            }
            !std::mem::replace(&mut s.reraising, true)
        };
        if let Err(e) = self.irq.write(1) {
            warn!("PCI hotplug: raising the GED interrupt: {e}");
        }
        if start {
            self.spawn_reraise();
        }
    }

    /// Raises the interrupt again while an event is unread (see the
    /// module docs): every [`RERAISE_EVERY`] for [`RERAISE_FOR`], then
    /// (a paused guest, or one without ACPI PCI hotplug) once a second
    /// with one warning. The thread holds the state weakly: it ends when
    /// the guest reads, or when the VM and its controller are gone.
    fn spawn_reraise(&self) {
        let (state, irq) = (Arc::downgrade(&self.state), self.irq.clone());
        let spawned = std::thread::Builder::new()
            .name("pci-hotplug".into())
            .spawn(move || {
                let slow_after = Instant::now() + RERAISE_FOR;
                let mut warned = false;
                loop {
                    let slow = Instant::now() >= slow_after;
                    std::thread::sleep(if slow {
                        Duration::from_secs(1)
                    } else {
                        RERAISE_EVERY
                    });
                    let Some(state) = state.upgrade() else { return };
                    let mut s = lock(&state);
                    if !s.unread() {
                        s.reraising = false;
                        return;
                    }
                    drop(s);
                    if slow && !warned {
                        warned = true;
                        warn!(
                            "PCI hotplug: the guest has not read its hotplug event in {} s \
                             (paused, or no ACPI PCI hotplug in its kernel: \
                             CONFIG_HOTPLUG_PCI_ACPI?); raising it once a second",
                            RERAISE_FOR.as_secs()
                        );
                    }
                    let _ = irq.write(1);
                }
            });
        if let Err(e) = spawned {
            lock(&self.state).reraising = false;
            warn!("PCI hotplug: no re-raise thread ({e}); an event sent before the guest listens is lost");
        }
    }

    /// A read of `data.len()` bytes at `offset` into the register block.
    pub fn read(&self, offset: u16, data: &mut [u8]) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let sel = s.selector;
        let b = s.segments.get(sel as usize).copied().unwrap_or_default();
        let mut regs = [0u8; 16];
        regs[..4].copy_from_slice(&sel.to_le_bytes());
        regs[4..8].copy_from_slice(&b.up.to_le_bytes());
        regs[8..12].copy_from_slice(&b.down.to_le_bytes());
        for (i, v) in data.iter_mut().enumerate() {
            *v = regs.get(offset as usize + i).copied().unwrap_or(0);
        }
        if data.len() == 4 {
            if let Some(b) = s.segments.get_mut(sel as usize) {
                match offset {
                    REG_UP => b.up = 0,
                    REG_DOWN => b.down = 0,
                    _ => {}
                }
            }
        }
    }

    /// A write of `data` at `offset` into the register block. Returns the
    /// slots to eject, as (segment, slot).
    pub fn write(&self, offset: u16, data: &[u8]) -> Vec<(u16, usize)> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut word = [0u8; 4];
        let n = data.len().min(4);
        word[..n].copy_from_slice(&data[..n]);
        let v = u32::from_le_bytes(word);
        match (offset, n) {
            (REG_SEGMENT, 4) => s.selector = v,
            (REG_EJECT, 4) => {
                let Ok(seg) = u16::try_from(s.selector) else {
                    return Vec::new();
                };
                if usize::from(seg) >= s.segments.len() {
                    return Vec::new();
                }
                let slots: Vec<(u16, usize)> = (1..32)
                    .filter(|i| v & (1 << i) != 0)
                    .map(|i| (seg, i))
                    .collect();
                if !slots.is_empty() {
                    debug!(segment = seg, slots = ?slots.iter().map(|s| s.1).collect::<Vec<_>>(),
                        "PCI hotplug: the guest ejects");
                }
                return slots;
            }
            _ => {}
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(segments: u16) -> PciHotplug {
        PciHotplug::new(segments, EventFd::new(libc::EFD_NONBLOCK).unwrap())
    }

    fn read32(h: &PciHotplug, off: u16) -> u32 {
        let mut b = [0u8; 4];
        h.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn an_added_slot_is_announced_once_and_interrupts() {
        let h = hp(2);
        h.announce_added(1, 3);
        assert_eq!(h.irq.read().unwrap(), 1);
        // Segment 0 has nothing.
        assert_eq!(read32(&h, REG_UP), 0);
        h.write(REG_SEGMENT, &1u32.to_le_bytes());
        // A byte read does not acknowledge.
        let mut b = [0u8; 1];
        h.read(REG_UP, &mut b);
        assert_eq!(b[0], 1 << 3);
        assert!(h.unread());
        assert_eq!(read32(&h, REG_UP), 1 << 3);
        assert_eq!(read32(&h, REG_UP), 0, "read to clear");
        assert!(!h.unread());
    }

    #[test]
    fn removal_then_eject_names_the_slot() {
        let h = hp(1);
        h.request_removal(0, 5);
        assert_eq!(read32(&h, REG_DOWN), 1 << 5);
        assert_eq!(h.write(REG_EJECT, &(1u32 << 5).to_le_bytes()), vec![(0, 5)]);
        // Slot 0 (the host bridge) is never ejected; nor is a slot of a
        // segment that does not exist.
        assert!(h.write(REG_EJECT, &1u32.to_le_bytes()).is_empty());
        h.write(REG_SEGMENT, &7u32.to_le_bytes());
        assert!(h.write(REG_EJECT, &(1u32 << 5).to_le_bytes()).is_empty());
        assert_eq!(read32(&h, REG_SEGMENT), 7);
        assert_eq!(read32(&h, REG_DOWN), 0);
    }

    #[test]
    fn a_later_event_replaces_an_unread_opposite_one() {
        let h = hp(1);
        h.announce_added(0, 2);
        h.request_removal(0, 2);
        assert_eq!(read32(&h, REG_UP), 0);
        assert_eq!(read32(&h, REG_DOWN), 1 << 2);
        // Out of range slots and segments are ignored.
        h.announce_added(0, 0);
        h.announce_added(0, 40);
        h.announce_added(9, 1);
        assert!(!h.unread());
    }

    #[test]
    fn an_unread_event_raises_again_until_read() {
        let h = hp(1);
        h.announce_added(0, 1);
        assert_eq!(h.irq.read().unwrap(), 1);
        std::thread::sleep(RERAISE_EVERY * 3);
        assert!(h.irq.read().unwrap() >= 1, "raised again while unread");
        assert_eq!(read32(&h, REG_UP), 1 << 1);
        std::thread::sleep(RERAISE_EVERY * 3);
        let _ = h.irq.read();
        std::thread::sleep(RERAISE_EVERY * 2);
        assert!(h.irq.read().is_err(), "quiet once read");
        assert!(!lock(&h.state).reraising);
    }

    #[test]
    fn garbage_accesses_are_harmless() {
        let h = hp(1);
        h.write(3, &[0xff; 9]);
        h.write(REG_EJECT, &[0xff]);
        let mut b = [0u8; 32];
        h.read(0, &mut b);
        h.read(14, &mut b[..8]);
        assert!(!h.unread());
    }
}
