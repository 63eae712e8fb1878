//! The in-memory executable cache is bounded (`LAZYFUSE_MAX_EXECUTABLES`): a
//! long-lived process with many distinct shapes keeps at most that many
//! executables, drops the least recently used, and recompiles one when it
//! is needed again, with the same results. Its own test binary, because the
//! cap is process-wide.

mod common;

use lazyfuse::{metrics, set_max_executables, Tensor};

#[test]
fn distinct_shapes_beyond_the_cap_evict_and_recompile() {
    set_max_executables(8);
    // Distinct shapes, not buckets of one dynamic length: every n compiles.
    lazyfuse::set_auto_dynamic(false);
    let dev = common::dev();
    let run = |n: usize| -> Vec<f32> {
        let x = Tensor::arange(0.0, n as f64, lazyfuse::DType::F32, &dev).unwrap();
        x.mul(3.0).unwrap().exp().unwrap().to_vec::<f32>().unwrap()
    };
    let first = run(1);
    let m0 = metrics::snapshot();
    for n in 2..40 {
        assert_eq!(run(n).len(), n);
    }
    let m1 = metrics::snapshot();
    assert!(
        m1.executables_evicted > m0.executables_evicted,
        "38 new shapes past a cap of 8 evict nothing"
    );
    // The first shape's executable is long gone: compiled again, same answer.
    assert_eq!(run(1), first);
    let m2 = metrics::snapshot();
    if common::backends().contains(&common::Backend::Xla) {
        assert!(
            m2.compiles > m1.compiles,
            "an evicted executable was not recompiled"
        );
    }
}
