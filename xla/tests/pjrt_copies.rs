//! What XLA's CPU backend copies in a training-style update, under the
//! compile options lazyfuse sends (`xla/src/pjrt/options.rs`).

#[path = "common/mod.rs"]
mod common;

use common::*;
use lazyfuse_xla::pjrt::{Client, CompileOverride};

/// One SGD step of a linear layer with its weight donated: `w` is read by
/// the forward product and by the backward product for the input's
/// gradient, and the updated weight is written over it.
const SGD_STEP: &str = r#"module @m {
  func.func public @main(%w: tensor<256x256xf32> {tf.aliasing_output = 0 : i32}, %x: tensor<64x256xf32>) -> (tensor<256x256xf32>, tensor<64x256xf32>) {
    %y = "stablehlo.dot_general"(%x, %w) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>} : (tensor<64x256xf32>, tensor<256x256xf32>) -> tensor<64x256xf32>
    %dx = "stablehlo.dot_general"(%y, %w) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]>} : (tensor<64x256xf32>, tensor<256x256xf32>) -> tensor<64x256xf32>
    %g = "stablehlo.dot_general"(%x, %y) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [0]>} : (tensor<64x256xf32>, tensor<64x256xf32>) -> tensor<256x256xf32>
    %w2 = "stablehlo.subtract"(%w, %g) : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
    "func.return"(%w2, %dx) : (tensor<256x256xf32>, tensor<64x256xf32>) -> ()
  }
}"#;

fn copies(c: &Client) -> usize {
    let exe = c.compile(SGD_STEP).unwrap();
    let ops = exe.optimized_opcodes().unwrap();
    assert!(ops.iter().any(|o| o == "dot"), "{ops:?}");
    ops.iter().filter(|o| *o == "copy").count()
}

#[test]
fn a_donated_weight_is_updated_in_place_without_a_copy() {
    assert_eq!(copies(client()), 0);
    // XLA's default copy insertion copies the weight before the update
    // (what region analysis, on in lazyfuse's options, removes).
    let plain = Client::with_options(
        plugin(),
        &[],
        &[CompileOverride::Bool(
            "xla_cpu_copy_insertion_use_region_analysis".into(),
            false,
        )],
    )
    .unwrap();
    assert!(copies(&plain) >= 1);
}

#[test]
fn the_in_place_update_computes_the_same_step() {
    let c = client();
    let exe = c.compile(SGD_STEP).unwrap();
    let w: Vec<f32> = (0..256 * 256)
        .map(|i| ((i % 97) as f32 - 48.0) / 512.0)
        .collect();
    let x: Vec<f32> = (0..64 * 256)
        .map(|i| ((i % 31) as f32 - 15.0) / 64.0)
        .collect();
    let wb = upload_f32(c, &w, &[256, 256], 0);
    let xb = upload_f32(c, &x, &[64, 256], 0);
    let (outs, done) = exe.launch(&[&wb, &xb], 0, &[0]).unwrap();
    done.wait().unwrap();
    let got = f32_vec(&download(&outs[0]));
    // Reference in f64: y = x w, g = x^T y, w2 = w - g.
    let mut y = vec![0f64; 64 * 256];
    for r in 0..64 {
        for k in 0..256 {
            let a = x[r * 256 + k] as f64;
            for j in 0..256 {
                y[r * 256 + j] += a * w[k * 256 + j] as f64;
            }
        }
    }
    // The backward product must read the weight from before the update.
    let dx = f32_vec(&download(&outs[1]));
    for r in (0..64).step_by(7) {
        for k in (0..256).step_by(29) {
            let want: f64 = (0..256)
                .map(|j| y[r * 256 + j] * w[k * 256 + j] as f64)
                .sum();
            let tol = 1e-4 * (1.0 + want.abs());
            assert!((dx[r * 256 + k] as f64 - want).abs() <= tol, "dx ({r},{k})");
        }
    }
    for i in (0..256).step_by(37) {
        for j in (0..256).step_by(41) {
            let g: f64 = (0..64)
                .map(|r| x[r * 256 + i] as f64 * y[r * 256 + j])
                .sum();
            let want = w[i * 256 + j] as f64 - g;
            let tol = 1e-4 * (1.0 + want.abs());
            assert!(
                (got[i * 256 + j] as f64 - want).abs() <= tol,
                "({i},{j}) {} vs {want}",
                got[i * 256 + j]
            );
        }
    }
}
