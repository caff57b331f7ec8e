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
