//! The ACPI side of PCI: the MCFG (each segment's ECAM window) and, in the
//! DSDT, one host bridge device per segment and one motherboard-resources
//! device that reserves the ECAM windows.
//!
//! Each host bridge `\_SB.PCnn` is a `PNP0A08` (PCI Express root, with
//! `PNP0A03` as its compatible ID) with `_SEG` = its segment, `_BBN` = 0,
//! `_PXM` = its guest NUMA node and a `_CRS` of bus 0 and its BAR window;
//! segment 0's also claims ports 0xCF8-0xCFF. With PCI hotplug, inside
//! each are its slots ([`super::pci_hotplug`]). Linux then prints, per
//! segment, `PCI host bridge to bus nnnn:00` and the node of each device
//! (`pci_bus nnnn:00: on NUMA node N`). Linux accepts an MCFG window only
//! if the firmware reserves it, through E820 or a `PNP0C02` device's
//! `_CRS`; the `\_SB.MBRD` device is that reservation (Cloud Hypervisor
//! reserves its ECAM the same way).

use acpi_tables::aml::{self, AddressSpace, AddressSpaceCacheable};
use acpi_tables::mcfg::MCFG;
use acpi_tables::Aml;
use vmm_devices::pci::{SegmentLayout, ECAM_SEGMENT_SIZE};

use super::{aml_bytes, pci_hotplug, RawAml, OEM_ID, OEM_REV, OEM_TABLE};

/// The MCFG: one ECAM entry (bus 0 only) per segment.
pub fn mcfg(segments: &[SegmentLayout]) -> Vec<u8> {
    let mut t = MCFG::new(OEM_ID, OEM_TABLE, OEM_REV);
    for s in segments {
        t.add_ecam(s.ecam, s.id, 0, 0);
    }
    aml_bytes(&t)
}

fn host_bridge(s: &SegmentLayout, hotplug: bool) -> Vec<u8> {
    let (start, size) = s.mmio;
    let bus = AddressSpace::<u16>::new_bus_number(0, 0);
    let mem = AddressSpace::<u32>::new_memory(
        AddressSpaceCacheable::NotCacheable,
        true,
        start as u32,
        (start + size - 1) as u32,
        None,
    );
    let cf8 = aml::IO::new(0xcf8, 0xcf8, 1, 8);
    let mut crs: Vec<&dyn Aml> = vec![&bus, &mem];
    if s.id == 0 {
        crs.push(&cf8);
    }
    let crs = aml::ResourceTemplate::new(crs);
    let hid = aml::EISAName::new("PNP0A08");
    let cid = aml::EISAName::new("PNP0A03");
    let seg = u32::from(s.id);
    let pxm = s.node.unwrap_or(0);
    let mut children: Vec<Box<dyn Aml>> = vec![
        Box::new(aml::Name::new("_HID".into(), &hid)),
        Box::new(aml::Name::new("_CID".into(), &cid)),
        Box::new(aml::Name::new("_ADR".into(), &aml::ZERO)),
        Box::new(aml::Name::new("_SEG".into(), &seg)),
        Box::new(aml::Name::new("_UID".into(), &seg)),
        Box::new(aml::Name::new("_BBN".into(), &aml::ZERO)),
        Box::new(aml::Name::new("_CRS".into(), &crs)),
    ];
    if s.node.is_some() {
        children.push(Box::new(aml::Name::new("_PXM".into(), &pxm)));
    }
    if hotplug {
        children.push(Box::new(RawAml(pci_hotplug::bridge_children(s))));
    }
    let refs: Vec<&dyn Aml> = children.iter().map(|c| c.as_ref()).collect();
    let name = format!("_SB_.PC{:02X}", s.id);
    aml_bytes(&aml::Device::new(name.as_str().into(), refs))
}

/// The DSDT's PCI part: the host bridges (with their hotplug slots if
/// `hotplug`) and the ECAM reservation.
pub fn dsdt_devices(segments: &[SegmentLayout], hotplug: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for s in segments {
        out.extend(host_bridge(s, hotplug));
    }
    if let (Some(first), Some(last)) = (segments.first(), segments.last()) {
        let len = (last.ecam + ECAM_SEGMENT_SIZE - first.ecam) as u32;
        let ecam = aml::Memory32Fixed::new(false, first.ecam as u32, len);
        let crs = aml::ResourceTemplate::new(vec![&ecam]);
        let hid = aml::EISAName::new("PNP0C02");
        let uid = 0u32;
        let names = [
            aml::Name::new("_HID".into(), &hid),
            aml::Name::new("_UID".into(), &uid),
            aml::Name::new("_CRS".into(), &crs),
        ];
        let refs: Vec<&dyn Aml> = names.iter().map(|n| n as &dyn Aml).collect();
        out.extend(aml_bytes(&aml::Device::new("_SB_.MBRD".into(), refs)));
    }
    out
}
