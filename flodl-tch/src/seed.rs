//! Seeding libtorch's global generator for one model's construction.

use std::sync::Mutex;

/// Serialises the constructions that seed libtorch's one global generator.
static SEEDED: Mutex<()> = Mutex::new(());

/// Runs `build` with libtorch's global generator seeded with `seed`, holding a process-wide
/// lock so that ranks building their models on their own threads at once each draw from their
/// own seeded sequence: the same `seed` gives the same initial weights on every rank.
pub fn seeded<T>(seed: u64, build: impl FnOnce() -> T) -> T {
    let _lock = SEEDED.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(seed as i64);
    build()
}
