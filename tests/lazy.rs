//! Lazy-execution behaviour: when things compile, flush, bind and free.
//! Tests here assert on process-wide metric deltas, so every test takes `metrics_lock`.

mod common;
use common::{dev, metrics_lock};
use lazyfuse::metrics::{snapshot, FlushReason};
use lazyfuse::{pending_ops, DType, FusionGuard, Tensor};

test_device!(
    nothing_compiles_before_a_sync_point,
    a_loop_recording_the_same_ops_compiles_once,
    reading_a_pending_tensor_flushes_exactly_once,
    dropped_intermediates_are_not_materialised,
    live_buffers_stay_flat_over_a_thousand_iterations,
    pending_tensor_used_on_another_thread,
    many_threads_share_tensors,
    fusion_off_runs_every_op_when_recorded,
    fused_equals_unfused_on_multi_op_programs,
    graph_cap_flushes_long_recordings,
    creation_ops_are_lazy_and_fuse,
    display_shows_values,
    a_flush_returns_at_once_and_later_graphs_use_in_flight_results,
    a_read_with_nothing_queued_runs_on_the_reading_thread,
    reads_of_host_memory_buffers_are_in_place,
    read_into_fills_the_callers_memory_and_checks_its_size,
    a_host_view_keeps_its_bytes_while_the_program_goes_on,
    two_threads_missing_the_same_key_compile_it_once,
    cross_thread_recording_never_hangs,
    held_scalars_are_uploaded_with_their_values,
);

fn data(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect()
}

fn nothing_compiles_before_a_sync_point() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let x = Tensor::from_slice(&data(37, 0.1), &[37], &d).unwrap();
    let before = snapshot();
    let y = x.exp().unwrap().mul(&x).unwrap().add(3.0).unwrap();
    let mid = snapshot();
    assert_eq!(mid.compiles, before.compiles, "recording must not compile");
    assert_eq!(
        mid.regions_executed, before.regions_executed,
        "recording must not execute"
    );
    assert_eq!(mid.flushes(), before.flushes());
    assert!(pending_ops(&d) >= 4, "ops are pending");
    assert!(y.is_pending());
    let v = y.to_vec::<f32>().unwrap();
    let after = snapshot();
    assert_eq!(after.compiles - mid.compiles, 1, "one fused region");
    assert_eq!(after.regions_executed - mid.regions_executed, 1);
    assert_eq!(pending_ops(&d), 0);
    let expect: Vec<f32> = data(37, 0.1).iter().map(|&x| x.exp() * x + 3.0).collect();
    for (a, e) in v.iter().zip(&expect) {
        assert!((a - e).abs() < 1e-5, "{a} vs {e}");
    }
}

fn a_loop_recording_the_same_ops_compiles_once() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let mut p = Tensor::from_slice(&data(41, 0.2), &[41], &d).unwrap();
    let before = snapshot();
    for step in 0..6 {
        let g = Tensor::from_slice(&data(41, step as f32), &[41], &d).unwrap();
        // The learning rate changes every step: lifted scalars are region
        // parameters, so this never recompiles.
        let lr = 0.5 / (1.0 + step as f64);
        p = p.sub(g.mul(lr).unwrap()).unwrap();
        p.realize().unwrap();
    }
    let after = snapshot();
    assert_eq!(
        after.compiles - before.compiles,
        1,
        "the loop body compiles once"
    );
    assert_eq!(
        after.cache_hits - before.cache_hits,
        5,
        "then only hits the cache"
    );
    let mut expect = data(41, 0.2);
    for step in 0..6 {
        let lr = 0.5 / (1.0 + step as f64);
        for (e, g) in expect.iter_mut().zip(data(41, step as f32)) {
            *e -= g * lr as f32;
        }
    }
    let got = p.to_vec::<f32>().unwrap();
    for (a, e) in got.iter().zip(&expect) {
        assert!((a - e).abs() < 1e-5, "{a} vs {e}");
    }
}

fn reading_a_pending_tensor_flushes_exactly_once() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let x = Tensor::from_slice(&data(43, 0.3), &[43], &d).unwrap();
    let y = x.tanh().unwrap().sqrt().unwrap();
    let z = x.abs().unwrap();
    let before = snapshot();
    let _ = y.to_vec::<f32>().unwrap();
    let mid = snapshot();
    assert_eq!(mid.flushes() - before.flushes(), 1);
    assert_eq!(
        mid.flushes_for(FlushReason::Read) - before.flushes_for(FlushReason::Read),
        1
    );
    // Both pending tensors were computed by that one flush.
    assert!(!z.is_pending());
    let _ = y.to_vec::<f32>().unwrap();
    let _ = z.to_vec::<f32>().unwrap();
    assert_eq!(
        snapshot().flushes(),
        mid.flushes(),
        "materialised tensors never flush again"
    );
}

fn dropped_intermediates_are_not_materialised() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let x = Tensor::from_slice(&data(47, 0.4), &[47], &d).unwrap();
    // Warm the lifted-scalar cache so only computed values count below.
    x.mul(2.0).unwrap().realize().unwrap();
    let live_before = snapshot().live_buffers;
    let a = x.exp().unwrap();
    let b = a.mul(2.0).unwrap();
    let c = b.add(&x).unwrap();
    drop(a);
    drop(b);
    c.realize().unwrap();
    let live_after = snapshot().live_buffers;
    assert_eq!(live_after - live_before, 1, "only `c` got a device buffer");
}

fn live_buffers_stay_flat_over_a_thousand_iterations() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let mut p = Tensor::from_slice(&data(53, 0.5), &[53], &d).unwrap();
    let g = Tensor::from_slice(&data(53, 0.6), &[53], &d).unwrap();
    // Warm-up past the scalar-pack cache's idle bound, so the packs of
    // earlier tests in this process are released before `start`.
    for _ in 0..100 {
        p = p.sub(g.mul(0.01).unwrap()).unwrap();
        p.realize().unwrap();
    }
    let start = snapshot().live_buffers;
    for _ in 0..1000 {
        p = p.sub(g.mul(0.01).unwrap()).unwrap();
        p.realize().unwrap();
    }
    let end = snapshot().live_buffers;
    assert_eq!(start, end, "no device buffer leaks");
}

fn pending_tensor_used_on_another_thread() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &d).unwrap();
    let y = x.mul(&x).unwrap(); // pending in this thread's graph
    assert!(y.is_pending());
    let y2 = y.clone();
    let got = std::thread::spawn(move || {
        let z = y2.add(1.0).unwrap(); // flushes the owner's graph first
        z.to_vec::<f32>().unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(got, vec![2.0, 5.0, 10.0]);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 4.0, 9.0]);
}

fn many_threads_share_tensors() {
    let _l = metrics_lock();
    let d = dev();
    let base = Tensor::from_slice(&data(64, 0.7), &[8, 8], &d).unwrap();
    let pending = base.exp().unwrap();
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let p = pending.clone();
            std::thread::spawn(move || {
                let mut acc = p.mul(t as f64).unwrap();
                for _ in 0..10 {
                    acc = acc.add(&p).unwrap();
                }
                acc.sum(.., false).unwrap().item::<f32>().unwrap()
            })
        })
        .collect();
    let total: f32 = data(64, 0.7).iter().map(|v| v.exp()).sum();
    for (t, h) in handles.into_iter().enumerate() {
        let got = h.join().unwrap();
        let expect = total * (t as f32 + 10.0);
        assert!(
            (got - expect).abs() < 1e-3 * expect.abs(),
            "thread {t}: {got} vs {expect}"
        );
    }
}

fn fusion_off_runs_every_op_when_recorded() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(false);
    let d = dev();
    let x = Tensor::from_slice(&data(59, 0.8), &[59], &d).unwrap();
    let before = snapshot();
    let y = x.exp().unwrap();
    assert!(!y.is_pending(), "unfused ops are flushed when recorded");
    let z = y.add(1.0).unwrap().sqrt().unwrap();
    assert!(!z.is_pending());
    z.realize().unwrap();
    let after = snapshot();
    assert_eq!(
        after.regions_executed - before.regions_executed,
        3,
        "one region per op"
    );
    assert_eq!(
        after.flushes_for(FlushReason::Eager) - before.flushes_for(FlushReason::Eager),
        3
    );
}

fn fused_equals_unfused_on_multi_op_programs() {
    let _l = metrics_lock();
    let d = dev();
    let run = |fuse: bool| {
        let _f = FusionGuard::new(fuse);
        let x = Tensor::from_slice(&data(6 * 5, 0.9), &[6, 5], &d).unwrap();
        let w = Tensor::from_slice(&data(5 * 4, 1.3), &[5, 4], &d).unwrap();
        let h = x.matmul(&w).unwrap().gelu().unwrap();
        let mu = h.mean([-1], true).unwrap();
        let c = h.sub(&mu).unwrap();
        let var = c.mul(&c).unwrap().mean([-1], true).unwrap();
        let n = c.div(var.add(1e-5).unwrap().sqrt().unwrap()).unwrap();
        let m = n
            .maximum(
                n.transpose(0, 1)
                    .unwrap()
                    .narrow(0, 0, 1)
                    .unwrap()
                    .reshape(&[1, 6])
                    .unwrap()
                    .narrow(1, 0, 4)
                    .unwrap(),
            )
            .unwrap();
        let sel = m
            .gt(0.0)
            .unwrap()
            .where_cond(&m, &m.neg().unwrap())
            .unwrap();
        let out = Tensor::cat(&[&sel, &m.exp().unwrap()], 0).unwrap();
        let am = out.argmax(1, false).unwrap();
        (out.to_vec::<f32>().unwrap(), am.to_vec::<i64>().unwrap())
    };
    let (fa, fb) = run(true);
    let (ua, ub) = run(false);
    assert_eq!(fb, ub);
    for (a, b) in fa.iter().zip(&ua) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "fused {a} vs unfused {b}"
        );
    }
}

fn graph_cap_flushes_long_recordings() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let old = lazyfuse::max_pending_ops();
    lazyfuse::set_max_pending_ops(50);
    let before = snapshot();
    let mut x = Tensor::from_slice(&data(61, 1.0), &[61], &d).unwrap();
    for _ in 0..120 {
        x = x.mul(1.0001).unwrap();
    }
    let v = x.to_vec::<f32>().unwrap();
    lazyfuse::set_max_pending_ops(old);
    let after = snapshot();
    assert!(
        after.flushes_for(FlushReason::GraphCap) - before.flushes_for(FlushReason::GraphCap) >= 2
    );
    let expect = data(61, 1.0)[0] * 1.0001f32.powi(120);
    assert!((v[0] - expect).abs() < 1e-4);
}

fn creation_ops_are_lazy_and_fuse() {
    let _l = metrics_lock();
    let d = dev();
    let z = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    let o = Tensor::ones(&[3], DType::F32, &d).unwrap();
    let r = Tensor::arange(0.0, 6.0, DType::I64, &d)
        .unwrap()
        .reshape(&[2, 3])
        .unwrap();
    let f = Tensor::full(2.5, &[2, 3], DType::F64, &d).unwrap();
    assert!(z.is_pending());
    assert_eq!(z.add(&o).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 6]);
    assert_eq!(r.to_vec::<i64>().unwrap(), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(f.to_vec::<f64>().unwrap(), vec![2.5; 6]);
    let s = Tensor::arange_step(1.0, -1.0, -0.5, DType::F32, &d).unwrap();
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![1.0, 0.5, 0.0, -0.5]);
    let a = Tensor::rand(&[1000], 7, &d)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!(a.iter().all(|&v| (0.0..1.0).contains(&v)));
    let b = Tensor::rand(&[1000], 7, &d)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(a, b, "seeded rand is deterministic");
    let n = Tensor::randn(&[4000], 3, &d).unwrap();
    let mean = n.mean(.., false).unwrap().item::<f32>().unwrap();
    let var = n
        .mul(&n)
        .unwrap()
        .mean(.., false)
        .unwrap()
        .item::<f32>()
        .unwrap();
    assert!(
        mean.abs() < 0.06 && (var - 1.0).abs() < 0.08,
        "mean {mean} var {var}"
    );
}

fn display_shows_values() {
    let _l = metrics_lock();
    let d = dev();
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &d).unwrap();
    assert_eq!(format!("{x}"), "[[1.0, 2.0], [3.0, 4.0]] f32[2, 2]");
    let b = x.gt(2.0).unwrap();
    assert_eq!(format!("{b}"), "[[false, false], [true, true]] bool[2, 2]");
    let i = Tensor::from_slice(&[7i32], &[], &d).unwrap();
    assert_eq!(format!("{i:?}"), "Tensor(7 i32[])");
}

fn a_flush_returns_at_once_and_later_graphs_use_in_flight_results() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let x = Tensor::from_slice(&data(67, 1.1), &[67], &d).unwrap();
    let mut y = x.clone();
    let mut expect = data(67, 1.1);
    for k in 0..5 {
        y = y.mul(0.5).unwrap().add(k as f64).unwrap();
        for e in &mut expect {
            *e = *e * 0.5 + k as f32;
        }
        lazyfuse::flush(); // hand it over; keep recording on the in-flight value
        assert!(!y.is_pending());
    }
    let got = y.to_vec::<f32>().unwrap();
    for (a, e) in got.iter().zip(&expect) {
        assert!((a - e).abs() < 1e-5, "{a} vs {e}");
    }
}

/// A read (or `realize()`) flushed with nothing queued runs on the reading
/// thread (counted). A read flushed right behind other work gives the right
/// value, and so does another thread using a value whose read may be
/// running on this one.
fn a_read_with_nothing_queued_runs_on_the_reading_thread() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let x = Tensor::from_slice(&data(64, 0.3), &[64], &d).unwrap();
    x.realize().unwrap();
    // With launch blocking every job runs where it is flushed, not counted.
    let counted = u64::from(!lazyfuse::launch_blocking());
    let inline = || snapshot().flushes_inline;
    let before = inline();
    let y = x.mul(3.0).unwrap().add(1.0).unwrap();
    let got = y.to_vec::<f32>().unwrap();
    assert_eq!(inline() - before, counted, "an idle read runs here");
    for (g, e) in got.iter().zip(data(64, 0.3)) {
        assert!((g - (e * 3.0 + 1.0)).abs() < 1e-6, "{g} vs {e}");
    }
    let z = y.mul(&y).unwrap();
    z.realize().unwrap();
    assert_eq!(inline() - before, 2 * counted, "so does an idle realize()");
    // `flush()` hands a big graph over without waiting; the read that
    // follows may find it still queued or running.
    let mut w = x.clone();
    for _ in 0..400 {
        w = w.mul(1.0001).unwrap().sin().unwrap();
    }
    lazyfuse::flush();
    let v = w.add(1.0).unwrap().to_vec::<f32>().unwrap();
    let mut expect = data(64, 0.3);
    for e in &mut expect {
        for _ in 0..400 {
            *e = (*e * 1.0001).sin();
        }
        *e += 1.0;
    }
    for (g, e) in v.iter().zip(&expect) {
        assert!((g - e).abs() < 1e-4, "{g} vs {e}");
    }
    // Another thread uses a value this thread reads at the same time.
    let big = Tensor::from_slice(&data(1 << 16, 0.9), &[1 << 16], &d).unwrap();
    let s = big.exp().unwrap().sum([0], false).unwrap();
    let t = s.clone();
    let reader = std::thread::spawn(move || t.mul(2.0).unwrap().item::<f32>().unwrap());
    let here = s.item::<f32>().unwrap();
    let there = reader.join().unwrap();
    assert_eq!(there, here * 2.0);
}

/// On the CPU plugin every read copies the result straight from its host
/// memory (`d2h_in_place`), whatever its dtype or the layout of the op
/// that made it; the interpreter's reads are plain copies, not counted.
fn reads_of_host_memory_buffers_are_in_place() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let x = Tensor::from_slice(&data(12, 0.2), &[3, 4], &d).unwrap();
    let before = snapshot();
    let t = x.permute(&[1, 0]).unwrap().mul(2.0).unwrap();
    let got = t.to_vec::<f32>().unwrap();
    let host = data(12, 0.2);
    let expect: Vec<f32> = (0..4)
        .flat_map(|j| (0..3).map(move |i| (i, j)))
        .map(|(i, j)| host[i * 4 + j] * 2.0)
        .collect();
    assert_eq!(got, expect);
    let pos = x.gt(0.0).unwrap().to_vec::<bool>().unwrap();
    assert_eq!(pos, host.iter().map(|&v| v > 0.0).collect::<Vec<_>>());
    let idx = x.argmax(1, false).unwrap().to_vec::<i64>().unwrap();
    assert_eq!(idx.len(), 3);
    let reads = snapshot().d2h_transfers - before.d2h_transfers;
    let in_place = snapshot().d2h_in_place - before.d2h_in_place;
    assert_eq!(reads, 3);
    assert_eq!(in_place, if d.is_interpreter() { 0 } else { 3 });
}

/// `read_into` writes the value into memory the caller owns, the same
/// bytes `to_host` gives (a bf16 result and a permuted one included); a
/// buffer of the wrong size is an `Err` and nothing is written.
fn read_into_fills_the_callers_memory_and_checks_its_size() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let x = Tensor::from_slice(&data(12, 0.3), &[3, 4], &d).unwrap();
    for t in [
        x.permute(&[1, 0]).unwrap().mul(3.0).unwrap(),
        x.to_dtype(DType::BF16).unwrap().exp().unwrap(),
        x.sum([1], false).unwrap(),
    ] {
        let want = t.to_host().unwrap().bytes;
        let mut got = vec![0xAAu8; want.len()];
        t.read_into(&mut got).unwrap();
        assert_eq!(got, want);
        let mut short = vec![0xAAu8; want.len() - 1];
        let e = t.read_into(&mut short).unwrap_err().to_string();
        assert!(e.contains("read_into") && e.contains("bytes"), "{e}");
        assert!(short.iter().all(|&b| b == 0xAA));
    }
}

/// `host_view` lends the value in place (both CPU devices keep it in host
/// memory): the bytes equal `to_host`'s, and stay so after the tensor is
/// dropped and a computation that would have donated its buffer to its
/// result has run.
fn a_host_view_keeps_its_bytes_while_the_program_goes_on() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let x = Tensor::from_slice(&data(64, 0.7), &[8, 8], &d)
        .unwrap()
        .mul(2.0)
        .unwrap();
    let view = x
        .host_view()
        .unwrap()
        .expect("a CPU device keeps values in host memory");
    let want = x.to_host().unwrap().bytes;
    assert_eq!(view.bytes(), &want[..]);
    assert_eq!(
        (view.shape().dims(), view.dtype()),
        (&[8usize, 8][..], DType::F32)
    );
    // x dies before the flush: only the view still holds its buffer.
    let y = x.add(1.0).unwrap().exp().unwrap();
    drop(x);
    let got = y.to_vec::<f32>().unwrap();
    assert_eq!(got.len(), 64);
    for _ in 0..3 {
        let z = Tensor::from_slice(&data(64, 1.0), &[8, 8], &d).unwrap();
        z.sin().unwrap().to_vec::<f32>().unwrap();
    }
    assert_eq!(view.bytes(), &want[..]);
}

fn two_threads_missing_the_same_key_compile_it_once() {
    let _l = metrics_lock();
    let before = snapshot();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let device = dev();
    let handles: Vec<_> = (0..2)
        .map(|t| {
            let b = barrier.clone();
            let d = device.clone();
            std::thread::spawn(move || {
                let _f = FusionGuard::new(true);
                let x = Tensor::from_slice(&data(71, t as f32), &[71], &d).unwrap();
                let y = x.sin().unwrap().exp().unwrap().mul(&x).unwrap();
                b.wait();
                y.to_vec::<f32>().unwrap()
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let after = snapshot();
    assert_eq!(
        after.compiles - before.compiles,
        1,
        "one compile for both threads"
    );
    assert_eq!(after.cache_hits - before.cache_hits, 1);
}

/// Rounds of [`cross_thread_recording_never_hangs`] (`LAZYFUSE_STRESS_ROUNDS`).
fn stress_rounds() -> usize {
    std::env::var("LAZYFUSE_STRESS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// Regression for the submit race: a flush used to mark its tensors in
/// flight before queueing its job, so another thread could see one in
/// flight, queue a job reading it first, and hang the single worker on a
/// job queued behind itself. Threads here record on each other's pending
/// and in-flight tensors and flush every round; a watchdog turns a hang
/// into a failure.
fn cross_thread_recording_never_hangs() {
    use std::sync::{mpsc, Arc, Mutex};
    const THREADS: usize = 4;
    let _l = metrics_lock();
    let d = dev();
    let rounds = stress_rounds();
    let slots: Arc<Vec<Mutex<Tensor>>> = Arc::new(
        (0..THREADS)
            .map(|t| Mutex::new(Tensor::full(t as f64, &[16], DType::F32, &d).unwrap()))
            .collect(),
    );
    let (done_tx, done_rx) = mpsc::channel();
    for t in 0..THREADS {
        let slots = slots.clone();
        let done = done_tx.clone();
        std::thread::spawn(move || {
            let _f = FusionGuard::new(true);
            let r = (|| -> lazyfuse::Result<()> {
                for r in 0..rounds {
                    let other = slots[(t + 1 + r % (THREADS - 1)) % THREADS]
                        .lock()
                        .unwrap()
                        .clone();
                    let mine = slots[t].lock().unwrap().clone();
                    // Depends on `other` (pending in its owner's graph, or in
                    // flight), but its value is `mine + 1` whatever the timing.
                    let next = mine.add(&other.mul(0.0)?)?.add(1.0)?;
                    *slots[t].lock().unwrap() = next.clone();
                    if r % 3 != 2 {
                        lazyfuse::flush();
                    } else {
                        next.realize()?;
                    }
                }
                Ok(())
            })();
            let _ = done.send((t, r));
        });
    }
    drop(done_tx);
    let watchdog = std::time::Duration::from_secs(120);
    for _ in 0..THREADS {
        match done_rx.recv_timeout(watchdog) {
            Ok((t, r)) => r.unwrap_or_else(|e| panic!("thread {t}: {e}")),
            Err(_) => panic!(
                "cross-thread recording hung: no thread finished within {watchdog:?} ({rounds} rounds)"
            ),
        }
    }
    for (t, s) in slots.iter().enumerate() {
        let v = s.lock().unwrap().to_vec::<f32>().unwrap();
        assert_eq!(v, vec![(t + rounds) as f32; 16], "thread {t}");
    }
}

/// A scalar the program holds at a flush is uploaded from its value, not
/// computed by a region (`Plan::constants`): it comes back with the right
/// value and dtype, fused or not, here and on another thread.
fn held_scalars_are_uploaded_with_their_values() {
    let _l = metrics_lock();
    let d = dev();
    let x = Tensor::from_slice(&[1.0f32, -2.0, 3.0], &[3], &d).unwrap();
    let k = Tensor::from_slice(&[4i64, 5, 6], &[3], &d).unwrap();
    for fuse in [true, false] {
        let _f = FusionGuard::new(fuse);
        let s = Tensor::full(0.75, &[], DType::F32, &d).unwrap();
        assert_eq!(
            x.mul(&s).unwrap().to_vec::<f32>().unwrap(),
            [0.75, -1.5, 2.25]
        );
        assert!(!s.is_pending(), "fuse {fuse}: bound by the read of x * s");
        let n = Tensor::full(-3.0, &[], DType::I64, &d).unwrap();
        assert_eq!(k.add(&n).unwrap().to_vec::<i64>().unwrap(), [1, 2, 3]);
        assert!(!n.is_pending(), "fuse {fuse}: bound by the read of k + n");
        let compiles = snapshot().compiles;
        let n_again = Tensor::full(-4.0, &[], DType::I64, &d).unwrap();
        assert_eq!(k.add(&n_again).unwrap().to_vec::<i64>().unwrap(), [0, 1, 2]);
        assert_eq!(
            (snapshot().compiles, n_again.item::<i64>().unwrap()),
            (compiles, -4),
            "fuse {fuse}: another value compiles nothing new"
        );
        let (s2, n2) = (s.clone(), n.clone());
        let there = std::thread::spawn(move || {
            let a = s2.add(1.0).unwrap().item::<f32>().unwrap();
            (a, n2.item::<i64>().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(there, (1.75, -3));
        assert_eq!((s.item::<f32>().unwrap(), n.dtype()), (0.75, DType::I64));
    }
}
