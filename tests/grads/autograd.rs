//! Autograd semantics: leaves, accumulation across backward calls, zeroing,
//! detach, no_grad, released graphs, errors; and forward values of the
//! training composites against plain host computations.

use crate::common::dev;
use lazyfuse::{no_grad, DType, Error, FusionGuard, Tensor};

test_device!(
    gradients_accumulate_until_zeroed,
    detach_no_grad_and_non_leaves,
    released_graph_and_retain,
    bad_backward_and_loss_inputs_are_errors,
    composite_forward_values,
    dropout_rate_scaling_and_mode_independence,
    gather_with_and_without_autograd_state_agree,
);

fn t(v: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_slice(v, dims, &dev()).unwrap()
}

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

fn gradients_accumulate_until_zeroed() {
    let x = t(&[1.0, 2.0, 3.0], &[3]).with_grad().unwrap();
    let y = t(&[4.0, 5.0, 6.0], &[3]);
    assert!(x.requires_grad() && x.is_leaf() && !y.requires_grad());
    let loss = || x.mul(&y).unwrap().sum(.., false).unwrap();
    loss().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), [4.0, 5.0, 6.0]);
    assert!(y.grad().is_none());
    loss().backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec::<f32>().unwrap(),
        [8.0, 10.0, 12.0]
    );
    x.zero_grad();
    assert!(x.grad().is_none());
    loss().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), [4.0, 5.0, 6.0]);
}

fn detach_no_grad_and_non_leaves() {
    let x = t(&[1.0, -2.0], &[2]).with_grad().unwrap();
    let y = x.mul(3.0).unwrap();
    assert!(y.requires_grad() && !y.is_leaf());
    assert!(y.set_requires_grad(false).is_err(), "non-leaf");
    let d = y.detach().unwrap();
    assert!(!d.requires_grad() && d.is_leaf());
    assert_eq!(d.to_vec::<f32>().unwrap(), [3.0, -6.0]);
    let z = no_grad(|| x.mul(&x).unwrap());
    assert!(!z.requires_grad());
    assert!(lazyfuse::is_grad_enabled());
    // Only the tracked path contributes.
    let loss = x.mul(&d).unwrap().sum(.., false).unwrap();
    loss.backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), [3.0, -6.0]);
    // A materialised tracked tensor detaches to the same buffer.
    let w = t(&[5.0], &[1]).with_grad().unwrap();
    assert_eq!(w.detach().unwrap().to_vec::<f32>().unwrap(), [5.0]);
    // Backward through a leaf itself.
    w.sum(.., false).unwrap().backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), [1.0]);
}

fn released_graph_and_retain() {
    let x = t(&[2.0], &[]).with_grad().unwrap();
    let y = x.mul(&x).unwrap();
    y.backward_retain_graph().unwrap();
    y.backward().unwrap();
    assert_eq!(x.grad().unwrap().item::<f32>().unwrap(), 8.0);
    let e = y.backward().unwrap_err();
    assert!(e.to_string().contains("already released"), "{e}");
}

fn bad_backward_and_loss_inputs_are_errors() {
    let d = dev();
    let x = t(&[1.0, 2.0], &[2]).with_grad().unwrap();
    let op_err = |r: lazyfuse::Result<()>, what: &str| match r {
        Err(Error::Op { op, location, .. }) => {
            assert_eq!(op, "backward", "{what}");
            assert!(location.file().ends_with("autograd.rs"), "{what}");
        }
        other => panic!("{what}: expected an op error, got {other:?}"),
    };
    op_err(x.mul(2.0).unwrap().backward(), "non-scalar");
    op_err(t(&[1.0], &[]).backward(), "no grad");
    assert!(Tensor::zeros(&[2], DType::I32, &d)
        .unwrap()
        .set_requires_grad(true)
        .is_err());
    let logits = t(&[0.0; 6], &[2, 3]);
    let ft = t(&[0.0, 1.0], &[2]);
    let msg = logits.cross_entropy(&ft, None).unwrap_err().to_string();
    assert!(msg.contains("targets must be integer"), "{msg}");
    let msg = logits
        .cross_entropy_ids(&[0, 3], None)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("target 1 is class 3, outside 0..3"), "{msg}");
    assert!(logits.cross_entropy_ids(&[0, -1], None).is_err());
    assert!(logits.cross_entropy_ids(&[0, -1], Some(-1)).is_ok());
    let bad_shape = Tensor::zeros(&[3], DType::I64, &d).unwrap();
    assert!(logits.cross_entropy(&bad_shape, None).is_err());
    assert!(logits.dropout(1.5, 0, true).is_err());
    assert!(logits.clamp(1.0, 0.0).is_err());
}

fn composite_forward_values() {
    let x = [1.0f32, 2.0, 3.0, -1.0, 0.0, 4.0];
    let xt = t(&x, &[2, 3]);
    let mut sm = vec![];
    let mut lse = vec![];
    for row in x.chunks(3) {
        let m = row.iter().cloned().fold(f32::MIN, f32::max);
        let s: f32 = row.iter().map(|v| (v - m).exp()).sum();
        sm.extend(row.iter().map(|v| (v - m).exp() / s));
        lse.push(m + s.ln());
    }
    close(&xt.softmax(-1).unwrap().to_vec::<f32>().unwrap(), &sm, 1e-6);
    let ls: Vec<f32> = sm.iter().map(|v| v.ln()).collect();
    close(
        &xt.log_softmax(-1).unwrap().to_vec::<f32>().unwrap(),
        &ls,
        1e-6,
    );
    close(
        &xt.logsumexp(-1, false).unwrap().to_vec::<f32>().unwrap(),
        &lse,
        1e-6,
    );
    let ce = xt
        .cross_entropy_ids(&[2, 0], None)
        .unwrap()
        .item::<f32>()
        .unwrap();
    close(&[ce], &[-(ls[2] + ls[3]) / 2.0], 1e-6);
    let ce = xt
        .cross_entropy_ids(&[2, -100], Some(-100))
        .unwrap()
        .item::<f32>()
        .unwrap();
    close(&[ce], &[-ls[2]], 1e-6);
    let idx = Tensor::from_slice(&[2i64, 0, 1, 1], &[2, 2], &dev()).unwrap();
    assert_eq!(
        xt.gather(1, &idx).unwrap().to_vec::<f32>().unwrap(),
        [3.0, 1.0, 0.0, 0.0]
    );
    let ln = xt
        .layer_norm(None, None, 0.0)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let r = 1.0 / (2.0f32 / 3.0).sqrt();
    close(&ln[..3], &[-r, 0.0, r], 1e-5);
    let mask = Tensor::from_slice(&[true, false, true], &[3], &dev()).unwrap();
    let mf = xt
        .masked_fill(&mask, f64::NEG_INFINITY)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(mf[1], 2.0);
    assert!(mf[0] == f32::NEG_INFINITY && mf[5] == f32::NEG_INFINITY);
    assert_eq!(
        xt.clamp(0.0, 2.5).unwrap().to_vec::<f32>().unwrap(),
        [1.0, 2.0, 2.5, 0.0, 0.0, 2.5]
    );
    let g = t(&[0.0, 1.0, -2.0], &[3])
        .gelu_exact()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    close(&g, &[0.0, 0.841_344_7, -0.045_500_26], 1e-6);
    // Softmax of a row that is all -inf except masked positions stays finite.
    let m = t(&[f32::NEG_INFINITY, 0.0], &[1, 2])
        .softmax(-1)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(m, [0.0, 1.0]);
}

fn dropout_rate_scaling_and_mode_independence() {
    let d = dev();
    let x = Tensor::ones(&[64, 64], DType::F32, &d).unwrap();
    let run = |fuse: bool| {
        let _g = FusionGuard::new(fuse);
        x.dropout(0.25, 3, true).unwrap().to_vec::<f32>().unwrap()
    };
    let (a, b) = (run(true), run(false));
    assert_eq!(a, b, "fused and unfused drop the same elements");
    let kept = a.iter().filter(|&&v| v != 0.0).count() as f64 / a.len() as f64;
    assert!((kept - 0.75).abs() < 0.03, "kept {kept}");
    assert!(a.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
    let eval = x.dropout(0.25, 3, false).unwrap();
    assert!(eval.to_vec::<f32>().unwrap().iter().all(|&v| v == 1.0));
}

/// `gather` of a value without autograd state is one `index_select` at flat
/// offsets; with it, the one-hot form its gradient comes from. Both give
/// the host's `torch.gather` (indices clamped into range) for every rank,
/// axis and index dtype, fused and unfused. (Shapes change at each call
/// here, so after a few calls the dynamic-shape layer pads these values
/// and the one-hot form serves both: `-0.0` is compared as equal to `+0.0`,
/// which that form's sum gives.)
fn gather_with_and_without_autograd_state_agree() {
    let mut state = 7u64;
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
        (state >> 33) as i64
    };
    for fuse in [true, false] {
        let _f = FusionGuard::new(fuse);
        for dims in [vec![7usize], vec![3, 5], vec![2, 3, 4], vec![2, 1, 3, 5]] {
            for axis in 0..dims.len() {
                for idt in [DType::I64, DType::I32, DType::U8] {
                    let numel: usize = dims.iter().product();
                    let xv: Vec<f32> = (0..numel)
                        .map(|i| {
                            if i % 5 == 0 {
                                -0.0
                            } else {
                                i as f32 * 0.5 - 3.0
                            }
                        })
                        .collect();
                    let mut idims = dims.clone();
                    idims[axis] = (next() % 4 + 1) as usize;
                    let n = dims[axis] as i64;
                    let iv: Vec<i64> = (0..idims.iter().product::<usize>())
                        .map(|_| next() % (n + 4) - if idt == DType::U8 { 0 } else { 2 })
                        .collect();
                    // Host gather: output position -> source offset.
                    let strides = |d: &[usize]| -> Vec<usize> {
                        (0..d.len()).map(|k| d[k + 1..].iter().product()).collect()
                    };
                    let (xs, is) = (strides(&dims), strides(&idims));
                    let want: Vec<f32> = (0..iv.len())
                        .map(|o| {
                            let off: usize = (0..dims.len())
                                .map(|d| {
                                    let c = o / is[d] % idims[d];
                                    let c = if d == axis {
                                        iv[o].clamp(0, n - 1) as usize
                                    } else {
                                        c
                                    };
                                    c * xs[d]
                                })
                                .sum();
                            xv[off]
                        })
                        .collect();
                    let idx = Tensor::from_slice(&iv, &idims, &dev())
                        .unwrap()
                        .to_dtype(idt)
                        .unwrap();
                    let plain = t(&xv, &dims);
                    let graded = t(&xv, &dims).with_grad().unwrap();
                    let got = plain
                        .gather(axis as isize, &idx)
                        .unwrap()
                        .to_vec::<f32>()
                        .unwrap();
                    let one_hot = graded
                        .gather(axis as isize, &idx)
                        .unwrap()
                        .to_vec::<f32>()
                        .unwrap();
                    let what = format!("{dims:?} axis {axis} {idt:?} fused {fuse}");
                    assert_eq!(got, want, "flat form, {what}");
                    assert_eq!(one_hot, want, "one-hot form, {what}");
                }
            }
        }
    }
    // At one shape the values stay static: the flat form runs, and copies
    // the bits of a gathered -0.0.
    let x = t(&[-0.0, 1.0, 2.0, -0.0, 4.0, 5.0], &[2, 3]);
    let idx = Tensor::from_slice(&[0i64, 2, 0, 1], &[2, 2], &dev()).unwrap();
    let got = x.gather(1, &idx).unwrap().to_vec::<f32>().unwrap();
    let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
    assert_eq!(
        bits,
        [
            (-0.0f32).to_bits(),
            2.0f32.to_bits(),
            (-0.0f32).to_bits(),
            4.0f32.to_bits()
        ]
    );
}
