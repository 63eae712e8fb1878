//! Custom StableHLO kernels (`lazyfuse::custom`): a softplus kernel against
//! the same math composed from ops, fused (one region with its
//! neighbours) and unfused bit for bit; its registered gradient; two
//! kernels in one region; and the errors: malformed text, a signature the
//! text disagrees with, wrong operands, no gradient, the interpreter.
//!
//! XLA only: the reference interpreter cannot run StableHLO. Every test
//! takes `metrics_lock` (one counts regions).

mod common;
use common::{metrics_lock, xla_dev};
use lazyfuse::custom::{self, CustomOp};
use lazyfuse::{metrics, DType, Device, FusionGuard, Tensor};

const SOFTPLUS: &str = r#"
module @softplus {
  func.func public @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
    %e = stablehlo.exponential %x : tensor<2x3xf32>
    %y = stablehlo.log_plus_one %e : tensor<2x3xf32>
    return %y : tensor<2x3xf32>
  }
}"#;

/// `x * y + x`, in the generic syntax, with a private helper.
const FMA: &str = r#"
func.func @main(%x: tensor<2x3xf32>, %y: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %p = func.call @helper_mul(%x, %y) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  %s = "stablehlo.add"(%p, %x) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  return %s : tensor<2x3xf32>
}
func.func private @helper_mul(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %m = stablehlo.multiply %a, %b : tensor<2x3xf32>
  return %m : tensor<2x3xf32>
}"#;

const X: [f32; 6] = [0.5, -1.0, 2.0, 0.0, -30.0, 12.0];

fn softplus(dev: &Device) -> CustomOp {
    custom::stablehlo(
        "softplus",
        SOFTPLUS,
        &[(&[2, 3], DType::F32)],
        (&[2, 3], DType::F32),
        dev,
    )
    .unwrap()
    .with_grad(|x, _y, g| Ok(vec![Some(g.mul(&x[0].sigmoid()?)?)]))
}

#[test]
fn softplus_matches_the_composed_ops_fused_and_unfused() {
    let _m = metrics_lock();
    let dev = xla_dev();
    let sp = softplus(&dev);
    let run = |fuse: bool| {
        let _g = FusionGuard::new(fuse);
        let x = Tensor::from_slice(&X, &[2, 3], &dev).unwrap();
        // With neighbours on both sides, so fused it sits inside a region.
        let before = metrics::snapshot().regions_executed;
        let y = sp.apply(&[&x.mul(2.0).unwrap()]).unwrap().add(1.0).unwrap();
        let v = y.to_vec::<f32>().unwrap();
        (v, metrics::snapshot().regions_executed - before)
    };
    let (fused, regions) = run(true);
    let (unfused, _) = run(false);
    assert_eq!(regions, 1, "the kernel and its neighbours are one region");
    assert_eq!(
        fused.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        unfused.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        "fused and unfused differ"
    );
    for (got, x) in fused.iter().zip(X) {
        let want = ((2.0 * x as f64).exp().ln_1p() + 1.0) as f32;
        assert!(
            (got - want).abs() <= 1e-6 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }
}

#[test]
fn gradient_is_the_registered_rule() {
    let _m = metrics_lock();
    let dev = xla_dev();
    let sp = softplus(&dev);
    let x = Tensor::from_slice(&X, &[2, 3], &dev)
        .unwrap()
        .with_grad()
        .unwrap();
    let y = sp.apply(&[&x]).unwrap();
    y.mul(&y)
        .unwrap()
        .sum([0, 1], false)
        .unwrap()
        .backward()
        .unwrap();
    let got = x.grad().unwrap().to_vec::<f32>().unwrap();
    for (g, x) in got.iter().zip(X) {
        let x = x as f64;
        let want = (2.0 * x.exp().ln_1p() / (1.0 + (-x).exp())) as f32;
        assert!(
            (g - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{g} vs {want}"
        );
    }
    // Without a gradient, backward through the kernel is an Err.
    let plain = custom::stablehlo(
        "fma",
        FMA,
        &[(&[2usize, 3][..], DType::F32); 2],
        (&[2, 3], DType::F32),
        &dev,
    )
    .unwrap();
    let a = Tensor::from_slice(&X, &[2, 3], &dev)
        .unwrap()
        .with_grad()
        .unwrap();
    let out = plain.apply(&[&a, &a]).unwrap().sum([0, 1], false).unwrap();
    let e = out.backward().unwrap_err().to_string();
    assert!(e.contains("no gradient") && e.contains("fma"), "{e}");
}

#[test]
fn two_kernels_and_a_helper_in_one_region() {
    let _m = metrics_lock();
    let dev = xla_dev();
    let (sp, fma) = (
        softplus(&dev),
        custom::stablehlo(
            "fma",
            FMA,
            &[(&[2usize, 3][..], DType::F32); 2],
            (&[2, 3], DType::F32),
            &dev,
        )
        .unwrap(),
    );
    // Another kernel whose helper has the same name: `x * y - x`.
    let fms = custom::stablehlo(
        "fms",
        &FMA.replace("stablehlo.add", "stablehlo.subtract"),
        &[(&[2usize, 3][..], DType::F32); 2],
        (&[2, 3], DType::F32),
        &dev,
    )
    .unwrap();
    let x = Tensor::from_slice(&X, &[2, 3], &dev).unwrap();
    let y = fma.apply(&[&sp.apply(&[&x]).unwrap(), &x]).unwrap();
    let y2 = sp.apply(&[&y]).unwrap();
    let d = fms
        .apply(&[&x, &x])
        .unwrap()
        .sub(x.mul(&x).unwrap().sub(&x).unwrap())
        .unwrap();
    assert!(d.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
    let got = y2.to_vec::<f32>().unwrap();
    for (g, x) in got.iter().zip(X) {
        // In f32, as the kernel computes it: exp(156) overflows to inf.
        let s = x.exp().ln_1p();
        let want = (s * x + s).exp().ln_1p();
        assert!(
            *g == want || (g - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{g} vs {want}"
        );
    }
}

#[test]
fn bad_kernels_and_calls_are_errs_at_the_callers_line() {
    let _m = metrics_lock();
    let dev = xla_dev();
    let f32x = |d: &'static [usize]| (d, DType::F32);
    // Malformed text: an Err from the check compile, naming this file.
    let e = custom::stablehlo(
        "broken",
        "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> { %y = stablehlo.nonsense %x",
        &[f32x(&[2])],
        f32x(&[2]),
        &dev,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("broken") && e.contains("tests/custom.rs"), "{e}");
    // A signature the text disagrees with.
    let e = custom::stablehlo("sp", SOFTPLUS, &[f32x(&[3])], f32x(&[3]), &dev)
        .unwrap_err()
        .to_string();
    assert!(e.contains("tests/custom.rs"), "{e}");
    // No @main at all.
    let e = custom::stablehlo("none", "stablehlo.add", &[f32x(&[2])], f32x(&[2]), &dev)
        .unwrap_err()
        .to_string();
    assert!(e.contains("@main"), "{e}");
    // Operands that are not the declared ones.
    let sp = softplus(&dev);
    let wrong = Tensor::zeros(&[3, 2], DType::F32, &dev).unwrap();
    let e = sp.apply(&[&wrong]).unwrap_err().to_string();
    assert!(
        e.contains("operand 0 must be") && e.contains("tests/custom.rs"),
        "{e}"
    );
    let e = sp.apply(&[&wrong, &wrong]).unwrap_err().to_string();
    assert!(e.contains("takes 1 operand"), "{e}");
    // The runtime is still usable after the failed compiles.
    let x = Tensor::from_slice(&X, &[2, 3], &dev).unwrap();
    assert_eq!(sp.apply(&[&x]).unwrap().to_vec::<f32>().unwrap().len(), 6);
    // The interpreter cannot run StableHLO.
    let interp = Device::interpreter();
    let xi = Tensor::from_slice(&X, &[2, 3], &interp).unwrap();
    let e = sp.apply(&[&xi]).unwrap_err().to_string();
    assert!(e.contains("interpreter"), "{e}");
}
