//! The DSDT's side of ACPI CPU hotplug: one processor device per possible
//! vCPU, the methods that read the controller's registers
//! ([`crate::devices::cpu_hotplug`]), and the Generic Event Device whose
//! interrupt makes the guest scan them.
//!
//! ```text
//! \_SB.CPUS  ACPI0010 processor container
//!   PRST     SystemIO region at CPU_HOTPLUG_PORT: CSEL (selector, dword),
//!            CPEN/CINS/CRMV/CEJ0 (status and command bits, byte)
//!   CPLK     mutex around every selector + status access
//!   CSTA(i)  _STA of vCPU i: 0xf if present, else 0
//!   CEJX(i)  eject vCPU i
//!   CSCN()   for each vCPU: insert pending -> Notify(Cnnn, 1) (device
//!            check) and ack; remove pending -> Notify(Cnnn, 3) (eject
//!            request) and ack
//!   CTFY(i, e)  Notify(Cnnn, e) for vCPU i (Notify needs a name)
//!   Cnnn     ACPI0007 processor, _UID = its MADT processor UID (its
//!            index), _STA, _MAT (its MADT entry, enabled), _PXM, and
//!            _EJ0 (every vCPU but 0)
//! \_SB.GED0  (see super::ged) its _EVT calls CSCN
//! ```
//!
//! The design (selector register, per-CPU status, a scan method that
//! notifies) follows the idea of QEMU's `docs/specs/acpi_cpu_hotplug.rst`
//! and Cloud Hypervisor's CPU manager; the AML here is written for this
//! VMM's registers.

use acpi_tables::aml::{self, FieldAccessType, FieldEntry, FieldLockRule, FieldUpdateRule};
use acpi_tables::Aml;
use topology::GuestTopology;

use super::{aml_bytes, RawAml};
use crate::devices::cpu_hotplug::REG_STATUS;
use crate::layout::{CPU_HOTPLUG_PORT, CPU_HOTPLUG_PORTS};

const CPUS: &str = "\\_SB_.CPUS";

fn path(name: &str) -> aml::Path {
    format!("{CPUS}.{name}").as_str().into()
}

/// vCPU `i`'s device name.
pub fn device_name(i: usize) -> String {
    format!("C{i:03X}")
}

/// A Local x2APIC MADT entry (type 9), enabled, for `_MAT`.
pub fn mat_entry(apic_id: u32, uid: u32) -> Vec<u8> {
    let mut e = vec![0u8; 16];
    e[0] = 9;
    e[1] = 16;
    e[4..8].copy_from_slice(&apic_id.to_le_bytes());
    e[8..12].copy_from_slice(&1u32.to_le_bytes());
    e[12..16].copy_from_slice(&uid.to_le_bytes());
    e
}

/// The register region, its fields and the mutex.
fn registers() -> Vec<u8> {
    let mut out = Vec::new();
    let (port, len) = (CPU_HOTPLUG_PORT as u32, CPU_HOTPLUG_PORTS as u32);
    aml::OpRegion::new("PRST".into(), aml::OpRegionSpace::SystemIO, &port, &len)
        .to_aml_bytes(&mut out);
    aml::Field::new(
        "PRST".into(),
        FieldAccessType::DWord,
        FieldLockRule::NoLock,
        FieldUpdateRule::Preserve,
        vec![FieldEntry::Named(*b"CSEL", 32)],
    )
    .to_aml_bytes(&mut out);
    // Write-as-zeros: storing one bit writes only that bit, a command.
    aml::Field::new(
        "PRST".into(),
        FieldAccessType::Byte,
        FieldLockRule::NoLock,
        FieldUpdateRule::WriteAsZeroes,
        vec![
            FieldEntry::Reserved(8 * REG_STATUS as usize),
            FieldEntry::Named(*b"CPEN", 1),
            FieldEntry::Named(*b"CINS", 1),
            FieldEntry::Named(*b"CRMV", 1),
            FieldEntry::Named(*b"CEJ0", 1),
            FieldEntry::Reserved(4),
        ],
    )
    .to_aml_bytes(&mut out);
    aml::Mutex::new("CPLK".into(), 0).to_aml_bytes(&mut out);
    out
}

/// `CSTA`, `CEJX` and `CSCN`.
fn methods(n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let lock = aml::Acquire::new("CPLK".into(), 0xffff);
    let unlock = aml::Release::new("CPLK".into());
    let (csel, cpen, cej0, cins, crmv): (aml::Path, aml::Path, aml::Path, aml::Path, aml::Path) = (
        "CSEL".into(),
        "CPEN".into(),
        "CEJ0".into(),
        "CINS".into(),
        "CRMV".into(),
    );
    let (l0, a0) = (aml::Local(0), aml::Arg(0));
    let sel_arg = aml::Store::new(&csel, &a0);
    let is_present = aml::Equal::new(&cpen, &aml::ONE);
    let set_f = aml::Store::new(&l0, &0xfu8);
    let present = aml::If::new(&is_present, vec![&set_f]);
    let zero_l0 = aml::Store::new(&l0, &aml::ZERO);
    let ret = aml::Return::new(&l0);
    aml::Method::new(
        "CSTA".into(),
        1,
        true,
        vec![&lock, &sel_arg, &zero_l0, &present, &unlock, &ret],
    )
    .to_aml_bytes(&mut out);
    let eject = aml::Store::new(&cej0, &aml::ONE);
    aml::Method::new(
        "CEJX".into(),
        1,
        true,
        vec![&lock, &sel_arg, &eject, &unlock],
    )
    .to_aml_bytes(&mut out);
    // CSCN: walk every vCPU, notify and acknowledge its pending event.
    let sel_l0 = aml::Store::new(&csel, &l0);
    let check = aml::MethodCall::new("CTFY".into(), vec![&l0, &aml::ONE]);
    let eject_req = aml::MethodCall::new("CTFY".into(), vec![&l0, &3u8]);
    let ack_ins = aml::Store::new(&cins, &aml::ONE);
    let ack_rmv = aml::Store::new(&crmv, &aml::ONE);
    let (ins, rmv) = (
        aml::Equal::new(&cins, &aml::ONE),
        aml::Equal::new(&crmv, &aml::ONE),
    );
    let on_ins = aml::If::new(&ins, vec![&check, &ack_ins]);
    let on_rmv = aml::If::new(&rmv, vec![&eject_req, &ack_rmv]);
    let next = aml::Add::new(&l0, &l0, &aml::ONE);
    let count = n as u32;
    let more = aml::LessThan::new(&l0, &count);
    let walk = aml::While::new(&more, vec![&sel_l0, &on_ins, &on_rmv, &next]);
    aml::Method::new(
        "CSCN".into(),
        0,
        true,
        vec![&lock, &zero_l0, &walk, &unlock],
    )
    .to_aml_bytes(&mut out);
    out
}

/// `CTFY(i, event)`: one `If` per vCPU.
fn notifier(n: usize) -> Vec<u8> {
    let names: Vec<aml::Path> = (0..n).map(|i| device_name(i).as_str().into()).collect();
    let idx: Vec<u32> = (0..n as u32).collect();
    let eqs: Vec<aml::Equal> = idx
        .iter()
        .map(|i| aml::Equal::new(&aml::Arg(0), i))
        .collect();
    let notes: Vec<aml::Notify> = names
        .iter()
        .map(|p| aml::Notify::new(p, &aml::Arg(1)))
        .collect();
    let ifs: Vec<aml::If> = eqs
        .iter()
        .zip(&notes)
        .map(|(e, nt)| aml::If::new(e, vec![nt]))
        .collect();
    let body: Vec<&dyn Aml> = ifs.iter().map(|i| i as &dyn Aml).collect();
    aml_bytes(&aml::Method::new("CTFY".into(), 2, false, body))
}

/// vCPU `i`'s processor device.
fn processor(guest: &GuestTopology, i: usize) -> Vec<u8> {
    let c = guest.cpu(i);
    let uid = i as u32;
    let hid = "ACPI0007";
    let sta_call = aml::MethodCall::new(path("CSTA"), vec![&uid]);
    let sta_ret = aml::Return::new(&sta_call);
    let sta = aml::Method::new("_STA".into(), 0, false, vec![&sta_ret]);
    let mat = aml::BufferData::new(mat_entry(c.apic_id, uid));
    let ej_call = aml::MethodCall::new(path("CEJX"), vec![&uid]);
    let ej0 = aml::Method::new("_EJ0".into(), 1, false, vec![&ej_call]);
    let (n_hid, n_uid, n_mat, n_pxm) = (
        aml::Name::new("_HID".into(), &hid),
        aml::Name::new("_UID".into(), &uid),
        aml::Name::new("_MAT".into(), &mat),
        aml::Name::new("_PXM".into(), &c.node),
    );
    let mut children: Vec<&dyn Aml> = vec![&n_hid, &n_uid, &sta, &n_mat, &n_pxm];
    if i > 0 {
        children.push(&ej0);
    }
    aml_bytes(&aml::Device::new(device_name(i).as_str().into(), children))
}

/// The DSDT's CPU hotplug part for every vCPU of `guest`: the processor
/// container with its devices and methods (the GED that calls `CSCN` is
/// the DSDT's Generic Event Device).
pub fn dsdt_devices(guest: &GuestTopology) -> Vec<u8> {
    let n = guest.num_vcpus();
    let hid = "ACPI0010";
    let cid = aml::EISAName::new("PNP0A05");
    let mut body = aml_bytes(&aml::Name::new("_HID".into(), &hid));
    body.extend(aml_bytes(&aml::Name::new("_CID".into(), &cid)));
    body.extend(registers());
    body.extend(methods(n));
    body.extend(notifier(n));
    for i in 0..n {
        body.extend(processor(guest, i));
    }
    aml_bytes(&aml::Device::new(CPUS.into(), vec![&RawAml(body)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_possible_vcpu_has_a_device() {
        let g = GuestTopology::from_spec("package:2 [numa] core:2 pu:1").unwrap();
        let d = dsdt_devices(&g);
        let count = |needle: &[u8]| d.windows(needle.len()).filter(|w| *w == needle).count();
        for i in 0..4 {
            assert!(count(device_name(i).as_bytes()) >= 2, "C{i:03X}");
        }
        assert_eq!(count(b"ACPI0007"), 4);
        assert_eq!(count(b"_EJ0"), 3, "vCPU 0 cannot be ejected");
        assert_eq!(count(b"_PXM"), 4);
        // Each _MAT is an enabled x2APIC entry with its APIC ID and UID.
        let c3 = g.cpu(3);
        assert_eq!(count(&mat_entry(c3.apic_id, 3)), 1);
    }

    /// `iasl -d` (acpica-tools, installed by scripts/setup.sh), the
    /// independent judge: the DSDT disassembles, with the devices and
    /// methods where they belong. Without iasl: a failure under `CI`,
    /// elsewhere skipped with a note.
    #[test]
    fn iasl_disassembles_the_dsdt() {
        let g = GuestTopology::from_spec("package:1 core:3 pu:1").unwrap();
        let Some(dsl) =
            super::super::iasl_disassemble(super::super::dsdt(&[], Some(&g), false).as_slice())
        else {
            return;
        };
        for want in [
            "Device (\\_SB.CPUS)",
            "OperationRegion (PRST, SystemIO, 0x0620, 0x08)",
            "Method (CSCN, 0, Serialized)",
            "Notify (C002, Arg1)",
            "Device (C002)",
            "Name (_HID, \"ACPI0007\"",
            "Method (_EJ0, 1, NotSerialized)",
            "Device (\\_SB.GED0)",
            "Name (_HID, \"ACPI0013\"",
            "Method (_EVT, 1, Serialized)",
            "\\_SB.CPUS.CSCN ()",
        ] {
            assert!(dsl.contains(want), "{want:?} not in:\n{dsl}");
        }
    }
}
