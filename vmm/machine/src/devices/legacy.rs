//! The legacy devices a Linux guest needs, behind one [`PortIo`]:
//!
//! | ports | device |
//! |---|---|
//! | 0x3f8-0x3ff | COM1, a 16550A (vm-superio `Serial`), IRQ 4 through an irqfd |
//! | 0x60, 0x64 | i8042 (vm-superio): writing 0xfe to 0x64 resets the machine (`reboot=k`) |
//! | 0xcf9 | reset control: a write with bit 2 set resets (the FADT's reset register) |
//! | 0x600, 0x601 | ACPI hardware-reduced sleep control/status: S5 powers off |
//!
//! Every other port reads as all ones (nothing there) and ignores writes,
//! as an ISA bus does. The PIC, PIT and IOAPIC are KVM's in-kernel ones.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tracing::{trace, warn};
use vm_superio::{I8042Device, Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::console::ConsoleSink;
use crate::layout::{
    COM1_PORT, I8042_CMD_PORT, I8042_DATA_PORT, RESET_PORT, S5_SLEEP_TYPE, SLEEP_CONTROL_PORT,
    SLEEP_STATUS_PORT,
};
use crate::vcpu::{IoAction, PortIo};

/// An interrupt line backed by an eventfd that KVM turns into a GSI edge
/// (`KVM_IRQFD`).
#[derive(Debug)]
pub struct EventFdTrigger(pub EventFd);

impl Trigger for EventFdTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// The i8042's reset line: a trigger that raises a shared flag.
#[derive(Clone, Debug, Default)]
pub struct ResetLine(Arc<AtomicBool>);

impl Trigger for ResetLine {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        self.0.store(true, Ordering::SeqCst);
        Ok(())
    }
}

impl ResetLine {
    fn take(&self) -> bool {
        self.0.swap(false, Ordering::SeqCst)
    }
}

/// The serial port type used here.
pub type SerialPort = Serial<EventFdTrigger, vm_superio::serial::NoEvents, ConsoleSink>;

/// The devices of a Linux guest (see the module docs).
pub struct LegacyDevices {
    serial: Mutex<SerialPort>,
    i8042: Mutex<I8042Device<ResetLine>>,
    reset: ResetLine,
}

impl std::fmt::Debug for LegacyDevices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LegacyDevices")
    }
}

impl LegacyDevices {
    /// COM1 raising `serial_irq` and writing to `console`.
    pub fn new(serial_irq: EventFd, console: ConsoleSink) -> Self {
        let reset = ResetLine::default();
        Self {
            serial: Mutex::new(Serial::new(EventFdTrigger(serial_irq), console)),
            i8042: Mutex::new(I8042Device::new(reset.clone())),
            reset,
        }
    }

    /// Flushes the console (at VM stop).
    pub fn flush_console(&self) {
        let mut s = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = std::io::Write::flush(s.writer_mut()) {
            warn!("flushing the console failed: {e}");
        }
    }
}

impl PortIo for LegacyDevices {
    fn pio_read(&self, _vcpu: usize, port: u16, data: &mut [u8]) {
        match port {
            p if (COM1_PORT..COM1_PORT + 8).contains(&p) && data.len() == 1 => {
                let mut s = self.serial.lock().unwrap_or_else(|e| e.into_inner());
                data[0] = s.read((p - COM1_PORT) as u8);
            }
            I8042_DATA_PORT | I8042_CMD_PORT if data.len() == 1 => {
                let mut k = self.i8042.lock().unwrap_or_else(|e| e.into_inner());
                data[0] = k.read((port - I8042_DATA_PORT) as u8);
            }
            SLEEP_STATUS_PORT | SLEEP_CONTROL_PORT => data.fill(0),
            _ => {
                trace!(port = format_args!("{port:#x}"), "read of an absent port");
                data.fill(0xff);
            }
        }
    }

    fn pio_write(&self, _vcpu: usize, port: u16, data: &[u8]) -> IoAction {
        let v = data.first().copied().unwrap_or(0);
        match port {
            p if (COM1_PORT..COM1_PORT + 8).contains(&p) && data.len() == 1 => {
                let mut s = self.serial.lock().unwrap_or_else(|e| e.into_inner());
                if let Err(e) = s.write((p - COM1_PORT) as u8, v) {
                    warn!("serial console: {e}");
                }
                IoAction::Continue
            }
            I8042_DATA_PORT | I8042_CMD_PORT if data.len() == 1 => {
                let mut k = self.i8042.lock().unwrap_or_else(|e| e.into_inner());
                let _ = k.write((port - I8042_DATA_PORT) as u8, v);
                if self.reset.take() {
                    IoAction::Reset
                } else {
                    IoAction::Continue
                }
            }
            RESET_PORT if v & 0x4 != 0 => IoAction::Reset,
            SLEEP_CONTROL_PORT => {
                // SLP_EN is bit 5, SLP_TYPx bits 2-4.
                if v & (1 << 5) != 0 && (v >> 2) & 7 == S5_SLEEP_TYPE {
                    IoAction::PowerOff
                } else {
                    IoAction::Continue
                }
            }
            _ => {
                trace!(
                    port = format_args!("{port:#x}"),
                    value = v,
                    "write to an absent port"
                );
                IoAction::Continue
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::ConsoleEvents;

    struct NoEvents;
    impl ConsoleEvents for NoEvents {
        fn until_matched(&self, _: &str) {}
        fn guest_panicked(&self, _: &str) {}
    }

    #[test]
    fn ports() {
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = ConsoleSink::new(Box::new(std::io::sink()), None, Arc::new(NoEvents))
            .with_capture(out.clone());
        let d = LegacyDevices::new(EventFd::new(libc::EFD_NONBLOCK).unwrap(), sink);
        for b in b"ok\n" {
            assert_eq!(d.pio_write(0, COM1_PORT, &[*b]), IoAction::Continue);
        }
        assert_eq!(&*out.lock().unwrap(), b"ok\n");
        // Line status: transmitter empty.
        let mut lsr = [0u8];
        d.pio_read(0, COM1_PORT + 5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0);
        // Absent ports read as all ones.
        let mut b = [0u8; 4];
        d.pio_read(0, 0xcfc, &mut b);
        assert_eq!(b, [0xff; 4]);
        assert_eq!(d.pio_write(0, 0x80, &[1]), IoAction::Continue);
        // Resets and poweroff.
        assert_eq!(d.pio_write(0, I8042_CMD_PORT, &[0x20]), IoAction::Continue);
        assert_eq!(d.pio_write(0, I8042_CMD_PORT, &[0xfe]), IoAction::Reset);
        assert_eq!(d.pio_write(0, RESET_PORT, &[0x2]), IoAction::Continue);
        assert_eq!(d.pio_write(0, RESET_PORT, &[0x6]), IoAction::Reset);
        assert_eq!(
            d.pio_write(0, SLEEP_CONTROL_PORT, &[(1 << 5) | (5 << 2)]),
            IoAction::PowerOff
        );
        assert_eq!(
            d.pio_write(0, SLEEP_CONTROL_PORT, &[3 << 2]),
            IoAction::Continue
        );
    }
}
