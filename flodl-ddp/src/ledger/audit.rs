//! The audit of a ledger: per epoch, the samples the final model holds once, twice or not at
//! all, and the work deaths threw away.

use std::fmt;
use std::path::Path;

use super::entry::{Entry, Header, Span};
use super::error::LedgerError;

/// One epoch's accounting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpochAudit {
    /// The epoch.
    pub epoch: usize,
    /// Positions in the final model (once or more).
    pub in_model: usize,
    /// Extra copies: positions trained into the model more than once, counted per copy past
    /// the first.
    pub duplicated: usize,
    /// Positions no consensus holds.
    pub skipped: usize,
    /// Of the skipped, those a dead rank was handed, no consensus held when it died, and the
    /// dispatcher did not hand out again (a chunk it reported trained before a reduce took it
    /// in: the dispatcher counts such a chunk done).
    pub dropped: usize,
    /// Positions handed to ranks that died and not in the consensus when they died (the work
    /// their deaths threw away, at most), and in a chain of runs the positions a run reduced
    /// past the cut the next one resumed from.
    pub lost: usize,
    /// Positions the dispatcher handed out again after deaths.
    pub requeued: usize,
    /// Completed before the checkpoint this run resumed from: held by the model, audited by
    /// the ledger of the run that saved it.
    pub restored: bool,
}

/// A ledger audited: the run, each epoch's accounting, and whether the run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audit {
    /// The run.
    pub header: Header,
    /// Every epoch of the run, in order.
    pub epochs: Vec<EpochAudit>,
    /// Reduces completed (a resumed run's count includes those before its checkpoint).
    pub reduces: u64,
    /// Ranks declared dead.
    pub deaths: usize,
    /// Positions this run's reduces put into a consensus (copies included).
    pub trained: usize,
    /// Whether the ledger records the run's end (else it stopped or crashed: what it holds is
    /// audited, the rest is skipped).
    pub complete: bool,
    /// A resumed run audited through the run that saved its checkpoint: the epochs where the
    /// checkpoint's coverage differs from that run's consensus at the cut.
    pub cut_mismatch: Vec<usize>,
}

impl Audit {
    /// Audits the entries read from `file` (named in errors). The epochs a resumed run's
    /// checkpoint completed are taken as restored, and what its cut holds of the others as
    /// held: [`Audit::resumed`] checks them against the ledger of the run that saved it.
    ///
    /// # Errors
    /// [`LedgerError::Corrupt`] naming the line of an entry that contradicts the header (a span
    /// past its epoch, an epoch past the run) or follows the end.
    pub fn of(file: &Path, entries: &[Entry]) -> Result<Audit, LedgerError> {
        let (header, mut t) = tally(file, entries, None)?;
        let mut restored = 0;
        if let Some(r) = &header.resumed {
            restored = r.epoch;
            for s in &r.coverage {
                check(file, 1, s, header.epochs, header.positions())?;
                t.held[s.epoch].push(*s);
            }
        }
        Ok(t.audit(header, restored))
    }

    /// Audits a resumed run's ledger (`file`, `entries`) through the ledger of the run whose
    /// checkpoint it resumed (`earlier_file`, `earlier`): [`Audit::chained`] of the two.
    ///
    /// # Errors
    /// As [`Audit::chained`].
    pub fn resumed(
        earlier_file: &Path,
        earlier: &[Entry],
        file: &Path,
        entries: &[Entry],
    ) -> Result<Audit, LedgerError> {
        Audit::chained(&[(earlier_file, earlier), (file, entries)])
    }

    /// Audits a chain of runs, oldest first, each of which resumed the one before it (a run
    /// resumed by hand, or a standby's run after each takeover): what each run's consensus held
    /// at the cut the next one resumed from (its reduces up to that cut) stands in for the next
    /// run's restored epochs and coverage, which must equal it (epochs where one does not are
    /// listed in [`Audit::cut_mismatch`]); the last run's whole ledger follows. What a run
    /// reduced past that cut (a dead controller's reduces its standby never heard of) counts as
    /// lost to deaths. A chain of one is [`Audit::of`].
    ///
    /// # Errors
    /// As [`Audit::of`] for any ledger; [`LedgerError::Unrelated`] when a run after the first
    /// did not resume, or its epochs differ from the run before it.
    pub fn chained(runs: &[(&Path, &[Entry])]) -> Result<Audit, LedgerError> {
        let Some((&(last_file, last), earlier)) = runs.split_last() else {
            return Err(LedgerError::inconsistent(Path::new(""), 0, "no ledger to audit".into()));
        };
        let Some(&(first_file, first)) = earlier.first() else {
            return Audit::of(last_file, last);
        };
        // Each link: the run before, tallied up to the cut the next one resumed from.
        let cut_of = |file: &Path, entries: &[Entry], earlier_file: &Path| {
            let header = header_of(file, entries)?;
            header.resumed.clone().map(|r| (header, r)).ok_or_else(|| LedgerError::Unrelated {
                earlier: earlier_file.to_owned(),
                later: file.to_owned(),
                reason: "the later run did not resume".to_owned(),
            })
        };
        let (_, first_cut) = cut_of(runs[1].0, runs[1].1, first_file)?;
        let (mut before_header, mut acc) = tally(first_file, first, Some(first_cut.reduces))?;
        let mut cut_mismatch = Vec::new();
        for (k, &(file, entries)) in runs.iter().enumerate().skip(1) {
            let earlier_file = runs[k - 1].0;
            let (header, r) = cut_of(file, entries, earlier_file)?;
            if (before_header.epochs, before_header.batches, before_header.batch_size)
                != (header.epochs, header.batches, header.batch_size)
            {
                return Err(LedgerError::Unrelated {
                    earlier: earlier_file.to_owned(),
                    later: file.to_owned(),
                    reason: "their epochs differ".to_owned(),
                });
            }
            for epoch in r.epoch..header.epochs {
                let said: Vec<Span> =
                    r.coverage.iter().filter(|s| s.epoch == epoch).copied().collect();
                if merged(&said) != merged(&acc.held[epoch]) && !cut_mismatch.contains(&epoch) {
                    cut_mismatch.push(epoch);
                }
            }
            let until = match runs.get(k + 1) {
                Some(&(next_file, next)) => Some(cut_of(next_file, next, file)?.1.reduces),
                None => None,
            };
            let (header, mut t) = tally(file, entries, until)?;
            for (epoch, spans) in acc.held.into_iter().enumerate() {
                t.held[epoch].extend(spans);
                t.unreduced[epoch].extend(acc.unreduced[epoch].iter().copied());
                t.requeued_spans[epoch].extend(acc.requeued_spans[epoch].iter().copied());
                // What the run before reduced past the cut was thrown away with it.
                t.lost[epoch] += acc.lost[epoch] + acc.past_cut[epoch];
                t.requeued[epoch] += acc.requeued[epoch];
            }
            // A link is not counted as a death: a run resumed by hand may have stopped on
            // purpose, and a dead controller's ranks' work since its last reduce is in no ledger.
            t.deaths += acc.deaths;
            t.trained += acc.trained;
            (before_header, acc) = (header, t);
        }
        cut_mismatch.sort_unstable();
        let mut audit = acc.audit(before_header, 0);
        audit.cut_mismatch = cut_mismatch;
        Ok(audit)
    }

    /// Reads and audits the ledger at `file`.
    ///
    /// # Errors
    /// As [`crate::ledger::read`] and [`Audit::of`].
    pub fn read(file: &Path) -> Result<Audit, LedgerError> {
        Audit::of(file, &super::file::read(file)?)
    }

    /// Whether the final model holds every position of every epoch exactly once, and the run
    /// ended.
    pub fn exactly_once(&self) -> bool {
        self.complete
            && self.cut_mismatch.is_empty()
            && self.epochs.iter().all(|e| e.skipped == 0 && e.duplicated == 0)
    }

    /// Samples the final model holds over samples computed (trained into a consensus, or
    /// handed to a rank that died and thrown away with it, an upper bound): the share of the
    /// computed work that reached the model, at least. `None` when nothing was trained.
    pub fn retention(&self) -> Option<f64> {
        let lost: usize = self.epochs.iter().map(|e| e.lost).sum();
        let duplicated: usize = self.epochs.iter().map(|e| e.duplicated).sum();
        let computed = self.trained + lost;
        (computed > 0)
            .then(|| (self.trained - duplicated.min(self.trained)) as f64 / computed as f64)
    }
}

/// What a ledger's entries say, up to a cut: the spans the consensus holds per epoch and the
/// work deaths threw away.
struct Tally {
    held: Vec<Vec<Span>>,
    /// Per epoch: what deaths left unreduced and what was handed out again.
    unreduced: Vec<Vec<Span>>,
    requeued_spans: Vec<Vec<Span>>,
    lost: Vec<usize>,
    requeued: Vec<usize>,
    /// Per epoch: positions reduced past the cut the tally stops at (a dead controller's
    /// reduces its standby never heard of: thrown away with it).
    past_cut: Vec<usize>,
    reduces: u64,
    deaths: usize,
    trained: usize,
    complete: bool,
}

impl Tally {
    /// The audit of the held spans, the first `restored` epochs taken as held whole.
    fn audit(self, header: Header, restored: usize) -> Audit {
        let positions = header.positions();
        let epochs = self
            .held
            .iter()
            .enumerate()
            .map(|(epoch, spans)| {
                let mut e = EpochAudit {
                    epoch,
                    lost: self.lost[epoch],
                    requeued: self.requeued[epoch],
                    ..EpochAudit::default()
                };
                if epoch < restored {
                    e.restored = true;
                    e.in_model = positions;
                } else {
                    let (once_or_more, extra) = sweep(spans);
                    e.in_model = once_or_more;
                    e.duplicated = extra;
                    e.skipped = positions - once_or_more;
                    let left = minus(
                        &merged(&self.unreduced[epoch]),
                        &merged(&self.requeued_spans[epoch]),
                    );
                    e.dropped = length(&left) - length(&overlap(&left, &merged(spans)));
                }
                e
            })
            .collect();
        Audit {
            header,
            epochs,
            reduces: self.reduces,
            deaths: self.deaths,
            trained: self.trained,
            complete: self.complete,
            cut_mismatch: Vec::new(),
        }
    }
}

/// The header of `entries` (read from `file`) and what they say up to reduce `until` (all of
/// them when `None`; a death's part of the reduce in progress counts when that reduce does).
/// The header a ledger starts with.
fn header_of(file: &Path, entries: &[Entry]) -> Result<Header, LedgerError> {
    match entries.first() {
        Some(Entry::Run(header)) => Ok(header.clone()),
        _ => Err(LedgerError::inconsistent(file, 1, "no run header".into())),
    }
}

fn tally(
    file: &Path,
    entries: &[Entry],
    until: Option<u64>,
) -> Result<(Header, Tally), LedgerError> {
    let Some(Entry::Run(header)) = entries.first() else {
        return Err(LedgerError::inconsistent(file, 1, "no run header".into()));
    };
    let (epochs, positions) = (header.epochs, header.positions());
    let mut t = Tally {
        held: vec![Vec::new(); epochs],
        unreduced: vec![Vec::new(); epochs],
        requeued_spans: vec![Vec::new(); epochs],
        lost: vec![0; epochs],
        requeued: vec![0; epochs],
        past_cut: vec![0; epochs],
        reduces: header.resumed.as_ref().map_or(0, |r| r.reduces),
        deaths: 0,
        trained: 0,
        complete: false,
    };
    let within = |n: u64| until.is_none_or(|u| n <= u);
    for (i, entry) in entries.iter().enumerate().skip(1) {
        let line = i + 1;
        if t.complete {
            return Err(LedgerError::inconsistent(file, line, "an entry after the end".into()));
        }
        match entry {
            Entry::Run(_) => {
                return Err(LedgerError::inconsistent(file, line, "a second header".into()));
            }
            Entry::Reduce { n, spans } => {
                for r in spans {
                    check(file, line, &r.span, epochs, positions)?;
                }
                if within(*n) {
                    t.reduces = *n;
                    for r in spans {
                        t.held[r.span.epoch].push(r.span);
                        t.trained += r.span.len;
                    }
                } else {
                    for r in spans {
                        t.past_cut[r.span.epoch] += r.span.len;
                    }
                }
            }
            Entry::Death { kept, unreduced, requeued, after, .. } => {
                for s in kept.iter().chain(unreduced).chain(requeued) {
                    check(file, line, s, epochs, positions)?;
                }
                if !within(after + 1) {
                    continue;
                }
                t.deaths += 1;
                for s in kept {
                    t.held[s.epoch].push(*s);
                    t.trained += s.len;
                }
                for s in unreduced {
                    t.lost[s.epoch] += s.len;
                    t.unreduced[s.epoch].push(*s);
                }
                for s in requeued {
                    t.requeued[s.epoch] += s.len;
                    t.requeued_spans[s.epoch].push(*s);
                }
            }
            Entry::End { reduces } => {
                if within(*reduces) {
                    t.reduces = *reduces;
                }
                t.complete = until.is_none();
                if until.is_some() {
                    break;
                }
            }
        }
    }
    Ok((header.clone(), t))
}

/// Positions in sorted disjoint `runs`.
fn length(runs: &[(usize, usize)]) -> usize {
    runs.iter().map(|(s, e)| e - s).sum()
}

/// The positions in both sorted disjoint run lists.
fn overlap(a: &[(usize, usize)], b: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let (s, e) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if s < e {
            out.push((s, e));
        }
        if a[i].1 < b[j].1 { i += 1 } else { j += 1 }
    }
    out
}

/// The positions of sorted disjoint `a` not in sorted disjoint `b`.
fn minus(a: &[(usize, usize)], b: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for &(mut s, e) in a {
        for &(bs, be) in b {
            if be <= s || bs >= e {
                continue;
            }
            if bs > s {
                out.push((s, bs));
            }
            s = s.max(be);
        }
        if s < e {
            out.push((s, e));
        }
    }
    out
}

/// `spans` as sorted disjoint `(start, end)` runs, touching ones joined.
fn merged(spans: &[Span]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> =
        spans.iter().filter(|s| s.len > 0).map(|s| (s.offset, s.end())).collect();
    runs.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (s, e) in runs {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Rejects a span outside the run's epochs or past its epoch's positions.
fn check(
    file: &Path,
    line: usize,
    s: &Span,
    epochs: usize,
    positions: usize,
) -> Result<(), LedgerError> {
    if s.epoch >= epochs || s.end() > positions || s.offset.checked_add(s.len).is_none() {
        let reason =
            format!("span {s:?} is outside the run's {epochs} epochs of {positions} positions");
        return Err(LedgerError::inconsistent(file, line, reason));
    }
    Ok(())
}

/// Positions covered at least once by `spans`, and the copies past the first.
fn sweep(spans: &[Span]) -> (usize, usize) {
    let mut edges: Vec<(usize, i64)> = Vec::with_capacity(spans.len() * 2);
    for s in spans.iter().filter(|s| s.len > 0) {
        edges.push((s.offset, 1));
        edges.push((s.end(), -1));
    }
    edges.sort_unstable();
    let (mut covered, mut extra, mut depth, mut at) = (0usize, 0usize, 0i64, 0usize);
    for (pos, d) in edges {
        let run = pos - at;
        if depth > 0 {
            covered += run;
            extra += run * (depth as usize - 1);
        }
        depth += d;
        at = pos;
    }
    (covered, extra)
}

impl fmt::Display for Audit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = &self.header;
        writeln!(
            f,
            "ledger: {} rank(s), {} epoch(s) of {} samples ({} batches of {}), {} reduces, {} death(s){}",
            h.world,
            h.epochs,
            h.positions(),
            h.batches,
            h.batch_size,
            self.reduces,
            self.deaths,
            match &h.resumed {
                Some(r) => format!(", resumed at epoch {} after reduce {}", r.epoch, r.reduces),
                None => String::new(),
            }
        )?;
        writeln!(
            f,
            "epoch  in model  duplicated  skipped  lost to deaths  re-dispatched  dropped"
        )?;
        for e in &self.epochs {
            if e.restored {
                writeln!(f, "{:>5}  {:>8}  restored from the checkpoint", e.epoch, e.in_model)?;
                continue;
            }
            writeln!(
                f,
                "{:>5}  {:>8}  {:>10}  {:>7}  {:>14}  {:>13}  {:>7}",
                e.epoch, e.in_model, e.duplicated, e.skipped, e.lost, e.requeued, e.dropped
            )?;
        }
        if let Some(r) = self.retention() {
            writeln!(
                f,
                "work retention: {r:.4} (samples in the final model / samples trained into a \
                 consensus or lost to a death)"
            )?;
        }
        let (skipped, duplicated): (usize, usize) =
            self.epochs.iter().fold((0, 0), |(s, d), e| (s + e.skipped, d + e.duplicated));
        if !self.cut_mismatch.is_empty() {
            write!(
                f,
                "NOT EXACT: the checkpoint's coverage of epoch(s) {:?} is not what the saving \
                 run's consensus held at its cut",
                self.cut_mismatch
            )
        } else if !self.complete {
            write!(
                f,
                "NOT EXACT: the ledger ends before the run did ({skipped} samples not trained)"
            )
        } else if self.exactly_once() {
            write!(f, "exactly once: every sample of every epoch is in the final model once")
        } else {
            let dropped: usize = self.epochs.iter().map(|e| e.dropped).sum();
            write!(
                f,
                "NOT EXACT: {skipped} sample(s) skipped ({dropped} of them dropped: a dead rank's \
                 chunks reported trained before a reduce took them in, not re-dispatched), \
                 {duplicated} duplicated"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::entry::{RankSpan, Resume};

    fn sp(epoch: usize, offset: usize, len: usize) -> Span {
        Span { epoch, offset, len }
    }

    /// Hand-built ledgers of 2 epochs of 8 positions: clean, with a death re-dispatched, with
    /// a gap, a double, a resume, and a run that did not end.
    #[test]
    fn audits_count_each_position() -> Result<(), Box<dyn std::error::Error>> {
        let header = |resumed| Header {
            version: 1,
            world: 2,
            epochs: 2,
            batch_size: 2,
            batches: 4,
            resumed,
        };
        let reduce = |n, spans: &[(usize, Span)]| Entry::Reduce {
            n,
            spans: spans.iter().map(|&(rank, span)| RankSpan { rank, span }).collect(),
        };
        let end = Entry::End { reduces: 9 };
        // (what, entries, want (in model, duplicated, skipped, lost, requeued, dropped) per epoch,
        // exactly once)
        type Case =
            (&'static str, Vec<Entry>, [(usize, usize, usize, usize, usize, usize); 2], bool);
        let cases: Vec<Case> = vec![
            (
                "clean",
                vec![
                    Entry::Run(header(None)),
                    reduce(1, &[(0, sp(0, 0, 4)), (1, sp(0, 4, 4))]),
                    reduce(2, &[(0, sp(1, 0, 8))]),
                    end.clone(),
                ],
                [(8, 0, 0, 0, 0, 0), (8, 0, 0, 0, 0, 0)],
                true,
            ),
            (
                "a death, its part kept and the rest re-dispatched",
                vec![
                    Entry::Run(header(None)),
                    reduce(1, &[(0, sp(0, 0, 2))]),
                    Entry::Death {
                        rank: 1,
                        after: 1,
                        kept: vec![sp(0, 4, 2)],
                        unreduced: vec![sp(0, 6, 2), sp(1, 0, 2)],
                        requeued: vec![sp(0, 6, 2), sp(1, 0, 2)],
                    },
                    reduce(2, &[(0, sp(0, 2, 2)), (0, sp(0, 6, 2)), (0, sp(1, 0, 8))]),
                    end.clone(),
                ],
                [(8, 0, 0, 2, 2, 0), (8, 0, 0, 2, 2, 0)],
                true,
            ),
            (
                "a death drops a chunk it reported trained: skipped, and named dropped",
                vec![
                    Entry::Run(header(None)),
                    reduce(1, &[(0, sp(0, 0, 4)), (0, sp(1, 0, 8))]),
                    Entry::Death {
                        rank: 1,
                        after: 1,
                        kept: vec![],
                        unreduced: vec![sp(0, 4, 4)],
                        requeued: vec![sp(0, 6, 2)],
                    },
                    reduce(2, &[(0, sp(0, 6, 2))]),
                    end.clone(),
                ],
                [(6, 0, 2, 4, 2, 2), (8, 0, 0, 0, 0, 0)],
                false,
            ),
            (
                "a gap and a double",
                vec![
                    Entry::Run(header(None)),
                    reduce(1, &[(0, sp(0, 0, 6)), (1, sp(0, 4, 2))]),
                    reduce(2, &[(0, sp(1, 0, 8)), (1, sp(1, 2, 2)), (1, sp(1, 2, 2))]),
                    end.clone(),
                ],
                [(6, 2, 2, 0, 0, 0), (8, 4, 0, 0, 0, 0)],
                false,
            ),
            (
                "resumed in epoch 1 with half of it in the checkpoint",
                vec![
                    Entry::Run(header(Some(Resume {
                        epoch: 1,
                        reduces: 5,
                        coverage: vec![sp(1, 0, 4)],
                    }))),
                    reduce(6, &[(1, sp(1, 4, 4))]),
                    end.clone(),
                ],
                [(8, 0, 0, 0, 0, 0), (8, 0, 0, 0, 0, 0)],
                true,
            ),
            (
                "stopped before the end",
                vec![Entry::Run(header(None)), reduce(1, &[(0, sp(0, 0, 8))])],
                [(8, 0, 0, 0, 0, 0), (0, 0, 8, 0, 0, 0)],
                false,
            ),
        ];
        let file = Path::new("ledger.jsonl");
        for (what, entries, want, exact) in cases {
            let a = Audit::of(file, &entries)?;
            let got: Vec<_> = a
                .epochs
                .iter()
                .map(|e| (e.in_model, e.duplicated, e.skipped, e.lost, e.requeued, e.dropped))
                .collect();
            if got != want || a.exactly_once() != exact {
                return Err(
                    format!("{what}: {got:?}, exactly once {}\n{a}", a.exactly_once()).into()
                );
            }
        }
        // A span past its epoch, and an entry after the end, are refused naming the line.
        let past = reduce(1, &[(0, sp(0, 6, 4))]);
        let bad = [
            (vec![Entry::Run(header(None)), past.clone()], 2),
            (vec![Entry::Run(header(None)), end.clone(), reduce(1, &[])], 3),
        ];
        for (entries, line) in bad {
            match Audit::of(file, &entries) {
                Err(LedgerError::Corrupt { line: l, .. }) if l == line => {}
                other => return Err(format!("line {line}: {other:?}").into()),
            }
        }
        Ok(())
    }

    /// A resumed run audited through the run that saved its checkpoint: the restored epochs
    /// are that run's consensus at the cut, and a checkpoint claiming another coverage is caught.
    #[test]
    fn resumed_runs_are_audited_through_the_saving_run() -> Result<(), Box<dyn std::error::Error>> {
        let header = |resumed| Header {
            version: 1,
            world: 2,
            epochs: 2,
            batch_size: 2,
            batches: 4,
            resumed,
        };
        let reduce = |n, spans: &[Span]| Entry::Reduce {
            n,
            spans: spans.iter().map(|&span| RankSpan { rank: 0, span }).collect(),
        };
        let saving = |first: Span| {
            vec![
                Entry::Run(header(None)),
                reduce(1, &[first]),
                reduce(2, &[sp(1, 0, 4)]),
                // Past the cut: not in the resumed run's model.
                reduce(3, &[sp(1, 4, 4)]),
                Entry::End { reduces: 3 },
            ]
        };
        let resumed = |coverage: Vec<Span>, rest: Span| {
            vec![
                Entry::Run(header(Some(Resume { epoch: 1, reduces: 2, coverage }))),
                reduce(3, &[rest]),
                Entry::End { reduces: 3 },
            ]
        };
        // (what, saving run's first reduce, checkpoint coverage, the resumed run's reduce,
        // want (in model, skipped) per epoch, cut mismatch, exactly once)
        type Case = (&'static str, Span, Vec<Span>, Span, [(usize, usize); 2], Vec<usize>, bool);
        let cases: Vec<Case> = vec![
            ("exact", sp(0, 0, 8), vec![sp(1, 0, 4)], sp(1, 4, 4), [(8, 0), (8, 0)], vec![], true),
            (
                "the saving run skipped part of epoch 0",
                sp(0, 0, 6),
                vec![sp(1, 0, 4)],
                sp(1, 4, 4),
                [(6, 2), (8, 0)],
                vec![],
                false,
            ),
            (
                "the checkpoint claims less than its cut held",
                sp(0, 0, 8),
                vec![sp(1, 0, 2)],
                sp(1, 2, 6),
                [(8, 0), (8, 0)],
                vec![1],
                false,
            ),
        ];
        let (a, b) = (Path::new("saved/ledger.jsonl"), Path::new("resumed/ledger.jsonl"));
        for (what, first, coverage, rest, want, mismatch, exact) in cases {
            let audit = Audit::resumed(a, &saving(first), b, &resumed(coverage, rest))?;
            let got: Vec<_> = audit.epochs.iter().map(|e| (e.in_model, e.skipped)).collect();
            if got != want || audit.cut_mismatch != mismatch || audit.exactly_once() != exact {
                return Err(format!("{what}: {got:?} {:?}\n{audit}", audit.cut_mismatch).into());
            }
        }
        // A run that did not resume is no resumption.
        match Audit::resumed(a, &saving(sp(0, 0, 8)), b, &saving(sp(0, 0, 8))) {
            Err(LedgerError::Unrelated { .. }) => Ok(()),
            other => Err(format!("not a resumption: {other:?}").into()),
        }
    }

    /// A chain of three runs (two takeovers): each middle run counts only up to the cut the
    /// next resumed from, whatever it trained after; a link whose coverage differs from what the
    /// run before held is named, and a chain of one is the plain audit.
    #[test]
    fn a_chain_of_runs_is_audited_link_by_link() -> Result<(), Box<dyn std::error::Error>> {
        let header = |resumed| Header {
            version: 1,
            world: 3,
            epochs: 2,
            batch_size: 2,
            batches: 4,
            resumed,
        };
        let reduce = |n, span: Span| Entry::Reduce { n, spans: vec![RankSpan { rank: 1, span }] };
        let first = vec![
            Entry::Run(header(None)),
            reduce(1, sp(0, 0, 8)),
            reduce(2, sp(1, 0, 2)),
            // Past the first takeover's cut (2): thrown away with the dead controller.
            reduce(3, sp(1, 2, 2)),
        ];
        let middle = |coverage: Vec<Span>| {
            vec![
                Entry::Run(header(Some(Resume { epoch: 1, reduces: 2, coverage }))),
                reduce(3, sp(1, 2, 2)),
                // Past the second takeover's cut (3).
                reduce(4, sp(1, 4, 4)),
            ]
        };
        let last = |coverage: Vec<Span>| {
            vec![
                Entry::Run(header(Some(Resume { epoch: 1, reduces: 3, coverage }))),
                reduce(4, sp(1, 4, 4)),
                Entry::End { reduces: 4 },
            ]
        };
        let files =
            [Path::new("a/ledger.jsonl"), Path::new("b/ledger.jsonl"), Path::new("c/ledger.jsonl")];
        // (what, the middle run's coverage, the last run's, in model per epoch, mismatch, exact)
        type Case = (&'static str, Vec<Span>, Vec<Span>, [usize; 2], Vec<usize>, bool);
        let cases: Vec<Case> = vec![
            ("exact", vec![sp(1, 0, 2)], vec![sp(1, 0, 4)], [8, 8], vec![], true),
            (
                "the second link claims less",
                vec![sp(1, 0, 2)],
                vec![sp(1, 0, 2)],
                [8, 8],
                vec![1],
                false,
            ),
            (
                "the first link claims more",
                vec![sp(1, 0, 4)],
                vec![sp(1, 0, 4)],
                [8, 8],
                vec![1],
                false,
            ),
        ];
        for (what, mid, end, want, mismatch, exact) in cases {
            let (a, b, c) = (first.clone(), middle(mid), last(end));
            let audit = Audit::chained(&[(files[0], &a), (files[1], &b), (files[2], &c)])?;
            let got: Vec<usize> = audit.epochs.iter().map(|e| e.in_model).collect();
            let dup: usize = audit.epochs.iter().map(|e| e.duplicated).sum();
            if got != want
                || dup != 0
                || audit.cut_mismatch != mismatch
                || audit.exactly_once() != exact
            {
                return Err(format!("{what}: {got:?} {:?}\n{audit}", audit.cut_mismatch).into());
            }
        }
        // A chain of one is the plain audit; a link that did not resume is no chain.
        let c = last(vec![sp(1, 0, 4)]);
        if Audit::chained(&[(files[2], &c)])?.epochs != Audit::of(files[2], &c)?.epochs {
            return Err("a chain of one differs from the plain audit".into());
        }
        match Audit::chained(&[(files[0], &first), (files[1], &first), (files[2], &c)]) {
            Err(LedgerError::Unrelated { .. }) => Ok(()),
            other => Err(format!("not a chain: {other:?}").into()),
        }
    }

    /// The sweep against a position-by-position count on random spans.
    #[test]
    fn sweep_matches_counting_each_position() -> Result<(), String> {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(5);
        for case in 0..500 {
            let n = rng.random_range(1..60usize);
            let mut count = vec![0usize; n];
            let spans: Vec<Span> = (0..rng.random_range(0..12))
                .map(|_| {
                    let o = rng.random_range(0..n);
                    let l = rng.random_range(0..=n - o);
                    count[o..o + l].iter_mut().for_each(|c| *c += 1);
                    sp(0, o, l)
                })
                .collect();
            let want = (
                count.iter().filter(|&&c| c > 0).count(),
                count.iter().map(|&c| c.saturating_sub(1)).sum(),
            );
            if sweep(&spans) != want {
                return Err(format!("case {case}: {spans:?}"));
            }
        }
        Ok(())
    }
}
