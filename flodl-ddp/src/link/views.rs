//! One end's consensus views of a connection under a quantized wire: a [`DeltaCoder`] per
//! fragment of the model (`--fragments F`; one for the whole model without fragments).
//!
//! Each fragment's view is its parameters and every buffer (buffers travel at every exchange),
//! so a fragment's delta, its base count and its error feedback are its own: a snapshot or an
//! update of fragment k goes through coder k alone, and the other views are untouched. A base
//! state (`Init`) is cut by [`Fragments`] — both ends cut the same sizes alike — and becomes
//! every view. Under F > 1 a message of the whole state (a reduce that syncs every fragment:
//! the run's last, or one for a checkpoint) carries one delta per fragment, in order, each
//! through its own coder: the whole sync costs the quantized bytes of every fragment once, and
//! every view, every base count and every residual moves on as if the fragments had been synced
//! one after another (the buffers, in every fragment's part, take the last fragment's values).

use flodl_tensor::quant::QuantFormat;

use super::delta::{Delta, DeltaCoder, DeltaError, Direction};
use crate::control::fragment::Fragments;
use crate::state::HostState;

/// One end's views of a connection: see the module docs.
#[derive(Debug)]
pub(crate) struct Views {
    /// The fragments the model is cut into (1: the whole model).
    fragments: usize,
    /// A coder per fragment.
    coders: Vec<DeltaCoder>,
    /// Under F > 1, the cut of the base state's parameters, and its buffers' values.
    cut: Option<(Fragments, usize)>,
}

/// Fragment `k`'s vectors of a whole `state`: its pieces' runs of values in ascending order,
/// then every buffer, as its view holds them.
fn fragment_parts<'a>(cut: &Fragments, k: usize, state: &'a HostState) -> Vec<&'a [f32]> {
    let params = cut.pieces(k).iter().filter_map(|p| state.params.get(p.tensor)?.get(p.range()));
    params.chain(state.buffers.iter().map(Vec::as_slice)).collect()
}

/// [`fragment_parts`], to be written (a fragment holds one piece of a tensor at most).
fn fragment_parts_mut<'a>(
    cut: &Fragments,
    k: usize,
    state: &'a mut HostState,
) -> Vec<&'a mut [f32]> {
    let pieces = cut.pieces(k);
    let params = state.params.iter_mut().enumerate().filter_map(|(t, v)| {
        let at = pieces.binary_search_by_key(&t, |p| p.tensor).ok()?;
        v.get_mut(pieces[at].range())
    });
    params.chain(state.buffers.iter_mut().map(Vec::as_mut_slice)).collect()
}

/// `values` cut into vectors of `lens` values, in order; `None` unless they use them all.
fn split(values: &[f32], lens: impl Iterator<Item = usize>) -> Option<Vec<Vec<f32>>> {
    let mut at = 0usize;
    let mut out = Vec::new();
    for n in lens {
        out.push(values.get(at..at.checked_add(n)?)?.to_vec());
        at += n;
    }
    (at == values.len()).then_some(out)
}

/// Every vector of `state`, parameters then buffers.
fn all_parts(state: &HostState) -> Vec<&[f32]> {
    state.params.iter().chain(&state.buffers).map(Vec::as_slice).collect()
}

impl Views {
    /// The views of one end (`direction` as for [`DeltaCoder::new`]) for a model cut into
    /// `fragments` (at least one).
    pub(crate) fn new(format: QuantFormat, direction: Direction, fragments: usize) -> Views {
        let fragments = fragments.max(1);
        let coders = (0..fragments).map(|_| DeltaCoder::new(format, direction)).collect();
        Views { fragments, coders, cut: None }
    }

    /// Whether this is the controller's end (it sends the consensus).
    pub(crate) fn is_controller(&self) -> bool {
        self.coders.first().is_some_and(DeltaCoder::is_controller)
    }

    /// Takes the whole `state` as every fragment's view: a fresh start.
    ///
    /// # Errors
    /// [`DeltaError::Cut`] when the state has fewer parameter values than fragments.
    pub(crate) fn set_base(&mut self, state: &HostState) -> Result<(), DeltaError> {
        if self.fragments == 1 {
            if let Some(coder) = self.coders.first_mut() {
                coder.set_base_parts(&all_parts(state));
            }
            return Ok(());
        }
        let cut = Fragments::of_state(state, self.fragments)?;
        for (k, coder) in self.coders.iter_mut().enumerate() {
            coder.set_base_parts(&fragment_parts(&cut, k, state));
        }
        let buffers = state.buffers.iter().map(Vec::len).sum();
        self.cut = Some((cut, buffers));
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

    /// The whole state a receiving end holds after reading a whole message: the views, laid
    /// out as vectors of `params` then `buffers` values (each fragment's parameters from its
    /// view, the buffers from the last fragment's, which is read last). `None` before a base,
    /// or for a layout that is not the views'.
    pub(crate) fn decoded(&self, params: &[usize], buffers: &[usize]) -> Option<HostState> {
        if self.fragments == 1 {
            let view = self.coders.first()?.view()?;
            let mut all = split(view, params.iter().chain(buffers).copied())?;
            let buffers = all.split_off(params.len());
            return Some(HostState { params: all, buffers });
        }
        let (cut, _) = self.cut.as_ref()?;
        let mut out: Vec<Vec<f32>> = params.iter().map(|&n| vec![0.0; n]).collect();
        let mut last_buffers = Vec::new();
        for (k, coder) in self.coders.iter().enumerate() {
            let pieces = cut.pieces(k);
            let lens = pieces.iter().map(|p| p.len).chain(buffers.iter().copied());
            let mut parts = split(coder.view()?, lens)?;
            last_buffers = parts.split_off(pieces.len());
            for (p, values) in pieces.iter().zip(parts) {
                out.get_mut(p.tensor)?.get_mut(p.range())?.copy_from_slice(&values);
            }
        }
        if cut.fits(&out, "a decoded state").is_err() {
            return None;
        }
        Some(HostState { params: out, buffers: last_buffers })
    }

    /// The cut of a whole state under F > 1, once a base was set.
    fn whole_cut(&self) -> Result<&(Fragments, usize), DeltaError> {
        self.cut.as_ref().ok_or(DeltaError::NoView)
    }

    /// Encodes `state`, the part of `fragment` (`None`: the whole state), as this end sends
    /// it: one delta, or one per fragment for the whole state under a cut.
    ///
    /// # Errors
    /// As [`DeltaCoder::encode_parts`]; [`DeltaError::Fragment`] for a fragment out of range;
    /// [`DeltaError::Cut`] for a whole state not of the cut model's layout.
    pub(crate) fn encode(
        &mut self,
        fragment: Option<usize>,
        state: &HostState,
    ) -> Result<Vec<Delta>, DeltaError> {
        if fragment.is_some() || self.fragments == 1 {
            return Ok(vec![self.coder(fragment)?.encode_parts(&all_parts(state))?]);
        }
        let (cut, _) = self.whole_cut()?;
        cut.fits(&state.params, "a whole state to encode")?;
        let parts: Vec<Vec<&[f32]>> =
            (0..self.fragments).map(|k| fragment_parts(cut, k, state)).collect();
        let coders = self.coders.iter_mut();
        coders.zip(parts).map(|(coder, parts)| coder.encode_parts(&parts)).collect()
    }

    /// The values the state of `deltas` (of `fragment`; `None`: the whole state) must be read
    /// into, once every delta is known to be from this end's view of its fragment.
    ///
    /// # Errors
    /// As [`DeltaCoder::expects`]; [`DeltaError::Fragment`] for a fragment out of range or a
    /// count of deltas that is not one per fragment.
    pub(crate) fn expects(
        &mut self,
        fragment: Option<usize>,
        deltas: &[Delta],
    ) -> Result<usize, DeltaError> {
        let count = DeltaError::Fragment { fragment, fragments: self.fragments };
        if fragment.is_some() || self.fragments == 1 {
            let [delta] = deltas else { return Err(count) };
            return self.coder(fragment)?.expects(delta);
        }
        if deltas.len() != self.fragments {
            return Err(count);
        }
        for (coder, delta) in self.coders.iter().zip(deltas) {
            coder.expects(delta)?;
        }
        let (cut, buffers) = self.whole_cut()?;
        Ok(cut.total() + buffers)
    }

    /// Reads `deltas` (as [`Views::expects`] accepted them) into `state`, whose vectors are of
    /// the message's lengths: the values they stand for.
    ///
    /// # Errors
    /// As [`DeltaCoder::decode_parts`]; [`DeltaError::Cut`] for a whole state not of the cut
    /// model's layout.
    pub(crate) fn decode(
        &mut self,
        fragment: Option<usize>,
        deltas: &[Delta],
        state: &mut HostState,
    ) -> Result<(), DeltaError> {
        if fragment.is_some() || self.fragments == 1 {
            let [delta] = deltas else {
                return Err(DeltaError::Fragment { fragment, fragments: self.fragments });
            };
            let mut parts: Vec<&mut [f32]> = state
                .params
                .iter_mut()
                .chain(state.buffers.iter_mut())
                .map(Vec::as_mut_slice)
                .collect();
            return self.coder(fragment)?.decode_parts(delta, &mut parts);
        }
        let (cut, _) = self.cut.as_ref().ok_or(DeltaError::NoView)?;
        cut.fits(&state.params, "a whole state to decode")?;
        for ((k, coder), delta) in self.coders.iter_mut().enumerate().zip(deltas) {
            coder.decode_parts(delta, &mut fragment_parts_mut(cut, k, state))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a whole update (a model cut into 3 fragments, and one not cut), the state the
    /// controller's end says the rank holds is, bit for bit, the one the rank's end decoded.
    #[test]
    fn the_controller_knows_the_state_a_whole_update_leaves_at_the_rank() -> Result<(), String> {
        let q = QuantFormat::Q4;
        let base = HostState {
            params: vec![vec![0.5; 70], vec![0.25; 40], vec![1.0; 30], vec![2.0; 20]],
            buffers: vec![vec![3.0; 2], vec![-1.0; 3]],
        };
        let mut consensus = base.clone();
        for (t, p) in consensus.params.iter_mut().chain(&mut consensus.buffers).enumerate() {
            p.iter_mut().enumerate().for_each(|(i, v)| *v += ((i * 7 + t) % 11) as f32 * 0.01);
        }
        let params: Vec<usize> = base.params.iter().map(Vec::len).collect();
        let buffers: Vec<usize> = base.buffers.iter().map(Vec::len).collect();
        for fragments in [1, 3] {
            let mut controller = Views::new(q, Direction::Consensus, fragments);
            let mut rank = Views::new(q, Direction::Replica, fragments);
            controller.set_base(&base).map_err(|e| e.to_string())?;
            rank.set_base(&base).map_err(|e| e.to_string())?;
            let deltas = controller.encode(None, &consensus).map_err(|e| e.to_string())?;
            let mut got = HostState {
                params: params.iter().map(|&n| vec![0.0; n]).collect(),
                buffers: buffers.iter().map(|&n| vec![0.0; n]).collect(),
            };
            rank.expects(None, &deltas).map_err(|e| e.to_string())?;
            rank.decode(None, &deltas, &mut got).map_err(|e| e.to_string())?;
            let known = controller.decoded(&params, &buffers).ok_or("no decoded state")?;
            if known.digest() != got.digest() || got == base {
                return Err(format!("{fragments} fragments: {known:?} against {got:?}"));
            }
            if controller.decoded(&params[1..], &buffers).is_some() {
                return Err(format!("{fragments} fragments: another layout was read"));
            }
        }
        Ok(())
    }

    /// Under a cut of 3, a base sets three views of each fragment's length (plus the buffers);
    /// fragment 1's delta goes through its coder alone, and the others stay at their base; the
    /// whole model, a fragment out of range and more fragments than values are refused.
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
        let mut too_few = Views::new(q, Direction::Consensus, 161);
        assert!(too_few.set_base(&state).is_err(), "160 values in 161 fragments");
        Ok(())
    }
}
