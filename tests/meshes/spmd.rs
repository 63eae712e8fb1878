//! Sharded tensors on a mesh of logical CPU devices (issue 12): ordinary
//! ops on them give the single-device results, fused and unfused; their
//! regions compile once as SPMD programs; bad placements are `Err`s.

use crate::spmd_support::{close, data};
use lazyfuse::{Device, FusionGuard, Mesh, Tensor};

fn dev8() -> Device {
    Device::cpu_with_devices(8).unwrap()
}

/// `relu(x @ w + b)`, its row sums and its total, on tensors of `dev`.
fn forward(x: &Tensor, w: &Tensor, b: &Tensor) -> (Vec<f32>, Vec<f32>, f32) {
    let h = x.matmul(w).unwrap().add(b).unwrap().relu().unwrap();
    let rows = h.sum([1], false).unwrap();
    let total = h.sum(.., false).unwrap();
    (
        h.to_vec::<f32>().unwrap(),
        rows.to_vec::<f32>().unwrap(),
        total.item::<f32>().unwrap(),
    )
}

#[test]
fn a_client_with_eight_devices_and_its_meshes() {
    let d = dev8();
    assert_eq!(d.device_count(), 8);
    let m = Mesh::new(&d, &[("dp", 2), ("tp", 4)]).unwrap();
    assert_eq!(m.size(), 8);
    assert_eq!(m.to_string(), "[dp=2, tp=4]");
    assert!(
        Mesh::new(&d, &[("dp", 16)]).is_err(),
        "larger than the client"
    );
    assert!(
        Mesh::new(&d, &[("dp", 2), ("dp", 2)]).is_err(),
        "an axis twice"
    );
    assert!(Mesh::new(&d, &[("dp", 0)]).is_err(), "size 0");
    assert!(Mesh::new(&d, &[]).is_err(), "no axis");
    assert!(Mesh::new(&Device::interpreter(), &[("dp", 1)]).is_err());
}

#[test]
fn ops_on_sharded_inputs_equal_the_single_device_results() {
    let d = dev8();
    let (xs, ws, bs) = (data(8 * 8, 1), data(8 * 4, 2), data(4, 3));
    let single = {
        let x = Tensor::from_slice(&xs, &[8, 8], &d).unwrap();
        let w = Tensor::from_slice(&ws, &[8, 4], &d).unwrap();
        let b = Tensor::from_slice(&bs, &[4], &d).unwrap();
        forward(&x, &w, &b)
    };
    let dp = Mesh::new(&d, &[("dp", 4)]).unwrap();
    let grid = Mesh::new(&d, &[("dp", 2), ("tp", 2)]).unwrap();
    type Spec = [Option<&'static str>; 2];
    let cases: [(&Mesh, Spec, Spec); 5] = [
        // Data parallel: rows of x split, w replicated (never placed).
        (&dp, [Some("dp"), None], [None, None]),
        // The contraction split: XLA sums partial products.
        (&dp, [None, None], [Some("dp"), None]),
        // Column split of w.
        (&dp, [None, None], [None, Some("dp")]),
        // 2-D: rows over dp, columns of w over tp.
        (&grid, [Some("dp"), None], [None, Some("tp")]),
        // Both over one 2-D mesh's axes, the contraction on tp.
        (&grid, [Some("dp"), Some("tp")], [Some("tp"), None]),
    ];
    for fuse in [true, false] {
        let _g = FusionGuard::new(fuse);
        for (mesh, xspec, wspec) in &cases {
            let what = format!("fused {fuse}, x {xspec:?}, w {wspec:?} over {mesh}");
            let x = Tensor::from_slice(&xs, &[8, 8], &d).unwrap();
            let x = x.shard(mesh, xspec).unwrap();
            let w = Tensor::from_slice(&ws, &[8, 4], &d).unwrap();
            let w = if wspec.iter().any(Option::is_some) {
                w.shard(mesh, wspec).unwrap()
            } else {
                w
            };
            let b = Tensor::from_slice(&bs, &[4], &d).unwrap();
            let (h, rows, total) = forward(&x, &w, &b);
            close(&h, &single.0, &format!("{what}: h"));
            close(&rows, &single.1, &format!("{what}: row sums"));
            close(&[total], &[single.2], &format!("{what}: total"));
        }
    }
}

#[test]
fn shardings_propagate_through_ops() {
    let d = dev8();
    let mesh = Mesh::new(&d, &[("dp", 4)]).unwrap();
    let x = Tensor::from_slice(&data(8 * 6, 4), &[8, 6], &d).unwrap();
    let x = x.shard(&mesh, &[Some("dp"), None]).unwrap();
    let s = x.sharding().unwrap().unwrap();
    assert_eq!(s.spec(), [Some("dp"), None]);
    assert_eq!(s.shard_shape(&lazyfuse::Shape::new(&[8, 6])).dims(), [2, 6]);
    // Elementwise keeps rows split; a transpose moves the split.
    let y = x.exp().unwrap();
    assert_eq!(y.sharding().unwrap().unwrap().spec(), [Some("dp"), None]);
    let t = x
        .transpose(0, 1)
        .unwrap()
        .mul(x.transpose(0, 1).unwrap())
        .unwrap();
    assert_eq!(t.sharding().unwrap().unwrap().spec(), [None, Some("dp")]);
    // Summing the split dimension away replicates.
    let c = x.sum([0], false).unwrap();
    assert!(c.sharding().unwrap().unwrap().is_replicated());
    // A one-device tensor is not on a mesh.
    let plain = Tensor::from_slice(&[1.0f32, 2.0], &[2], &d).unwrap();
    assert!(plain.sharding().unwrap().is_none());
    // Replicate: every device holds the whole value.
    let r = plain.replicate(&mesh).unwrap();
    assert!(r.sharding().unwrap().unwrap().is_replicated());
    assert_eq!(r.to_vec::<f32>().unwrap(), [1.0, 2.0]);
}

#[test]
fn bad_placements_are_errs_at_the_call_site() {
    let d = dev8();
    let mesh = Mesh::new(&d, &[("dp", 4)]).unwrap();
    let x = Tensor::from_slice(&data(6 * 4, 5), &[6, 4], &d).unwrap();
    let e = x.shard(&mesh, &[Some("dp"), None]).unwrap_err().to_string();
    assert!(
        e.contains("does not divide") && e.contains("tests/meshes/spmd.rs"),
        "{e}"
    );
    let e = x.shard(&mesh, &[None, Some("tp")]).unwrap_err().to_string();
    assert!(e.contains("no axis \"tp\""), "{e}");
    assert!(x.shard(&mesh, &[None]).is_err(), "one entry per dimension");
    let grid = Mesh::new(&d, &[("a", 2), ("b", 2)]).unwrap();
    assert!(
        x.shard(&grid, &[Some("a"), Some("a")]).is_err(),
        "an axis twice"
    );
    // A tensor of another client.
    let other = Tensor::from_slice(&[1.0f32; 4], &[4], &Device::cpu().unwrap()).unwrap();
    assert!(other.shard(&mesh, &[Some("dp")]).is_err());
    // Two meshes in one computation: an error at the op that mixes them,
    // also through values computed from each, and the runtime goes on.
    let m2 = Mesh::new(&d, &[("dp", 2)]).unwrap();
    let a = x.shard(&mesh, &[None, Some("dp")]).unwrap();
    let b = x.shard(&m2, &[None, Some("dp")]).unwrap();
    let e = a.add(&b).unwrap_err().to_string();
    assert!(
        e.contains("two device meshes") && e.contains("tests/meshes/spmd.rs"),
        "{e}"
    );
    let (a2, b2) = (a.exp().unwrap(), b.mul(2.0).unwrap());
    assert!(a2.sub(&b2).is_err());
    // Pending values of two meshes are recorded in graphs of their own, so
    // reading one computes it alone.
    assert_eq!(b2.to_vec::<f32>().unwrap().len(), 24);
    assert_eq!(a.add(&a2).unwrap().to_vec::<f32>().unwrap().len(), 24);
}

#[test]
fn dropout_on_a_sharded_tensor_drops_the_same_elements() {
    let d = dev8();
    let mesh = Mesh::new(&d, &[("dp", 2), ("tp", 2)]).unwrap();
    let xs = data(8 * 8, 10);
    let seed = lazyfuse::Key::new(1234);
    let x = Tensor::from_slice(&xs, &[8, 8], &d).unwrap();
    let single = x.dropout(0.5, seed, true).unwrap().to_vec::<f32>().unwrap();
    for spec in [
        [Some("dp"), None],
        [Some("dp"), Some("tp")],
        [None, Some("dp")],
    ] {
        let s = x.shard(&mesh, &spec).unwrap();
        let out = s.dropout(0.5, seed, true).unwrap();
        // The counter-based generator counts global element indices.
        assert_eq!(out.to_vec::<f32>().unwrap(), single, "{spec:?}");
    }
    assert!(single.contains(&0.0) && single.iter().any(|&v| v != 0.0));
}

/// Found by `fuzz_spmd` (seed 8, program 219): with the contraction of a
/// half-precision matmul split, each device's partial product was rounded
/// to f16 before XLA summed them, so two overflowing partial products of
/// opposite signs gave inf + -inf = NaN where one device accumulates in
/// f32 and gets a finite sum. SPMD programs now compute half matmuls in
/// f32 (`xla/src/lower/contract.rs`).
#[test]
fn a_split_half_precision_contraction_sums_unrounded_partials() {
    let d = dev8();
    let mesh = Mesh::new(&d, &[("dp", 2)]).unwrap();
    let f16 = |v: &[f64], dims: &[usize]| {
        let h = lazyfuse::HostTensor::from_f64(v, lazyfuse::Shape::new(dims), lazyfuse::DType::F16);
        Tensor::from_host(&h, &d).unwrap()
    };
    // 300 * 300 = 90000 and 300 * -299 = -89700 overflow f16; their sum,
    // 300, does not.
    let a = f16(&[300.0, 300.0, 1.0, 2.0], &[2, 2]);
    let b = f16(&[300.0, -299.0], &[2, 1]);
    let one = a
        .matmul(&b)
        .unwrap()
        .to_dtype(lazyfuse::DType::F32)
        .unwrap();
    let one = one.to_vec::<f32>().unwrap();
    assert_eq!(one, [300.0, -298.0]);
    let (sa, sb) = (
        a.shard(&mesh, &[None, Some("dp")]).unwrap(),
        b.shard(&mesh, &[Some("dp"), None]).unwrap(),
    );
    for fuse in [true, false] {
        let _g = FusionGuard::new(fuse);
        let y = sa
            .matmul(&sb)
            .unwrap()
            .to_dtype(lazyfuse::DType::F32)
            .unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), one, "fused {fuse}");
    }
}

/// A split parameter's gradient comes back split like it, even when the
/// backward pass runs in a region of its own (no update fused with it):
/// autograd constrains what it accumulates into a split leaf.
#[test]
fn a_split_parameters_gradient_is_split_like_it() {
    let d = dev8();
    let mesh = Mesh::new(&d, &[("dp", 4)]).unwrap();
    let x = Tensor::from_slice(&data(8 * 8, 21), &[8, 8], &d)
        .unwrap()
        .shard(&mesh, &[Some("dp"), None])
        .unwrap();
    let w = Tensor::from_slice(&data(8 * 4, 22), &[8, 4], &d)
        .unwrap()
        .shard(&mesh, &[Some("dp"), None])
        .unwrap();
    w.set_requires_grad(true).unwrap();
    let loss = x
        .matmul(&w)
        .unwrap()
        .tanh()
        .unwrap()
        .sum(.., false)
        .unwrap();
    loss.backward().unwrap();
    let g = w.grad().unwrap();
    let want = {
        let x = Tensor::from_slice(&data(8 * 8, 21), &[8, 8], &d).unwrap();
        let w = Tensor::from_slice(&data(8 * 4, 22), &[8, 4], &d).unwrap();
        w.set_requires_grad(true).unwrap();
        x.matmul(&w)
            .unwrap()
            .tanh()
            .unwrap()
            .sum(.., false)
            .unwrap()
            .backward()
            .unwrap();
        w.grad().unwrap().to_vec::<f32>().unwrap()
    };
    assert_eq!(g.sharding().unwrap().unwrap().spec(), [Some("dp"), None]);
    close(&g.to_vec::<f32>().unwrap(), &want, "split gradient");
}
