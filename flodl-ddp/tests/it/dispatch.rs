//! The runtime's dispatcher against hand-computed chunk sizes, and a simulated coordinator that
//! drives it: random ranks, skews, completion orders, reduces, deaths and checkpoints through
//! the bundle format; every sample is trained exactly once per epoch.

use std::collections::VecDeque;
use std::time::Instant;

use flodl_ddp::checkpoint::{Checkpoint, ConfigHash, TensorRecord, TensorSet};
use flodl_ddp::{Chunk, Cutting, Dispatcher, ElChe, Verdict, WorkTally};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::common::TestResult;

/// What a rank reports for a finished chunk.
fn work(c: &Chunk, bs: usize) -> WorkTally {
    WorkTally { batches: c.batches(bs), samples: c.len, ..Default::default() }
}

#[test]
fn epochs_complete_in_order_and_ranks_stream_one_epoch_ahead() -> TestResult {
    // 3 epochs of 4 batches of 2, two ranks, chunks of at least 4 batches.
    let mut d = Dispatcher::new(2, 2, 4, 3, Cutting::Progressive { min_chunk: 4 });
    let a = d.next_chunk(0, &[1, 1], false, Instant::now()).ok_or("no chunk")?;
    assert_eq!(a, Chunk { epoch: 0, offset: 0, len: 8 });
    // Epoch 0 is handed out: rank 1 streams into epoch 1, and no further.
    let b = d.next_chunk(1, &[1, 1], false, Instant::now()).ok_or("no chunk")?;
    assert_eq!(b, Chunk { epoch: 1, offset: 0, len: 8 });
    assert_eq!(d.next_chunk(1, &[1, 1], false, Instant::now()), None);
    // Epoch 1 is trained and reduced first but is only popped after epoch 0; a chunk completes
    // only when a reduce holds all of it.
    assert!(d.complete(1, &b, &work(&b, 2), Instant::now()));
    assert!(d.pop_complete().is_none());
    d.add_reduce(0.0, &[0, 4]);
    assert!(d.pop_complete().is_none());
    assert!(
        !d.complete(1, &a, &work(&a, 2), Instant::now()),
        "a chunk another rank holds was credited"
    );
    assert!(d.complete(0, &a, &work(&a, 2), Instant::now()));
    assert!(d.pop_complete().is_none(), "an epoch completed before a reduce held it");
    d.add_reduce(0.0, &[4, 0]);
    let popped: Vec<usize> = std::iter::from_fn(|| d.pop_complete().map(|p| p.0)).collect();
    assert_eq!(popped, [0, 1]);
    assert_eq!(d.oldest(), 2);
    assert!(d.in_last_epoch() && !d.all_done());
    // A rank outside the world, or retired, is handed nothing.
    assert_eq!(d.next_chunk(2, &[1, 1], false, Instant::now()), None);
    assert!(d.retire(1, 0, Instant::now()).is_empty());
    assert_eq!(d.next_chunk(1, &[1, 1], false, Instant::now()), None);
    let c = d.next_chunk(0, &[1, 1], false, Instant::now()).ok_or("no chunk")?;
    assert_eq!(c, Chunk { epoch: 2, offset: 0, len: 8 });
    Ok(())
}

#[test]
fn chunk_sizes_follow_the_documented_rule() -> TestResult {
    // (world, batches, min chunk, counts, calibrated, batches taken first by rank 1 in probes
    // of max(min chunk, batches / 20), the batches of rank 0's next chunk)
    type Case = (usize, usize, usize, &'static [usize], bool, usize, usize);
    let cases: [Case; 7] = [
        // Uncalibrated probe: 800 / (2 × 10) = 40.
        (2, 800, 4, &[10, 10], false, 0, 40),
        // 64 / 20 = 3: the 4-batch floor.
        (2, 64, 4, &[10, 10], false, 0, 4),
        // Never more than is left.
        (2, 2, 4, &[10, 10], false, 0, 2),
        // Calibrated 25:10: ceil(800 × 25 / 35) = 572, capped at two windows (50).
        (2, 800, 4, &[25, 10], true, 0, 50),
        // 10 left: ceil(10 × 25 / 35) = 8 (under two windows).
        (2, 40, 1, &[25, 10], true, 30, 8),
        // 2 left: ceil(2 × 25 / 35) = 2.
        (2, 32, 1, &[25, 10], true, 30, 2),
        // 2 left: ceil(2 × 25 / 35) = 2, floor 4, but only 2 are left.
        (2, 34, 4, &[25, 10], true, 32, 2),
    ];
    for (i, &(world, batches, min_chunk, counts, calibrated, first, want)) in
        cases.iter().enumerate()
    {
        let bs = 8;
        let mut d = Dispatcher::new(world, bs, batches, 1, Cutting::Progressive { min_chunk });
        let mut taken = 0;
        while taken < first {
            let c = d.next_chunk(1, &[1, 1], false, Instant::now()).ok_or("no chunk")?;
            taken += c.batches(bs);
        }
        assert_eq!(taken, first, "case {i}: rank 1 took {taken}");
        let c = d.next_chunk(0, counts, calibrated, Instant::now()).ok_or("no chunk")?;
        assert_eq!(c.batches(bs), want, "case {i}: {c:?}");
    }
    // The static cut: one share per rank, equal batches, the first ranks one more.
    let mut d = Dispatcher::new(3, 2, 10, 1, Cutting::Static);
    let shares: Vec<Chunk> =
        (0..3).filter_map(|r| d.next_chunk(r, &[1; 3], false, Instant::now())).collect();
    let want = [(0, 8), (8, 6), (14, 6)].map(|(offset, len)| Chunk { epoch: 0, offset, len });
    assert_eq!(shares, want);
    Ok(())
}

/// One simulated run.
struct Run {
    world: usize,
    epochs: usize,
    batches: usize,
    bs: usize,
    cutting: Cutting,
    speeds: Vec<f64>,
    deaths: bool,
    checkpoint: bool,
}

/// A rank of the simulation: the chunks handed to it that the consensus does not hold all of,
/// in order, with their finish times; how many of them it has trained (and reported); and how
/// many batches from the front of them the consensus holds.
#[derive(Default)]
struct SimRank {
    handed: VecDeque<(Chunk, f64)>,
    trained: usize,
    reduced: usize,
    free_at: f64,
    alive: bool,
}

impl SimRank {
    /// Batches of its reported chunks.
    fn trained_batches(&self, bs: usize) -> usize {
        self.handed.iter().take(self.trained).map(|(c, _)| c.batches(bs)).sum()
    }

    /// The consensus now holds `to` batches from the front of its handed chunks (from
    /// `self.reduced`): marks those positions seen and drops the chunks held whole.
    fn reduce_to(&mut self, to: usize, bs: usize, seen: &mut [Vec<u32>]) {
        let mut skip = self.reduced;
        let mut left = to - self.reduced;
        for (c, _) in &self.handed {
            let n = c.batches(bs);
            if skip >= n {
                skip -= n;
                continue;
            }
            let take = left.min(n - skip);
            see(seen, c.epoch, c.offset + skip * bs, (c.offset + (skip + take) * bs).min(c.end()));
            left -= take;
            skip = 0;
            if left == 0 {
                break;
            }
        }
        self.reduced = to;
        while let Some((c, _)) = self.handed.front() {
            let n = c.batches(bs);
            if self.reduced < n || self.trained == 0 {
                break;
            }
            self.reduced -= n;
            self.trained -= 1;
            self.handed.pop_front();
        }
    }
}

/// Counts `seen[epoch][from..to]` once more; a position seen twice fails the test.
fn see(seen: &mut [Vec<u32>], epoch: usize, from: usize, to: usize) {
    for (p, n) in seen[epoch].iter_mut().enumerate().take(to).skip(from) {
        *n += 1;
        assert_eq!(*n, 1, "epoch {epoch} position {p} trained twice");
    }
}

/// A checkpoint of the dispatcher's coverage through the bundle format, and a book resumed
/// from it.
fn through_a_bundle(
    d: &Dispatcher,
    run: &Run,
    seed: u64,
) -> Result<Dispatcher, Box<dyn std::error::Error>> {
    let params = TensorSet::from_records(vec![TensorRecord::from_f32("w", vec![1], &[1.0])?])?;
    let mut ckpt = Checkpoint::new(params, run.world, ConfigHash::of("dispatch"));
    ckpt.epoch = d.oldest() as u64;
    ckpt.coverage = d.coverage(&[], seed)?;
    let back = Checkpoint::from_bytes(&ckpt.to_bytes()?)?;
    if back.coverage != ckpt.coverage {
        return Err("the coverage changed in the bundle".into());
    }
    let oldest = usize::try_from(back.epoch)?;
    let fresh = Dispatcher::new(run.world, run.bs, run.batches, run.epochs, run.cutting);
    Ok(fresh.resume(oldest, &back.coverage)?)
}

/// Runs `run`; returns how many times each (epoch, position) was trained into the book (by a
/// completed chunk, or the part of a dead rank's chunk the consensus holds).
fn simulate(
    run: &Run,
    rng: &mut Xoshiro256PlusPlus,
) -> Result<Vec<Vec<u32>>, Box<dyn std::error::Error>> {
    let (w, bs) = (run.world, run.bs);
    let mut d = Dispatcher::new(w, bs, run.batches, run.epochs, run.cutting);
    let mut elche = ElChe::new(w, 4)?;
    let mut seen = vec![vec![0u32; run.batches * bs]; run.epochs];
    let mut ranks: Vec<SimRank> =
        (0..w).map(|_| SimRank { alive: true, ..SimRank::default() }).collect();
    let (mut wall, mut steps) = (vec![0.0; w], vec![0u64; w]);
    let mut next_epoch = 0;
    let mut checkpointed = false;
    for _ in 0..200_000 {
        if d.all_done() {
            return Ok(seen);
        }
        // Keep every live rank fed with up to two untrained chunks.
        for (r, rank) in ranks.iter_mut().enumerate().filter(|(_, k)| k.alive) {
            while rank.handed.len() - rank.trained < 2 {
                let oldest = d.oldest();
                let informed = elche.is_calibrated();
                let Some(c) = d.next_chunk(r, elche.counts(), informed, Instant::now()) else {
                    break;
                };
                assert!(c.epoch <= oldest + 1, "chunk past the next epoch");
                let cost: f64 = (0..c.batches(bs))
                    .map(|_| run.speeds[r] * (1.0 + rng.random_range(-0.2..0.2)))
                    .sum();
                let start = rank.handed.back().map_or(rank.free_at, |&(_, t)| t);
                rank.handed.push_back((c, start + cost));
            }
        }
        // Complete the earliest untrained chunk (random order among near-ties); with none in
        // flight, only a reduce can move the run on.
        let next = (0..w)
            .filter_map(|r| {
                let k = &ranks[r];
                k.handed.get(k.trained).map(|&(_, t)| (r, t + rng.random_range(0.0..0.5)))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let unreduced = ranks.iter().any(|k| k.alive && k.trained_batches(bs) > k.reduced);
        if let Some((r, _)) = next {
            let rank = &mut ranks[r];
            let (c, t) = rank.handed[rank.trained];
            if !d.complete(r, &c, &work(&c, bs), Instant::now()) {
                return Err(format!("{c:?} of rank {r} refused").into());
            }
            rank.trained += 1;
            rank.free_at = t;
            wall[r] += run.speeds[r] * c.batches(bs) as f64;
            steps[r] += c.batches(bs) as u64;
        } else if !unreduced {
            return Err("no work in flight but the run is unfinished".into());
        }
        // A reduce now and then (always when nothing is in flight): every live rank's batches
        // since its last one, part of the chunk it is training included; it feeds ElChe.
        if next.is_none() || rng.random_bool(0.3) {
            let mut reduced = vec![0; w];
            for (r, rank) in ranks.iter_mut().enumerate().filter(|(_, k)| k.alive) {
                let done = rank.trained_batches(bs);
                let front = rank.handed.get(rank.trained).map_or(0, |(c, _)| c.batches(bs));
                let low = rank.reduced.max(done);
                let to = rng.random_range(low..=(done + front).max(low));
                reduced[r] = to - rank.reduced;
                rank.reduce_to(to, bs, &mut seen);
            }
            d.add_reduce(1.0, &reduced);
            if steps.iter().zip(&ranks).all(|(&s, k)| !k.alive || s > 0) {
                elche.report_timing(&wall, &steps, 1.0)?;
                elche.apply_verdict(Verdict::Stable);
                wall.iter_mut().for_each(|x| *x = 0.0);
                steps.iter_mut().for_each(|x| *x = 0);
            }
        }
        while let Some((epoch, _, _)) = d.pop_complete() {
            assert_eq!(epoch, next_epoch, "epochs complete in order");
            next_epoch += 1;
        }
        // A death: what the consensus holds stays; everything else handed to it, trained or
        // not, goes back.
        let live = ranks.iter().filter(|k| k.alive).count();
        if run.deaths && live > 1 && rng.random_bool(0.01) {
            let victim = (0..w)
                .filter(|&r| ranks[r].alive)
                .nth(rng.random_range(0..live))
                .ok_or("no rank")?;
            let rank = &mut ranks[victim];
            let requeued = d.retire(victim, 0, Instant::now());
            let handed: Vec<Chunk> = rank.handed.drain(..).map(|(c, _)| c).collect();
            let back: usize = requeued.iter().map(|c| c.len).sum();
            let held_len: usize = handed.iter().map(|c| c.len).sum();
            // The consensus holds whole batches from the front; the last chunk may end short.
            let mut kept = 0;
            let mut left = rank.reduced;
            for c in &handed {
                let n = c.batches(bs).min(left);
                kept += (n * bs).min(c.len);
                left -= n;
            }
            assert_eq!(back, held_len - kept, "re-queued {requeued:?} of {handed:?}");
            rank.alive = false;
            rank.trained = 0;
            rank.reduced = 0;
            elche.retire(victim)?;
        }
        // A checkpoint at a quiet moment: through a bundle, resume, carry on.
        if run.checkpoint && !checkpointed && ranks.iter().all(|k| k.handed.is_empty()) {
            d = through_a_bundle(&d, run, rng.random())?;
            for (r, rank) in ranks.iter().enumerate() {
                if !rank.alive {
                    d.retire(r, 0, Instant::now());
                }
            }
            checkpointed = true;
        }
    }
    Err("simulation did not finish".into())
}

#[test]
fn every_sample_exactly_once_per_epoch_under_skew() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(2026);
    for case in 0..150 {
        let world = rng.random_range(1..9usize);
        let batches = rng.random_range(world..200);
        let run = Run {
            world,
            epochs: rng.random_range(1..4),
            batches,
            bs: rng.random_range(1..17),
            cutting: if rng.random_bool(0.5) {
                Cutting::Static
            } else {
                Cutting::Progressive { min_chunk: rng.random_range(1..6) }
            },
            speeds: (0..world).map(|_| rng.random_range(1.0..8.0)).collect(),
            deaths: rng.random_bool(0.5),
            checkpoint: rng.random_bool(0.5),
        };
        let seen = simulate(&run, &mut rng)?;
        for (e, epoch) in seen.iter().enumerate() {
            if let Some(p) = epoch.iter().position(|&n| n != 1) {
                return Err(format!("case {case} epoch {e} position {p}: {}", epoch[p]).into());
            }
        }
    }
    Ok(())
}
