//! What a device needs from the hypervisor, as two small traits the
//! machine crate implements with KVM:
//!
//! * [`MsiVectors`]: a device's MSI-X vectors. Each vector is a GSI with a
//!   KVM MSI route and an irqfd; [`MsiVectors::route`] reprograms the
//!   route when the guest writes the vector's table entry or (un)masks it,
//!   [`MsiVectors::trigger`] writes the irqfd. The device never polls and
//!   never asks a vCPU thread to inject anything.
//! * [`NotifyEvents`]: an ioeventfd per queue notification address, so a
//!   guest's doorbell write wakes the device's worker thread inside KVM,
//!   without an exit to this process.
//!
//! [`testing`] has in-memory versions for unit tests.

use vmm_sys_util::eventfd::EventFd;

use crate::DeviceError;

/// An MSI message, as the guest programmed it into an MSI-X table entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsiMessage {
    /// Message address (x86: 0xFEEx_xxxx, the destination in bits 12-19).
    pub addr: u64,
    /// Message data (x86: the vector in bits 0-7, delivery mode above).
    pub data: u32,
}

impl MsiMessage {
    /// The destination APIC ID on x86: address bits 12-19, and the
    /// extended destination ID in bits 5-11 above them (the feature the
    /// VMM advertises for guests with APIC IDs above 255).
    pub fn dest_apic_id(&self) -> u32 {
        let low = ((self.addr >> 12) & 0xff) as u32;
        let ext = ((self.addr >> 5) & 0x7f) as u32;
        low | (ext << 8)
    }
}

/// A device's MSI-X vectors, delivered by the hypervisor.
pub trait MsiVectors: Send + Sync {
    /// How many vectors there are.
    fn count(&self) -> u16;
    /// Points `vector` at `msg`, or takes its route away (`None`: the
    /// vector is masked, or MSI-X is off).
    fn route(&self, vector: u16, msg: Option<MsiMessage>) -> Result<(), DeviceError>;
    /// Raises `vector`. The caller (the MSI-X state) checked that it is
    /// routed and unmasked.
    fn trigger(&self, vector: u16) -> Result<(), DeviceError>;
}

/// Guest writes to an MMIO address turned into an eventfd (ioeventfd).
pub trait NotifyEvents: Send + Sync {
    /// From now on a guest write to `addr` signals `evt` instead of
    /// exiting to the VMM.
    fn register(&self, addr: u64, evt: &EventFd) -> Result<(), DeviceError>;
    /// Undoes [`register`](Self::register).
    fn unregister(&self, addr: u64, evt: &EventFd) -> Result<(), DeviceError>;
}

/// In-memory [`MsiVectors`] and [`NotifyEvents`] for tests: they record
/// what a device asked for.
pub mod testing {
    use std::sync::Mutex;

    use super::*;

    /// Records routes and counts triggers per vector.
    #[derive(Debug, Default)]
    pub struct RecordingMsi {
        /// Vector count.
        pub vectors: u16,
        /// The current route of each vector.
        pub routes: Mutex<Vec<Option<MsiMessage>>>,
        /// Triggers per vector.
        pub triggers: Mutex<Vec<u64>>,
    }

    impl RecordingMsi {
        /// `vectors` vectors, none routed.
        pub fn new(vectors: u16) -> Self {
            Self {
                vectors,
                routes: Mutex::new(vec![None; vectors as usize]),
                triggers: Mutex::new(vec![0; vectors as usize]),
            }
        }
        /// Triggers of `vector` so far.
        pub fn triggered(&self, vector: u16) -> u64 {
            self.triggers.lock().unwrap()[vector as usize]
        }
        /// The route of `vector`.
        pub fn route_of(&self, vector: u16) -> Option<MsiMessage> {
            self.routes.lock().unwrap()[vector as usize]
        }
    }

    impl MsiVectors for RecordingMsi {
        fn count(&self) -> u16 {
            self.vectors
        }
        fn route(&self, vector: u16, msg: Option<MsiMessage>) -> Result<(), DeviceError> {
            self.routes.lock().unwrap()[vector as usize] = msg;
            Ok(())
        }
        fn trigger(&self, vector: u16) -> Result<(), DeviceError> {
            self.triggers.lock().unwrap()[vector as usize] += 1;
            Ok(())
        }
    }

    /// Remembers which addresses have an eventfd; nothing is wired, so
    /// tests signal the eventfds themselves.
    #[derive(Debug, Default)]
    pub struct RecordingNotify {
        /// Registered addresses.
        pub addrs: Mutex<Vec<u64>>,
    }

    impl NotifyEvents for RecordingNotify {
        fn register(&self, addr: u64, _: &EventFd) -> Result<(), DeviceError> {
            self.addrs.lock().unwrap().push(addr);
            Ok(())
        }
        fn unregister(&self, addr: u64, _: &EventFd) -> Result<(), DeviceError> {
            self.addrs.lock().unwrap().retain(|&a| a != addr);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destination_apic_ids() {
        let m = MsiMessage {
            addr: 0xfee0_0000 | (5 << 12),
            data: 0x30,
        };
        assert_eq!(m.dest_apic_id(), 5);
        // APIC ID 300: 44 in bits 12-19, 1 in the extended bits 5-11.
        let m = MsiMessage {
            addr: 0xfee0_0000 | (44 << 12) | (1 << 5),
            data: 0x30,
        };
        assert_eq!(m.dest_apic_id(), 300);
    }
}
