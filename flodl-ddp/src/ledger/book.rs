//! The ledger's book: each live rank's stream of handed positions, and the part of it each
//! reduce puts into the consensus.

use std::collections::VecDeque;

use super::entry::{RankSpan, Span};

/// Per rank, the spans handed to it and not yet in the consensus, in the order handed (a rank
/// trains its chunks in that order, batch by batch, so a reduce's `steps` of a rank are the
/// first `steps` batches of its stream). A dead rank's stream ends with its death; a rank
/// handed work again starts a new one.
#[derive(Debug, Clone)]
pub struct Book {
    batch_size: usize,
    streams: Vec<Option<VecDeque<Span>>>,
}

impl Book {
    /// An empty book for batches of `batch_size`.
    pub fn new(batch_size: usize) -> Self {
        Book { batch_size: batch_size.max(1), streams: Vec::new() }
    }

    /// `span` was handed to `rank` (after everything handed to it before).
    pub fn hand(&mut self, rank: usize, span: Span) {
        if self.streams.len() <= rank {
            self.streams.resize(rank + 1, None);
        }
        self.streams[rank].get_or_insert_with(VecDeque::new).push_back(span);
    }

    /// Takes the first `batches` batches of `rank`'s stream: the spans (merged where they
    /// touch) and the batches asked for that the stream did not hold.
    fn take(&mut self, rank: usize, batches: usize) -> (Vec<Span>, usize) {
        let bs = self.batch_size;
        let Some(Some(stream)) = self.streams.get_mut(rank) else { return (Vec::new(), batches) };
        let mut want = batches.saturating_mul(bs);
        let mut out: Vec<Span> = Vec::new();
        while want > 0 {
            let Some(front) = stream.front_mut() else { break };
            let n = want.min(front.len);
            push_merged(&mut out, Span { epoch: front.epoch, offset: front.offset, len: n });
            front.offset += n;
            front.len -= n;
            want -= n;
            if front.len == 0 {
                stream.pop_front();
            }
        }
        (out, want.div_ceil(bs))
    }

    /// A reduce completed holding `steps[r]` batches of each rank `r` trained since its
    /// previous one: the spans it added to the consensus, and the batches reduced beyond what
    /// the ranks were handed (0 unless the facts given are inconsistent). Ranks with no stream
    /// (dead) are skipped: what the consensus holds of them was settled at their death.
    pub fn reduce(&mut self, steps: &[usize]) -> (Vec<RankSpan>, usize) {
        let mut spans = Vec::new();
        let mut short = 0;
        for (rank, &s) in steps.iter().enumerate() {
            if s == 0 || !matches!(self.streams.get(rank), Some(Some(_))) {
                continue;
            }
            let (taken, missing) = self.take(rank, s);
            short += missing;
            spans.extend(taken.into_iter().map(|span| RankSpan { rank, span }));
        }
        (spans, short)
    }

    /// `rank` died with `pending` of its batches in a reduce in progress that already holds
    /// them: those spans (kept), and the rest of its stream (handed, not in the consensus).
    pub fn retire(&mut self, rank: usize, pending: usize) -> (Vec<Span>, Vec<Span>) {
        let (kept, _) = self.take(rank, pending);
        let rest = self.streams.get_mut(rank).and_then(Option::take).unwrap_or_default();
        let mut unreduced = Vec::new();
        for s in rest {
            push_merged(&mut unreduced, s);
        }
        (kept, unreduced)
    }
}

/// Appends `s` to `out`, extending the last span when `s` continues it.
pub(super) fn push_merged(out: &mut Vec<Span>, s: Span) {
    if s.len == 0 {
        return;
    }
    match out.last_mut() {
        Some(last) if last.epoch == s.epoch && last.end() == s.offset => last.len += s.len,
        _ => out.push(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sp(epoch: usize, offset: usize, len: usize) -> Span {
        Span { epoch, offset, len }
    }

    /// Hand-computed streams: reduces take batches in the order handed, across chunk and
    /// epoch boundaries; a death keeps its pending batches and gives back the rest.
    #[test]
    fn reduces_take_each_rank_stream_in_order() -> Result<(), String> {
        // (batch size, handed (rank, span), reduces' steps, death (rank, pending), want the
        // reduces' spans, want (kept, unreduced))
        type Case = (
            usize,
            Vec<(usize, Span)>,
            Vec<Vec<usize>>,
            Option<(usize, usize)>,
            Vec<Vec<RankSpan>>,
            (Vec<Span>, Vec<Span>),
        );
        let rs = |rank, e, o, l| RankSpan { rank, span: sp(e, o, l) };
        let cases: Vec<Case> = vec![
            // Two chunks of rank 0 reduced in three steps of 2: merged where they touch.
            (
                2,
                vec![(0, sp(0, 0, 4)), (0, sp(0, 4, 4)), (1, sp(0, 8, 4))],
                vec![vec![1, 2], vec![2, 0], vec![1, 0]],
                None,
                vec![
                    vec![rs(0, 0, 0, 2), rs(1, 0, 8, 4)],
                    vec![rs(0, 0, 2, 4)],
                    vec![rs(0, 0, 6, 2)],
                ],
                (vec![], vec![]),
            ),
            // Across an epoch's end; rank 1 dies with one pending batch and two more handed.
            (
                1,
                vec![(0, sp(0, 6, 2)), (0, sp(1, 0, 2)), (1, sp(0, 0, 6))],
                vec![vec![3, 2]],
                Some((1, 1)),
                vec![vec![rs(0, 0, 6, 2), rs(0, 1, 0, 1), rs(1, 0, 0, 2)]],
                (vec![sp(0, 2, 1)], vec![sp(0, 3, 3)]),
            ),
        ];
        for (i, (bs, handed, reduces, death, want, want_death)) in cases.into_iter().enumerate() {
            let mut book = Book::new(bs);
            for (rank, span) in handed {
                book.hand(rank, span);
            }
            for (steps, want) in reduces.iter().zip(&want) {
                let (got, short) = book.reduce(steps);
                if &got != want || short != 0 {
                    return Err(format!("case {i}: reduce {steps:?} gave {got:?} (short {short})"));
                }
            }
            if let Some((rank, pending)) = death {
                let got = book.retire(rank, pending);
                if got != want_death {
                    return Err(format!("case {i}: death gave {got:?}, want {want_death:?}"));
                }
                // A dead rank's steps in a later reduce are settled already.
                if book.reduce(&[0, 5]) != (vec![], 0) {
                    return Err(format!("case {i}: a dead rank's stream was reduced"));
                }
            }
        }
        // More steps than handed: the shortfall is reported, not invented.
        let mut book = Book::new(2);
        book.hand(0, sp(0, 0, 2));
        if book.reduce(&[3]) != (vec![rs(0, 0, 0, 2)], 2) {
            return Err("an overdrawn stream was not reported".into());
        }
        Ok(())
    }
}
