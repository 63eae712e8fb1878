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
    predicted_outputs_do_not_depend_on_jobs_in_flight,
    sync_waits_for_the_jobs_flush_queued,
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

/// Values written per iteration (besides the slow job's one) by a loop
/// whose intermediate (of held tensors only, so leaving it out pins no
/// dying buffer) dies unread after each read; with `slow`, a slow job
/// is queued ahead of every iteration, still running when the read flushes.
fn outputs_per_iteration(slow: bool) -> Vec<u64> {
    let _f = FusionGuard::new(true);
    let (a, w) = (randn(&[256, 256], 5), randn(&[N, N], 6));
    let mut acc = upload(0);
    (0..8)
        .map(|i| {
            let before = snapshot().region_outputs;
            let queued = slow.then(|| slow_job(&a));
            let h = w.tanh().unwrap().mul(i as f64).unwrap();
            acc = acc.mul(&w).unwrap().add(&h).unwrap().sin().unwrap();
            acc.sum(.., false).unwrap().to_vec::<f32>().unwrap();
            drop(h);
            drop(queued);
            snapshot().region_outputs - before - u64::from(slow)
        })
        .collect()
}

/// Output prediction counts a drop at the flush after it, whether or not
/// earlier jobs are still queued or binding their values then: the same
/// loop writes the same values per iteration with and without a slow job
/// ahead of each step, and settles on the sum and the accumulator.
fn predicted_outputs_do_not_depend_on_jobs_in_flight() {
    let _l = metrics_lock();
    // Each on a fresh thread, whose graph has learned nothing yet.
    let on_new_thread = |slow: bool| {
        let b = common::current();
        std::thread::spawn(move || common::with_backend(b, || outputs_per_iteration(slow)))
            .join()
            .unwrap()
    };
    let (quiet, busy) = (on_new_thread(false), on_new_thread(true));
    assert_eq!(quiet, busy);
    assert_eq!(quiet[..2], [3, 3], "the intermediate, watched: {quiet:?}");
    assert_eq!(quiet[2..], [2; 6], "then left out: {quiet:?}");
}

/// `lazyfuse::sync()` is a barrier for what the thread handed over
/// before it, not only for what it still had pending: after `flush()`
/// queued a slow job (fused or not), `sync()` returns only once it ran.
fn sync_waits_for_the_jobs_flush_queued() {
    let _l = metrics_lock();
    for fuse in [true, false] {
        let _f = FusionGuard::new(fuse);
        let a = randn(&[256, 256], 7 + u64::from(fuse));
        let slow = slow_job(&a);
        assert!(!slow.is_pending(), "flush() handed it over");
        lazyfuse::sync();
        assert!(
            slow.is_ready(),
            "sync() returned before the queued job ran (fusion {fuse})"
        );
    }
}
