//! Typed errors of the scheduler crate. Messages name the problem and how to
//! fix it: they reach users of the `vmm` CLI unchanged.

/// Anything that can go wrong when building or driving the scheduler.
#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    /// The topology could not be loaded.
    #[error(transparent)]
    Topology(#[from] topology::TopologyError),

    /// The topology has more CPUs than a [`crate::CpuMask`] holds.
    #[error("the topology has {cpus} CPUs; this scheduler handles at most {max}")]
    TooManyCpus {
        /// CPUs in the topology.
        cpus: usize,
        /// [`crate::MAX_CPUS`].
        max: usize,
    },

    /// A mitigation set string could not be parsed (built by the parsers of
    /// [`crate::mitigations`]).
    #[error(
        "unknown mitigation set {input:?}: {reason}. Use none, all, only:FIX or all-but:FIX \
         (FIX one of {fixes}, several joined with commas)"
    )]
    Mitigations {
        /// What the user wrote.
        input: String,
        /// What is wrong with it.
        reason: String,
        /// The valid fix names.
        fixes: String,
    },

    /// A task priority or weight is out of range.
    #[error("invalid scheduling policy: {0}")]
    Policy(String),

    /// An affinity mask is empty or names CPUs the scheduler does not manage.
    #[error("invalid affinity {mask}: {reason}")]
    Affinity {
        /// The mask as a CPU list.
        mask: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The task table is full.
    #[error("too many tasks: the scheduler was built for {0}; raise SchedConfig::max_tasks")]
    TooManyTasks(usize),

    /// The group table is full.
    #[error("too many groups: the scheduler was built for {0}; raise SchedConfig::max_groups")]
    TooManyGroups(usize),

    /// A task or group id that does not name a live task or group.
    #[error("no such {what} {id}")]
    NoSuch {
        /// `task` or `group`.
        what: &'static str,
        /// The id.
        id: u32,
    },

    /// A CPU id that this scheduler does not manage (ids run from 0 to
    /// `ncpus - 1`).
    #[error("no such CPU {cpu}: this scheduler manages CPUs 0..{ncpus}")]
    NoSuchCpu {
        /// The id given.
        cpu: u32,
        /// How many CPUs the scheduler has.
        ncpus: usize,
    },

    /// The task is in a state that does not allow the operation.
    #[error("task {task} cannot {op} while {state}")]
    BadState {
        /// The task.
        task: u32,
        /// The operation.
        op: &'static str,
        /// The state it was in.
        state: &'static str,
    },

    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// A task thread could not be set up as asked (pinned, or given an RT
    /// policy the host refuses): the user's request, not a fault.
    #[error("{0}")]
    ThreadSetup(String),

    /// A workload or comparison was asked for with bad parameters.
    #[error("invalid workload request: {0}")]
    Workload(String),

    /// An OS call of the threads executor failed.
    #[error("{context}: {source}")]
    Os {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// The invariant checker found violations.
    #[error("scheduler invariants violated ({count} violations), first: {first}")]
    /// `first` holds the first few, separated by ` | `.
    Invariant {
        /// How many.
        count: usize,
        /// The first one, in words.
        first: String,
    },
}

impl SchedError {
    /// Whether a different request would work: a topology, mitigation
    /// set, policy, configuration or workload the caller gave, or more
    /// tasks, groups or CPUs than it was built for. A broken invariant, an
    /// OS call or a task in the wrong state is not.
    pub fn is_user_error(&self) -> bool {
        match self {
            SchedError::Topology(t) => t.is_user_error(),
            SchedError::Workload(_)
            | SchedError::Config(_)
            | SchedError::Mitigations { .. }
            | SchedError::Policy(_)
            | SchedError::TooManyTasks(_)
            | SchedError::TooManyGroups(_)
            | SchedError::TooManyCpus { .. }
            | SchedError::ThreadSetup(_) => true,
            SchedError::Affinity { .. }
            | SchedError::NoSuch { .. }
            | SchedError::NoSuchCpu { .. }
            | SchedError::BadState { .. }
            | SchedError::Os { .. }
            | SchedError::Invariant { .. } => false,
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = SchedError> = std::result::Result<T, E>;
