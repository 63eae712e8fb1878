//! Pipelined flushes (`lazyfuse::flush()`, which does not wait): what a
//! flush decides about its inputs (which die with its job and are donated
//! to its outputs, which changes the compiled regions) follows from what the
//! program holds at the flush, never from how far the executor has got.
//! Each loop queues its jobs behind a slow one, so an executor that decided
//! when it reached them would see the program's later drops.
//! Every test takes `metrics_lock` (it asserts on process-wide deltas).

mod common;
use common::{dev, metrics_lock};
use lazyfuse::metrics::snapshot;
use lazyfuse::{FusionGuard, Tensor};

test_device!(
    inputs_held_at_the_flush_are_not_donated_however_late_the_job_runs,
    an_input_dropped_before_the_flush_is_donated,
);

const N: usize = 48;

fn randn(dims: &[usize], seed: u64) -> Tensor {
    let t = Tensor::randn(dims, seed, &dev()).unwrap();
    t.realize().unwrap();
    t
}

fn upload(seed: u64) -> Tensor {
    let data: Vec<f32> = (0..N * N)
        .map(|i| ((i as u64 * 7 + seed) % 13) as f32 * 0.1)
        .collect();
    Tensor::from_slice(&data, &[N, N], &dev()).unwrap()
}

/// Queues a job that takes a while (a matmul of held operands: it donates
/// nothing) and returns its result, which the caller keeps alive.
fn slow_job(a: &Tensor) -> Tensor {
    let slow = a.matmul(a).unwrap();
    lazyfuse::flush();
    slow
}

fn expected(x: &Tensor, w: &Tensor) -> Vec<f32> {
    let _f = FusionGuard::new(false);
    x.mul(w)
        .unwrap()
        .tanh()
        .unwrap()
        .sin()
        .unwrap()
        .to_vec()
        .unwrap()
}

/// Buffers donated over four iterations of `step` (given the upload's
/// seed and the weight, returning the result), each queued behind a slow
/// job; every result is checked against an unfused run.
fn donations_over(step: impl Fn(u64, &Tensor) -> Tensor) -> u64 {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let (a, w) = (randn(&[256, 256], 1), randn(&[N, N], 2));
    let before = snapshot().buffers_donated;
    for i in 0..4 {
        let want = expected(&upload(i), &w);
        let slow = slow_job(&a);
        let z = step(i, &w);
        assert_eq!(z.to_vec::<f32>().unwrap(), want, "iteration {i}");
        drop(slow);
    }
    snapshot().buffers_donated - before
}

/// An upload and an intermediate the program holds at their flushes and
/// drops right after, while the jobs reading them still wait behind a slow
/// one: neither is donated, on any iteration, and the values are right.
fn inputs_held_at_the_flush_are_not_donated_however_late_the_job_runs() {
    let donated = donations_over(|i, w| {
        let x = upload(i);
        let y = x.mul(w).unwrap().tanh().unwrap();
        lazyfuse::flush();
        drop(x);
        let z = y.sin().unwrap();
        lazyfuse::flush();
        drop(y);
        z
    });
    assert_eq!(
        donated, 0,
        "a buffer the program held at the flush was donated"
    );
}

/// The converse: an upload the program drops before the flush dies with
/// the job, and is donated to the output it matches, every time.
fn an_input_dropped_before_the_flush_is_donated() {
    let donated = donations_over(|i, w| {
        let z = upload(i).mul(w).unwrap().tanh().unwrap().sin().unwrap();
        lazyfuse::flush();
        z
    });
    assert_eq!(donated, 4);
}
