//! Guest physical memory layout of a Linux guest.
//!
//! ```text
//! 0x0000_0500  GDT (4 entries), then the IDT (empty)
//! 0x0000_7000  boot_params ("zero page")
//! 0x0000_8ff0  initial stack pointer of the boot vCPU
//! 0x0000_9000  PML4, 0xA000 PDPT, 0xB000 PD: identity map of the first 1 GiB
//! 0x0002_0000  kernel command line (up to CMDLINE_MAX bytes)
//! 0x0009_fc00  -- reserved in E820 from here to 1 MiB (EBDA, BIOS area)
//! 0x000e_0000  RSDP, then the other ACPI tables (up to 1 MiB)
//! 0x0010_0000  bzImage protected-mode kernel (code32_start)
//! 0x0100_0000  vmlinux (ELF) load address, as linked
//!  ...         RAM of node 0, node 1, ... back to back; the initrd sits at
//!              the top of the RAM below the MMIO hole
//! 0xc000_0000  MMIO hole to 4 GiB: PCI BAR windows to 0xe000_0000, then
//!              the PCI segments' ECAM (1 MiB each), IOAPIC 0xfec0_0000,
//!              LAPIC 0xfee0_0000
//! 0x1_0000_0000 RAM continues above 4 GiB
//! ```
//!
//! Each NUMA node's memory is a contiguous run of guest physical addresses
//! (split in two only where the MMIO hole cuts through it), so that the SRAT
//! memory affinity entries and the host-side `mbind` agree by construction.

/// One mebibyte.
pub const MIB: u64 = 1 << 20;
/// One gibibyte.
pub const GIB: u64 = 1 << 30;

/// The GDT.
pub const GDT_ADDR: u64 = 0x500;
/// The (empty) IDT loaded at entry.
pub const IDT_ADDR: u64 = 0x520;
/// Linux's `boot_params`.
pub const ZERO_PAGE: u64 = 0x7000;
/// Initial RSP/RBP of the boot vCPU.
pub const BOOT_STACK: u64 = 0x8ff0;
/// PML4 of the boot page tables.
pub const PML4_ADDR: u64 = 0x9000;
/// PDPT of the boot page tables.
pub const PDPT_ADDR: u64 = 0xa000;
/// PD of the boot page tables (512 x 2 MiB = 1 GiB).
pub const PD_ADDR: u64 = 0xb000;
/// Kernel command line.
pub const CMDLINE_ADDR: u64 = 0x20000;
/// Longest command line accepted (x86 Linux's COMMAND_LINE_SIZE is 2048,
/// including the terminating NUL).
pub const CMDLINE_MAX: usize = 2047;
/// Start of the reserved area below 1 MiB (EBDA).
pub const EBDA_START: u64 = 0x9fc00;
/// Where the ACPI tables start (the RSDP first, inside the BIOS area Linux
/// scans for it).
pub const ACPI_START: u64 = 0xe0000;
/// End of the ACPI area.
pub const ACPI_END: u64 = 0x10_0000;
/// Start of "high memory": kernels are loaded at or above it.
pub const HIMEM_START: u64 = 0x10_0000;
/// The MMIO hole below 4 GiB starts here.
pub const MMIO_HOLE_START: u64 = 0xc000_0000;
/// ... and ends here.
pub const MMIO_HOLE_END: u64 = 1 << 32;
/// ECAM of PCI segment 0; segment `s` at `+ s MiB` (bus 0 only). Below
/// it, from [`MMIO_HOLE_START`], the segments' BAR windows.
pub const PCI_ECAM_START: u64 = 0xe000_0000;
/// The in-kernel IOAPIC.
pub const IOAPIC_ADDR: u32 = 0xfec0_0000;
/// The local APICs.
pub const LAPIC_ADDR: u32 = 0xfee0_0000;

/// COM1.
pub const COM1_PORT: u16 = 0x3f8;
/// COM1's interrupt (ISA IRQ 4, IOAPIC pin 4).
pub const COM1_GSI: u32 = 4;
/// i8042 data port.
pub const I8042_DATA_PORT: u16 = 0x60;
/// i8042 command/status port: writing 0xfe resets the machine.
pub const I8042_CMD_PORT: u16 = 0x64;
/// The PCI reset control register (FADT RESET_REG).
pub const RESET_PORT: u16 = 0xcf9;
/// Hardware-reduced ACPI sleep control register (FADT SLEEP_CONTROL_REG).
pub const SLEEP_CONTROL_PORT: u16 = 0x600;
/// Hardware-reduced ACPI sleep status register (FADT SLEEP_STATUS_REG).
pub const SLEEP_STATUS_PORT: u16 = 0x601;
/// The sleep type the DSDT's `\_S5` names: power off.
pub const S5_SLEEP_TYPE: u8 = 5;
/// The ACPI CPU hotplug controller's registers (8 ports, see
/// [`crate::devices::cpu_hotplug`]).
pub const CPU_HOTPLUG_PORT: u16 = 0x620;
/// How many ports the CPU hotplug controller takes.
pub const CPU_HOTPLUG_PORTS: u16 = 8;
/// The ACPI PCI hotplug controller's registers (16 ports, see
/// [`crate::devices::pci_hotplug`]).
pub const PCI_HOTPLUG_PORT: u16 = 0x630;
/// How many ports the PCI hotplug controller takes.
pub const PCI_HOTPLUG_PORTS: u16 = 16;
/// The ACPI Generic Event Device's interrupt (ISA IRQ 5, IOAPIC pin 5,
/// edge, active high): a CPU or PCI hotplug event.
pub const GED_GSI: u32 = 5;
