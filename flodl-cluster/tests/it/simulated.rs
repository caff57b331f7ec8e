//! The session under simulated latency, a hold and a partition (turmoil, deterministic).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flodl_cluster::{Caps, Lane, Liveness, NetError, Session};
use tokio::time::Instant;
use turmoil::net::{TcpListener, TcpStream};

use crate::support::TestResult;

const PORT: u16 = 7100;
const CAPS: Caps = Caps { control: 4096, bulk: 1 << 20 };
const LIVENESS: Liveness =
    Liveness { heartbeat: Duration::from_millis(200), silence: Duration::from_secs(2) };
const WAIT: Duration = Duration::from_secs(10);

/// The i-th frame: its lane is its first byte; bulk ones are large.
fn frame(i: u32) -> (Lane, Vec<u8>) {
    let lane = if i.is_multiple_of(3) { Lane::Bulk } else { Lane::Control };
    let len = if lane == Lane::Bulk { 64 * 1024 } else { 16 };
    let mut bytes = vec![(i % 200) as u8; len];
    bytes[0] = lane.index() as u8;
    bytes[1..5].copy_from_slice(&i.to_le_bytes());
    (lane, bytes)
}

#[test]
fn order_survives_latency_and_a_hold_and_a_partition_ends_both_sides() -> TestResult {
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(60))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(40))
        .rng_seed(14)
        .build();
    let controller_end: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let report = controller_end.clone();
    sim.host("controller", move || {
        let report = report.clone();
        async move {
            let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
            let (control, _) = listener.accept().await?;
            let (bulk, _) = listener.accept().await?;
            let session = Session::over(0, control, bulk, CAPS, LIVENESS)?;
            // Echo every frame on the lane it names, until the session ends.
            let end = loop {
                match session.recv_async(Duration::from_secs(30)).await {
                    Ok(frame) => {
                        let lane =
                            if frame.first() == Some(&1) { Lane::Bulk } else { Lane::Control };
                        if let Err(e) = session.send_async(lane, frame, WAIT).await {
                            break format!("send: {e}");
                        }
                    }
                    Err(e) => break e.to_string(),
                }
            };
            *report.lock().unwrap_or_else(|p| p.into_inner()) = Some(end);
            Ok(())
        }
    });
    sim.client("rank", async move {
        let control = TcpStream::connect(("controller", PORT)).await?;
        let bulk = TcpStream::connect(("controller", PORT)).await?;
        let session = Session::over(0, control, bulk, CAPS, LIVENESS)?;
        // Under random latency per message the two lanes overtake each other; order must hold.
        for i in 0..60u32 {
            let (lane, bytes) = frame(i);
            session.send_async(lane, bytes, WAIT).await?;
        }
        for i in 0..60u32 {
            if session.recv_async(WAIT).await? != frame(i).1 {
                return Err(format!("echo {i} out of order or garbled").into());
            }
        }
        // A hold shorter than the silence delays but does not end the session.
        turmoil::hold("rank", "controller");
        tokio::time::sleep(LIVENESS.silence / 2).await;
        turmoil::release("rank", "controller");
        session.send_async(Lane::Control, frame(1).1, WAIT).await?;
        if session.recv_async(WAIT).await? != frame(1).1 {
            return Err("the echo after the hold was garbled".into());
        }
        // A partition ends it within the silence.
        turmoil::partition("rank", "controller");
        let start = Instant::now();
        match session.recv_async(WAIT).await {
            Err(NetError::Gone) => {}
            other => return Err(format!("after the partition: {other:?}").into()),
        }
        let took = start.elapsed();
        if took > LIVENESS.silence + Duration::from_millis(500) {
            return Err(format!("Gone only {took:?} after the partition").into());
        }
        // Let the controller's side notice too before the simulation ends.
        tokio::time::sleep(LIVENESS.silence * 2).await;
        Ok(())
    });
    sim.run()?;
    match controller_end.lock().unwrap_or_else(|p| p.into_inner()).clone() {
        Some(end) if end == NetError::Gone.to_string() => Ok(()),
        other => Err(format!("the controller's side ended with {other:?}").into()),
    }
}
