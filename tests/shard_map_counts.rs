//! A manual region's step compiles once, then never, and runs exactly
//! the collectives it names: one all-reduce of the partial products per
//! step of a hand-written tensor-parallel MLP, nothing gathered; one
//! collective for a gather and for a scatter. One test in this binary:
//! the counters are process-wide.

mod spmd_support;

use lazyfuse::{Device, Local, Mesh, Reduction, Tensor};
use spmd_support::data;

#[test]
fn a_manual_step_compiles_once_and_all_reduces_once() {
    let d = Device::cpu_with_devices(8).unwrap();
    let mesh = Mesh::new(&d, &[("tp", 4)]).unwrap();
    let x = Tensor::from_slice(&data(6 * 8, 8), &[6, 8], &d)
        .unwrap()
        .replicate(&mesh)
        .unwrap();
    let w1 = Tensor::from_slice(&data(8 * 16, 9), &[8, 16], &d)
        .unwrap()
        .shard(&mesh, &[None, Some("tp")])
        .unwrap();
    let w2 = Tensor::from_slice(&data(16 * 4, 10), &[16, 4], &d)
        .unwrap()
        .shard(&mesh, &[Some("tp"), None])
        .unwrap();
    let mut steps = Vec::new();
    for step in 0..6 {
        let m0 = lazyfuse::metrics::snapshot();
        let xs = x.mul(2.0 + step as f64).unwrap();
        let y = mesh
            .shard_map(
                &[
                    (&xs, &[None, None]),
                    (&w1, &[None, Some("tp")]),
                    (&w2, &[Some("tp"), None]),
                ],
                &[&[None, None]],
                |p: &[Local]| {
                    let h = p[0].matmul(&p[1])?.map(|t| t.relu())?;
                    Ok(vec![h.matmul(&p[2])?.all_reduce("tp", Reduction::Sum)?])
                },
            )
            .unwrap()
            .remove(0);
        y.to_vec::<f32>().unwrap();
        let m1 = lazyfuse::metrics::snapshot();
        steps.push((
            m1.compiles - m0.compiles,
            m1.collectives - m0.collectives,
            m1.collective_bytes - m0.collective_bytes,
        ));
    }
    eprintln!("(compiles, collectives, bytes) per step: {steps:?}");
    // The first step compiles; the third settles which live values the
    // flush writes (issue 9's output prediction); then nothing.
    assert!(steps[0].0 >= 1, "{steps:?}");
    for s in &steps[3..] {
        // Nothing compiles; one all-reduce of one device's [6, 4] f32
        // partial product (96 bytes) per step.
        assert_eq!(*s, (0, 1, 6 * 4 * 4), "{steps:?}");
    }

    // A gather and a scatter: one collective each, moving no more than
    // the gathered piece or the scattered block.
    let dp = Mesh::new(&d, &[("dp", 4)]).unwrap();
    let v = Tensor::from_slice(&data(8 * 8, 11), &[8, 8], &d)
        .unwrap()
        .shard(&dp, &[Some("dp"), None])
        .unwrap();
    let run = |f: fn(&Local) -> lazyfuse::Result<Local>, out: &[Option<&str>]| {
        let v = &v;
        let dp = &dp;
        counted(move || {
            dp.shard_map(&[(v, &[Some("dp"), None])], &[out], |p| Ok(vec![f(&p[0])?]))
                .unwrap()[0]
                .to_vec::<f32>()
                .unwrap();
        })
    };
    let gather = run(|p| p.all_gather("dp", 0), &[None, None]);
    let scatter = run(|p| p.reduce_scatter("dp", 1), &[None, Some("dp")]);
    eprintln!("all_gather {gather:?}, reduce_scatter {scatter:?}");
    assert_eq!(
        gather,
        (1, 8 * 8 * 4),
        "all_gather: the whole [8, 8] on each device"
    );
    // XLA's CPU pipeline does not form a reduce-scatter: it all-reduces
    // the [2, 8] sum and each device keeps its block (a [2, 2] block
    // would be 16 bytes where a plugin forms one).
    assert_eq!(scatter.0, 1, "reduce_scatter: one collective");
    assert!(
        scatter.1 == 2 * 2 * 4 || scatter.1 == 2 * 8 * 4,
        "reduce_scatter moves a block or the sum: {scatter:?}"
    );
}

/// Runs `f` once to warm up, then once counted: (collectives, bytes).
fn counted(f: impl Fn()) -> (u64, u64) {
    f();
    let m0 = lazyfuse::metrics::snapshot();
    f();
    let m1 = lazyfuse::metrics::snapshot();
    (
        m1.collectives - m0.collectives,
        m1.collective_bytes - m0.collective_bytes,
    )
}
