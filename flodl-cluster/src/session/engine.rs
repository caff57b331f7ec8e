//! The tasks that run a session over two byte streams: a writer and a reader per lane, the merge,
//! and a supervisor that ends them together.

use std::io::Cursor;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_util::codec::{Encoder, FramedRead};
use tokio_util::sync::CancellationToken;

use super::arrival::{Arrival, Watched};
use super::config::{Caps, Liveness};
use super::deadline::Deadline;
use super::ends::{Core, LaneTx, SendLanes, Session};
use super::lane::Lane;
use super::merge::{Ending, LaneEvent, merge};
use crate::wire::{DATA_HEADER, FrameDecoder, FrameError, Message, codec, data_header};

/// Frames queued per lane before `send` waits: many small ones, few large ones.
const SEND_QUEUE: [usize; 2] = [64, 2];
/// Frames a lane's reader holds ready for the merge.
const LANE_EVENTS: [usize; 2] = [16, 1];
/// Frames merged and waiting for the user's `recv`.
const RECV_QUEUE: usize = 16;
/// Frames up to this size are written with their header in one write (one TLS record); larger
/// ones are written after it, without a copy.
const SMALL_FRAME: usize = 16 * 1024;

/// One authenticated connection and the bytes its handshake read past the hello exchange.
#[derive(Debug)]
pub(crate) struct Conn<S> {
    pub(crate) stream: S,
    pub(crate) leftover: BytesMut,
}

/// What runs when a session has ended (the controller frees the rank's seat).
pub(crate) type OnEnd = Box<dyn FnOnce() + Send>;

/// Starts a session with the peer `rank` over its control and bulk connections, on `handle`.
pub(crate) fn start<S>(
    handle: &tokio::runtime::Handle,
    rank: usize,
    lanes: [Conn<S>; 2],
    caps: Caps,
    liveness: Liveness,
    on_end: Option<OnEnd>,
) -> Session
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let cancel = CancellationToken::new();
    let (done_tx, done_rx) = flume::bounded::<()>(1);
    let (app_tx, app_rx) = flume::bounded::<Bytes>(RECV_QUEUE);
    let _guard = handle.enter();
    let [control, bulk] = lanes;
    let arrival = Arrival::new();
    let watch = (caps, liveness, arrival.clone());
    let control = spawn_lane(handle, Lane::Control, control, watch.clone(), &cancel);
    let bulk = spawn_lane(handle, Lane::Bulk, bulk, watch, &cancel);
    let lanes = [control.events, bulk.events];
    let merged = handle.spawn(merge(lanes, app_tx, cancel.clone(), liveness.silence));
    handle.spawn(supervise(
        rank,
        [control.writer, bulk.writer],
        [control.reader, bulk.reader],
        merged,
        cancel.clone(),
        liveness.silence,
        on_end,
        done_tx,
    ));
    let core = Core {
        rank,
        done: done_rx,
        cancel,
        drain: liveness.silence,
        reactor: Mutex::new(None),
        handle: handle.clone(),
        arrival,
    };
    Session::assemble(
        SendLanes { lanes: [control.tx, bulk.tx], next_seq: Mutex::new(0), caps },
        app_rx,
        core,
    )
}

/// One lane's running tasks and the channels to them.
struct RunningLane {
    tx: LaneTx,
    events: flume::Receiver<LaneEvent>,
    writer: JoinHandle<Ending>,
    reader: JoinHandle<()>,
}

/// Starts the writer and the reader of one lane; the reader stamps `arrival` as a data frame's
/// bytes come in.
fn spawn_lane<S>(
    handle: &tokio::runtime::Handle,
    lane: Lane,
    conn: Conn<S>,
    (caps, liveness, arrival): (Caps, Liveness, Arc<Arrival>),
    cancel: &CancellationToken,
) -> RunningLane
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let i = lane.index();
    let (frames_tx, frames_rx) = flume::unbounded::<(u64, Vec<u8>)>();
    let (credit_tx, credit_rx) = flume::bounded::<()>(SEND_QUEUE[i]);
    for _ in 0..SEND_QUEUE[i] {
        let _ = credit_tx.try_send(());
    }
    let (event_tx, events) = flume::bounded::<LaneEvent>(LANE_EVENTS[i]);
    let (read_half, write_half) = tokio::io::split(Deadline::new(conn.stream, liveness.silence));
    let input = FramedRead::new(
        Cursor::new(conn.leftover).chain(read_half),
        Watched::new(FrameDecoder::new(caps.of(lane) + DATA_HEADER), arrival),
    );
    // Control messages are small: a whole one must arrive within the silence. Bulk frames may
    // take longer; there, bytes must keep coming.
    let message_deadline = (lane == Lane::Control).then_some(liveness.silence);
    let c = cancel.clone();
    let writer = handle.spawn(async move {
        tokio::select! {
            biased;
            _ = c.cancelled() => Ending::Failed("cancelled".into()),
            ending = write_lane(write_half, frames_rx, credit_tx, liveness.heartbeat) => ending,
        }
    });
    let c = cancel.clone();
    let reader = handle.spawn(async move {
        tokio::select! {
            biased;
            _ = c.cancelled() => {}
            _ = read_lane(input, event_tx, message_deadline) => {}
        }
    });
    RunningLane { tx: LaneTx { frames: frames_tx, credits: credit_rx }, events, writer, reader }
}

/// Writes queued frames, and a heartbeat whenever the lane has been quiet for `heartbeat`; when
/// the user's side is gone, flushes, closes the stream (TLS close_notify) and returns `Closed`.
async fn write_lane<W: AsyncWrite + Unpin>(
    mut out: W,
    frames: flume::Receiver<(u64, Vec<u8>)>,
    credits: flume::Sender<()>,
    heartbeat: Duration,
) -> Ending {
    let mut beat = BytesMut::new();
    if let Err(e) = codec(1).encode(Message::Heartbeat.encode(), &mut beat) {
        return Ending::Failed(format!("cannot frame a heartbeat: {e}"));
    }
    let beat = beat.freeze();
    loop {
        let written = match tokio::time::timeout(heartbeat, frames.recv_async()).await {
            Err(_quiet) => {
                async {
                    out.write_all(&beat).await?;
                    out.flush().await
                }
                .await
            }
            Ok(Ok((seq, frame))) => {
                // The frame has left the queue: its slot is free again.
                let _ = credits.try_send(());
                let Some(header) = data_header(seq, frame.len()) else {
                    return Ending::Failed(format!(
                        "a frame of {} bytes does not fit the wire",
                        frame.len()
                    ));
                };
                async {
                    if frame.len() <= SMALL_FRAME {
                        let mut message = Vec::with_capacity(header.len() + frame.len());
                        message.extend_from_slice(&header);
                        message.extend_from_slice(&frame);
                        out.write_all(&message).await?;
                    } else {
                        out.write_all(&header).await?;
                        out.write_all(&frame).await?;
                    }
                    if frames.is_empty() { out.flush().await } else { Ok(()) }
                }
                .await
            }
            Ok(Err(_closed)) => {
                return match async {
                    out.flush().await?;
                    out.shutdown().await
                }
                .await
                {
                    Ok(()) => Ending::Closed,
                    Err(e) => Ending::Failed(e.to_string()),
                };
            }
        };
        if let Err(e) = written {
            return Ending::Failed(e.to_string());
        }
    }
}

/// Reads messages, passes frames on in order and swallows heartbeats, until the lane closes or
/// fails; the last event says which.
async fn read_lane<R, D>(
    mut input: FramedRead<R, D>,
    out: flume::Sender<LaneEvent>,
    message_deadline: Option<Duration>,
) where
    R: AsyncRead + Unpin,
    D: tokio_util::codec::Decoder<Item = BytesMut, Error = FrameError>,
{
    let mut last: Option<u64> = None;
    let ending = loop {
        let next = match message_deadline {
            Some(limit) => match tokio::time::timeout(limit, input.next()).await {
                Ok(next) => next,
                Err(_) => break Ending::Failed(format!("no message for {limit:?}")),
            },
            None => input.next().await,
        };
        let bytes = match next {
            None => break Ending::Closed,
            Some(Err(e @ FrameError::TooLarge { seq: Some(seq), .. }))
                if last.is_none_or(|l| seq > l) =>
            {
                let _ = out.send_async(LaneEvent::Refused { seq, reason: e.to_string() }).await;
                return;
            }
            Some(Err(e)) => break Ending::Failed(e.to_string()),
            Some(Ok(bytes)) => bytes,
        };
        match Message::decode(bytes) {
            Ok(Message::Heartbeat) => {}
            Ok(Message::Data { seq, frame }) => {
                // The frame shares its allocation with the read buffer's tail. Once the user has
                // dropped it, the buffer is the allocation's only owner and reads the next frames
                // into the same pages (`BytesMut::reserve` reclaims it): no fresh allocation and
                // no page faults per large frame. Where the user still holds it, the buffer grows
                // a new one as before.
                if last.is_some_and(|l| seq <= l) {
                    break Ending::Failed(format!("frame {seq} after frame {}", last.unwrap_or(0)));
                }
                last = Some(seq);
                if out.send_async(LaneEvent::Frame(seq, frame)).await.is_err() {
                    return;
                }
            }
            Ok(other) => break Ending::Failed(format!("an unexpected message: {other:?}")),
            Err(e) => break Ending::Failed(e.to_string()),
        }
    };
    let _ = out.send_async(LaneEvent::Ended(ending)).await;
}

/// Ends the session's tasks together: when the merge stops (the peer is gone) or a writer fails,
/// at once; when the user has closed both writers, after the merge or the silence.
#[allow(clippy::too_many_arguments)]
async fn supervise(
    rank: usize,
    mut writers: [JoinHandle<Ending>; 2],
    readers: [JoinHandle<()>; 2],
    mut merged: JoinHandle<String>,
    cancel: CancellationToken,
    silence: Duration,
    on_end: Option<OnEnd>,
    done: flume::Sender<()>,
) {
    // A writer is finished once its handle has returned (a handle is awaited at most once).
    let mut finished = [false, false];
    let mut closed = [false, false];
    let why = loop {
        if closed == [true, true] {
            break match tokio::time::timeout(silence, &mut merged).await {
                Ok(Ok(why)) => why,
                Ok(Err(e)) => format!("the merge task failed: {e}"),
                Err(_) => "closed by this side".into(),
            };
        }
        let [w0, w1] = &mut writers;
        let (i, result) = tokio::select! {
            m = &mut merged => break m.unwrap_or_else(|e| format!("the merge task failed: {e}")),
            w = w0, if !finished[0] => (0, w),
            w = w1, if !finished[1] => (1, w),
        };
        finished[i] = true;
        match result {
            Ok(Ending::Closed) => closed[i] = true,
            Ok(Ending::Failed(e)) => break format!("writing the {} lane: {e}", Lane::BOTH[i]),
            Err(e) => break format!("the {} writer failed: {e}", Lane::BOTH[i]),
        }
    };
    cancel.cancel();
    for (i, writer) in writers.into_iter().enumerate() {
        if !finished[i] {
            let _ = writer.await;
        }
    }
    for reader in readers {
        let _ = reader.await;
    }
    if !merged.is_finished() {
        let _ = merged.await;
    }
    tracing::debug!(rank, "session ended: {why}");
    if let Some(on_end) = on_end {
        on_end();
    }
    drop(done);
}

impl Session {
    /// A session over two already-authenticated byte streams (the control lane and the bulk
    /// lane), run on the current tokio runtime: the transport without TLS or hello, for tests
    /// over in-memory pipes or a network simulator. `rank` is the peer's rank.
    pub fn over<S>(
        rank: usize,
        control: S,
        bulk: S,
        caps: Caps,
        liveness: Liveness,
    ) -> Result<Session, crate::NetError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        super::config::check(caps, liveness)?;
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|e| crate::NetError::Runtime(e.to_string()))?;
        let lanes = [control, bulk].map(|stream| Conn { stream, leftover: BytesMut::new() });
        Ok(start(&handle, rank, lanes, caps, liveness, None))
    }
}
