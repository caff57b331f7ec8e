//! A rank's position in its reduce window: the steps and training time it has, the clock that
//! says when the window is reached, the snapshot a host round holds, and the window's tail (the
//! speed its last steps ran at).

use std::collections::VecDeque;
use std::time::Instant;

use crate::control::trust_window::{TAIL_MIN, median};
use crate::link::wire::{Readiness, TAIL_STEPS, Window};

/// What a rank's last host snapshot carried, while the round that averages it runs.
#[derive(Debug)]
pub(super) struct Sent {
    /// Steps and ms of the window at the snapshot.
    pub(super) steps: usize,
    pub(super) wall_ms: f64,
    /// The parameters it sent, kept when the rank may train on before the update (`Async`,
    /// or any policy with `--overlap`): the update is merged with them.
    pub(super) params: Option<Vec<Vec<f32>>>,
}

/// A rank's position in its reduce window.
#[derive(Debug)]
pub(super) struct WindowState {
    pub(super) window: Window,
    pub(super) steps: usize,
    /// Time in training calls (steps with their batches' fetch and upload): the window's pace.
    pub(super) wall_ms: f64,
    /// When the window opened, and the training ms carried into it from before.
    opened: Instant,
    carried_ms: f64,
    pub(super) reported: Option<Readiness>,
    /// Host backend: the snapshot taken for the pending round.
    pub(super) sent: Option<Sent>,
    /// The ms of this window's last steps (at most `2 × TAIL_STEPS`, oldest first), each with
    /// the calls that waited for its batch: the window's tail (`WindowState::tail_ms`).
    step_ms: VecDeque<f64>,
    /// Ms of calls since the last step trained (a batch not ready yet), charged to the next.
    pending_ms: f64,
    /// The ms the reduce that opened this window cost the rank, the exchange it could not
    /// train through (`None`: no reduce opened it).
    pub(super) exposed_ms: Option<f64>,
}

impl WindowState {
    /// The start of `window`, with `carried` steps and ms already in it.
    pub(super) fn new(window: Window, carried: (usize, f64)) -> WindowState {
        WindowState {
            window,
            steps: carried.0,
            wall_ms: carried.1,
            opened: Instant::now(),
            carried_ms: carried.1,
            reported: None,
            sent: None,
            step_ms: VecDeque::with_capacity(2 * TAIL_STEPS),
            pending_ms: 0.0,
            exposed_ms: None,
        }
    }

    /// Counts a training call of `ms`; `trained` when it trained a step.
    pub(super) fn call(&mut self, ms: f64, trained: bool) {
        self.wall_ms += ms;
        self.pending_ms += ms;
        if trained {
            if self.step_ms.len() == 2 * TAIL_STEPS {
                self.step_ms.pop_front();
            }
            self.step_ms.push_back(self.pending_ms);
            self.pending_ms = 0.0;
        }
    }

    /// The median ms of the window's last steps: the last half of those it timed, at least
    /// `TAIL_MIN` and at most `TAIL_STEPS`; none from fewer than `TAIL_MIN` (so one stalled
    /// step cannot move it).
    pub(super) fn tail_ms(&self) -> Option<f64> {
        let timed = self.step_ms.len();
        if timed < TAIL_MIN {
            return None;
        }
        let n = timed.div_ceil(2).clamp(TAIL_MIN, TAIL_STEPS);
        Some(median(self.step_ms.iter().rev().take(n).copied().collect()))
    }

    /// Whether the window is reached: by its count, or once its clock — the wall time since
    /// it opened (plus what was carried in) — reaches the window's wall time.
    ///
    /// The clock is the rank's wall time, not its time in training calls: everything else the
    /// rank did meanwhile (an evaluation, a checkpoint part, its loop, a descheduled moment)
    /// delays it as much as a step would, and the anchor, whose window is that wall time
    /// measured in its own steps, would otherwise wait for this rank at every reduce.
    pub(super) fn is_reached(&self) -> bool {
        let clock_ms = self.carried_ms + self.opened.elapsed().as_secs_f64() * 1000.0;
        self.window.is_reached(self.steps, clock_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window's tail: the median of its last timed steps (the last half, at most
    /// `TAIL_STEPS`), calls that waited for a batch charged to the step that trained it, none
    /// from fewer than `TAIL_MIN` steps; a stalled last step does not move it.
    #[test]
    fn a_windows_tail_is_the_median_of_its_last_steps() -> std::result::Result<(), String> {
        let window = Window { round: 1, target: 1, limit: 1, wall: None };
        let steps = |ms: &[f64]| -> Vec<(f64, bool)> { ms.iter().map(|&m| (m, true)).collect() };
        let mut long = vec![10.0; 40];
        long.extend([30.0; 8]);
        type Calls = Vec<(f64, bool)>;
        let cases: Vec<(&str, Calls, Option<f64>)> = vec![
            ("steady", steps(&[10.0; 5]), Some(10.0)),
            (
                "slower from step 6",
                steps(&[10.0, 10.0, 10.0, 10.0, 10.0, 30.0, 30.0, 30.0]),
                Some(30.0),
            ),
            (
                "one stalled last step",
                steps(&[10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 100.0]),
                Some(10.0),
            ),
            ("four steps: the last three", steps(&[10.0, 30.0, 30.0, 100.0]), Some(30.0)),
            ("too few steps", steps(&[10.0; 2]), None),
            ("a long window ends slower", steps(&long), Some(30.0)),
            (
                "waits charged to the step after them",
                vec![
                    (4.0, false),
                    (6.0, true),
                    (10.0, true),
                    (3.0, false),
                    (7.0, true),
                    (10.0, true),
                    (10.0, true),
                ],
                Some(10.0),
            ),
            ("none trained", vec![(5.0, false); 6], None),
        ];
        for (name, calls, want) in cases {
            let mut w = WindowState::new(window, (0, 0.0));
            for &(ms, trained) in &calls {
                w.call(ms, trained);
            }
            let wall: f64 = calls.iter().map(|c| c.0).sum();
            if w.tail_ms() != want || (w.wall_ms - wall).abs() > 1e-9 {
                return Err(format!(
                    "{name}: tail {:?}, wall {}, want {want:?}, {wall}",
                    w.tail_ms(),
                    w.wall_ms
                ));
            }
        }
        Ok(())
    }
}
