//! Host kernels (`lazyfuse::custom::host`): Rust functions XLA calls as
//! typed-FFI custom calls. Checked: a kernel between neighbours is one
//! region, bit for bit equal unfused and on the interpreter (which calls
//! the function itself); several operands and dtypes; a registered
//! gradient; a kernel's `Err` and panic fail the sync with the message and
//! leave the runtime usable; names; no recompiles on new values.
//!
//! Every test takes `metrics_lock` (some count regions and compiles).

mod common;
use common::{metrics_lock, xla_dev};
use lazyfuse::custom::{self, CustomOp, HostArg, HostOut};
use lazyfuse::{metrics, DType, Device, FusionGuard, Tensor};

const X: [f32; 6] = [0.5, -1.0, 2.0, 0.0, -30.0, 12.0];

/// `x * x * x`, clamped to [-100, 100]: written to be bit-reproducible.
fn cube(x: &[HostArg<'_>], out: &mut HostOut<'_>) -> Result<(), String> {
    let x = x[0].as_slice::<f32>().ok_or("f32 expected")?;
    let out = out.as_mut_slice::<f32>().ok_or("f32 expected")?;
    for (o, v) in out.iter_mut().zip(x) {
        *o = (v * v * v).clamp(-100.0, 100.0);
    }
    Ok(())
}

fn cube_op() -> CustomOp {
    custom::host(
        "test.cube",
        &[(&[2, 3], DType::F32)],
        (&[2, 3], DType::F32),
        cube,
    )
    .unwrap()
    .with_grad(|x, _y, g| {
        // d/dx x^3 = 3x^2 inside the clamp, 0 outside.
        let x = &x[0];
        let inside = x.mul(x)?.mul(x)?.abs()?.le(100.0)?;
        let d = x.mul(x)?.mul(3.0)?.mul(g)?;
        Ok(vec![Some(inside.where_cond(&d, &d.zeros_like()?)?)])
    })
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_host_kernel_fuses_with_its_neighbours_and_agrees_everywhere() {
    let _m = metrics_lock();
    let dev = xla_dev();
    let op = cube_op();
    let run = |dev: &Device, fuse: bool| {
        let _g = FusionGuard::new(fuse);
        let x = Tensor::from_slice(&X, &[2, 3], dev).unwrap();
        let before = metrics::snapshot().regions_executed;
        let y = op.apply(&[&x.mul(2.0).unwrap()]).unwrap().add(1.0).unwrap();
        let v = y.to_vec::<f32>().unwrap();
        (v, metrics::snapshot().regions_executed - before)
    };
    let (fused, regions) = run(&dev, true);
    let (unfused, _) = run(&dev, false);
    let (interp, _) = run(&Device::interpreter(), true);
    assert_eq!(regions, 1, "the kernel and its neighbours are one region");
    assert_eq!(bits(&fused), bits(&unfused), "fused and unfused differ");
    assert_eq!(
        bits(&fused),
        bits(&interp),
        "XLA and the interpreter differ"
    );
    let want: Vec<f32> = X
        .iter()
        .map(|x| {
            let v = x * 2.0;
            (v * v * v).clamp(-100.0, 100.0) + 1.0
        })
        .collect();
    assert_eq!(bits(&fused), bits(&want));
}

#[test]
fn several_operands_and_dtypes() {
    let _m = metrics_lock();
    // out[i] = table[ids[i]] * scale[0]: f32, i64 and f32 operands.
    let gather = custom::host(
        "test.scaled_gather",
        &[
            (&[4, 2], DType::F32),
            (&[3], DType::I64),
            (&[1], DType::F32),
        ],
        (&[3, 2], DType::F32),
        |a, out| {
            let table = a[0].as_slice::<f32>().ok_or("table")?;
            let ids = a[1].as_slice::<i64>().ok_or("ids")?;
            let scale = a[2].as_slice::<f32>().ok_or("scale")?[0];
            let cols = a[0].dims[1];
            let out = out.as_mut_slice::<f32>().ok_or("out")?;
            for (r, &id) in ids.iter().enumerate() {
                let id = usize::try_from(id)
                    .ok()
                    .filter(|&i| i < a[0].dims[0])
                    .ok_or(format!("id {id} out of range"))?;
                for c in 0..cols {
                    out[r * cols + c] = table[id * cols + c] * scale;
                }
            }
            Ok(())
        },
    )
    .unwrap();
    for dev in [xla_dev(), Device::interpreter()] {
        let table =
            Tensor::from_slice(&[1.0f32, 2., 3., 4., 5., 6., 7., 8.], &[4, 2], &dev).unwrap();
        let ids = Tensor::from_slice(&[3i64, 0, 2], &[3], &dev).unwrap();
        let scale = Tensor::from_slice(&[0.5f32], &[1], &dev).unwrap();
        let y = gather.apply(&[&table, &ids, &scale]).unwrap();
        assert_eq!(
            y.to_vec::<f32>().unwrap(),
            vec![3.5, 4.0, 0.5, 1.0, 2.5, 3.0]
        );
        // The kernel's own Err fails the sync with its message...
        let bad = Tensor::from_slice(&[9i64, 0, 2], &[3], &dev).unwrap();
        let e = gather
            .apply(&[&table, &bad, &scale])
            .unwrap()
            .to_vec::<f32>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("id 9 out of range"), "{e}");
        // ...and the runtime goes on.
        let y = gather
            .apply(&[&table, &ids, &scale])
            .unwrap()
            .sum([0, 1], false)
            .unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![14.5]);
    }
}

#[test]
fn gradient_is_the_registered_rule() {
    let _m = metrics_lock();
    let dev = xla_dev();
    let op = cube_op();
    let x = Tensor::from_slice(&X, &[2, 3], &dev)
        .unwrap()
        .with_grad()
        .unwrap();
    op.apply(&[&x])
        .unwrap()
        .sum([0, 1], false)
        .unwrap()
        .backward()
        .unwrap();
    let g = x.grad().unwrap().to_vec::<f32>().unwrap();
    let want: Vec<f32> = X
        .iter()
        .map(|x| {
            if (x * x * x).abs() <= 100.0 {
                3.0 * x * x
            } else {
                0.0
            }
        })
        .collect();
    assert_eq!(g, want);
}

#[test]
fn a_panicking_kernel_is_an_err_and_the_runtime_goes_on() {
    let _m = metrics_lock();
    let boom = custom::host(
        "test.boom",
        &[(&[2], DType::F32)],
        (&[2], DType::F32),
        |a, _| {
            let v = a[0].as_slice::<f32>().unwrap();
            if v[0] > 0.0 {
                panic!("positive");
            }
            Err("not positive either".into())
        },
    )
    .unwrap();
    for dev in [xla_dev(), Device::interpreter()] {
        let x = Tensor::from_slice(&[1.0f32, 2.0], &[2], &dev).unwrap();
        let e = boom
            .apply(&[&x])
            .unwrap()
            .to_vec::<f32>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("panicked"), "{e}");
        let e = boom
            .apply(&[&x.neg().unwrap()])
            .unwrap()
            .to_vec::<f32>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("not positive either"), "{e}");
        assert_eq!(x.add(1.0).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
    }
}

#[test]
fn new_values_never_recompile() {
    let _m = metrics_lock();
    let dev = xla_dev();
    let op = cube_op();
    let step = |s: f32| {
        let x = Tensor::from_slice(&X, &[2, 3], &dev)
            .unwrap()
            .mul(s)
            .unwrap();
        op.apply(&[&x]).unwrap().to_vec::<f32>().unwrap()
    };
    step(1.0);
    let before = metrics::snapshot().compiles;
    for s in [0.5f32, 2.0, -1.0] {
        let got = step(s);
        let want: Vec<f32> = X
            .iter()
            .map(|x| ((x * s).powi(3)).clamp(-100.0, 100.0))
            .collect();
        assert_eq!(bits(&got), bits(&want));
    }
    assert_eq!(metrics::snapshot().compiles, before);
}

#[test]
fn names_are_checked() {
    let f = |_: &[HostArg<'_>], _: &mut HostOut<'_>| Ok(());
    let sig = [(&[1usize][..], DType::F32)];
    let e = custom::host("bad name", &sig, (&[1], DType::F32), f)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tests/host_kernels.rs") && e.contains("letters"),
        "{e}"
    );
    custom::host("test.taken", &sig, (&[1], DType::F32), f).unwrap();
    // Another function under a taken name.
    let e = custom::host("test.taken", &sig, (&[1], DType::F32), |_, _| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("already registered"), "{e}");
}
