//! Shared by the SPMD tests: deterministic data and a float comparison.
#![allow(dead_code)]

/// `n` deterministic values in [-2, 2) (`seed` picks the set).
pub fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 250.0 - 2.0)
        .collect()
}

/// `a` equals `b` elementwise to within 1e-5 x (1 + |b|).
pub fn close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

/// `a` equals `b` elementwise to within 1e-5 x (1 + max |b|): for values
/// that come out of cancelling sums (gradients), where programs cut into
/// different regions may round differently (FMA contraction, summation
/// order) by a few ulp of the summands, not of the result.
pub fn close_normwise(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    let scale = 1.0 + b.iter().fold(0f32, |m, y| m.max(y.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * scale,
            "{what}[{i}]: {x} vs {y} (scale {scale})"
        );
    }
}
