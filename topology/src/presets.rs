//! Named presets: plain aliases for hwloc synthetic strings describing the
//! 2-socket servers this project targets.
//!
//! Cache sizes are the public figures of a representative part; PU numbering
//! (`indexes=2*N:1*2`) is Linux's usual one on those machines, where CPU `i`
//! and CPU `i + N` are SMT siblings, so that an emulated host numbers its CPUs
//! like the real one.

/// A named preset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preset {
    /// Name users type (`genoa-2s`).
    pub name: &'static str,
    /// What machine it stands for.
    pub description: &'static str,
    /// The hwloc synthetic description.
    pub synthetic: &'static str,
}

/// All presets.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "gnr-2s",
        description: "2 x Xeon 6 Granite Rapids, 120 cores each, SMT2, L2 per core, one LLC and one node per package (480 CPUs)",
        synthetic: "package:2 [numa] l3:1(size=528482304) l2:120(size=2097152) l1d:1(size=49152) l1i:1(size=65536) core:1 pu:2(indexes=2*240:1*2)",
    },
    Preset {
        name: "genoa-2s",
        description: "2 x EPYC 9654 Genoa, 12 CCDs x 8 cores per package, SMT2 (384 CPUs)",
        synthetic: "package:2 [numa] l3:12(size=33554432) l2:8(size=1048576) l1d:1(size=32768) l1i:1(size=32768) core:1 pu:2(indexes=2*192:1*2)",
    },
    Preset {
        name: "milan-2s",
        description: "2 x EPYC 7763 Milan, 8 CCDs x 8 cores per package, SMT2 (256 CPUs)",
        synthetic: "package:2 [numa] l3:8(size=33554432) l2:8(size=524288) l1d:1(size=32768) l1i:1(size=32768) core:1 pu:2(indexes=2*128:1*2)",
    },
    Preset {
        name: "spr-2s",
        description: "2 x Xeon Sapphire Rapids, 48 cores each, SMT2 (192 CPUs)",
        synthetic: "package:2 [numa] l3:1(size=110100480) l2:48(size=2097152) l1d:1(size=49152) l1i:1(size=32768) core:1 pu:2(indexes=2*96:1*2)",
    },
    Preset {
        name: "icx-2s",
        description: "2 x Xeon Ice Lake-SP, 32 cores each, SMT2 (128 CPUs)",
        synthetic: "package:2 [numa] l3:1(size=50331648) l2:32(size=1310720) l1d:1(size=49152) l1i:1(size=32768) core:1 pu:2(indexes=2*64:1*2)",
    },
    Preset {
        name: "clx-2s",
        description: "2 x Xeon Cascade Lake-SP, 24 cores each, SMT2 (96 CPUs)",
        synthetic: "package:2 [numa] l3:1(size=37486592) l2:24(size=1048576) l1d:1(size=32768) l1i:1(size=32768) core:1 pu:2(indexes=2*48:1*2)",
    },
];

/// Looks a preset up by name (case-insensitive).
pub fn find(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name.eq_ignore_ascii_case(name))
}

/// The preset names, comma separated, for error messages.
pub fn names() -> String {
    PRESETS
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}
