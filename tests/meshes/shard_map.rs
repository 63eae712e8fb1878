//! Manual regions (`Mesh::shard_map`) with explicit collectives (issue
//! 12): each collective against its definition computed on the host, on
//! 1-D and 2-D meshes, fused and unfused; a Megatron MLP written by hand
//! with one `all_reduce` equals one device, gradients included; misuse is
//! an `Err` at the call site. Compile and collective counts:
//! `shard_map_counts.rs` (process-wide counters, one test).

use crate::spmd_support::{close, close_normwise, data};
use lazyfuse::{Device, FusionGuard, Local, Mesh, Reduction, Tensor};

fn dev8() -> Device {
    Device::cpu_with_devices(8).unwrap()
}

/// Block `(i, j)` of size `[r, c]` of the row-major `[rows, cols]` array `x`.
fn block(x: &[f32], cols: usize, (i, j): (usize, usize), (r, c): (usize, usize)) -> Vec<f32> {
    (0..r)
        .flat_map(|a| (0..c).map(move |b| x[(i * r + a) * cols + j * c + b]))
        .collect()
}

fn sum_blocks(blocks: &[Vec<f32>]) -> Vec<f32> {
    (0..blocks[0].len())
        .map(|k| blocks.iter().map(|b| b[k]).sum())
        .collect()
}

/// Both fusion modes.
fn both(mut f: impl FnMut()) {
    for fused in [true, false] {
        let _g = FusionGuard::new(fused);
        f();
    }
}

#[test]
fn all_reduce_sums_the_pieces_along_an_axis() {
    let d = dev8();
    let mesh = Mesh::new(&d, &[("dp", 4)]).unwrap();
    let xs = data(16 * 8, 1);
    let want = sum_blocks(
        &(0..4)
            .map(|i| block(&xs, 8, (i, 0), (4, 8)))
            .collect::<Vec<_>>(),
    );
    both(|| {
        let x = Tensor::from_slice(&xs, &[16, 8], &d).unwrap();
        let out = mesh
            .shard_map(&[(&x, &[Some("dp"), None])], &[&[None, None]], |p| {
                assert_eq!(p[0].dims(), [4, 8]);
                Ok(vec![p[0].all_reduce("dp", Reduction::Sum)?])
            })
            .unwrap();
        assert_eq!(out[0].dims(), [4, 8]);
        close(&out[0].to_vec::<f32>().unwrap(), &want, "psum");
        // Kept split over dp, every device's piece is the sum.
        let out = mesh
            .shard_map(&[(&x, &[Some("dp"), None])], &[&[Some("dp"), None]], |p| {
                Ok(vec![p[0].all_reduce("dp", Reduction::Max)?])
            })
            .unwrap();
        let blocks: Vec<Vec<f32>> = (0..4).map(|i| block(&xs, 8, (i, 0), (4, 8))).collect();
        let max: Vec<f32> = (0..32)
            .map(|k| blocks.iter().map(|b| b[k]).fold(f32::MIN, f32::max))
            .collect();
        let got = out[0].to_vec::<f32>().unwrap();
        for i in 0..4 {
            close(&got[i * 32..(i + 1) * 32], &max, "pmax on every device");
        }
    });
}

#[test]
fn collectives_over_one_axis_of_a_two_dimensional_mesh() {
    let d = dev8();
    let mesh = Mesh::new(&d, &[("dp", 2), ("tp", 2)]).unwrap();
    let xs = data(8 * 6, 2);
    both(|| {
        let x = Tensor::from_slice(&xs, &[8, 6], &d).unwrap();
        // Pieces [4, 3]; gathering over tp gives each its rows whole.
        let out = mesh
            .shard_map(
                &[(&x, &[Some("dp"), Some("tp")])],
                &[&[Some("dp"), None], &[Some("dp"), Some("tp")]],
                |p| {
                    assert_eq!(p[0].dims(), [4, 3]);
                    let g = p[0].all_gather("tp", -1)?;
                    assert_eq!(g.dims(), [4, 6]);
                    // A mean over dp of each piece, on every device.
                    let m = p[0].all_reduce("dp", Reduction::Mean)?;
                    Ok(vec![g, m])
                },
            )
            .unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), xs, "all_gather");
        let got = out[1].to_vec::<f32>().unwrap();
        for j in 0..2 {
            let mean: Vec<f32> = block(&xs, 6, (0, j), (4, 3))
                .iter()
                .zip(block(&xs, 6, (1, j), (4, 3)))
                .map(|(a, b)| (a + b) / 2.0)
                .collect();
            for i in 0..2 {
                close(&block(&got, 6, (i, j), (4, 3)), &mean, "pmean over dp");
            }
        }
    });
}

#[test]
fn reduce_scatter_gives_each_device_its_block_of_the_sum() {
    let d = dev8();
    let mesh = Mesh::new(&d, &[("dp", 4)]).unwrap();
    let xs = data(8 * 8, 3);
    // Pieces are rows 2i..2i+2; their sum is [2, 8]; device i keeps
    // columns 2i..2i+2 of it.
    let sum = sum_blocks(
        &(0..4)
            .map(|i| block(&xs, 8, (i, 0), (2, 8)))
            .collect::<Vec<_>>(),
    );
    both(|| {
        let x = Tensor::from_slice(&xs, &[8, 8], &d).unwrap();
        let out = mesh
            .shard_map(&[(&x, &[Some("dp"), None])], &[&[None, Some("dp")]], |p| {
                let r = p[0].reduce_scatter("dp", 1)?;
                assert_eq!(r.dims(), [2, 2]);
                Ok(vec![r])
            })
            .unwrap();
        assert_eq!(out[0].dims(), [2, 8]);
        close(&out[0].to_vec::<f32>().unwrap(), &sum, "psum_scatter");
    });
}

#[test]
fn axis_index_and_local_ops_run_per_device() {
    let d = dev8();
    let mesh = Mesh::new(&d, &[("dp", 2), ("tp", 4)]).unwrap();
    let x = Tensor::from_slice(&data(2 * 4, 4), &[2, 4], &d).unwrap();
    let out = mesh
        .shard_map(
            &[(&x, &[Some("dp"), Some("tp")])],
            &[&[Some("dp"), Some("tp")]],
            |p| {
                // Each device's piece is one element; add its coordinates.
                let i = p[0]
                    .axis_index("dp")?
                    .map(|t| t.to_dtype(lazyfuse::DType::F32))?;
                let j = p[0]
                    .axis_index("tp")?
                    .map(|t| t.to_dtype(lazyfuse::DType::F32))?;
                let ten = j.map(|t| t.mul(10.0))?;
                Ok(vec![p[0].add(&i)?.add(&ten)?])
            },
        )
        .unwrap();
    let xs = x.to_vec::<f32>().unwrap();
    let want: Vec<f32> = (0..8)
        .map(|k| xs[k] + (k / 4) as f32 + 10.0 * (k % 4) as f32)
        .collect();
    close(&out[0].to_vec::<f32>().unwrap(), &want, "axis_index");
}

/// `relu(x @ w1) @ w2` written by hand over `tp`: `w1` split by columns,
/// `w2` by rows, one `all_reduce` of the partial products.
pub fn megatron(mesh: &Mesh, x: &Tensor, w1: &Tensor, w2: &Tensor) -> Tensor {
    let spec_x: &[Option<&str>] = &[None, None];
    mesh.shard_map(
        &[
            (x, spec_x),
            (w1, &[None, Some("tp")]),
            (w2, &[Some("tp"), None]),
        ],
        &[&[None, None]],
        |p: &[Local]| {
            let h = p[0].matmul(&p[1])?.map(|t| t.relu())?;
            let partial = h.matmul(&p[2])?;
            Ok(vec![partial.all_reduce("tp", Reduction::Sum)?])
        },
    )
    .unwrap()
    .remove(0)
}

#[test]
fn a_hand_written_tensor_parallel_mlp_equals_one_device_with_gradients() {
    let d = dev8();
    let mesh = Mesh::new(&d, &[("tp", 4)]).unwrap();
    let (xs, w1s, w2s) = (data(6 * 8, 5), data(8 * 16, 6), data(16 * 4, 7));
    let run = |placed: bool| {
        let x = Tensor::from_slice(&xs, &[6, 8], &d).unwrap();
        let mut w1 = Tensor::from_slice(&w1s, &[8, 16], &d).unwrap();
        let mut w2 = Tensor::from_slice(&w2s, &[16, 4], &d).unwrap();
        if placed {
            w1 = w1.shard(&mesh, &[None, Some("tp")]).unwrap();
            w2 = w2.shard(&mesh, &[Some("tp"), None]).unwrap();
        }
        w1.set_requires_grad(true).unwrap();
        w2.set_requires_grad(true).unwrap();
        let y = if placed {
            megatron(&mesh, &x, &w1, &w2)
        } else {
            x.matmul(&w1).unwrap().relu().unwrap().matmul(&w2).unwrap()
        };
        let loss = y.mul(&y).unwrap().sum(.., false).unwrap();
        loss.backward().unwrap();
        (
            y.to_vec::<f32>().unwrap(),
            w1.grad().unwrap().to_vec::<f32>().unwrap(),
            w2.grad().unwrap().to_vec::<f32>().unwrap(),
        )
    };
    let one = run(false);
    both(|| {
        let tp = run(true);
        close(&tp.0, &one.0, "forward");
        // Gradients sum cancelling terms (grad w1[52] is 0.38 from terms
        // whose magnitudes add up to 66), so they are compared normwise.
        close_normwise(&tp.1, &one.1, "grad w1");
        close_normwise(&tp.2, &one.2, "grad w2");
    });
}

#[test]
fn misuse_is_an_err_at_the_call_site() {
    let d = dev8();
    let mesh = Mesh::new(&d, &[("dp", 4)]).unwrap();
    let x = Tensor::from_slice(&data(8 * 6, 11), &[8, 6], &d).unwrap();
    let e = mesh
        .shard_map(&[(&x, &[Some("nope"), None])], &[&[None, None]], |p| {
            Ok(p.to_vec())
        })
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no axis \"nope\""), "{e}");
    let e = mesh
        .shard_map(&[(&x, &[None, Some("dp")])], &[&[None, None]], |p| {
            Ok(p.to_vec())
        })
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("does not divide"), "{e}");
    let e = mesh
        .shard_map(&[(&x, &[Some("dp"), None])], &[&[None]], |p| Ok(p.to_vec()))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("one entry per dimension"), "{e}");
    let e = mesh
        .shard_map(&[(&x, &[Some("dp"), None])], &[&[None, None]], |p| {
            Ok(vec![p[0].reduce_scatter("dp", 1)?])
        })
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("reduce_scatter") && e.contains("does not divide"),
        "{e}"
    );
    let e = mesh
        .shard_map(&[(&x, &[Some("dp"), None])], &[&[None]], |p| {
            Ok(vec![p[0].map(|t| t.sum(.., false))?])
        })
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("leading mesh dimensions"), "{e}");
    let e = mesh
        .shard_map(&[(&x, &[Some("dp"), None])], &[&[None, None]], |p| {
            Ok(vec![p[0].all_gather("dp", 2)?])
        })
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("out of range"), "{e}");
    // A result that differs across an axis its out spec does not name
    // (JAX's replication check).
    let e = mesh
        .shard_map(&[(&x, &[Some("dp"), None])], &[&[None, None]], |p| {
            Ok(p.to_vec())
        })
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("differs across mesh axis \"dp\""), "{e}");
    // The graph is still usable.
    let total: f32 = data(48, 11).iter().sum();
    close(
        &[x.sum(.., false).unwrap().item::<f32>().unwrap()],
        &[total],
        "after the errors",
    );
}

#[test]
fn a_sharding_constraint_lays_out_an_intermediate_and_changes_no_value() {
    let d = dev8();
    let mesh = Mesh::new(&d, &[("dp", 2), ("tp", 2)]).unwrap();
    let (xs, ws) = (data(8 * 4, 12), data(4 * 6, 13));
    let one = {
        let x = Tensor::from_slice(&xs, &[8, 4], &d).unwrap();
        let w = Tensor::from_slice(&ws, &[4, 6], &d).unwrap();
        // On one device a constraint does nothing.
        let y = x.matmul(&w).unwrap();
        let c = y
            .with_sharding_constraint(&mesh, &[Some("dp"), Some("tp")])
            .unwrap();
        assert_eq!(c.sharding().unwrap(), None);
        y.to_vec::<f32>().unwrap()
    };
    both(|| {
        let x = Tensor::from_slice(&xs, &[8, 4], &d)
            .unwrap()
            .shard(&mesh, &[Some("dp"), None])
            .unwrap();
        let w = Tensor::from_slice(&ws, &[4, 6], &d).unwrap();
        let y = x
            .matmul(&w)
            .unwrap()
            .with_sharding_constraint(&mesh, &[None, Some("tp")])
            .unwrap()
            .relu()
            .unwrap();
        let s = y.sharding().unwrap().unwrap();
        assert_eq!(s.spec(), [None, Some("tp")]);
        let want: Vec<f32> = one.iter().map(|v| v.max(0.0)).collect();
        close(&y.to_vec::<f32>().unwrap(), &want, "constrained");
    });
    let x = Tensor::from_slice(&xs, &[8, 4], &d).unwrap();
    for bad in [
        &[Some("tp"), Some("tp")][..],
        &[Some("dp")],
        &[None, Some("zz")],
    ] {
        assert!(x.with_sharding_constraint(&mesh, bad).is_err(), "{bad:?}");
    }
    // A value of another mesh, or of another client, names other axes.
    let other = Mesh::new(&d, &[("tp", 2), ("dp", 2)]).unwrap();
    let on_other = x.shard(&other, &[Some("dp"), None]).unwrap();
    let e = on_other
        .with_sharding_constraint(&mesh, &[Some("dp"), None])
        .unwrap_err()
        .to_string();
    assert!(e.contains("on the mesh"), "{e}");
    let elsewhere = Tensor::from_slice(&xs, &[8, 4], &Device::interpreter()).unwrap();
    let e = elsewhere
        .with_sharding_constraint(&mesh, &[Some("dp"), None])
        .unwrap_err()
        .to_string();
    assert!(e.contains("a client other than"), "{e}");
}
