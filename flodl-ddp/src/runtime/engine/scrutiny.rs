//! The check of a state that crossed the link: every tensor of the replica's shape, every
//! parameter finite and no buffer NaN. The controller evicts a rank whose state fails it; a
//! rank refuses a controller's state that fails it. (Buffers may hold infinities on purpose,
//! an attention mask's `-inf`; a NaN is never meant.)

use crate::Error;
use crate::runtime::engine::fault::Misconduct;
use crate::state::{HostState, first_where};

/// Checks `state` (called `what` in the refusal) against `shapes`, the replica's parameters'
/// then buffers' shapes.
///
/// # Errors
/// [`Misconduct::Misshaped`] when a count or a length differs, [`Misconduct::NonFinite`] for
/// the first value refused.
pub(crate) fn check_state(
    what: &str,
    state: &HostState,
    shapes: &[Vec<usize>],
) -> Result<(), Misconduct> {
    let tensors = state.params.len() + state.buffers.len();
    if tensors != shapes.len() || state.params.len() > shapes.len() {
        let detail = format!("{tensors} tensors where the replica has {}", shapes.len());
        return Err(Misconduct::Misshaped { what: what.into(), detail });
    }
    let values =
        state.params.iter().map(|v| (v, true)).chain(state.buffers.iter().map(|v| (v, false)));
    for (i, ((values, param), shape)) in values.zip(shapes).enumerate() {
        let len = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if len != Some(values.len()) {
            let detail =
                format!("tensor {i} holds {} values where its shape {shape:?} holds", values.len());
            let detail = match len {
                Some(len) => format!("{detail} {len}"),
                None => format!("{detail} more than can be counted"),
            };
            return Err(Misconduct::Misshaped { what: what.into(), detail });
        }
        let refused = match param {
            true => first_where(values, |x| !x.is_finite()),
            false => first_where(values, f32::is_nan),
        };
        if let Some(x) = refused.map(|at| values[at]) {
            let kind = if param { "parameter" } else { "buffer" };
            return Err(Misconduct::NonFinite {
                what: format!("{what} ({kind} tensor {i})"),
                value: x.to_string(),
            });
        }
    }
    Ok(())
}

/// A rank's check of an order of the controller's carrying `state` (called `what`) and the
/// cohort step `global_step`: the state as [`check_state`] wants it against the rank's
/// `shapes`, and the step not behind `current`, the rank's (steps only go forward).
///
/// # Errors
/// [`Error::Protocol`] naming what was refused.
pub(crate) fn check_order(
    what: &str,
    state: Option<&HostState>,
    shapes: &[Vec<usize>],
    global_step: u64,
    current: u64,
) -> Result<(), Error> {
    if let Some(state) = state
        && let Err(misconduct) = check_state(what, state, shapes)
    {
        return Err(Error::protocol(format!("the controller {misconduct}")));
    }
    if global_step < current {
        return Err(Error::protocol(format!(
            "the controller sent a {what} at cohort step {global_step}, behind step {current} \
             (a replay)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(params: Vec<Vec<f32>>, buffers: Vec<Vec<f32>>) -> HostState {
        HostState { params, buffers }
    }

    /// Each case: a state, and the misconduct it is refused for (`None`: accepted).
    #[test]
    fn states_are_refused_for_their_shape_or_their_values() -> Result<(), String> {
        let shapes = vec![vec![2, 2], vec![3], vec![1]];
        let good = || state(vec![vec![0.5; 4], vec![1.0; 3]], vec![vec![0.0]]);
        let mut nan = good();
        nan.params[1][2] = f32::NAN;
        let mut inf = good();
        inf.params[0][0] = f32::INFINITY;
        let mut mask = good();
        mask.buffers[0][0] = f32::NEG_INFINITY;
        let mut nan_buffer = good();
        nan_buffer.buffers[0][0] = f32::NAN;
        let mut short = good();
        short.params[0].pop();
        let mut extra = good();
        extra.buffers.push(vec![1.0]);
        let cases: Vec<(&str, HostState, Option<&str>)> = vec![
            ("good", good(), None),
            ("a mask's -inf in a buffer", mask, None),
            ("NaN parameter", nan, Some("NaN in its snapshot (parameter tensor 1)")),
            ("inf parameter", inf, Some("inf in its snapshot (parameter tensor 0)")),
            ("NaN buffer", nan_buffer, Some("NaN in its snapshot (buffer tensor 2)")),
            ("short tensor", short, Some("tensor 0 holds 3 values where its shape [2, 2] holds 4")),
            ("extra tensor", extra, Some("4 tensors where the replica has 3")),
        ];
        for (name, s, expected) in cases {
            let got = check_state("snapshot", &s, &shapes).err().map(|m| m.to_string());
            match (expected, &got) {
                (None, None) => {}
                (Some(e), Some(g)) if g.contains(e) => {}
                _ => return Err(format!("{name}: expected {expected:?}, got {got:?}")),
            }
        }
        Ok(())
    }

    /// A rank refuses an order whose state is bad or whose cohort step goes back.
    #[test]
    fn a_rank_refuses_bad_states_and_steps_going_back() -> Result<(), String> {
        let shapes = vec![vec![2]];
        let good = state(vec![vec![1.0, 2.0]], Vec::new());
        let nan = state(vec![vec![1.0, f32::NAN]], Vec::new());
        let cases: Vec<(&str, Option<&HostState>, u64, Option<&str>)> = vec![
            ("an update forward", Some(&good), 12, None),
            ("the same step", Some(&good), 10, None),
            ("an order with no state", None, 11, None),
            ("a NaN update", Some(&nan), 12, Some("the controller sent NaN in its update")),
            ("a step back", Some(&good), 9, Some("at cohort step 9, behind step 10 (a replay)")),
        ];
        for (name, s, step, expected) in cases {
            let got = check_order("update", s, &shapes, step, 10).err().map(|e| e.to_string());
            match (expected, &got) {
                (None, None) => {}
                (Some(e), Some(g)) if g.contains(e) => {}
                _ => return Err(format!("{name}: expected {expected:?}, got {got:?}")),
            }
        }
        Ok(())
    }
}
