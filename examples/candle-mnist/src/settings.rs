//! What a run trains: the data, the epochs, the ranks and their speeds, the optimizer.

use std::sync::Arc;

use flodl_data::Dataset;
use flodl_ddp::control::schedule::Schedule;
use flodl_ddp::{Backend, Devices, Policy, TimeBreakdown, Trainer};

/// One training run's settings, shared by the tiers and the baseline.
#[derive(Clone)]
pub struct Settings {
    /// The training set.
    pub train: Arc<dyn Dataset>,
    /// The test set.
    pub test: Arc<dyn Dataset>,
    /// Passes over the training set.
    pub epochs: usize,
    /// Samples per batch.
    pub batch_size: usize,
    /// AdamW's starting learning rate (see [`Settings::schedule`]).
    pub lr: f32,
    /// Ranks (each a CPU thread).
    pub ranks: usize,
    /// Per-rank slowdown factors (one per rank, 1 = full speed).
    pub slowdown: Vec<f64>,
    /// When to average.
    pub policy: Policy,
    /// How to average.
    pub backend: Backend,
    /// The seed of the initial weights and of the epochs' permutations.
    pub seed: u64,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("train", &self.train.len())
            .field("epochs", &self.epochs)
            .field("ranks", &self.ranks)
            .field("slowdown", &self.slowdown)
            .field("policy", &self.policy)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// A trainer configured by these settings, for either tier.
    pub fn configure(&self, trainer: Trainer) -> Trainer {
        trainer
            .dataset(self.train.clone())
            .batch_size(self.batch_size)
            .epochs(self.epochs)
            .devices(Devices::Cpu(self.ranks))
            .policy(self.policy)
            .backend(self.backend)
            .schedule(self.schedule())
            .slowdown(self.slowdown.clone())
            .seed(self.seed)
    }
}

impl Settings {
    /// The learning rate over the run: a cosine descent from `lr` to `lr / 100` over every
    /// batch of the run, indexed by the batches trained by all ranks together (flodl's cohort
    /// step; candle's own loop counts its batches the same way).
    pub fn schedule(&self) -> Schedule {
        let lr = f64::from(self.lr);
        let total = (self.epochs * (self.train.len() / self.batch_size.max(1))) as u64;
        Schedule::Cosine { lr, min_lr: lr / 100.0, total: total.max(1) }
    }
}

/// What a training run reached.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Test accuracy of the final model, in [0, 1].
    pub accuracy: f64,
    /// Training wall time in seconds.
    pub train_s: f64,
    /// Training throughput in samples per second.
    pub samples_per_s: f64,
    /// Reduces performed (0 for the baseline).
    pub reduces: u64,
    /// Where each rank's training wall time went, all epochs together, in rank order (empty
    /// for candle's own loops).
    pub ranks: Vec<TimeBreakdown>,
    /// Seconds each rank's own loop spent inside candle, in rank order, where the loop is the
    /// user's (the cooperative tier; empty otherwise): the rank's compute beyond it is the
    /// hand-offs between the rank and its loop.
    pub candle_s: Vec<f64>,
}
