//! Order across lanes, and the frame caps.

use std::thread;
use std::time::Duration;

use flodl_cluster::{Caps, Lane, Liveness, NetError, Session};

use crate::support::{CAPS, TestResult, WAIT, config, controller, joined, keys};

/// The i-th frame of the order test: small on control, large on bulk, tagged with `i`.
fn frame(i: u32) -> (Lane, Vec<u8>) {
    let tag = i.to_le_bytes();
    if i.is_multiple_of(2) {
        (Lane::Control, tag.to_vec())
    } else {
        let len = 256 * 1024 + (i as usize % 7) * 100_000;
        let mut big = vec![(i % 251) as u8; len];
        big[..4].copy_from_slice(&tag);
        (Lane::Bulk, big)
    }
}

#[test]
fn frames_alternating_lanes_arrive_in_send_order_both_ways() -> TestResult {
    const FRAMES: u32 = 120;
    let dir = tempfile::tempdir()?;
    let cfg = config(&keys(dir.path())?)?;
    let server = controller(&cfg, 1)?;
    let (at_controller, at_rank) = joined(&server, &cfg, 0, 1)?;
    for (direction, (from, to)) in [
        ("rank to controller", (&at_rank, &at_controller)),
        ("controller to rank", (&at_controller, &at_rank)),
    ] {
        thread::scope(|scope| -> TestResult {
            let sender = scope.spawn(|| -> Result<(), NetError> {
                for i in 0..FRAMES {
                    let (lane, bytes) = frame(i);
                    from.send(lane, bytes, WAIT)?;
                }
                Ok(())
            });
            for i in 0..FRAMES {
                let got = to.recv(WAIT)?;
                let want = frame(i).1;
                if got != want {
                    let tag = got.get(..4).map(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]));
                    return Err(format!(
                        "{direction}: frame {i} expected, got frame {tag:?} of {} bytes",
                        got.len()
                    )
                    .into());
                }
            }
            sender.join().map_err(|_| "the sender panicked")??;
            Ok(())
        })?;
    }
    Ok(())
}

#[test]
fn frames_above_the_cap_are_refused_on_send() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(&keys(dir.path())?)?;
    let server = controller(&cfg, 1)?;
    let (_at_controller, at_rank) = joined(&server, &cfg, 0, 1)?;
    for lane in Lane::BOTH {
        let cap = CAPS.of(lane);
        match at_rank.send(lane, vec![0; cap + 1], WAIT) {
            Err(NetError::TooLarge { lane: l, len, cap: c })
                if l == lane && len == cap + 1 && c == cap => {}
            other => return Err(format!("{lane}: send of cap+1 gave {other:?}").into()),
        }
        match at_rank.try_send(lane, vec![0; cap + 1]) {
            Err(NetError::TooLarge { .. }) => {}
            other => return Err(format!("{lane}: try_send of cap+1 gave {other:?}").into()),
        }
        at_rank.send(lane, vec![1; cap], WAIT)?;
    }
    Ok(())
}

#[test]
fn a_frame_above_the_receivers_cap_ends_the_session_after_the_frames_before_it() -> TestResult {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let liveness =
            Liveness { heartbeat: Duration::from_millis(50), silence: Duration::from_millis(500) };
        let (control_a, control_b) = tokio::io::duplex(1 << 16);
        let (bulk_a, bulk_b) = tokio::io::duplex(1 << 16);
        // The sender believes in larger caps than the receiver enforces: its oversize frame goes
        // onto the wire.
        let sender = Session::over(
            0,
            control_a,
            bulk_a,
            Caps { control: 1 << 20, bulk: 1 << 20 },
            liveness,
        )?;
        let receiver =
            Session::over(0, control_b, bulk_b, Caps { control: 1024, bulk: 1024 }, liveness)?;
        sender.send_async(Lane::Control, b"before".to_vec(), WAIT).await?;
        sender.send_async(Lane::Bulk, vec![5; 4096], WAIT).await?;
        // The receiver may already have read the oversize frame and cut the session: then this
        // send finds it gone, which is the behaviour under test, not a failure.
        match sender.send_async(Lane::Control, b"after".to_vec(), WAIT).await {
            Ok(()) | Err(NetError::Gone) => {}
            Err(e) => return Err(e.into()),
        }
        if receiver.recv_async(WAIT).await? != b"before" {
            return Err("the frame before the oversize one was lost".into());
        }
        match receiver.recv_async(WAIT).await {
            Err(NetError::Gone) => {}
            other => {
                return Err(format!("expected Gone after the oversize frame, got {other:?}").into());
            }
        }
        // The sender learns of it too: the receiver cut both lanes.
        match sender.recv_async(WAIT).await {
            Err(NetError::Gone) => Ok(()),
            other => Err(format!("the sender expected Gone, got {other:?}").into()),
        }
    })
}
