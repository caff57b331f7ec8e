//! Non-progressive partition sizing against hand-computed values and an f64 reference.

use flodl_ddp::LogicError;
use flodl_ddp::control::partition::{
    Share, equal_sizes, shares, throughput_weights, weighted_sizes,
};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn equal_and_weighted_by_hand() -> TestResult {
    assert_eq!(equal_sizes(10, 3)?, vec![4, 3, 3]);
    assert_eq!(equal_sizes(2, 3)?, vec![1, 1, 0]);
    // 100 * [0.5, 0.3, 0.2]: exact.
    assert_eq!(weighted_sizes(100, &[5.0, 3.0, 2.0])?, vec![50, 30, 20]);
    // 10 * [1/3, 2/3] = 3.33, 6.67 -> floors 3, 6, remainder to the largest weight.
    assert_eq!(weighted_sizes(10, &[1.0, 2.0])?, vec![3, 7]);
    // Throughputs 1/4 and 1/10: 70 -> 50 : 20.
    assert_eq!(weighted_sizes(70, &throughput_weights(&[4.0, 10.0]))?, vec![50, 20]);
    assert_eq!(weighted_sizes(7, &[0.0, 1.0])?, vec![0, 7]);
    assert_eq!(
        shares(&[3, 0, 4]),
        vec![Share { offset: 0, len: 3 }, Share { offset: 3, len: 0 }, Share { offset: 3, len: 4 }]
    );
    assert_eq!(throughput_weights(&[0.0, 2.0, 0.0005]), vec![500.25, 0.5, 1000.0]);
    Ok(())
}

#[test]
fn bad_weights_are_typed() {
    assert!(matches!(equal_sizes(3, 0), Err(LogicError::WorldTooSmall { .. })));
    assert!(matches!(weighted_sizes(3, &[]), Err(LogicError::WorldTooSmall { .. })));
    for w in [[-1.0, 1.0], [f64::NAN, 1.0], [0.0, 0.0]] {
        assert!(matches!(weighted_sizes(3, &w), Err(LogicError::InvalidValue { .. })), "{w:?}");
    }
}

#[test]
fn weighted_sizes_match_f64_reference() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
    for _ in 0..3000 {
        let w = rng.random_range(1..9usize);
        let n = rng.random_range(0..100_000usize);
        let weights: Vec<f64> = (0..w).map(|_| rng.random_range(0.01..10.0)).collect();
        let sizes = weighted_sizes(n, &weights)?;
        assert_eq!(sizes.iter().sum::<usize>(), n);
        let sum: f64 = weights.iter().sum();
        for (s, wt) in sizes.iter().zip(&weights) {
            let exact = n as f64 * wt / sum;
            assert!((*s as f64 - exact).abs() < 1.0 + 1e-9, "{s} vs {exact}");
        }
    }
    Ok(())
}
