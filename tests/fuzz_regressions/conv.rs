//! Convolutions whose padding crops the input (XLA's CPU convolution was
//! wrong there; `xla/src/lower/conv.rs` pads separately).

use crate::common;
use crate::fuzz_support::{self, Program, Step};
#[allow(unused_imports)]
use lazyfuse::ir::{
    Axes, BinaryOp, CmpOp, ConvSpec, DType, HostTensor, Literal, Op, ReduceOp, Shape, Spatial,
    UnaryOp,
};
#[allow(unused_imports)]
use lazyfuse::{FusionGuard, Tensor};

/// XLA bug on the newer CPU plugins (`jax-cpu`, PJRT 0.115): a convolution
/// whose padding is negative on one side and positive on the other read
/// outside its input: zeros convolved came out as 1.27e-8 in bf16. The
/// lowering now crops negative padding with a `stablehlo.pad` of its own
/// before the convolution, which then only pads (`xla/src/lower/conv.rs`).
#[test]
fn conv_with_negative_padding_crops_its_input() {
    for dtype in [DType::BF16, DType::F32] {
        let paddings = [[(0, 0), (-1, 2)], [(-1, 1), (0, -2)], [(1, -1), (-2, 0)]];
        for (padding, dilation) in paddings.into_iter().flat_map(|p| [(p, 1), (p, 2)]) {
            let spec = ConvSpec {
                stride: Spatial::from_slice(&[2, 2]),
                padding: Spatial::from_slice(&padding),
                lhs_dilation: Spatial::from_slice(&[dilation, 1]),
                rhs_dilation: Spatial::from_slice(&[1, 1]),
                feature_groups: 1,
                batch_groups: 1,
            };
            let program = Program {
                steps: vec![
                    Step::Input(HostTensor::from_f64(
                        &(0..36).map(|i| (i % 5) as f64 - 2.0).collect::<Vec<_>>(),
                        Shape::new(&[1, 3, 2, 6]),
                        dtype,
                    )),
                    Step::Input(HostTensor::from_f64(
                        &[0.0, 1.0, 0.0, 0.0, 0.5, 0.0, -1.0, 0.0, 0.0, 2.0, 0.0, 0.0],
                        Shape::new(&[1, 3, 2, 2]),
                        dtype,
                    )),
                    Step::Apply {
                        op: Op::Conv(Box::new(spec)),
                        args: vec![0, 1],
                    },
                ],
            };
            fuzz_support::check_program(&program, &common::dev()).unwrap();
        }
    }
}

/// The crop above on an empty axis: padding `(2, -1)` of nothing is one
/// zero, the crop eating into the other side's padding.
#[test]
fn conv_crop_of_an_empty_axis_eats_into_the_padding() {
    let program = Program {
        steps: vec![
            Step::Full {
                value: 1.0,
                dims: vec![1, 3, 0],
                dtype: DType::BF16,
            },
            Step::Input(HostTensor::from_f64(
                &[0.5, 1.0, -2.0],
                Shape::new(&[3, 1, 1]),
                DType::BF16,
            )),
            Step::Apply {
                op: Op::Conv(Box::new(ConvSpec {
                    stride: Spatial::from_slice(&[1]),
                    padding: Spatial::from_slice(&[(2, -1)]),
                    lhs_dilation: Spatial::from_slice(&[1]),
                    rhs_dilation: Spatial::from_slice(&[1]),
                    feature_groups: 3,
                    batch_groups: 1,
                })),
                args: vec![0, 1],
            },
        ],
    };
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}
