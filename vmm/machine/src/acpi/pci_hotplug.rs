//! The DSDT's side of ACPI PCI hotplug: a slot device for every slot of
//! every host bridge, the methods that read the controller's registers
//! ([`crate::devices::pci_hotplug`]), and the scan the Generic Event
//! Device runs.
//!
//! ```text
//! \_SB.PHPC   PNP0A06 container: the controller's registers
//!   PHPR      SystemIO region at PCI_HOTPLUG_PORT: PSEG (segment
//!             selector), PCIU (slots up), PCID (slots down), B0EJ
//!             (eject), dwords
//!   PHLK      mutex around every selector + register access
//!   PUPS(s)   segment s's up bitmap (reading acknowledges it)
//!   PDNS(s)   segment s's down bitmap (the same)
//!   PCEJ(n, s)  eject slot n of segment s
//!   PSCN()    every segment's PCNT
//! \_SB.PCss   each host bridge (see [`super::pci`]) gains:
//!   Snnn      slot n (1-31): _ADR n << 16, _SUN n, _EJ0 -> PCEJ(n, ss)
//!   DVNT(b, e)  Notify(Snnn, e) for each bit n set in b
//!   PCNT()    DVNT(PUPS(ss), 1) (device check), DVNT(PDNS(ss), 3)
//!             (eject request)
//! ```
//!
//! Linux's acpiphp registers every slot device that has `_EJ0` as a
//! hotplug slot (`acpiphp: Slot [n] registered`). On a device check it
//! scans the slot, assigns the BAR from the host bridge's window and binds
//! the driver; on an eject request it unbinds the driver, removes the
//! function and calls `_EJ0`. The shape (slot devices with `_EJ0`, a
//! per-bridge notify method over up/down bitmaps) follows QEMU's and
//! Cloud Hypervisor's ACPI PCI hotplug; the AML is written for this VMM's
//! registers.

use acpi_tables::aml::{self, FieldAccessType, FieldEntry, FieldLockRule, FieldUpdateRule};
use acpi_tables::Aml;
use vmm_devices::pci::{SegmentLayout, SLOTS};

use super::{aml_bytes, RawAml};
use crate::layout::{PCI_HOTPLUG_PORT, PCI_HOTPLUG_PORTS};

const PHPC: &str = "\\_SB_.PHPC";

fn path(name: &str) -> aml::Path {
    format!("{PHPC}.{name}").as_str().into()
}

/// Slot `n`'s device name.
pub fn slot_name(n: usize) -> String {
    format!("S{n:03X}")
}

/// The controller device: its registers, mutex and methods, and the
/// scan over `segments`.
pub fn controller(segments: &[SegmentLayout]) -> Vec<u8> {
    let mut body = Vec::new();
    let hid = aml::EISAName::new("PNP0A06");
    let uid = "PCI hotplug";
    aml::Name::new("_HID".into(), &hid).to_aml_bytes(&mut body);
    aml::Name::new("_UID".into(), &uid).to_aml_bytes(&mut body);
    let (port, len) = (u32::from(PCI_HOTPLUG_PORT), u32::from(PCI_HOTPLUG_PORTS));
    aml::OpRegion::new("PHPR".into(), aml::OpRegionSpace::SystemIO, &port, &len)
        .to_aml_bytes(&mut body);
    aml::Field::new(
        "PHPR".into(),
        FieldAccessType::DWord,
        FieldLockRule::NoLock,
        FieldUpdateRule::WriteAsZeroes,
        vec![
            FieldEntry::Named(*b"PSEG", 32),
            FieldEntry::Named(*b"PCIU", 32),
            FieldEntry::Named(*b"PCID", 32),
            FieldEntry::Named(*b"B0EJ", 32),
        ],
    )
    .to_aml_bytes(&mut body);
    aml::Mutex::new("PHLK".into(), 0).to_aml_bytes(&mut body);
    let lock = aml::Acquire::new("PHLK".into(), 0xffff);
    let unlock = aml::Release::new("PHLK".into());
    let pseg: aml::Path = "PSEG".into();
    let select = aml::Store::new(&pseg, &aml::Arg(0));
    let ret = aml::Return::new(&aml::Local(0));
    for (name, field) in [("PUPS", "PCIU"), ("PDNS", "PCID")] {
        let f: aml::Path = field.into();
        let read = aml::Store::new(&aml::Local(0), &f);
        aml::Method::new(
            name.into(),
            1,
            true,
            vec![&lock, &select, &read, &unlock, &ret],
        )
        .to_aml_bytes(&mut body);
    }
    // PCEJ(slot, segment): B0EJ = 1 << slot on the selected segment.
    let select_seg = aml::Store::new(&pseg, &aml::Arg(1));
    let bit = aml::ShiftLeft::new(&aml::Local(0), &aml::ONE, &aml::Arg(0));
    let b0ej: aml::Path = "B0EJ".into();
    let eject = aml::Store::new(&b0ej, &aml::Local(0));
    aml::Method::new(
        "PCEJ".into(),
        2,
        true,
        vec![&lock, &select_seg, &bit, &eject, &unlock],
    )
    .to_aml_bytes(&mut body);
    let calls: Vec<aml::MethodCall> = segments
        .iter()
        .map(|s| {
            let p = format!("\\_SB_.PC{:02X}.PCNT", s.id);
            aml::MethodCall::new(p.as_str().into(), vec![])
        })
        .collect();
    let refs: Vec<&dyn Aml> = calls.iter().map(|c| c as &dyn Aml).collect();
    aml::Method::new("PSCN".into(), 0, true, refs).to_aml_bytes(&mut body);
    aml_bytes(&aml::Device::new(PHPC.into(), vec![&RawAml(body)]))
}

/// What goes inside segment `s`'s host bridge device: its slot devices,
/// `DVNT` and `PCNT`.
pub fn bridge_children(s: &SegmentLayout) -> Vec<u8> {
    let mut out = Vec::new();
    let seg = u32::from(s.id);
    for n in 1..SLOTS {
        let adr = (n as u32) << 16;
        let sun = n as u32;
        let call = aml::MethodCall::new(path("PCEJ"), vec![&sun, &seg]);
        let ej0 = aml::Method::new("_EJ0".into(), 1, false, vec![&call]);
        let (a, u) = (
            aml::Name::new("_ADR".into(), &adr),
            aml::Name::new("_SUN".into(), &sun),
        );
        aml::Device::new(slot_name(n).as_str().into(), vec![&a, &u, &ej0]).to_aml_bytes(&mut out);
    }
    // DVNT(bitmap, event): one If per slot.
    let names: Vec<aml::Path> = (1..SLOTS).map(|n| slot_name(n).as_str().into()).collect();
    let bits: Vec<u32> = (1..SLOTS).map(|n| 1u32 << n).collect();
    let tests: Vec<aml::And> = bits
        .iter()
        .map(|b| aml::And::new(&aml::Local(0), &aml::Arg(0), b))
        .collect();
    let notes: Vec<aml::Notify> = names
        .iter()
        .map(|p| aml::Notify::new(p, &aml::Arg(1)))
        .collect();
    let ifs: Vec<aml::If> = tests
        .iter()
        .zip(&notes)
        .map(|(t, n)| aml::If::new(t, vec![n]))
        .collect();
    let body: Vec<&dyn Aml> = ifs.iter().map(|i| i as &dyn Aml).collect();
    aml::Method::new("DVNT".into(), 2, false, body).to_aml_bytes(&mut out);
    let (ups, downs) = (
        aml::MethodCall::new(path("PUPS"), vec![&seg]),
        aml::MethodCall::new(path("PDNS"), vec![&seg]),
    );
    let check = aml::MethodCall::new("DVNT".into(), vec![&ups, &aml::ONE]);
    let eject = aml::MethodCall::new("DVNT".into(), vec![&downs, &3u8]);
    aml::Method::new("PCNT".into(), 0, true, vec![&check, &eject]).to_aml_bytes(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(id: u16) -> SegmentLayout {
        SegmentLayout {
            id,
            ecam: 0xe000_0000 + u64::from(id) * (1 << 20),
            mmio: (0xc000_0000 + u64::from(id) * (1 << 28), 1 << 28),
            node: Some(u32::from(id)),
        }
    }

    #[test]
    fn every_slot_but_the_bridge_is_ejectable() {
        let d = bridge_children(&layout(0));
        let count = |needle: &[u8]| d.windows(needle.len()).filter(|w| *w == needle).count();
        assert_eq!(count(b"_EJ0"), SLOTS - 1);
        assert_eq!(count(b"_SUN"), SLOTS - 1);
        assert_eq!(
            count(slot_name(0).as_bytes()),
            0,
            "slot 0 is the host bridge"
        );
        assert!(count(slot_name(31).as_bytes()) >= 2);
    }

    /// `iasl -d` (acpica-tools, installed by scripts/setup.sh), the
    /// independent judge: the whole DSDT with two segments and PCI
    /// hotplug disassembles, with the slots inside their bridges and the
    /// GED calling the scan. Without iasl: a failure under `CI`,
    /// elsewhere skipped with a note.
    #[test]
    fn iasl_disassembles_the_hotplug_slots() {
        let segs = [layout(0), layout(1)];
        let Some(dsl) =
            super::super::iasl_disassemble(super::super::dsdt(&segs, None, true).as_slice())
        else {
            return;
        };
        for want in [
            "Device (\\_SB.PHPC)",
            "OperationRegion (PHPR, SystemIO, 0x0630, 0x10)",
            "Method (PCEJ, 2, Serialized)",
            "Method (PSCN, 0, Serialized)",
            "\\_SB.PC00.PCNT ()",
            "\\_SB.PC01.PCNT ()",
            "Device (_SB.PC01)",
            "Device (S01F)",
            "Name (_ADR, 0x001F0000)",
            "\\_SB.PHPC.PCEJ (0x1F, One)",
            "Notify (S01F, Arg1)",
            "DVNT (\\_SB.PHPC.PDNS (One), 0x03)",
            "Device (\\_SB.GED0)",
            "\\_SB.PHPC.PSCN ()",
        ] {
            assert!(dsl.contains(want), "{want:?} not in:\n{dsl}");
        }
        assert!(!dsl.contains("CSCN"), "no CPU hotplug asked for:\n{dsl}");
    }
}
