//! The dispatcher's tests: every position trained once, through deaths, resumes and reshards.

use super::*;
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The shape of a random book: world, batch size, batches an epoch, epochs and cutting.
#[derive(Debug, Clone, Copy)]
struct Shape {
    world: usize,
    bs: usize,
    batches: usize,
    epochs: usize,
    cutting: Cutting,
}

impl Shape {
    /// A random shape of `worlds` ranks, a batch size below `bs_below`, from `world` to below
    /// `batches_below` batches an epoch, 1 to 3 epochs; the static cut on even cases, else
    /// progressive with a smallest chunk below `chunk_below`.
    fn random(
        rng: &mut Xoshiro256PlusPlus,
        case: usize,
        worlds: std::ops::Range<usize>,
        bs_below: usize,
        batches_below: usize,
        chunk_below: usize,
    ) -> Shape {
        let world = rng.random_range(worlds);
        let bs = rng.random_range(1..bs_below);
        let batches = rng.random_range(world..batches_below);
        let epochs = rng.random_range(1..4);
        let cutting = if case.is_multiple_of(2) {
            Cutting::Static
        } else {
            Cutting::Progressive { min_chunk: rng.random_range(1..chunk_below) }
        };
        Shape { world, bs, batches, epochs, cutting }
    }

    /// A fresh book of this shape.
    fn book(&self) -> Dispatcher {
        Dispatcher::new(self.world, self.bs, self.batches, self.epochs, self.cutting)
    }
}

/// Moves `d` at random for `moves` moves or until it is done: a random rank is handed its
/// next chunk (half the time) or gives the last chunk it holds to `complete`.
fn shuffle(
    d: &mut Dispatcher,
    rng: &mut Xoshiro256PlusPlus,
    counts: &[usize],
    held: &mut [Vec<Chunk>],
    moves: usize,
    mut complete: impl FnMut(&mut Dispatcher, usize, Chunk) -> TestResult,
) -> TestResult {
    for _ in 0..moves {
        if d.all_done() {
            break;
        }
        let r = rng.random_range(0..held.len());
        if rng.random_bool(0.5) {
            if let Some(c) = d.next_chunk(r, counts, false, Instant::now()) {
                held[r].push(c);
            }
        } else if let Some(c) = held[r].pop() {
            complete(d, r, c)?;
        }
        while d.pop_complete().is_some() {}
    }
    Ok(())
}

/// The book reads no clock: an epoch's wall time is the span between the times it was
/// given for the first hand-out and the last completion, exactly.
#[test]
fn epoch_wall_time_comes_from_the_times_given() -> TestResult {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + std::time::Duration::from_millis(ms);
    for (handed, done, expected) in [(0, 250, 250.0), (40, 40, 0.0), (7, 1007, 1000.0)] {
        let mut d = Dispatcher::new(1, 2, 4, 1, Cutting::Static);
        let c = d.next_chunk(0, &[1], true, at(handed)).ok_or("no chunk")?;
        let w = WorkTally { batches: c.batches(2), samples: c.len, ..Default::default() };
        if !d.complete(0, &c, &w, at(done)) {
            return Err("the chunk was not credited".into());
        }
        if d.pop_complete().is_some() {
            return Err("the epoch completed before a reduce held its chunk".into());
        }
        d.add_reduce(0.0, &[c.batches(2)]);
        let (_, _, ms) = d.pop_complete().ok_or("the epoch did not complete")?;
        if (ms - expected).abs() > 1e-9 {
            return Err(format!("handed at {handed}, done at {done}: {ms} ms").into());
        }
    }
    Ok(())
}

/// Hands out and completes chunks in a random rank order; every position of every epoch is
/// handed out exactly once and epochs complete in order.
#[test]
fn every_position_once_per_epoch() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
    for case in 0..200 {
        let shape = Shape::random(&mut rng, case, 1..6, 5, 60, 5);
        let Shape { world, bs, batches, epochs, .. } = shape;
        let counts: Vec<usize> = (0..world).map(|_| rng.random_range(1..8)).collect();
        let mut d = shape.book();
        let mut seen = vec![vec![0u32; batches * bs]; epochs];
        let mut held: Vec<Vec<Chunk>> = vec![Vec::new(); world];
        let mut done = Vec::new();
        for _ in 0..100_000 {
            if d.all_done() {
                break;
            }
            let r = rng.random_range(0..world);
            if rng.random_bool(0.5) {
                if let Some(c) = d.next_chunk(r, &counts, case % 4 == 1, Instant::now()) {
                    for n in &mut seen[c.epoch][c.offset..c.offset + c.len] {
                        *n += 1;
                    }
                    held[r].push(c);
                }
            } else if !held[r].is_empty() {
                let c = held[r].remove(0);
                if !train_and_reduce(&mut d, r, &c) {
                    return Err(format!("case {case}: {c:?} not held by rank {r}").into());
                }
            }
            while let Some((e, tally, _)) = d.pop_complete() {
                let m = tally.finish(e, 1.0, &[]);
                if m.samples != batches * bs {
                    return Err(format!("epoch {e}: {} samples", m.samples).into());
                }
                done.push(e);
            }
        }
        if !d.all_done() || done != (0..epochs).collect::<Vec<_>>() {
            return Err(format!("case {case}: epochs done {done:?}").into());
        }
        if seen.iter().flatten().any(|&n| n != 1) {
            return Err(format!("case {case}: a position was not handed out exactly once").into());
        }
    }
    Ok(())
}

/// Random deaths and rejoins at random moments: every position of every epoch is still
/// completed exactly once by a live rank, a retired rank is handed nothing until it is
/// admitted again, its late report is refused, and only a retired rank can be admitted.
#[test]
fn retired_work_is_completed_once_by_the_living() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
    for case in 0..300 {
        let shape = Shape::random(&mut rng, case, 2..6, 4, 50, 4);
        let Shape { world, bs, batches, epochs, .. } = shape;
        let counts = vec![3; world];
        let mut d = shape.book();
        let mut completed = vec![vec![0u32; batches * bs]; epochs];
        let mut held: Vec<Vec<Chunk>> = vec![Vec::new(); world];
        let mut dead = vec![false; world];
        for _ in 0..100_000 {
            if d.all_done() {
                break;
            }
            let r = rng.random_range(0..world);
            let alive = dead.iter().filter(|&&x| !x).count();
            if alive > 1 && rng.random_bool(0.01) {
                // No reduce is recorded: everything the rank held goes back.
                let requeued = d.retire(r, 0, Instant::now());
                if !dead[r] && requeued.len() != held[r].len() {
                    return Err(
                        format!("case {case}: requeued {requeued:?}, held {:?}", held[r]).into()
                    );
                }
                dead[r] = true;
                // A late report of a dead rank is refused.
                if let Some(c) = held[r].pop()
                    && d.complete(r, &c, &WorkTally::default(), Instant::now())
                {
                    return Err(format!("case {case}: a retired rank's chunk was credited").into());
                }
                held[r].clear();
            } else if rng.random_bool(0.01) {
                // A process joins again as rank r (refused while r is live).
                if d.admit(r) != dead[r] {
                    return Err(format!("case {case}: admit({r}) when dead = {}", dead[r]).into());
                }
                dead[r] = false;
            } else if rng.random_bool(0.5) {
                if let Some(c) = d.next_chunk(r, &counts, true, Instant::now()) {
                    if dead[r] {
                        return Err(
                            format!("case {case}: retired rank {r} was handed {c:?}").into()
                        );
                    }
                    held[r].push(c);
                }
            } else if !held[r].is_empty() {
                let c = held[r].remove(0);
                if !train_and_reduce(&mut d, r, &c) {
                    return Err(format!("case {case}: {c:?} refused").into());
                }
                for n in &mut completed[c.epoch][c.offset..c.offset + c.len] {
                    *n += 1;
                }
            }
            while d.pop_complete().is_some() {}
        }
        if !d.all_done() {
            return Err(format!("case {case}: the run did not finish").into());
        }
        if completed.iter().flatten().any(|&n| n != 1) {
            return Err(format!("case {case}: a position was not completed exactly once").into());
        }
    }
    Ok(())
}

/// Interrupts a book at a random moment, resumes a new one from its coverage (completed
/// chunks plus the trained part of held ones): together they complete every position once,
/// and under the static cut each rank is handed exactly the positions it would have been.
#[test]
fn resume_hands_out_only_the_uncovered_rest() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(13);
    for case in 0..300 {
        let shape = Shape::random(&mut rng, case, 1..5, 4, 40, 4);
        let Shape { world, bs, batches, epochs, cutting } = shape;
        let counts = vec![2; world];
        // Reference: which rank trains each position, uninterrupted (static only).
        let mut owner = vec![vec![usize::MAX; batches * bs]; epochs];
        let mut completed = vec![vec![0u32; batches * bs]; epochs];
        let mut d = shape.book();
        let mut held: Vec<Vec<Chunk>> = vec![Vec::new(); world];
        let stop_after = rng.random_range(0..200);
        shuffle(&mut d, &mut rng, &counts, &mut held, stop_after, |d, r, c| {
            train_and_reduce(d, r, &c);
            for p in c.offset..c.offset + c.len {
                completed[c.epoch][p] += 1;
                owner[c.epoch][p] = r;
            }
            Ok(())
        })?;
        // Each held chunk was partly trained: a random number of leading batches.
        let mut partial = Vec::new();
        for (r, hs) in held.iter().enumerate() {
            for c in hs {
                let k = rng.random_range(0..=c.len / bs);
                if k > 0 {
                    partial.push((c.epoch, SampleRange::new(c.offset, k * bs)));
                    for p in c.offset..c.offset + k * bs {
                        completed[c.epoch][p] += 1;
                        owner[c.epoch][p] = r;
                    }
                }
            }
        }
        let coverage = d.coverage(&partial, 42)?;
        let oldest = d.oldest();
        let mut e =
            shape.book().resume(oldest, &coverage).map_err(|e| format!("case {case}: {e}"))?;
        let mut held: Vec<Vec<Chunk>> = vec![Vec::new(); world];
        shuffle(&mut e, &mut rng, &counts, &mut held, 100_000, |e, r, c| {
            train_and_reduce(e, r, &c);
            for p in c.offset..c.offset + c.len {
                completed[c.epoch][p] += 1;
                if cutting == Cutting::Static && owner[c.epoch][p] != usize::MAX {
                    return Err(format!("case {case}: position {p} trained twice").into());
                }
                owner[c.epoch][p] = r;
            }
            Ok(())
        })?;
        if !e.all_done() {
            return Err(format!("case {case}: the resumed run did not finish").into());
        }
        if completed.iter().flatten().any(|&n| n != 1) {
            return Err(format!("case {case}: a position was not completed exactly once").into());
        }
        if cutting == Cutting::Static {
            let reference = shape.book();
            for (epoch, owners) in owner.iter().enumerate() {
                for (index, (s, e)) in reference.shares(world).into_iter().enumerate() {
                    if owners[s..e].iter().any(|&o| o != index) {
                        return Err(
                            format!("case {case}: epoch {epoch} share {index} moved").into()
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// A forecast starts with the chunks the rank holds and, where the dispatcher's choice
/// depends on nobody else (the static cut, a world of one), is exactly what it hands the
/// rank next, cut at the horizon; a retired rank gets none.
#[test]
fn forecast_is_what_the_rank_is_handed_next() -> TestResult {
    // (cutting, world, batch size, batches, epochs, calibrated)
    let cases = [
        (Cutting::Static, 3, 2, 31, 3, false),
        (Cutting::Static, 2, 4, 10, 2, true),
        (Cutting::Progressive { min_chunk: 2 }, 1, 2, 50, 3, false),
        (Cutting::Progressive { min_chunk: 1 }, 1, 3, 40, 2, true),
    ];
    for (i, (cutting, world, bs, batches, epochs, calibrated)) in cases.into_iter().enumerate() {
        let counts = vec![3; world];
        let mut d = Dispatcher::new(world, bs, batches, epochs, cutting);
        let mut held = Vec::new();
        for r in 0..world {
            let c = d
                .next_chunk(r, &counts, calibrated, Instant::now())
                .ok_or(format!("case {i}: none"))?;
            if r == 0 {
                held.push(c);
            }
        }
        for horizon in [1, 5, usize::MAX] {
            let forecast = d.forecast(0, &counts, calibrated, horizon);
            let mut probe = Dispatcher::new(world, bs, batches, epochs, cutting);
            let mut want = Vec::new();
            for r in 0..world {
                let c = probe.next_chunk(r, &counts, calibrated, Instant::now());
                if r == 0 {
                    want.extend(c);
                }
            }
            while let Some(c) = probe.next_chunk(0, &counts, calibrated, Instant::now()) {
                want.push(c);
            }
            // The same positions in the same order, cut at the horizon.
            let flat = |cs: &[Chunk]| -> Vec<(usize, usize)> {
                cs.iter().flat_map(|c| (c.offset..c.end()).map(move |p| (c.epoch, p))).collect()
            };
            let mut want = flat(&want);
            want.truncate(horizon.saturating_mul(bs));
            let starts_held = horizon < usize::MAX || forecast.first() == held.first();
            if flat(&forecast) != want || !starts_held {
                return Err(format!("case {i} horizon {horizon}: {forecast:?}").into());
            }
        }
    }
    let mut d = Dispatcher::new(2, 1, 10, 1, Cutting::Static);
    d.next_chunk(1, &[1, 1], false, Instant::now());
    d.retire(1, 0, Instant::now());
    assert!(d.forecast(1, &[1, 1], false, 100).is_empty());
    Ok(())
}

/// Elastic resume: a book of one world size interrupted at a random moment, resumed and
/// re-sharded on another world size. Together they complete every position once; under
/// the static cut the rest of the interrupted epoch is split over the new ranks with batch
/// counts at most one apart.
#[test]
fn reshard_onto_another_world_trains_the_rest_once() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(17);
    for case in 0..300 {
        let from = rng.random_range(1..5);
        let to = rng.random_range(1..5);
        let bs = rng.random_range(1..4);
        let batches = rng.random_range(from.max(to)..40);
        let epochs = rng.random_range(1..4);
        let cutting = if case % 2 == 0 {
            Cutting::Static
        } else {
            Cutting::Progressive { min_chunk: rng.random_range(1..4) }
        };
        let mut completed = vec![vec![0u32; batches * bs]; epochs];
        let mut d = Dispatcher::new(from, bs, batches, epochs, cutting);
        let mut held: Vec<Vec<Chunk>> = vec![Vec::new(); from];
        let moves = rng.random_range(0..200);
        shuffle(&mut d, &mut rng, &vec![2; from], &mut held, moves, |d, r, c| {
            train_and_reduce(d, r, &c);
            for n in &mut completed[c.epoch][c.offset..c.end()] {
                *n += 1;
            }
            Ok(())
        })?;
        let coverage = d.coverage(&[], 42)?;
        let oldest = d.oldest();
        let mut e = Dispatcher::new(to, bs, batches, epochs, cutting)
            .resume(oldest, &coverage)
            .map_err(|e| format!("case {case}: {e}"))?
            .reshard();
        // Static: what each new rank is handed of the resumed epoch, before anything ends.
        if cutting == Cutting::Static && oldest < epochs {
            let mut mine = vec![0usize; to];
            e.pool_mut(oldest);
            for (r, n) in mine.iter_mut().enumerate() {
                while e
                    .pools
                    .front()
                    .is_some_and(|p| p.epoch == oldest && !p.assigned[r].is_empty())
                {
                    let c = e
                        .next_chunk(r, &[], false, Instant::now())
                        .ok_or("an assigned span not handed")?;
                    *n += c.batches(bs);
                    held_push(&mut e, &mut completed, r, c)?;
                }
            }
            let (lo, hi) = (mine.iter().min(), mine.iter().max());
            if let (Some(lo), Some(hi)) = (lo, hi)
                && hi - lo > 1
            {
                return Err(format!("case {case}: {from}→{to} shares {mine:?}").into());
            }
            while e.pop_complete().is_some() {}
        }
        let mut held: Vec<Vec<Chunk>> = vec![Vec::new(); to];
        shuffle(&mut e, &mut rng, &vec![2; to], &mut held, 100_000, |e, r, c| {
            held_push(e, &mut completed, r, c)
        })?;
        if !e.all_done() {
            return Err(format!("case {case}: the resumed run did not finish").into());
        }
        if completed.iter().flatten().any(|&n| n != 1) {
            return Err(format!("case {case}: {from}→{to}: a position not trained once").into());
        }
    }
    Ok(())
}

/// Completes chunk `c` of rank `r` in `e` and counts its positions.
fn held_push(e: &mut Dispatcher, completed: &mut [Vec<u32>], r: usize, c: Chunk) -> TestResult {
    if !train_and_reduce(e, r, &c) {
        return Err(format!("rank {r} did not hold {c:?}").into());
    }
    for n in &mut completed[c.epoch][c.offset..c.end()] {
        *n += 1;
    }
    Ok(())
}

/// A book with fewer epochs than the run that saved the coverage ignores the epochs it will
/// not train; coverage of an epoch before the resumed one is refused.
#[test]
fn resume_into_fewer_epochs_ignores_the_later_ones() -> TestResult {
    let covered = vec![
        EpochCoverage::with_completed(1, 42, 12, &[SampleRange::new(0, 8)])?,
        EpochCoverage::with_completed(2, 42, 12, &[SampleRange::new(0, 4)])?,
    ];
    let mut d =
        Dispatcher::new(2, 2, 6, 2, Cutting::Progressive { min_chunk: 1 }).resume(1, &covered)?;
    let mut trained = Vec::new();
    while let Some(c) = d.next_chunk(0, &[1, 1], false, Instant::now()) {
        train_and_reduce(&mut d, 0, &c);
        trained.push(c);
        while d.pop_complete().is_some() {}
    }
    assert!(d.all_done(), "the resumed epoch did not finish");
    assert!(trained.iter().all(|c| c.epoch == 1 && c.offset >= 8), "{trained:?}");
    assert_eq!(trained.iter().map(|c| c.len).sum::<usize>(), 4, "{trained:?}");
    let early = Dispatcher::new(2, 2, 6, 3, Cutting::Static).resume(2, &covered);
    assert!(early.is_err(), "coverage before the resumed epoch was accepted");
    Ok(())
}

/// Rank `r` reports it trained `c`, the oldest chunk it holds, and a reduce at once takes its
/// batches (and nothing of another rank) into the consensus: the chunk is completed. False
/// when the book refused the report.
fn train_and_reduce(d: &mut Dispatcher, r: usize, c: &Chunk) -> bool {
    if !d.complete(r, c, &work_of(c, d.batch_size), Instant::now()) {
        return false;
    }
    let mut steps = vec![0; d.world];
    steps[r] = c.batches(d.batch_size);
    d.add_reduce(0.0, &steps);
    true
}

/// The work of `c`'s batches as a rank reports it when the chunk is done.
fn work_of(c: &Chunk, bs: usize) -> WorkTally {
    WorkTally { batches: c.batches(bs), samples: c.len, ..Default::default() }
}

/// Hand-computed retirements: what the consensus holds of a dead rank's chunks stays done
/// and counts for it in the epoch's metrics; only the rest is handed out again.
#[test]
fn a_dead_ranks_reduced_batches_stay_done() -> TestResult {
    // (cutting, world, batch size, batches, chunks each rank takes first, reduces of one
    // step per rank, steps of a reduce in progress, the dead rank, re-queued chunks, the
    // dead rank's batches in the epoch's metrics)
    type Case = (Cutting, usize, usize, usize, usize, usize, usize, usize, Vec<Chunk>, usize);
    let c = |offset, len| Chunk { epoch: 0, offset, len };
    let progressive = Cutting::Progressive { min_chunk: 4 };
    let cases: [Case; 6] = [
        // Static shares of 10 batches of 2: rank 1 holds 20..40 and trained 4 into reduces.
        (Cutting::Static, 3, 2, 30, 1, 4, 0, 1, vec![c(28, 12)], 4),
        // ... and a fifth in a reduce its collective finished before it died.
        (Cutting::Static, 3, 2, 30, 1, 4, 1, 1, vec![c(30, 10)], 5),
        // Nothing reduced yet: the whole share goes back.
        (Cutting::Static, 3, 2, 30, 1, 0, 0, 1, vec![c(20, 20)], 0),
        // The whole share reduced: nothing goes back.
        (Cutting::Static, 3, 2, 30, 1, 10, 0, 2, vec![], 10),
        // Progressive probes of 80 / (2 × 10) = 4 batches, two per rank (rank 0: 0..4 and
        // 8..12): 6 steps reduced cover its first chunk and half its second.
        (progressive, 2, 1, 80, 2, 6, 0, 0, vec![c(10, 2)], 6),
        (progressive, 2, 1, 80, 2, 1, 0, 1, vec![c(5, 3), c(12, 4)], 1),
    ];
    for (i, (cutting, world, bs, batches, take, reduces, pending, dead, want, mine)) in
        cases.into_iter().enumerate()
    {
        let mut d = Dispatcher::new(world, bs, batches, 1, cutting);
        let counts = vec![4; world];
        for _ in 0..take {
            for r in 0..world {
                d.next_chunk(r, &counts, false, Instant::now())
                    .ok_or(format!("case {i}: no chunk"))?;
            }
        }
        for _ in 0..reduces {
            d.add_reduce(0.0, &vec![1; world]);
        }
        let requeued = d.retire(dead, pending, Instant::now());
        if requeued != want {
            return Err(format!("case {i}: re-queued {requeued:?}, want {want:?}").into());
        }
        // The living finish the epoch: every chunk they hold, then what they are handed.
        let mut held: Vec<Vec<Chunk>> = vec![Vec::new(); world];
        let live: Vec<usize> = (0..world).filter(|&r| r != dead).collect();
        for (r, h) in held.iter_mut().enumerate() {
            if r != dead {
                *h = d.pools[0].held[r].iter().map(|h| h.chunk).collect();
            }
        }
        let mut metrics = None;
        for _ in 0..10_000 {
            for &r in &live {
                if !held[r].is_empty() {
                    let c = held[r].remove(0);
                    train_and_reduce(&mut d, r, &c);
                } else if let Some(c) = d.next_chunk(r, &counts, true, Instant::now()) {
                    held[r].push(c);
                }
            }
            if let Some((e, tally, _)) = d.pop_complete() {
                metrics = Some(tally.finish(e, 1.0, &[]));
                break;
            }
        }
        let m = metrics.ok_or(format!("case {i}: the epoch did not complete"))?;
        if m.samples != batches * bs || m.ranks[dead].batches != mine {
            return Err(format!(
                "case {i}: {} samples, the dead rank {} batches (want {mine})",
                m.samples, m.ranks[dead].batches
            )
            .into());
        }
    }
    Ok(())
}

/// One batch a rank trained and no reduce has taken yet, in the reference model: its epoch,
/// first position, and the chunk (by hand-out number) it belongs to.
#[derive(Debug, Clone, Copy)]
struct Trained {
    epoch: usize,
    offset: usize,
    chunk: usize,
}

/// A batch's loss in the model runs: distinct per position and a whole number, so sums of
/// them are exact in any order.
fn loss_at(offset: usize, bs: usize) -> f64 {
    (1 + offset / bs) as f64
}

/// Random runs against a reference model of the consensus. Ranks train their chunks batch by
/// batch in the order handed and report each chunk when its last batch is trained; reduces at
/// random moments put what each live rank trained since its last one into the consensus;
/// ranks die at random moments (sometimes with their part of a reduce in progress done, and
/// often with chunks they reported but no reduce took) and join again. The reference keeps
/// which rank's training of each position the consensus holds. Checked: every position of
/// every epoch is in the consensus exactly once; an epoch completes only once nothing of it
/// is outstanding (handed, or trained and not reduced); each epoch's metrics count every
/// sample once, for the rank the consensus holds it from, and its mean loss is that of the
/// reported chunks wholly in the consensus (a lost report does not count); a reduce is
/// forecast to complete the run (`completes_the_run`) exactly when the run is done after it.
#[test]
fn the_consensus_holds_every_position_once() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(17);
    // Deaths that lost a reported chunk's batches, and joins: the cases reach both, often.
    let (mut lost_reports, mut joins) = (0usize, 0usize);
    // Runs whose last reduce was forecast as such.
    let mut last_reduces = 0usize;
    for case in 0..800 {
        let world = rng.random_range(2..6);
        let bs = rng.random_range(1..4);
        let batches = rng.random_range(world..50);
        let epochs = rng.random_range(1..4);
        let cutting = if case % 2 == 0 {
            Cutting::Static
        } else {
            Cutting::Progressive { min_chunk: rng.random_range(1..4) }
        };
        let counts: Vec<usize> = (0..world).map(|_| rng.random_range(1..6)).collect();
        let mut d = Dispatcher::new(world, bs, batches, epochs, cutting);
        // Per rank: chunks held in the order handed (with their hand-out number), the batches
        // trained of the first, and the batches trained since its last reduce.
        let mut queue: Vec<VecDeque<(Chunk, usize)>> = vec![VecDeque::new(); world];
        let mut trained = vec![0usize; world];
        let mut since: Vec<Vec<Trained>> = vec![Vec::new(); world];
        let mut dead = vec![false; world];
        // Per chunk handed: reported trained, and broken (a death lost some of its batches).
        let mut reported: Vec<bool> = Vec::new();
        let mut broken: Vec<bool> = Vec::new();
        // Per epoch and position: the ranks whose training of it the consensus holds, and the
        // chunk it came in.
        let mut held_by = vec![vec![Vec::<(usize, usize)>::new(); batches * bs]; epochs];
        let mut book = Vec::new();
        let reduce = |since: &mut [Vec<Trained>],
                      held_by: &mut [Vec<Vec<(usize, usize)>>],
                      only: Option<usize>| {
            let mut steps = vec![0; since.len()];
            for (r, s) in since.iter_mut().enumerate() {
                if only.is_some_and(|o| o != r) {
                    continue;
                }
                steps[r] = s.len();
                for t in s.drain(..) {
                    held_by[t.epoch][t.offset..t.offset + bs]
                        .iter_mut()
                        .for_each(|by| by.push((r, t.chunk)));
                }
            }
            steps
        };
        for _ in 0..200_000 {
            if d.all_done() {
                break;
            }
            let r = rng.random_range(0..world);
            let live = dead.iter().filter(|&&x| !x).count();
            // A reduce's forecast that it completes the run, checked once its epochs are out.
            let mut predicted = None;
            let roll = rng.random_range(0..1000);
            if dead[r] {
                if roll < 20 {
                    if !d.admit(r) {
                        return Err(format!("case {case}: rank {r} not admitted again").into());
                    }
                    dead[r] = false;
                    joins += 1;
                }
                continue;
            }
            if roll < 300 {
                if queue[r].len() < 2
                    && let Some(c) = d.next_chunk(r, &counts, case % 4 == 1, Instant::now())
                {
                    queue[r].push_back((c, reported.len()));
                    reported.push(false);
                    broken.push(false);
                }
            } else if roll < 900 {
                let Some(&(c, id)) = queue[r].front() else { continue };
                since[r].push(Trained {
                    epoch: c.epoch,
                    offset: c.offset + trained[r] * bs,
                    chunk: id,
                });
                trained[r] += 1;
                if trained[r] == c.batches(bs) {
                    queue[r].pop_front();
                    trained[r] = 0;
                    let loss_sum: f64 =
                        (0..c.batches(bs)).map(|b| loss_at(c.offset + b * bs, bs)).sum();
                    let work = WorkTally { loss_sum, ..work_of(&c, bs) };
                    if !d.complete(r, &c, &work, Instant::now()) {
                        return Err(format!("case {case}: {c:?} refused").into());
                    }
                    reported[id] = true;
                }
            } else if roll < 990 || live == 1 {
                let steps = reduce(&mut since, &mut held_by, None);
                predicted = Some(d.completes_the_run(&steps));
                d.add_reduce(0.0, &steps);
            } else {
                // A death; half the time its part of a reduce in progress was done.
                let pending = if rng.random_bool(0.5) {
                    reduce(&mut since, &mut held_by, Some(r))[r]
                } else {
                    0
                };
                let mut lost_report = false;
                for t in since[r].drain(..) {
                    lost_report |= reported[t.chunk];
                    broken[t.chunk] = true;
                }
                for &(_, id) in &queue[r] {
                    broken[id] = true;
                }
                lost_reports += usize::from(lost_report);
                d.retire(r, pending, Instant::now());
                dead[r] = true;
                // Its late report is refused.
                if let Some(&(c, _)) = queue[r].front()
                    && d.complete(r, &c, &work_of(&c, bs), Instant::now())
                {
                    return Err(format!("case {case}: a dead rank's report was taken").into());
                }
                queue[r].clear();
                trained[r] = 0;
            }
            while let Some((e, tally, _)) = d.pop_complete() {
                let open = since.iter().flatten().any(|t| t.epoch == e)
                    || queue.iter().flatten().any(|(c, _)| c.epoch == e);
                if open {
                    return Err(format!("case {case}: epoch {e} completed with work open").into());
                }
                book.push(tally.finish(e, 1.0, &[]));
            }
            if let Some(ends) = predicted {
                if ends != d.all_done() {
                    return Err(format!(
                        "case {case}: a reduce forecast to end the run {ends}, done {}",
                        d.all_done()
                    )
                    .into());
                }
                last_reduces += usize::from(ends);
            }
        }
        if !d.all_done() || since.iter().any(|s| !s.is_empty()) {
            return Err(
                format!("case {case}: the run did not finish, or left work unreduced").into()
            );
        }
        for (e, positions) in held_by.iter().enumerate() {
            if let Some(p) = positions.iter().position(|by| by.len() != 1) {
                return Err(format!(
                    "case {case} epoch {e} position {p}: in the consensus from {:?}",
                    positions[p]
                )
                .into());
            }
            let m = &book[e];
            for rank in 0..world {
                let mine = positions.iter().filter(|by| by[0].0 == rank).count();
                if m.ranks[rank].samples != mine {
                    return Err(format!(
                        "case {case} epoch {e}: rank {rank} counted {} samples, trained {mine}",
                        m.ranks[rank].samples
                    )
                    .into());
                }
            }
            // Batches whose chunk was reported and is wholly in the consensus: their losses.
            let (mut sum, mut n) = (0.0, 0usize);
            for (p, by) in positions.iter().enumerate().step_by(bs) {
                let id = by[0].1;
                if reported[id] && !broken[id] {
                    sum += loss_at(p, bs);
                    n += 1;
                }
            }
            let want = if n > 0 { sum / n as f64 } else { 0.0 };
            if m.samples != batches * bs || m.avg_loss != want {
                return Err(format!(
                    "case {case} epoch {e}: {} samples, loss {} (want {want})",
                    m.samples, m.avg_loss
                )
                .into());
            }
        }
    }
    if lost_reports < 100 || joins < 100 || last_reduces < 300 {
        return Err(format!(
            "{lost_reports} deaths lost a report, {joins} joins, {last_reduces} last reduces"
        )
        .into());
    }
    Ok(())
}

/// A chunk's share, against an f64 reference: a rank's part of what is left at its speed,
/// at most two of its windows, and no more than takes it to `T = (left + Σheld) / Σcounts` over
/// the live ranks (when all would finish together, counting what each holds untrained), each
/// within a batch's rounding; nothing for a rank that holds that much already; otherwise at
/// least `min_chunk` batches, or the rank's part of what is left when that is less.
#[test]
fn a_share_never_takes_a_rank_past_the_common_end() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0x5ea2e);
    for case in 0..20_000 {
        let world = rng.random_range(1..6);
        let counts: Vec<usize> = (0..world).map(|_| rng.random_range(1..120)).collect();
        let held: Vec<usize> = (0..world).map(|_| rng.random_range(0..400)).collect();
        let mut live: Vec<bool> = (0..world).map(|_| rng.random_bool(0.8)).collect();
        let rank = rng.random_range(0..world);
        live[rank] = true;
        let left = rng.random_range(1..3_000);
        let min_chunk = rng.random_range(1..9);
        let size = share(left, rank, &counts, &live, &held, min_chunk);
        let members = || (0..world).filter(|&r| live[r]);
        let speed: f64 = members().map(|r| counts[r] as f64).sum();
        let backlog = left as f64 + members().map(|r| held[r] as f64).sum::<f64>();
        let c = counts[rank] as f64;
        let to_end = c * backlog / speed - held[rank] as f64;
        let of_left = c * left as f64 / speed;
        let want = of_left.min(to_end).min(2.0 * c);
        // The floor: `min_chunk`, or the rank's whole part of what is left when less.
        let floor = (min_chunk as f64).min(of_left.ceil());
        let ctx = format!(
            "case {case}: counts {counts:?} held {held:?} live {live:?} rank {rank} left {left} \
             min chunk {min_chunk}: {size}, {want:.3} wanted, floor {floor}"
        );
        let ok = if to_end <= 1e-9 {
            size == 0
        } else {
            let size = size as f64;
            size >= want.max(floor) - 1e-9 && size <= (want + 1.0).max(floor) + 1e-9
        };
        if !ok {
            return Err(ctx.into());
        }
    }
    Ok(())
}

/// The run's end, as a trace of an 80 MB run showed it: the slow rank, done with its part of
/// an epoch while the fast rank still trains its own, asks twice into the last epoch. It takes
/// about its part of what is left counting the fast rank's unfinished work (its last batch
/// planned within a smallest chunk of when the fast rank's is), not two of its windows.
#[test]
fn a_slow_rank_asking_ahead_takes_only_its_part_of_the_end() -> TestResult {
    let (counts, min_chunk) = ([52, 20], 4);
    let mut d = Dispatcher::new(2, 1, 100, 2, Cutting::Progressive { min_chunk });
    let now = Instant::now();
    let fast = d.next_chunk(0, &counts, true, now).ok_or("no chunk for rank 0")?;
    // Rank 1 trains the rest of epoch 0, chunk by chunk; a reduce takes it in with all but 10
    // batches of rank 0's.
    let mut slow = 0;
    while d.pools.front().is_some_and(|p| !p.free.is_empty()) {
        let c = d.next_chunk(1, &counts, true, now).ok_or("no chunk for rank 1")?;
        if c.epoch != 0 || !d.complete(1, &c, &work_of(&c, 1), now) {
            return Err(
                format!("rank 1 handed {c:?} of epoch 0's rest, or its report refused").into()
            );
        }
        slow += c.len;
    }
    if fast.len + slow != 100 {
        return Err(format!("epoch 0 cut {} + {slow}", fast.len).into());
    }
    d.add_reduce(0.0, &[fast.len - 10, slow]);
    while d.pop_complete().is_some() {}
    if d.oldest() != 0 {
        return Err("epoch 0 completed with rank 0's work unfinished".into());
    }
    let mut taken = d.next_chunk(1, &counts, true, now).ok_or("no chunk ahead for rank 1")?.len;
    taken += d.next_chunk(1, &counts, true, now).map_or(0, |c| c.len);
    let mut fast_left = 10;
    while let Some(c) = d.next_chunk(0, &counts, true, now) {
        fast_left += c.len;
    }
    let (slow_end, fast_end) = (taken as f64 / 20.0, fast_left as f64 / 52.0);
    if slow_end > fast_end + (min_chunk + 1) as f64 / 20.0 {
        return Err(format!(
            "rank 1 took {taken} batches ({slow_end:.2} windows) of the last epoch, rank 0 is \
             left {fast_left} ({fast_end:.2} windows)"
        )
        .into());
    }
    Ok(())
}

/// What a peer has trained since the book last heard of it is not work it still holds: on
/// random holdings, a rank asking knowing each peer's unbooked batches gets the chunk it gets
/// from a book in which a reduce holds those batches.
#[test]
fn a_peers_unbooked_batches_are_not_counted_as_held() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0xb00c);
    let now = Instant::now();
    for case in 0..2_000 {
        let world = rng.random_range(2..5);
        let counts: Vec<usize> = (0..world).map(|_| rng.random_range(1..80)).collect();
        let cutting = Cutting::Progressive { min_chunk: rng.random_range(1..4) };
        let mut known = Dispatcher::new(world, 1, 600, 1, cutting);
        let mut told = Dispatcher::new(world, 1, 600, 1, cutting);
        for _ in 0..rng.random_range(0..6) {
            let r = rng.random_range(0..world);
            let a = known.next_chunk(r, &counts, true, now);
            if a != told.next_chunk(r, &counts, true, now) {
                return Err(format!("case {case}: the two books diverged").into());
            }
        }
        let held = known.untrained();
        let asking = rng.random_range(0..world);
        let trained: Vec<usize> = (0..world)
            .map(|r| if r == asking { 0 } else { rng.random_range(0..=held[r]) })
            .collect();
        let got = told.next_chunk_after(asking, &counts, true, &trained, now);
        known.add_reduce(0.0, &trained);
        let want = known.next_chunk(asking, &counts, true, now);
        if got != want {
            return Err(format!(
                "case {case}: counts {counts:?} held {held:?} trained {trained:?}: rank \
                 {asking} got {got:?}, {want:?} after a reduce"
            )
            .into());
        }
    }
    Ok(())
}
