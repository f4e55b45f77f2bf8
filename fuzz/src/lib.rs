//! Checks shared by the fuzz targets: what must hold for every guest
//! topology the project accepts, whatever input it came from.
//!
//! * x2APIC IDs are unique;
//! * the CPUID topology leaves agree with each other and with the
//!   topology: in the Intel encoding, leaves 0xB and 0x1F (levels, shifts,
//!   x2APIC IDs) and the cache leaf 0x4; in the AMD encoding, leaf 0xB, the
//!   cache leaf 0x8000_001D and the extended APIC ID leaf 0x8000_001E.
//!   "Agree" is judged the way Linux reads them: vCPUs whose x2APIC IDs
//!   match above a level's shift share that level;
//! * the ACPI tables parse back: every table's length field is its length,
//!   every checksum is right, and the MADT, SRAT and SLIT list exactly the
//!   vCPUs, nodes and distances of the topology.
//!
//! Each check panics with a description on failure, which is what a fuzz
//! target reports as a crash.

use std::collections::BTreeSet;

use topology::{CpuidSet, GuestTopology, Vendor};
use vmm_machine::acpi;
use vmm_machine::memory::MemoryPlan;

/// Runs every check on `g`.
pub fn check_guest(g: &GuestTopology) {
    check_apic_ids(g);
    for vendor in [Vendor::Intel, Vendor::Amd] {
        check_cpuid(g, vendor);
    }
    check_acpi(g);
}

/// x2APIC IDs are unique.
pub fn check_apic_ids(g: &GuestTopology) {
    let mut seen = BTreeSet::new();
    for (i, c) in g.cpus().iter().enumerate() {
        assert!(
            seen.insert(c.apic_id),
            "vCPU {i}: x2APIC ID {:#x} given twice ({})",
            c.apic_id,
            g.describe()
        );
    }
}

fn ceil_log2(n: u32) -> u32 {
    if n <= 1 {
        0
    } else {
        32 - (n - 1).leading_zeros()
    }
}

/// The vCPUs whose x2APIC ID equals vCPU `i`'s above bit `shift`.
fn same_above(apics: &[u32], i: usize, shift: u32) -> Vec<u32> {
    let key = |a: u32| a.checked_shr(shift).unwrap_or(0);
    (0..apics.len() as u32)
        .filter(|&j| key(apics[j as usize]) == key(apics[i]))
        .collect()
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
}

/// The (level type, shift) list of an extended topology leaf (0xB, 0x1F).
fn levels(set: &CpuidSet, leaf: u32) -> Vec<(u32, u32, u32)> {
    let mut out = Vec::new();
    for sub in 0..16 {
        let Some(e) = set.get(leaf, sub) else { break };
        let ty = (e.ecx >> 8) & 0xff;
        if ty == 0 {
            break;
        }
        out.push((ty, e.eax & 0x1f, e.edx));
    }
    out
}

/// The (cache level, sharing shift) list of a deterministic cache leaf
/// (0x4, 0x8000_001D).
fn caches(set: &CpuidSet, leaf: u32) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for sub in 0..16 {
        let Some(e) = set.get(leaf, sub) else { break };
        if e.eax & 0x1f == 0 {
            break;
        }
        let level = (e.eax >> 5) & 0x7;
        let sharing = ((e.eax >> 14) & 0xfff) + 1;
        out.push((level, ceil_log2(sharing)));
    }
    out
}

/// The CPUID topology leaves of every vCPU in `vendor`'s encoding agree
/// with each other and with `g`.
pub fn check_cpuid(g: &GuestTopology, vendor: Vendor) {
    let base = CpuidSet::new(Vec::new());
    let n = g.num_vcpus();
    let apics: Vec<u32> = g.cpus().iter().map(|c| c.apic_id).collect();
    let what = |i: usize| format!("{vendor} vCPU {i} of {}", g.describe());
    for i in 0..n {
        let set = g.cpuid(i, &base, vendor);
        let mut leaves = vec![0xB];
        if vendor == Vendor::Intel {
            leaves.push(0x1F);
        }
        let mut package_shift = None;
        for leaf in leaves {
            let lv = levels(&set, leaf);
            assert!(!lv.is_empty(), "{}: leaf {leaf:#x} has no level", what(i));
            assert_eq!(lv[0].0, 1, "{}: leaf {leaf:#x} starts with SMT", what(i));
            for (k, &(ty, shift, x2apic)) in lv.iter().enumerate() {
                assert_eq!(
                    x2apic,
                    apics[i],
                    "{}: leaf {leaf:#x}.{k} x2APIC ID",
                    what(i)
                );
                if k > 0 {
                    assert!(
                        shift >= lv[k - 1].1 && ty > lv[k - 1].0,
                        "{}: leaf {leaf:#x} levels out of order: {lv:?}",
                        what(i)
                    );
                }
                // the vCPUs sharing the next level up
                let next = lv.get(k + 1).map(|l| l.0);
                let want = match (k, next) {
                    (0, _) => Some(g.smt_siblings(i)),
                    (_, Some(5)) => Some(g.die_siblings(i)),
                    (_, None) => Some(g.package_siblings(i)),
                    _ => None,
                };
                if let Some(want) = want {
                    assert_eq!(
                        sorted(same_above(&apics, i, shift)),
                        sorted(want),
                        "{}: leaf {leaf:#x}.{k} (type {ty}, shift {shift}) disagrees \
                         with the topology",
                        what(i)
                    );
                }
            }
            let last = lv.last().unwrap().1;
            if let Some(p) = package_shift {
                assert_eq!(p, last, "{}: 0xB and 0x1F package shifts", what(i));
            }
            package_shift = Some(last);
        }
        let cache_leaf = match vendor {
            Vendor::Intel => 0x4,
            Vendor::Amd => 0x8000_001D,
        };
        for (level, shift) in caches(&set, cache_leaf) {
            let want = match level {
                1 => g.smt_siblings(i),
                2 => g.l2_siblings(i),
                3 => g.llc_siblings(i),
                _ => continue,
            };
            assert_eq!(
                sorted(same_above(&apics, i, shift)),
                sorted(want),
                "{}: leaf {cache_leaf:#x} L{level} sharing (shift {shift})",
                what(i)
            );
        }
        if vendor == Vendor::Amd {
            let e = set.get(0x8000_001E, 0).expect("leaf 0x8000_001E");
            assert_eq!(e.eax, apics[i], "{}: 0x8000_001E extended APIC ID", what(i));
            let threads = ((e.ebx >> 8) & 0xff) + 1;
            assert_eq!(
                threads as usize,
                g.smt_siblings(i).len().max(1),
                "{}: 0x8000_001E threads per core",
                what(i)
            );
            // AMD's "node" here is the die (an internal node), not the
            // NUMA node: NodeId and nodes per processor minus one
            assert_eq!(
                e.ecx & 0xff,
                g.cpu(i).die & 0xff,
                "{}: 0x8000_001E NodeId",
                what(i)
            );
            assert_eq!(
                (e.ecx >> 8) & 7,
                (g.counts().dies_per_package - 1).min(7),
                "{}: 0x8000_001E nodes per processor",
                what(i)
            );
        }
    }
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

fn checksum_ok(b: &[u8]) -> bool {
    b.iter().fold(0u8, |s, x| s.wrapping_add(*x)) == 0
}

/// Walks the entries of a table from `start`: each has a type and a length
/// of at least 2 that stays inside the table.
fn entries(t: &[u8], start: usize) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut o = start;
    while o < t.len() {
        assert!(o + 2 <= t.len(), "entry header past the end at {o}");
        let len = t[o + 1] as usize;
        assert!(
            len >= 2 && o + len <= t.len(),
            "entry at {o} of length {len}"
        );
        out.push(&t[o..o + len]);
        o += len;
    }
    out
}

/// The ACPI tables for `g` parse back: lengths, checksums, and the MADT,
/// SRAT and SLIT contents.
pub fn check_acpi(g: &GuestTopology) {
    let nodes = g.num_nodes().max(1);
    let plan = MemoryPlan::new(MemoryPlan::minimum(nodes), nodes).expect("minimum plan");
    // with CPU hotplug (1 vCPU present at boot, the rest hot-pluggable)
    // and PCI hotplug: builds or refuses cleanly, never panics
    let _ = acpi::build(g, &plan, &[], (Some(1), true));
    let image = match acpi::build(g, &plan, &[], (None, false)) {
        Ok(i) => i,
        // too many vCPUs for the reserved area: a clean error, not a table
        Err(acpi::AcpiError::TooLarge { .. }) => return,
    };
    let table = |addr: u64, len: usize| {
        let o = (addr - image.base) as usize;
        &image.bytes[o..o + len]
    };
    for &(sig, addr, len) in &image.tables {
        let t = table(addr, len);
        let name = String::from_utf8_lossy(&sig).into_owned();
        if &sig == b"RSDP" {
            assert_eq!(&t[..8], b"RSD PTR ");
            assert!(checksum_ok(&t[..20]), "RSDP checksum");
            assert_eq!(u32_at(t, 20) as usize, len, "RSDP length");
            assert!(checksum_ok(t), "RSDP extended checksum");
            continue;
        }
        assert_eq!(&t[..4], &sig, "{name} signature");
        assert_eq!(u32_at(t, 4) as usize, len, "{name} length field");
        assert!(checksum_ok(t), "{name} checksum");
        match &sig {
            b"APIC" => {
                let x2: Vec<u32> = entries(t, 44)
                    .into_iter()
                    .filter(|e| e[0] == 9)
                    .map(|e| u32_at(e, 4))
                    .collect();
                let want: Vec<u32> = g.cpus().iter().map(|c| c.apic_id).collect();
                assert_eq!(x2, want, "MADT x2APIC entries");
            }
            b"SRAT" => {
                let mut cpus = Vec::new();
                for e in entries(t, 48) {
                    match e[0] {
                        0 => {
                            let node = u32::from_le_bytes([e[2], e[9], e[10], e[11]]);
                            cpus.push((e[3] as u32, node));
                        }
                        2 => cpus.push((u32_at(e, 8), u32_at(e, 4))),
                        _ => {}
                    }
                }
                let want: Vec<(u32, u32)> = g.cpus().iter().map(|c| (c.apic_id, c.node)).collect();
                assert_eq!(cpus, want, "SRAT processor affinity");
            }
            b"SLIT" => {
                let n = u64::from_le_bytes(t[36..44].try_into().unwrap()) as usize;
                assert_eq!(n, g.num_nodes(), "SLIT locality count");
                assert_eq!(len, 44 + n * n, "SLIT size");
                for a in 0..n {
                    for b in 0..n {
                        let d = t[44 + a * n + b];
                        assert_eq!(
                            d as u32,
                            g.distance(a as u32, b as u32).min(254),
                            "SLIT[{a}][{b}]"
                        );
                        if a == b {
                            assert_eq!(d, 10, "SLIT diagonal");
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

/// Topology input that would read files or the live host rather than a
/// description (paths, `host`): the fuzz targets skip it, since it depends
/// on the machine rather than the bytes.
pub fn touches_machine(spec: &str) -> bool {
    let s = spec.trim();
    s.contains('/') || s.starts_with('.') || s.starts_with('~') || s.eq_ignore_ascii_case("host")
}

/// Guest memory of the virtio fuzz targets, and where its rings sit.
const VIRTIO_MEM: usize = 64 << 10;

/// Drives virtio-blk's request path over `data` as guest memory (see
/// `fuzz_targets/virtio_block.rs`). Panics if the image file changes size.
pub fn virtio_block(data: &[u8]) {
    use std::sync::{Arc, OnceLock};

    use virtio_queue::{Queue, QueueT};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
    use vmm_devices::virtio::block::{serve_once, Disk};

    const IMAGE: u64 = 32 << 10;
    static DISK: OnceLock<(tempfile::NamedTempFile, Arc<Disk>)> = OnceLock::new();
    let Some((&size_bits, memory)) = data.split_first() else {
        return;
    };
    let (file, disk) = DISK.get_or_init(|| {
        let f = tempfile::NamedTempFile::new().expect("a temporary image");
        f.as_file().set_len(IMAGE).expect("sizing the image");
        let d = Disk::open(f.path(), false).expect("opening the image");
        (f, Arc::new(d))
    });
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), VIRTIO_MEM)]).expect("guest memory");
    let n = memory.len().min(VIRTIO_MEM);
    mem.write_slice(&memory[..n], GuestAddress(0))
        .expect("filling guest memory");
    let mut q = Queue::new(256).expect("a queue");
    // Sizes 1 to 256, powers of two, as the transport lets through.
    if q.try_set_size(1 << (size_bits % 9)).is_err() {
        return;
    }
    q.try_set_desc_table_address(GuestAddress(0))
        .expect("aligned");
    q.try_set_avail_ring_address(GuestAddress(0x1000))
        .expect("aligned");
    q.try_set_used_ring_address(GuestAddress(0x2000))
        .expect("aligned");
    q.set_ready(true);
    let _ = serve_once(disk, &mem, q);
    let len = file.as_file().metadata().expect("stat").len();
    assert_eq!(len, IMAGE, "the image changed size");
}

/// virtio-net over a guest that writes anything: the input's first byte
/// picks the queue sizes and whether receive buffers are mergeable, the
/// next two the length of one packet waiting on the host side (a socket
/// pair standing in for the tap), the rest is guest memory: receive queue
/// rings at 0 / 0x1000 / 0x2000, transmit at 0x3000 / 0x4000 / 0x5000,
/// control at 0x6000 / 0x7000 / 0x8000, buffers anywhere in its 64 KiB.
/// Whatever the chains say, serving ends: packets go out or are dropped,
/// the waiting packet is delivered, dropped or kept, control commands are
/// answered, or the device asks for a reset; and the used index never
/// runs ahead of what the driver made available.
pub fn virtio_net(data: &[u8]) {
    use std::os::unix::net::UnixDatagram;
    use std::sync::atomic::Ordering;

    use virtio_queue::{Queue, QueueT};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
    use vmm_devices::tap::Tap;
    use vmm_devices::virtio::net::serve_once;

    let [bits, l0, l1, memory @ ..] = data else {
        return;
    };
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), VIRTIO_MEM)]).expect("guest memory");
    let n = memory.len().min(VIRTIO_MEM);
    mem.write_slice(&memory[..n], GuestAddress(0))
        .expect("filling guest memory");
    let queue = |base: u64| {
        let mut q = Queue::new(256).expect("a queue");
        q.try_set_size(1 << (bits % 9)).ok()?;
        q.try_set_desc_table_address(GuestAddress(base)).ok()?;
        q.try_set_avail_ring_address(GuestAddress(base + 0x1000))
            .ok()?;
        q.try_set_used_ring_address(GuestAddress(base + 0x2000))
            .ok()?;
        q.set_ready(true);
        Some(q)
    };
    let (Some(rx), Some(tx), Some(ctrl)) = (queue(0), queue(0x3000), queue(0x6000)) else {
        return;
    };
    let (ours, peer) = UnixDatagram::pair().expect("a socket pair");
    let len = usize::from(u16::from_le_bytes([*l0, *l1])).min(9000);
    let _ = peer.send(&vec![0x5a; len]);
    let tap = Tap::from_socket(ours).expect("non-blocking");
    // The driver starts each used ring at index 0.
    for base in [0u64, 0x3000, 0x6000] {
        mem.write_obj(0u16, GuestAddress(base + 0x2002))
            .expect("in memory");
    }
    let avail = |base: u64| {
        mem.load::<u16>(GuestAddress(base + 0x1002), Ordering::Relaxed)
            .expect("in memory")
    };
    let before = [avail(0), avail(0x3000), avail(0x6000)];
    let _ = serve_once(tap, &mem, [rx, tx, ctrl], bits & 0x80 != 0);
    let size = 1u16 << (bits % 9);
    for (base, a) in [0u64, 0x3000, 0x6000].into_iter().zip(before) {
        let used = mem
            .load::<u16>(GuestAddress(base + 0x2002), Ordering::Relaxed)
            .expect("in memory");
        // Each used entry is a chain the driver made available, at most a
        // queue's worth: never more than the available index says.
        assert!(
            used <= a.min(size),
            "queue at {base:#x}: used index {used}, available {a}, size {size}"
        );
    }
}
