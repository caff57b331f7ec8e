//! Putting the two lanes' frames back into send order.

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

/// What a lane's reader passes on.
#[derive(Debug)]
pub(crate) enum LaneEvent {
    /// A frame and its sequence number.
    Frame(u64, Bytes),
    /// The lane is over.
    Ended(Ending),
}

/// How a lane ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The peer closed it cleanly: every frame it sent on it has arrived.
    Closed,
    /// It failed (silence, reset, bad bytes); the reason is for the log.
    Failed(String),
}

/// Delivers frames to `app` in sequence order, pulling from the lane whose head is missing, until
/// both lanes are closed, one fails, a frame is missing, the user is gone or `cancel` fires.
/// Returns why it stopped, for the log.
pub(crate) async fn merge(
    lanes: [flume::Receiver<LaneEvent>; 2],
    app: flume::Sender<Bytes>,
    cancel: CancellationToken,
) -> String {
    let mut heads: [Option<(u64, Bytes)>; 2] = [None, None];
    let mut open = [true, true];
    let mut next: u64 = 0;
    let mut failed: Option<String> = None;
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
                (Some(reason), _) => reason,
                (None, true) => "both lanes closed".into(),
                (None, false) => format!("frame {next} never arrived"),
            };
        }
        let event = if let Some(reason) = failed.as_ref() {
            // After a failure, deliver only what has already arrived.
            let arrived = (0..2)
                .filter(|&i| wanted[i])
                .find_map(|i| lanes[i].try_recv().ok().map(|e| (i, Some(e))));
            match arrived {
                Some(event) => Some(event),
                None => return reason.clone(),
            }
        } else {
            match wanted {
                [true, false] => pull(0, &lanes[0], &cancel).await,
                [false, true] => pull(1, &lanes[1], &cancel).await,
                _ => tokio::select! {
                    biased;
                    _ = cancel.cancelled() => None,
                    e = lanes[0].recv_async() => Some((0, e.ok())),
                    e = lanes[1].recv_async() => Some((1, e.ok())),
                },
            }
        };
        match event {
            None => return "cancelled".into(),
            Some((i, Some(LaneEvent::Frame(seq, frame)))) => heads[i] = Some((seq, frame)),
            Some((i, Some(LaneEvent::Ended(Ending::Closed)) | None)) => open[i] = false,
            Some((i, Some(LaneEvent::Ended(Ending::Failed(reason))))) => {
                open[i] = false;
                failed.get_or_insert(format!("lane {i} failed: {reason}"));
            }
        }
    }
}

/// The next event of one lane (`Some((i, None))` when its reader is gone), or `None` on cancel.
async fn pull(
    i: usize,
    lane: &flume::Receiver<LaneEvent>,
    cancel: &CancellationToken,
) -> Option<(usize, Option<LaneEvent>)> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => None,
        e = lane.recv_async() => Some((i, e.ok())),
    }
}
