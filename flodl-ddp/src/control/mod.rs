//! The pure control logic of a run, free of threads, devices and IO: the ElChe cadence, the
//! policies' reduce windows and triggers, dispatch and coverage, the overshoot bound, partitions,
//! the divergence guard, LR schedules, work weighting, the outer optimizers and the cut of a
//! model into fragments.
//!
//! The runtime calls these modules; each is tested on its own.

pub mod breakdown;
pub(crate) mod change;
pub mod deadline;
pub mod dispatch;
pub mod elche;
pub(crate) mod eval_rank;
pub mod exposure;
pub(crate) mod fragment;
pub mod guard;
pub mod logic_error;
pub(crate) mod metrics;
pub mod outer;
pub mod overshoot;
pub(crate) mod partition;
pub mod policy;
pub mod schedule;
pub mod schedule_kind;
pub mod speed_change;
pub(crate) mod standby;
pub(crate) mod trust_window;
pub mod verdict;
pub mod weighting;
