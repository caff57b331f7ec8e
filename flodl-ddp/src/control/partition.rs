//! Non-progressive partitions: one contiguous share of an epoch per rank.
//!
//! Units are whatever the caller counts: pass positions for the [0.5] behaviour (each rank then
//! drops its own `len % batch_size` tail), or whole batches and multiply by the batch size for
//! batch-aligned shares that drop nothing but the epoch's own tail (recommended).

use crate::control::logic_error::{LogicError, LogicResult};

/// One rank's contiguous share of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Share {
    /// First unit.
    pub offset: usize,
    /// Number of units.
    pub len: usize,
}

/// Equal sizes: `n / w` each, one more for the first `n % w` ranks.
///
/// # Errors
/// [`LogicError::WorldTooSmall`] for an empty world.
pub(crate) fn equal_sizes(n: usize, world: usize) -> LogicResult<Vec<usize>> {
    if world == 0 {
        return Err(LogicError::WorldTooSmall { what: "partition", world, min: 1 });
    }
    Ok((0..world).map(|r| n / world + usize::from(r < n % world)).collect())
}

/// Contiguous shares from sizes, in rank order.
pub(crate) fn shares(sizes: &[usize]) -> Vec<Share> {
    let mut offset = 0;
    sizes
        .iter()
        .map(|&len| {
            let s = Share { offset, len };
            offset += len;
            s
        })
        .collect()
}

#[cfg(test)]
mod tests {
    //! Equal partition sizing and shares against hand-computed values.

    use crate::LogicError;
    use crate::control::partition::{Share, equal_sizes, shares};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn equal_sizes_and_shares_by_hand() -> TestResult {
        assert_eq!(equal_sizes(10, 3)?, vec![4, 3, 3]);
        assert_eq!(equal_sizes(2, 3)?, vec![1, 1, 0]);
        assert_eq!(
            shares(&[3, 0, 4]),
            vec![
                Share { offset: 0, len: 3 },
                Share { offset: 3, len: 0 },
                Share { offset: 3, len: 4 }
            ]
        );
        Ok(())
    }

    #[test]
    fn an_empty_world_is_typed() {
        assert!(matches!(equal_sizes(3, 0), Err(LogicError::WorldTooSmall { .. })));
    }
}
