//! Putting the two lanes' frames back into send order.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a lane's reader passes on.
#[derive(Debug)]
pub(crate) enum LaneEvent {
    /// A frame and its sequence number.
    Frame(u64, Bytes),
    /// The lane is over.
    Ended(Ending),
    /// The peer sent frame `seq`, which this side refuses (`reason`): the lane is over, and every
    /// frame the peer sent before it has a smaller sequence number.
    Refused { seq: u64, reason: String },
}

/// How a lane ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The peer closed it cleanly: every frame it sent on it has arrived.
    Closed,
    /// It failed (silence, reset, bad bytes); the reason is for the log.
    Failed(String),
}

/// Why the merge is winding down after a lane failed.
struct Failure {
    /// What failed, for the log.
    reason: String,
    /// The frame the failed lane refused, when it knows it: the frames before it are still owed,
    /// on the other lane, until `deadline`.
    refused: Option<u64>,
    deadline: Instant,
}

/// Delivers frames to `app` in sequence order, pulling from the lane whose head is missing, until
/// both lanes are closed, one fails, a frame is missing, the user is gone or `cancel` fires.
/// After a lane fails, it delivers what has already arrived; after it refuses a frame, it waits
/// up to `grace` for the frames sent before that one. Returns why it stopped, for the log.
pub(crate) async fn merge(
    lanes: [flume::Receiver<LaneEvent>; 2],
    app: flume::Sender<Bytes>,
    cancel: CancellationToken,
    grace: Duration,
) -> String {
    let mut heads: [Option<(u64, Bytes)>; 2] = [None, None];
    let mut open = [true, true];
    let mut next: u64 = 0;
    let mut failed: Option<Failure> = None;
    loop {
        // Deliver the head that is next in order, if either is.
        if let Some(i) = (0..2).find(|&i| heads[i].as_ref().is_some_and(|(seq, _)| *seq == next)) {
            let Some((_, frame)) = heads[i].take() else { continue };
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return "cancelled".into(),
                sent = app.send_async(frame) => if sent.is_err() { return "the user closed the session".into() },
            }
            next += 1;
            continue;
        }
        if let Some((seq, _)) = heads.iter().flatten().find(|(seq, _)| *seq < next) {
            return format!("frame {seq} arrived twice");
        }
        // Frame `next` can only be on a lane that is open and whose head is not past it.
        let wanted = [open[0] && heads[0].is_none(), open[1] && heads[1].is_none()];
        if wanted == [false, false] {
            return match (failed, heads.iter().all(Option::is_none)) {
                (Some(failure), _) => failure.reason,
                (None, true) => "both lanes closed".into(),
                (None, false) => format!("frame {next} never arrived"),
            };
        }
        let event = match &failed {
            None => pull(wanted, &lanes, &cancel).await,
            Some(Failure { reason, refused: Some(refused), deadline }) if next < *refused => {
                match tokio::time::timeout_at(*deadline, pull(wanted, &lanes, &cancel)).await {
                    Ok(event) => event,
                    Err(_) => return format!("{reason}; frame {next}, sent before it, never came"),
                }
            }
            Some(Failure { reason, .. }) => {
                // Only what has already arrived.
                let arrived = (0..2)
                    .filter(|&i| wanted[i])
                    .find_map(|i| lanes[i].try_recv().ok().map(|e| (i, Some(e))));
                match arrived {
                    Some(event) => Some(event),
                    None => return reason.clone(),
                }
            }
        };
        let (i, failure) = match event {
            None => return "cancelled".into(),
            Some((i, Some(LaneEvent::Frame(seq, frame)))) => {
                heads[i] = Some((seq, frame));
                continue;
            }
            Some((i, Some(LaneEvent::Ended(Ending::Closed)) | None)) => {
                open[i] = false;
                continue;
            }
            Some((i, Some(LaneEvent::Ended(Ending::Failed(reason))))) => (i, (reason, None)),
            Some((i, Some(LaneEvent::Refused { seq, reason }))) => (i, (reason, Some(seq))),
        };
        open[i] = false;
        let (reason, refused) = failure;
        failed.get_or_insert(Failure {
            reason: format!("lane {i} failed: {reason}"),
            refused,
            deadline: Instant::now() + grace,
        });
    }
}

/// The next event of a `wanted` lane (`Some((i, None))` when lane `i`'s reader is gone), or
/// `None` on cancel.
async fn pull(
    wanted: [bool; 2],
    lanes: &[flume::Receiver<LaneEvent>; 2],
    cancel: &CancellationToken,
) -> Option<(usize, Option<LaneEvent>)> {
    match wanted {
        [true, false] | [false, true] => {
            let i = usize::from(wanted[1]);
            tokio::select! {
                biased;
                _ = cancel.cancelled() => None,
                e = lanes[i].recv_async() => Some((i, e.ok())),
            }
        }
        _ => tokio::select! {
            biased;
            _ = cancel.cancelled() => None,
            e = lanes[0].recv_async() => Some((0, e.ok())),
            e = lanes[1].recv_async() => Some((1, e.ok())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted lane: events, each sent this many milliseconds after the one before.
    type Script = Vec<(u64, LaneEvent)>;

    fn frame(seq: u64) -> LaneEvent {
        LaneEvent::Frame(seq, Bytes::from(seq.to_le_bytes().to_vec()))
    }

    /// Runs the merge over two scripted lanes (each held open after its script) with `grace`;
    /// returns the sequence numbers delivered and why it stopped.
    fn run(scripts: [Script; 2], grace: Duration) -> Result<(Vec<u64>, String), String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let (app_tx, app_rx) = flume::bounded::<Bytes>(64);
            let mut lanes = Vec::new();
            for script in scripts {
                let (tx, rx) = flume::bounded::<LaneEvent>(1);
                lanes.push(rx);
                tokio::spawn(async move {
                    for (after, event) in script {
                        tokio::time::sleep(Duration::from_millis(after)).await;
                        if tx.send_async(event).await.is_err() {
                            return;
                        }
                    }
                    tokio::time::sleep(Duration::from_secs(60)).await;
                });
            }
            let lanes: [flume::Receiver<LaneEvent>; 2] =
                lanes.try_into().map_err(|_| "two lanes".to_string())?;
            let why = tokio::time::timeout(
                Duration::from_secs(10),
                merge(lanes, app_tx, CancellationToken::new(), grace),
            )
            .await
            .map_err(|_| "the merge did not stop within 10 s".to_string())?;
            let delivered =
                app_rx.drain().map(|b| b.first().map_or(u64::MAX, |&s| u64::from(s))).collect();
            Ok((delivered, why))
        })
    }

    #[test]
    fn frames_are_delivered_in_order_up_to_where_a_lane_ends() -> Result<(), String> {
        let refused = |seq| LaneEvent::Refused { seq, reason: "too large".into() };
        let failed = || LaneEvent::Ended(Ending::Failed("reset".into()));
        let closed = || LaneEvent::Ended(Ending::Closed);
        let grace = Duration::from_millis(300);
        /// A case: its name, the two lanes' scripts, the frames delivered, words of the reason.
        type Case = (&'static str, [Script; 2], Vec<u64>, &'static str);
        let cases: Vec<Case> = vec![
            (
                "alternating lanes, both closed",
                [
                    vec![(0, frame(0)), (5, frame(2)), (0, closed())],
                    vec![(2, frame(1)), (0, closed())],
                ],
                vec![0, 1, 2],
                "both lanes closed",
            ),
            (
                "a frame sent before a refused one arrives after the refusal",
                [vec![(100, frame(0)), (5, frame(2))], vec![(0, refused(1))]],
                vec![0],
                "too large",
            ),
            (
                "a frame owed by a refused one never comes",
                [vec![(10, frame(0))], vec![(0, refused(2))]],
                vec![0],
                "frame 1, sent before it, never came",
            ),
            (
                "after a failure naming no frame, only what has arrived",
                [vec![(1000, frame(0))], vec![(0, failed())]],
                vec![],
                "reset",
            ),
            (
                "a frame missing between two closed lanes",
                [vec![(0, frame(0)), (0, closed())], vec![(0, frame(2)), (0, closed())]],
                vec![0],
                "frame 1 never arrived",
            ),
        ];
        for (name, scripts, want, words) in cases {
            let (got, why) = run(scripts, grace)?;
            if got != want || !why.contains(words) {
                return Err(format!(
                    "{name}: delivered {got:?} ({why}), expected {want:?} and '{words}'"
                ));
            }
        }
        Ok(())
    }
}
