//! The checks and derivations of a [`VmConfig`]: its guest shape, its
//! devices, and one check per part of the config, each error naming the
//! field at fault. A child module of `api`, so the types stay a plain
//! list of CH's fields there and their rules live here.

use super::{
    absent, ch_shape, off, ApiError, ConsoleConfig, MemoryConfig, NumaConfig, PayloadConfig,
    RtConfig, VmConfig, LINUX_DEFAULT_MEMORY, LINUX_MIN_MEMORY, MICRO_PROGRAMS,
};

impl VmConfig {
    /// Does it boot a Linux kernel (`payload.kernel`)?
    pub fn linux_payload(&self) -> bool {
        self.payload.as_ref().is_some_and(|p| p.kernel.is_some())
    }

    /// The guest RAM this VM holds when booted: `memory.size`, or the
    /// default of its payload (CH's 512 MiB for Linux, 2 MiB for a
    /// micro-guest).
    pub fn memory_bytes(&self) -> u64 {
        match &self.memory {
            Some(m) => m.size,
            None if self.linux_payload() => LINUX_DEFAULT_MEMORY,
            None => vmm_machine::micro::MIN_MEMORY,
        }
    }

    /// The most vCPUs the VM can have: `cpus.max_vcpus`, else
    /// `boot_vcpus`. The guest topology describes all of them; the first
    /// `boot_vcpus` are present at boot, the others wait for `vm.resize`
    /// (ACPI CPU hotplug).
    pub fn max_vcpus(&self) -> u32 {
        self.cpus.max_vcpus.unwrap_or(self.cpus.boot_vcpus)
    }

    /// The config as `vm.info` shows it, in CH's schema: `cpus.max_vcpus`,
    /// `memory` (with the size in effect) and `payload` filled in where the
    /// request left them out, as CH echoes its defaults.
    pub fn echo(&self) -> VmConfig {
        let mut c = self.clone();
        c.cpus.max_vcpus.get_or_insert(c.cpus.boot_vcpus);
        if c.memory.is_none() {
            c.memory = Some(MemoryConfig::of_size(self.memory_bytes()));
        }
        c.payload.get_or_insert_with(PayloadConfig::default);
        c
    }

    /// Checks every field against what this VMM can honour and returns
    /// the guest shape as an hwloc synthetic string (or the preset
    /// named); an error names the field. Reads no file: the files a
    /// config names are checked apart, with no lock held (the crate's
    /// `files` module).
    pub fn guest_shape(&self) -> Result<String, ApiError> {
        self.ch.check()?;
        self.check_cpus()?;
        self.check_payload()?;
        self.check_extensions()?;
        self.check_memory()?;
        self.check_consoles()?;
        let (shape, field) = self.shape()?;
        let g = topology::GuestTopology::from_spec(&shape)
            .map_err(|e| ApiError::bad(field, format!("{shape:?}: {e}")))?;
        if g.num_vcpus() != self.max_vcpus() as usize {
            return Err(ApiError::bad(
                field,
                format!(
                    "{shape:?} has {} vCPUs, but max_vcpus (else boot_vcpus) is {}",
                    g.num_vcpus(),
                    self.max_vcpus()
                ),
            ));
        }
        self.check_numa(&g)?;
        Ok(shape)
    }

    /// The machine's devices (`disks`, `net`, `fs`, `rng`, `vsock`, `platform`); an error names
    /// the field. Stats the disk images, opens nothing.
    pub fn device_spec(&self) -> Result<vmm_machine::devices::DeviceSpec, ApiError> {
        let d = crate::devices::Devices {
            disks: self.disks.as_deref(),
            net: self.net.as_deref(),
            fs: self.fs.as_deref(),
            rng: self.rng.as_ref(),
            platform: self.platform.as_ref(),
            vsock: self.vsock.as_ref(),
        };
        if self.x_vmm.as_ref().is_some_and(|x| x.micro.is_some())
            && (self.disks.is_some()
                || self.rng.is_some()
                || self.net.is_some()
                || self.fs.as_ref().is_some_and(|f| !f.is_empty())
                || self.vsock.is_some())
        {
            let field = if self.vsock.is_some() {
                "vsock"
            } else {
                "disks"
            };
            return Err(ApiError::bad(
                field,
                "micro-guests have no PCI devices: give a Linux payload, or leave disks, net, \
                 fs, rng and vsock out",
            ));
        }
        let mut spec = crate::devices::device_spec(d, self.max_vcpus() as usize)
            .map_err(|(field, msg)| ApiError::bad(&field, msg))?;
        if self.linux_payload() && self.console.as_ref().is_some_and(ConsoleConfig::is_device) {
            spec.console = Some(0);
        }
        Ok(spec)
    }

    /// `cpus.boot_vcpus` and `cpus.max_vcpus`.
    fn check_cpus(&self) -> Result<(), ApiError> {
        let c = &self.cpus;
        if c.boot_vcpus == 0 {
            return Err(ApiError::bad("cpus.boot_vcpus", "give at least 1 vCPU"));
        }
        if c.boot_vcpus > vmm_machine::micro::MAX_VCPUS as u32 {
            return Err(ApiError::bad(
                "cpus.boot_vcpus",
                format!("at most {} vCPUs per VM", vmm_machine::micro::MAX_VCPUS),
            ));
        }
        if let Some(m) = c.max_vcpus {
            if m < c.boot_vcpus || m > vmm_machine::micro::MAX_VCPUS as u32 {
                return Err(ApiError::bad(
                    "cpus.max_vcpus",
                    format!(
                        "{m}: give boot_vcpus ({}) to {} (vCPUs past boot_vcpus are \
                         hot-added by vm.resize)",
                        c.boot_vcpus,
                        vmm_machine::micro::MAX_VCPUS
                    ),
                ));
            }
            if m != c.boot_vcpus && !self.linux_payload() {
                return Err(ApiError::bad(
                    "cpus.max_vcpus",
                    format!(
                        "{m} differs from boot_vcpus {}: only Linux guests have CPU hotplug \
                         (ACPI); give equal values for a micro-guest",
                        c.boot_vcpus
                    ),
                ));
            }
        }
        off(
            "cpus.kvm_hyperv",
            c.kvm_hyperv,
            "Hyper-V enlightenments are not implemented",
        )?;
        absent(
            "cpus.max_phys_bits",
            &c.max_phys_bits,
            "the guest's physical address width is this VMM's own",
        )?;
        if let Some(f) = &c.features {
            let none = serde_json::json!({});
            if *f != none && *f != serde_json::json!({"amx": false}) {
                absent(
                    "cpus.features",
                    &c.features,
                    "CPU features (AMX) are not implemented",
                )?;
            }
        }
        Ok(())
    }

    /// `payload`: what goes with what, and the command line (its files
    /// are checked apart).
    fn check_payload(&self) -> Result<(), ApiError> {
        let Some(p) = &self.payload else {
            return Ok(());
        };
        absent(
            "payload.firmware",
            &p.firmware,
            "firmware payloads are not implemented: give kernel",
        )?;
        absent(
            "payload.igvm",
            &p.igvm,
            "IGVM payloads are not implemented: give kernel",
        )?;
        absent(
            "payload.host_data",
            &p.host_data,
            "confidential guests are not implemented",
        )?;
        if p.kernel.is_none() && (p.initramfs.is_some() || p.cmdline.is_some()) {
            return Err(ApiError::bad(
                "payload.kernel",
                "initramfs and cmdline need a kernel",
            ));
        }
        if p.kernel.is_some() && self.x_vmm.as_ref().is_some_and(|x| x.micro.is_some()) {
            return Err(ApiError::bad(
                "x_vmm.micro",
                "give a micro-guest or payload.kernel, not both",
            ));
        }
        if let Some(c) = &p.cmdline {
            vmm_machine::boot::check_cmdline(c)
                .map_err(|e| ApiError::bad("payload.cmdline", e.to_string()))?;
        }
        Ok(())
    }

    /// `x_vmm`: the micro-guest, the RT policy, the placement.
    fn check_extensions(&self) -> Result<(), ApiError> {
        let Some(x) = &self.x_vmm else {
            return Ok(());
        };
        if let Some(m) = &x.micro {
            if !MICRO_PROGRAMS.contains(&m.as_str()) {
                return Err(ApiError::bad(
                    "x_vmm.micro",
                    format!("unknown program {m:?}; give one of {MICRO_PROGRAMS:?}"),
                ));
            }
        }
        if let Some(rt) = &x.rt {
            rt.check(self.max_vcpus())?;
        }
        if let Some(p) = &x.placement {
            if !matches!(p.policy.as_str(), "pinned" | "none") {
                return Err(ApiError::bad(
                    "x_vmm.placement.policy",
                    "give pinned or none",
                ));
            }
            if self.cpus.affinity.is_some() {
                return Err(ApiError::bad(
                    "x_vmm.placement",
                    "cpus.affinity already places every vCPU; give one of the two",
                ));
            }
        }
        if x.topology.is_some() && self.cpus.topology.is_some() {
            return Err(ApiError::bad(
                "x_vmm.topology",
                "cpus.topology gives the shape too; give one of the two",
            ));
        }
        Ok(())
    }

    /// `memory.size`, against the payload's limits and the host's RAM.
    fn check_memory(&self) -> Result<(), ApiError> {
        let Some(m) = &self.memory else {
            return Ok(());
        };
        m.check_ch()?;
        if !self.linux_payload() {
            let (lo, hi) = (
                vmm_machine::micro::MIN_MEMORY,
                vmm_machine::micro::MAX_MEMORY,
            );
            if m.size < lo || m.size > hi || m.size % lo != 0 {
                return Err(ApiError::bad(
                    "memory.size",
                    format!(
                        "{} bytes; a micro-guest takes a multiple of {lo} from {lo} to {hi}",
                        m.size
                    ),
                ));
            }
            return Ok(());
        }
        if let Some(total) = vmm_machine::memory::host_mem_total() {
            if m.size > total {
                return Err(ApiError::bad(
                    "memory.size",
                    format!(
                        "{} bytes is more than this host's {total} bytes of RAM",
                        m.size
                    ),
                ));
            }
        }
        if m.size < LINUX_MIN_MEMORY || m.size % (2 << 20) != 0 {
            return Err(ApiError::bad(
                "memory.size",
                format!(
                    "{} bytes; a Linux guest takes a multiple of 2 MiB, at least {LINUX_MIN_MEMORY}",
                    m.size
                ),
            ));
        }
        Ok(())
    }

    /// `serial` and `console`: only what this VMM has (a Linux guest's
    /// 16550 serial port, to a file or the server's stdout; its virtio
    /// console, `hvc0`, to the server's stdout, a new file, a new pty or a
    /// new Unix socket), never a field it would ignore.
    fn check_consoles(&self) -> Result<(), ApiError> {
        if let Some(s) = &self.serial {
            let honoured: &[&str] = if self.linux_payload() {
                &["Off", "Null", "Tty", "File"]
            } else {
                &["Off", "Null"]
            };
            if !honoured.contains(&s.mode.as_str()) {
                let why = if self.linux_payload() {
                    "this VMM sends a serial port to a file (File) or its stdout (Tty), or nowhere"
                } else {
                    "a micro-guest has no serial port"
                };
                return Err(ApiError::bad(
                    "serial.mode",
                    format!("{:?}: {why}; give one of {honoured:?}", s.mode),
                ));
            }
            check_console_file("serial", s)?;
        }
        if let Some(c) = &self.console {
            let honoured: &[&str] = if self.linux_payload() {
                &["Off", "Null", "Tty", "File", "Pty", "Socket"]
            } else {
                &["Off", "Null"]
            };
            if !honoured.contains(&c.mode.as_str()) {
                return Err(ApiError::bad(
                    "console.mode",
                    format!(
                        "{:?}: {}; give one of {honoured:?}",
                        c.mode,
                        if self.linux_payload() {
                            "not a console mode"
                        } else {
                            "a micro-guest has no virtio console"
                        }
                    ),
                ));
            }
            if c.iommu {
                return Err(ApiError::bad(
                    "console.iommu",
                    "this VMM has no IOMMU; give false",
                ));
            }
            match (c.mode.as_str(), &c.socket) {
                ("Socket", None) => {
                    return Err(ApiError::bad(
                        "console.socket",
                        "give a socket path for mode Socket",
                    ))
                }
                ("Socket", Some(_)) | (_, None) => {}
                (m, Some(_)) => {
                    return Err(ApiError::bad(
                        "console.socket",
                        format!("mode {m} makes no socket; give mode Socket, or leave socket out"),
                    ))
                }
            }
            check_console_file("console", c)?;
        }
        Ok(())
    }

    /// The guest shape: `x_vmm.topology`, `cpus.topology` (CH's terms) or
    /// one package of `max_vcpus` (else `boot_vcpus`) cores; and the field
    /// it came from.
    fn shape(&self) -> Result<(String, &'static str), ApiError> {
        let c = &self.cpus;
        let nodes = self.numa.as_ref().map_or(0, Vec::len);
        if let Some(t) = self.x_vmm.as_ref().and_then(|x| x.topology.as_ref()) {
            return Ok((t.clone(), "x_vmm.topology"));
        }
        let Some(t) = &c.topology else {
            if nodes > 1 {
                return Err(ApiError::bad(
                    "numa",
                    "several guest nodes need cpus.topology",
                ));
            }
            return Ok((
                format!("package:1 l3:1 l2:{} core:1 pu:1", self.max_vcpus()),
                if c.max_vcpus.is_some() {
                    "cpus.max_vcpus"
                } else {
                    "cpus.boot_vcpus"
                },
            ));
        };
        let n = [
            t.threads_per_core,
            t.cores_per_die,
            t.dies_per_package,
            t.packages,
        ];
        if n.contains(&0) {
            return Err(ApiError::bad(
                "cpus.topology",
                "every count must be at least 1",
            ));
        }
        let total: u64 = n.iter().map(|&v| v as u64).product();
        if total != self.max_vcpus() as u64 {
            return Err(ApiError::bad(
                "cpus.topology",
                format!(
                    "{} x {} x {} x {} = {total} vCPUs, but max_vcpus (else boot_vcpus) is {}",
                    t.packages,
                    t.dies_per_package,
                    t.cores_per_die,
                    t.threads_per_core,
                    self.max_vcpus()
                ),
            ));
        }
        if nodes > 1 && nodes as u32 != t.packages {
            return Err(ApiError::bad(
                "numa",
                format!("{nodes} guest nodes; give one per package ({})", t.packages),
            ));
        }
        let shape = ch_shape(
            t.packages,
            t.dies_per_package,
            t.cores_per_die,
            t.threads_per_core,
            nodes > 1,
        );
        Ok((shape, "cpus.topology"))
    }

    /// `numa`: one entry per guest node of the shape, each saying what
    /// the guest gets (its vCPUs, its distances) or leaving it out; no
    /// memory zones (this VMM has none).
    fn check_numa(&self, g: &topology::GuestTopology) -> Result<(), ApiError> {
        let Some(numa) = &self.numa else {
            return Ok(());
        };
        let nodes = g.num_nodes() as u32;
        if numa.len() as u32 != nodes {
            return Err(ApiError::bad(
                "numa",
                format!(
                    "{} entries, but the guest has {nodes} NUMA nodes; give one per node",
                    numa.len()
                ),
            ));
        }
        let mut seen = vec![false; nodes as usize];
        for n in numa {
            let id = n.guest_numa_id;
            if id >= nodes || std::mem::replace(&mut seen[id as usize], true) {
                return Err(ApiError::bad(
                    "numa.guest_numa_id",
                    format!("{id}: give each of 0..{nodes} once"),
                ));
            }
            n.check_against(g)?;
        }
        Ok(())
    }
}

/// A console's `file`: given with mode `File` only, and needed there.
fn check_console_file(name: &str, c: &ConsoleConfig) -> Result<(), ApiError> {
    match (c.mode.as_str(), &c.file) {
        ("File", None) => Err(ApiError::bad(
            &format!("{name}.file"),
            "give a file for mode File",
        )),
        ("File", Some(_)) | (_, None) => Ok(()),
        (m, Some(_)) => Err(ApiError::bad(
            &format!("{name}.file"),
            format!("mode {m} writes no file; give mode File, or leave file out"),
        )),
    }
}

impl NumaConfig {
    /// Its `cpus` and `distances` are what the guest gets, if given.
    fn check_against(&self, g: &topology::GuestTopology) -> Result<(), ApiError> {
        let id = self.guest_numa_id;
        if let Some(cpus) = &self.cpus {
            let mut mine = cpus.clone();
            mine.sort_unstable();
            let real = g.node_cpus(id);
            if mine != real {
                return Err(ApiError::bad(
                    "numa.cpus",
                    format!(
                        "node {id}: {cpus:?}, but the guest topology puts vCPUs {real:?} there; \
                         give those, or leave cpus out"
                    ),
                ));
            }
        }
        for d in self.distances.iter().flatten() {
            let real =
                (d.destination < g.num_nodes() as u32).then(|| g.distance(id, d.destination));
            if real != Some(d.distance) {
                return Err(ApiError::bad(
                    "numa.distances",
                    format!(
                        "node {id} to {}: {}, but the guest's distance (from its topology) is \
                         {real:?}; give that, or leave distances out",
                        d.destination, d.distance
                    ),
                ));
            }
        }
        if self.memory_zones.as_ref().is_some_and(|z| !z.is_empty()) {
            return Err(ApiError::bad(
                "numa.memory_zones",
                "this VMM has no memory zones; leave memory_zones out",
            ));
        }
        Ok(())
    }
}

impl RtConfig {
    /// The policy and priorities, for a VM of `vcpus` vCPUs.
    fn check(&self, vcpus: u32) -> Result<(), ApiError> {
        if !matches!(self.policy.as_str(), "fifo" | "rr") {
            return Err(ApiError::bad("x_vmm.rt.policy", "give fifo or rr"));
        }
        if !(1..=99).contains(&self.priority) {
            return Err(ApiError::bad(
                "x_vmm.rt.priority",
                "an RT priority is 1..=99",
            ));
        }
        if let Some(v) = &self.vcpu_priorities {
            if v.len() != vcpus as usize || v.iter().any(|p| !(1..=99).contains(p)) {
                return Err(ApiError::bad(
                    "x_vmm.rt.vcpu_priorities",
                    format!("give one RT priority (1..=99) per vCPU: {vcpus} of them"),
                ));
            }
        }
        Ok(())
    }
}
