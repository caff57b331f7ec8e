//! A healthy session: frames both ways, both lanes, in order; closing is seen as Gone.

use flodl_cluster::{Lane, NetError};

use crate::support::{TestResult, WAIT, config, controller, joined, keys};

#[test]
fn frames_travel_both_ways_on_both_lanes() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(&keys(dir.path())?)?;
    let server = controller(&cfg, 2)?;
    let (at_controller, at_rank) = joined(&server, &cfg, 1, 2)?;
    assert_eq!(at_controller.rank(), 1);
    assert_eq!(at_rank.rank(), 1);
    let cases: [(Lane, Vec<u8>); 4] = [
        (Lane::Control, b"hello".to_vec()),
        (Lane::Bulk, vec![3u8; 1 << 20]),
        (Lane::Control, Vec::new()),
        (Lane::Bulk, vec![9u8; 17]),
    ];
    for (lane, frame) in &cases {
        at_rank.send(*lane, frame.clone(), WAIT)?;
        at_controller.send(*lane, frame.iter().map(|b| b ^ 0xff).collect(), WAIT)?;
    }
    for (_, frame) in &cases {
        assert_eq!(&at_controller.recv(WAIT)?, frame);
        assert_eq!(at_rank.recv(WAIT)?, frame.iter().map(|b| b ^ 0xff).collect::<Vec<u8>>());
    }
    at_rank.close();
    match at_controller.recv(WAIT) {
        Err(NetError::Gone) => Ok(()),
        other => Err(format!("expected Gone after the rank closed, got {other:?}").into()),
    }
}

/// A session's halves (and the session itself) may be used from several threads.
fn shareable<T: Send + Sync>(_: &T) {}

#[test]
fn split_halves_work_from_two_threads() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(&keys(dir.path())?)?;
    let server = controller(&cfg, 1)?;
    let (at_controller, at_rank) = joined(&server, &cfg, 0, 1)?;
    shareable(&at_controller);
    let (to_rank, from_rank) = at_controller.split();
    shareable(&to_rank);
    shareable(&from_rank);
    // The controller echoes from one thread while another sends; the rank checks the echoes.
    let echo = std::thread::spawn(move || -> Result<(), NetError> {
        for _ in 0..100 {
            let frame = from_rank.recv(WAIT)?;
            let lane = if frame.len() > 100 { Lane::Bulk } else { Lane::Control };
            to_rank.send(lane, frame, WAIT)?;
        }
        Ok(())
    });
    for i in 0..100u32 {
        let frame =
            if i.is_multiple_of(4) { vec![i as u8; 5000] } else { i.to_le_bytes().to_vec() };
        at_rank.send(if frame.len() > 100 { Lane::Bulk } else { Lane::Control }, frame, WAIT)?;
    }
    for i in 0..100u32 {
        let want = if i.is_multiple_of(4) { vec![i as u8; 5000] } else { i.to_le_bytes().to_vec() };
        if at_rank.recv(WAIT)? != want {
            return Err(format!("echo {i} garbled or out of order").into());
        }
    }
    echo.join().map_err(|_| "the echo thread panicked")??;
    Ok(())
}

/// A large frame's bytes are the peer's sign of life before the frame is whole: the receiver's
/// arrival handle is stamped while it crosses (never by small whole frames or heartbeats).
#[test]
fn a_large_frame_on_its_way_is_seen_arriving() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(&keys(dir.path())?)?;
    let server = controller(&cfg, 2)?;
    let (at_controller, at_rank) = joined(&server, &cfg, 1, 2)?;
    let arrival = at_controller.arrival();
    for i in 0..10u8 {
        at_rank.send(Lane::Control, vec![i; 64], WAIT)?;
        at_controller.recv(WAIT)?;
    }
    if let Some(at) = arrival.last() {
        return Err(format!("small whole frames stamped an arrival at {at:?}").into());
    }
    let sent = std::time::Instant::now();
    at_rank.send(Lane::Bulk, vec![7u8; 8 << 20], WAIT)?;
    let frame = at_controller.recv(WAIT)?;
    let received = std::time::Instant::now();
    if frame.len() != 8 << 20 {
        return Err(format!("a frame of {} bytes", frame.len()).into());
    }
    match arrival.last() {
        Some(at) if sent <= at && at <= received => Ok(()),
        other => Err(format!("sent {sent:?}, received {received:?}, arrival {other:?}").into()),
    }
}
