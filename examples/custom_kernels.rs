//! The two escape hatches of `lazyfuse::custom`, side by side with the
//! ops they replace:
//!
//! - a StableHLO kernel (softplus, with its gradient), fused with its
//!   neighbours like any op;
//! - a host kernel: a hand-written top-k in Rust (per row, a partial
//!   selection instead of the k rounds of argmax `Tensor::topk` records),
//!   which XLA calls in the middle of the region on its own buffers.
//!
//! Run: `cargo run --release --example custom_kernels [-- ROWS COLS K]`.

use indicatif::{ProgressBar, ProgressStyle};
use lazyfuse::custom::{self, HostArg, HostOut};
use lazyfuse::{DType, Device, Result, Tensor};
use std::time::Instant;

/// The `k` largest values of each row of `x` (descending; NaN counts as
/// largest, as `Tensor::topk` orders it).
fn topk_rows(
    k: usize,
) -> impl Fn(&[HostArg<'_>], &mut HostOut<'_>) -> std::result::Result<(), String> {
    move |args, out| {
        let x = args[0].as_slice::<f32>().ok_or("f32 input expected")?;
        let cols = *args[0].dims.last().ok_or("a matrix expected")?;
        let out = out.as_mut_slice::<f32>().ok_or("f32 output expected")?;
        let key = |v: &f32| if v.is_nan() { f32::INFINITY } else { *v };
        let mut row = vec![0f32; cols];
        for (r, o) in x.chunks(cols).zip(out.chunks_mut(k)) {
            row.copy_from_slice(r);
            // The k largest to the front, then sorted among themselves.
            row.select_nth_unstable_by(k - 1, |a, b| key(b).total_cmp(&key(a)));
            row[..k].sort_unstable_by(|a, b| key(b).total_cmp(&key(a)));
            o.copy_from_slice(&row[..k]);
        }
        Ok(())
    }
}

fn time(label: &str, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let bar = ProgressBar::new(iters as u64).with_style(
        ProgressStyle::with_template("{msg:>22} {bar:30} {pos}/{len}").expect("a template"),
    );
    bar.set_message(label.to_string());
    let t0 = Instant::now();
    for _ in 0..iters {
        f()?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(t0.elapsed().as_secs_f64() * 1e3 / iters as f64)
}

fn main() -> Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("ROWS COLS K are numbers"))
        .collect();
    let (rows, cols, k) = match args[..] {
        [r, c, k] => (r, c, k),
        _ => (2048, 512, 8),
    };
    let dev = Device::cpu()?;

    // StableHLO: softplus with its gradient, between two ops.
    let softplus = custom::stablehlo(
        "softplus",
        r#"func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
             %e = stablehlo.exponential %x : tensor<4xf32>
             %y = stablehlo.log_plus_one %e : tensor<4xf32>
             return %y : tensor<4xf32>
           }"#,
        &[(&[4], DType::F32)],
        (&[4], DType::F32),
        &dev,
    )?
    .with_grad(|x, _y, g| Ok(vec![Some(g.mul(&x[0].sigmoid()?)?)]));
    let x = Tensor::from_slice(&[-2.0f32, -0.5, 0.5, 2.0], &[4], &dev)?.with_grad()?;
    let y = softplus.apply(&[&x.mul(2.0)?])?.sum([0], false)?;
    y.backward()?;
    println!("softplus(2x) summed: {:?}", y.to_vec::<f32>()?);
    println!(
        "its gradient:        {:?}",
        x.grad().expect("a gradient").to_vec::<f32>()?
    );

    // Host kernel: top-k values of each row, against Tensor::topk.
    let topk = custom::host(
        "example.topk_rows",
        &[(&[rows, cols], DType::F32)],
        (&[rows, k], DType::F32),
        topk_rows(k),
    )?;
    let x = Tensor::randn(&[rows, cols], 7, &dev)?;
    x.realize()?;
    let host = topk.apply(&[&x])?.to_vec::<f32>()?;
    let (values, _) = x.topk(k)?;
    let composed = values.to_vec::<f32>()?;
    assert_eq!(host, composed, "the host kernel and Tensor::topk disagree");
    println!("top-{k} of {rows} rows of {cols}: the host kernel equals Tensor::topk");
    let iters = 20;
    let t_host = time("host kernel", iters, || {
        topk.apply(&[&x])?.realize()?;
        Ok(())
    })?;
    let t_ops = time("Tensor::topk", iters, || {
        x.topk(k)?.0.realize()?;
        Ok(())
    })?;
    println!("host kernel {t_host:.3} ms, Tensor::topk {t_ops:.3} ms per call");
    Ok(())
}
