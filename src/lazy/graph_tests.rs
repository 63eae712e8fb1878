//! Tests of per-thread recording: weights entered once per graph, dead
//! values freed by the flush, and a thread's exit.

use crate::{Device, FusionGuard, Tensor};

/// A value on the device used by every op of a loop is one input node
/// of each graph, found without locking it after its first use there,
/// and threads recording with it at the same time (each writing the
/// value's packed node word for its own graph) still get their own
/// nodes and right answers, across several generations.
#[test]
fn a_value_on_the_device_is_one_input_of_each_threads_graph() {
    let dev = Device::interpreter();
    let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &dev).unwrap();
    w.realize().unwrap();
    let barrier = std::sync::Barrier::new(3);
    let run = |k: f32| {
        let _fused = FusionGuard::new(true);
        for round in 0..3 {
            barrier.wait();
            let mut acc = Tensor::from_slice(&[k; 3], &[3], &dev).unwrap();
            for _ in 0..200 {
                acc = acc.add(&w).unwrap().mul(1.0).unwrap();
            }
            let inputs = super::with_thread_graph(&dev, None, |g| g.state.lock().inputs.len());
            assert_eq!(inputs, 2, "round {round}: the start value and w");
            let want: Vec<f32> = [1.0, 2.0, 3.0].iter().map(|x| k + 200.0 * x).collect();
            assert_eq!(acc.to_vec::<f32>().unwrap(), want);
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| run(10.0));
        s.spawn(|| run(-5.0));
        run(0.5);
    });
}

/// A pending value that dies is freed by the next flush, which does
/// not compute it; one still alive is computed, and its value is right.
#[test]
fn dead_pending_values_are_freed_by_the_next_flush() {
    let dev = Device::interpreter();
    let _fused = FusionGuard::new(true);
    crate::sync();
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &dev).unwrap();
    let mut acc = x.add(&x).unwrap();
    let first = std::sync::Arc::downgrade(&acc.0);
    for _ in 0..10 {
        acc = acc.mul(2.0).unwrap();
    }
    let last = std::sync::Arc::downgrade(&acc.0);
    crate::sync();
    assert!(first.upgrade().is_none(), "a dead value outlived the flush");
    assert!(last.upgrade().is_some());
    assert_eq!(acc.to_vec::<f32>().unwrap(), vec![2048.0, 4096.0, 6144.0]);
}

/// A thread that exits with pending values flushes its graph: a value
/// it handed to another thread is computed (not left in a graph nobody
/// records into), and the graph and the values nobody holds are freed
/// (a pending value and its graph hold each other until a flush).
#[test]
fn an_exiting_thread_computes_what_others_hold_and_frees_its_graph() {
    let dev = Device::interpreter();
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &dev).unwrap();
    let (kept, graph, dropped) = std::thread::scope(|s| {
        s.spawn(|| {
            // Kept for the thread's life: restoring the mode on drop
            // would flush the graph before the thread exits.
            std::mem::forget(FusionGuard::new(true));
            let dead = x.mul(3.0).unwrap();
            let kept = dead.add(&x).unwrap();
            let graph = super::with_thread_graph(&dev, None, std::sync::Arc::downgrade);
            (kept, graph, std::sync::Arc::downgrade(&dead.0))
        })
        .join()
        .unwrap()
    });
    assert!(
        !kept.0.is_pending(),
        "the exiting thread's graph was not flushed"
    );
    assert!(
        dropped.upgrade().is_none(),
        "a dead value outlived its thread"
    );
    assert!(graph.upgrade().is_none(), "the thread's graph outlived it");
    assert_eq!(kept.to_vec::<f32>().unwrap(), vec![4.0, 8.0, 12.0]);
}
