//! One end's consensus views of a connection under a quantized wire: a [`DeltaCoder`] per
//! fragment of the model (`--fragments F`; one for the whole model without fragments).
//!
//! Each fragment's view is its parameters and every buffer (buffers travel at every exchange),
//! so a fragment's delta, its base count and its error feedback are its own: a snapshot or an
//! update of fragment k goes through coder k alone, and the other views are untouched. A base
//! state (`Init`) is cut by [`Fragments`] — both ends cut the same sizes alike — and becomes
//! every view. Under F > 1 a message of the whole state (a reduce that syncs every fragment,
//! for a checkpoint) carries no delta: an update travels whole in f32 and becomes every view
//! again, a snapshot travels whole and leaves the views alone.

use flodl_tensor::quant::QuantFormat;

use super::delta::{DeltaCoder, DeltaError, Direction};
use crate::control::fragment::Fragments;
use crate::state::HostState;

/// One end's views of a connection: see the module docs.
#[derive(Debug)]
pub(crate) struct Views {
    /// The fragments the model is cut into (1: the whole model).
    fragments: usize,
    /// A coder per fragment.
    coders: Vec<DeltaCoder>,
}

impl Views {
    /// The views of one end (`direction` as for [`DeltaCoder::new`]) for a model cut into
    /// `fragments` (at least one).
    pub(crate) fn new(format: QuantFormat, direction: Direction, fragments: usize) -> Views {
        let fragments = fragments.max(1);
        let coders = (0..fragments).map(|_| DeltaCoder::new(format, direction)).collect();
        Views { fragments, coders }
    }

    /// Whether the model is cut into more than one fragment.
    pub(crate) fn is_cut(&self) -> bool {
        self.fragments > 1
    }

    /// Takes the whole `state` as every fragment's view: a fresh start.
    ///
    /// # Errors
    /// [`DeltaError::Cut`] when the state has fewer parameter tensors than fragments.
    pub(crate) fn set_base(&mut self, state: &HostState) -> Result<(), DeltaError> {
        if self.fragments == 1 {
            let parts: Vec<&[f32]> =
                state.params.iter().chain(&state.buffers).map(Vec::as_slice).collect();
            if let Some(coder) = self.coders.first_mut() {
                coder.set_base_parts(&parts);
            }
            return Ok(());
        }
        let cut = Fragments::of_state(state, self.fragments)?;
        for (k, coder) in self.coders.iter_mut().enumerate() {
            let parts: Vec<&[f32]> = cut
                .tensors(k)
                .iter()
                .map(|&t| state.params[t].as_slice())
                .chain(state.buffers.iter().map(Vec::as_slice))
                .collect();
            coder.set_base_parts(&parts);
        }
        Ok(())
    }

    /// The coder of `fragment` (`None`: the whole model, without fragments).
    ///
    /// # Errors
    /// [`DeltaError::Fragment`] for a fragment this connection's cut does not have, or the
    /// whole model under a cut.
    pub(crate) fn coder(&mut self, fragment: Option<usize>) -> Result<&mut DeltaCoder, DeltaError> {
        let k = match (fragment, self.fragments) {
            (None, 1) => 0,
            (Some(k), n) if k < n => k,
            _ => return Err(DeltaError::Fragment { fragment, fragments: self.fragments }),
        };
        self.coders.get_mut(k).ok_or(DeltaError::Fragment { fragment, fragments: self.fragments })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under a cut of 3, a base sets three views of each fragment's length (plus the buffers);
    /// fragment 1's delta goes through its coder alone, and the others stay at their base; the
    /// whole model and a fragment out of range are refused.
    #[test]
    fn a_fragment_goes_through_its_own_view() -> Result<(), String> {
        let q = QuantFormat::Q4;
        let (mut controller, mut rank) =
            (Views::new(q, Direction::Consensus, 3), Views::new(q, Direction::Replica, 3));
        let state = HostState {
            params: vec![vec![0.5; 70], vec![0.25; 40], vec![1.0; 30], vec![2.0; 20]],
            buffers: vec![vec![3.0; 2]],
        };
        controller.set_base(&state).map_err(|e| e.to_string())?;
        rank.set_base(&state).map_err(|e| e.to_string())?;
        let cut = Fragments::of_state(&state, 3).map_err(|e| e.to_string())?;
        let part = cut.part(1, &state).map_err(|e| e.to_string())?;
        let mut parts: Vec<Vec<f32>> = part.params.iter().chain(&part.buffers).cloned().collect();
        parts[0][0] += 0.125;
        let slices: Vec<&[f32]> = parts.iter().map(Vec::as_slice).collect();
        let delta = rank.coder(Some(1)).map_err(|e| e.to_string())?.encode_parts(&slices);
        let delta = delta.map_err(|e| e.to_string())?;
        let coder = controller.coder(Some(1)).map_err(|e| e.to_string())?;
        let n = coder.expects(&delta).map_err(|e| e.to_string())?;
        assert_eq!(n, parts.iter().map(Vec::len).sum::<usize>());
        let mut got = vec![0.0; n];
        coder.decode_parts(&delta, &mut [got.as_mut_slice()]).map_err(|e| e.to_string())?;
        assert!((got[0] - parts[0][0]).abs() < 0.2, "{} against {}", got[0], parts[0][0]);
        for k in [0, 2] {
            let coder = controller.coder(Some(k)).map_err(|e| e.to_string())?;
            assert_eq!(coder.expects(&delta).ok(), Some(cut.values(k) + 2), "fragment {k}");
        }
        assert!(controller.coder(None).is_err());
        assert!(controller.coder(Some(3)).is_err());
        let mut too_few = Views::new(q, Direction::Consensus, 5);
        assert!(too_few.set_base(&state).is_err());
        Ok(())
    }
}
