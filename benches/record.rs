//! Recording cost: how long one elementwise op on pending tensors takes to
//! validate and append to the graph (target: at most 150 ns). The graph is
//! flushed outside the timed region by `iter_batched`; the drop of each
//! op's previous value is inside it (the graph holds a pending value until
//! the flush, which recycles the dead ones for the next batch's ops).

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use lazyfuse::{Device, FusionGuard, Tensor};

const OPS_PER_BATCH: usize = 1000;

fn bench_record(c: &mut Criterion) {
    let dev = Device::cpu().expect("XLA CPU plugin");
    let _fused = FusionGuard::new(true);
    let x = Tensor::randn(&[64, 64], 0, &dev).unwrap();
    let y = Tensor::randn(&[64, 64], 1, &dev).unwrap();
    let mut g = c.benchmark_group("record");
    g.throughput(criterion::Throughput::Elements(OPS_PER_BATCH as u64));
    type Op = fn(&Tensor, &Tensor) -> Tensor;
    let cases: [(&str, Op); 3] = [
        ("binary_op_on_pending_x1000", |acc, y| acc.mul(y).unwrap()),
        ("scalar_op_on_pending_x1000", |acc, _| {
            acc.mul(1.0001).unwrap()
        }),
        ("unary_op_on_pending_x1000", |acc, _| acc.tanh().unwrap()),
    ];
    for (name, op) in cases {
        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    // Flush the previous batch: its result is dropped, so nothing runs.
                    lazyfuse::sync();
                    x.add(&y).unwrap()
                },
                |mut acc| {
                    for _ in 0..OPS_PER_BATCH {
                        acc = op(&acc, &y);
                    }
                    acc
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
    lazyfuse::sync();
}

criterion_group!(benches, bench_record);
criterion_main!(benches);
