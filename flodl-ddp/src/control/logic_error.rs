//! The typed error of flodl-ddp's pure scheduling logic (ElChe, dispatch, policies, schedules).

/// A value or call the pure scheduling logic rejects.
///
/// The runtime's crate-level `Error` wraps it with `#[from]`; every variant names what was wrong so
/// a caller can `match` on it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LogicError {
    /// A world of ranks must hold at least one rank (ElChe needs at least two).
    #[error("world of {world} ranks is too small for {what} (needs at least {min})")]
    WorldTooSmall {
        /// What was being built.
        what: &'static str,
        /// The world size given.
        world: usize,
        /// The smallest world it accepts.
        min: usize,
    },
    /// A per-rank slice or saved state has the wrong number of ranks.
    #[error("{what} has {got} ranks, expected {expected}")]
    WorldMismatch {
        /// Which input was wrong.
        what: &'static str,
        /// The world size in force.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// A rank index is outside the world.
    #[error("rank {rank} is out of range for a world of {world}")]
    RankOutOfRange {
        /// The rank given.
        rank: usize,
        /// The world size.
        world: usize,
    },
    /// A numeric parameter is outside its valid range (or not finite).
    #[error("invalid {what}: {value}")]
    InvalidValue {
        /// The parameter's name.
        what: &'static str,
        /// The value given.
        value: f64,
    },
    /// A string does not name a member of a closed set.
    #[error("unknown {what} {input:?} (expected one of {expected})")]
    Parse {
        /// The set being parsed.
        what: &'static str,
        /// The string given.
        input: String,
        /// The accepted spellings.
        expected: &'static str,
    },
    /// A chunk was credited that the pool never handed to that rank (or credited twice).
    #[error("rank {rank} credited chunk at offset {offset} (epoch {epoch}) that it does not hold")]
    UnknownChunk {
        /// The rank that reported it.
        rank: usize,
        /// The epoch of the chunk.
        epoch: usize,
        /// The chunk's offset in the epoch permutation.
        offset: usize,
    },
    /// A rank that was retired (declared dead) was asked to take part.
    #[error("rank {rank} is retired")]
    RankRetired {
        /// The retired rank.
        rank: usize,
    },
    /// Saved coverage does not fit the epoch it is restored into.
    #[error("invalid coverage for epoch {epoch}: {reason}")]
    InvalidCoverage {
        /// The epoch being restored.
        epoch: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A model cannot be cut into more fragments than it has parameter values (a fragment
    /// would be empty).
    #[error("{fragments} fragments of a model of {values} parameter values")]
    TooManyFragments {
        /// The fragments asked for.
        fragments: usize,
        /// The model's parameter values.
        values: usize,
    },
    /// A state or a fragment's part does not fit the cut of the model into fragments.
    #[error("{what}: expected {expected}, got {got}")]
    FragmentShape {
        /// What did not fit.
        what: &'static str,
        /// What the cut holds (a count of tensors or values, or of fragments).
        expected: usize,
        /// What was given.
        got: usize,
    },
}

/// The result type of the pure scheduling logic.
pub type LogicResult<T> = std::result::Result<T, LogicError>;
