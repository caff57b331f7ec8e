//! The hello: a joiner that does not match the run is refused with one clear line, on both sides.

use std::time::Duration;

use flodl_cluster::{Hello, NetError, PROTOCOL, join};

use crate::support::{
    RUN, TestResult, WAIT, config, controller, joined, keys, log, logged, target,
};

#[test]
fn mismatched_joiners_are_refused_with_a_clear_line_on_both_sides() -> TestResult {
    let _ = log();
    let dir = tempfile::tempdir()?;
    let cfg = config(&keys(dir.path())?)?;
    let server = controller(&cfg, 2)?;
    // Rank 0 is connected, so a second rank 0 is a duplicate.
    let (_at_controller, _at_rank) = joined(&server, &cfg, 0, 2)?;
    let cases = [
        (
            Hello { protocol: PROTOCOL + 41, ..Hello::new(RUN, 1, 2) },
            format!(
                "protocol differs: this process speaks version {}, the controller version {PROTOCOL}",
                PROTOCOL + 41
            ),
            format!(
                "protocol differs: the joiner speaks version {}, this controller version {PROTOCOL}",
                PROTOCOL + 41
            ),
        ),
        (
            Hello::new([0x3f; 32], 1, 2),
            "run specification differs (its settings, or the checksums of the training and test \
             data the process loaded): this process 3f3f3f3f…, the controller 07070707…"
                .to_string(),
            "run specification differs (its settings, or the checksums of the training and test \
             data the process loaded): the joiner 3f3f3f3f…, this controller 07070707…"
                .to_string(),
        ),
        (
            Hello::new(RUN, 1, 3),
            "world size differs: this process was launched with 3 ranks, the controller with 2"
                .to_string(),
            "world size differs: the joiner was launched with 3 ranks, this controller with 2"
                .to_string(),
        ),
        (
            Hello::new(RUN, 2, 2),
            "rank 2 is out of range for a world of 2 ranks".to_string(),
            "rank 2 is out of range".to_string(),
        ),
        (
            Hello::new(RUN, 0, 2),
            "rank 0 is already connected".to_string(),
            "rank 0 is already connected".to_string(),
        ),
    ];
    let addr = target(server.local_addr());
    for (hello, joiner_line, controller_line) in cases {
        match join(&addr, hello, cfg.rank(hello.rank)?, WAIT) {
            Err(NetError::Refused { reason }) if reason == joiner_line && hello.rank != 0 => {}
            // A second live process claiming a live rank gets its own typed error.
            Err(NetError::RankTaken { rank: 0, reason }) if reason == joiner_line => {}
            other => {
                return Err(format!(
                    "{hello:?}: expected the refusal {joiner_line:?}, got {other:?}"
                )
                .into());
            }
        }
        if !logged(&["join refused", &controller_line], Duration::from_secs(2)) {
            return Err(format!("{hello:?}: the controller did not log {controller_line:?}").into());
        }
    }
    // A joiner whose application speaks another version of its messages.
    let mut other_app = cfg.rank(1)?;
    other_app.app = 7;
    let joiner_line = "the application's protocol differs: this process speaks version 7, the \
                       controller version 0 (every process of a job must run the same release)";
    match join(&addr, Hello::new(RUN, 1, 2), other_app, WAIT) {
        Err(NetError::Refused { reason }) if reason == joiner_line => {}
        other => return Err(format!("expected the refusal {joiner_line:?}, got {other:?}").into()),
    }
    let controller_line = "the application's protocol differs: the joiner speaks version 7";
    if !logged(&["join refused", controller_line], Duration::from_secs(2)) {
        return Err(format!("the controller did not log {controller_line:?}").into());
    }
    // The refused joins left no seat behind: rank 1 can still join.
    let (at_controller, at_rank) = joined(&server, &cfg, 1, 2)?;
    at_rank.send(flodl_cluster::Lane::Control, b"in".to_vec(), WAIT)?;
    if at_controller.recv(WAIT)? != b"in" {
        return Err("rank 1's frame was garbled".into());
    }
    Ok(())
}

#[test]
fn a_rank_may_join_again_after_its_session_ended() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(&keys(dir.path())?)?;
    let server = controller(&cfg, 1)?;
    for round in 0..2u8 {
        let (at_controller, at_rank) = joined(&server, &cfg, 0, 1)?;
        at_rank.send(flodl_cluster::Lane::Bulk, vec![round; 10], WAIT)?;
        if at_controller.recv(WAIT)? != vec![round; 10] {
            return Err(format!("round {round}: garbled").into());
        }
        drop(at_rank);
        match at_controller.recv(WAIT) {
            Err(NetError::Gone) => {}
            other => return Err(format!("round {round}: expected Gone, got {other:?}").into()),
        }
        drop(at_controller);
        // The seat is freed when the controller's side has wound down.
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
