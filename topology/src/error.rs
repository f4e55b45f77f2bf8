//! Typed errors of the topology crate.
//!
//! Every message names what was wrong and, where there is one, how to fix it:
//! these strings reach users of the `vmm` CLI unchanged.

use std::path::PathBuf;

/// Anything that can go wrong while reading or deriving a topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// hwloc rejected a synthetic description.
    #[error(
        "malformed topology description {spec:?}: {reason}. Use hwloc's synthetic \
         syntax, e.g. \"package:2 [numa] l3:2 l2:4 core:1 pu:2\", or a preset ({presets})"
    )]
    Synthetic {
        /// The string as given.
        spec: String,
        /// What hwloc (or our own check) said.
        reason: String,
        /// The preset names, for the hint.
        presets: String,
    },

    /// An XML file could not be loaded.
    #[error("cannot load hwloc XML topology {path}: {reason}")]
    Xml {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },

    /// A CPUID dump directory could not be loaded.
    #[error("cannot load CPUID dump directory {path}: {reason}")]
    CpuidDump {
        /// The directory.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },

    /// hwloc failed to read the live host.
    #[error("cannot read the host topology through hwloc: {0}")]
    Host(String),

    /// The topology has a shape this crate cannot model.
    #[error("unsupported topology: {0}")]
    Unsupported(String),

    /// A list of CPUs (such as `0-3,8`) is malformed or out of range.
    #[error("malformed CPU list {list:?}: {reason}")]
    CpuList {
        /// The list as given.
        list: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A guest was asked for with no CPUs, or with CPUs the host lacks.
    #[error("invalid guest topology: {0}")]
    Guest(String),

    /// The hwloc synthetic export only describes symmetric trees.
    #[error(
        "this topology is not symmetric, so hwloc's synthetic format cannot describe it; \
         use --format text or --format json"
    )]
    NotSymmetric,

    /// An output the library will not write: a path holding what it did
    /// not make.
    #[error("{0}")]
    Output(String),
    /// I/O while writing a CPUID dump or reading a file.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl TopologyError {
    /// Whether a different request would work: a description, file or
    /// guest shape the user gave. Reading this host (`Host`) or a file
    /// that exists but cannot be read or written (`Io`) is not.
    pub fn is_user_error(&self) -> bool {
        !matches!(self, TopologyError::Host(_) | TopologyError::Io { .. })
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        TopologyError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = TopologyError> = std::result::Result<T, E>;
