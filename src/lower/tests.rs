//! Golden lowering tests: the exact StableHLO text of small regions, so a
//! change in lowering is a visible diff (every module is also compiled by
//! XLA in the integration tests).

use super::lower_region;
use lazyfuse_fusion::{plan, PlanOptions};
use lazyfuse_ir::{Axes, BinaryOp, DType, Graph, Literal, Op, ReduceOp, Shape, UnaryOp};
use std::panic::Location;

#[track_caller]
fn loc() -> &'static Location<'static> {
    Location::caller()
}

#[test]
fn broadcast_binary_reduce_and_lifted_scalar() {
    let mut g = Graph::new();
    let x = g
        .push(
            Op::Input {
                shape: Shape::new(&[2, 3]),
                dtype: DType::F32,
            },
            &[],
            loc(),
        )
        .unwrap();
    let b = g
        .push(
            Op::Input {
                shape: Shape::new(&[3]),
                dtype: DType::F32,
            },
            &[],
            loc(),
        )
        .unwrap();
    let s = g
        .push(
            Op::Constant {
                value: Literal::Float(0.5),
                shape: Shape::scalar(),
                dtype: DType::F32,
            },
            &[],
            loc(),
        )
        .unwrap();
    let a = g.push(Op::Binary(BinaryOp::Add), &[x, b], loc()).unwrap();
    let m = g.push(Op::Binary(BinaryOp::Mul), &[a, s], loc()).unwrap();
    let t = g.push(Op::Unary(UnaryOp::Tanh), &[m], loc()).unwrap();
    let r = g
        .push(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: Axes::from_slice(&[1]),
                keepdim: true,
            },
            &[t],
            loc(),
        )
        .unwrap();
    let p = plan(&g, &[r], &PlanOptions::default());
    let text = lower_region(&g, &p.regions[0]);
    let text: String = text
        .lines()
        .map(|l| match l.find(" loc(") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let expected = r#"module @lazyfuse_region {
  func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<3xf32>, %arg2: tensor<f32>) -> (tensor<2x1xf32>) {
    %v1 = "stablehlo.broadcast_in_dim"(%arg1) {broadcast_dimensions = array<i64: 1>} : (tensor<3xf32>) -> tensor<2x3xf32>
    %v2 = "stablehlo.add"(%arg0, %v1) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %v3 = "stablehlo.broadcast_in_dim"(%arg2) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<2x3xf32>
    %v4 = "stablehlo.multiply"(%v2, %v3) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %v5 = "stablehlo.tanh"(%v4) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %v6 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
    %v7 = "stablehlo.reduce"(%v5, %v6) ({
    ^bb0(%v7a: tensor<f32>, %v7b: tensor<f32>):
      %v7m = "stablehlo.add"(%v7a, %v7b) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%v7m) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %v8 = "stablehlo.reshape"(%v7) : (tensor<2xf32>) -> tensor<2x1xf32>
    "func.return"(%v8) : (tensor<2x1xf32>) -> ()
  }
}"#;
    assert_eq!(text, expected);
}

#[test]
fn ops_carry_the_recording_location() {
    let mut g = Graph::new();
    let x = g
        .push(
            Op::Input {
                shape: Shape::new(&[4]),
                dtype: DType::F64,
            },
            &[],
            loc(),
        )
        .unwrap();
    let line = line!() + 1;
    let y = g.push(Op::Unary(UnaryOp::Exp), &[x], loc()).unwrap();
    let p = plan(&g, &[y], &PlanOptions::default());
    let text = lower_region(&g, &p.regions[0]);
    assert!(
        text.contains(&format!("loc(\"exp @ src/lower/tests.rs:{line}:")),
        "{text}"
    );
}

#[test]
fn literals_are_exact_bit_patterns() {
    use super::emit::literal;
    assert_eq!(literal(Literal::Float(1.0), DType::F32), "0x3F800000");
    assert_eq!(
        literal(Literal::Float(-0.0), DType::F64),
        "0x8000000000000000"
    );
    assert_eq!(
        literal(Literal::Float(f64::NEG_INFINITY), DType::BF16),
        "0xFF80"
    );
    assert_eq!(literal(Literal::Float(1.0), DType::F16), "0x3C00");
    assert_eq!(literal(Literal::Int(-7), DType::I32), "-7");
    assert_eq!(literal(Literal::Int(255), DType::U8), "255");
    assert_eq!(literal(Literal::Bool(true), DType::Bool), "true");
}
