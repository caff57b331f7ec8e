//! The adapter's errors, and their conversion into flodl-ddp's.

/// What can go wrong between a tch `VarStore` and flodl.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// libtorch raised an error.
    #[error("libtorch: {0}")]
    Tch(#[from] tch::TchError),
    /// A variable cannot be read or written in place: not f32, not contiguous, or not on the
    /// host (a CUDA variable's device-to-device path is not built yet).
    #[error("variable `{name}` is {what}; the adapter moves contiguous f32 host tensors")]
    Unsupported {
        /// The variable's name in the `VarStore`.
        name: String,
        /// What it is instead (`"Double"`, `"not contiguous"`, `"on Cuda(0)"`).
        what: String,
    },
    /// The values given or asked for do not fit the variable.
    #[error("variable `{name}` holds {have} values, {want} given")]
    Size {
        /// The variable's name in the `VarStore`.
        name: String,
        /// Its number of values.
        have: usize,
        /// The number given.
        want: usize,
    },
    /// No variable at this position.
    #[error("the VarStore has {count} variables, variable {index} asked")]
    Index {
        /// The position asked.
        index: usize,
        /// The number of variables.
        count: usize,
    },
}

impl From<Error> for flodl_ddp::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Size { name, have, want } => flodl_ddp::Error::mismatch(
                "values of a VarStore variable",
                format!("{have} (`{name}`'s)"),
                want,
            ),
            Error::Index { index, count } => flodl_ddp::Error::mismatch(
                "a VarStore variable's position",
                format!("below {count}"),
                index,
            ),
            e => flodl_ddp::Error::replica(e),
        }
    }
}

/// The adapter's result.
pub type Result<T> = std::result::Result<T, Error>;
