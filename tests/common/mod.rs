//! Shared helpers for the integration tests (all against the real XLA plugin).
#![allow(dead_code)]

pub mod mlp;

use lazyfuse::ir::{interp, DType, HostTensor, Op, Shape};
use lazyfuse::{Device, FusionGuard, Result, Tensor};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The default device (the provisioned CPU plugin, or `TPU_PJRT_PLUGIN`).
pub fn dev() -> Device {
    static D: OnceLock<Device> = OnceLock::new();
    D.get_or_init(|| Device::cpu().expect("the XLA CPU plugin must load for integration tests"))
        .clone()
}

/// Serialises tests that assert on process-wide metric deltas.
pub fn metrics_lock() -> MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    L.lock().unwrap_or_else(|e| e.into_inner())
}

/// Deterministic test data: splitmix64 stream.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// Random host data of `dtype` in a range suited to the dtype.
pub fn random_host(rng: &mut Rng, dims: &[usize], dtype: DType, lo: f64, hi: f64) -> HostTensor {
    let shape = Shape::new(dims);
    let n = shape.numel();
    match dtype {
        DType::Bool => HostTensor::from_i64(
            &(0..n)
                .map(|_| (rng.next_u64() & 1) as i64)
                .collect::<Vec<_>>(),
            shape,
            dtype,
        ),
        DType::U8 => HostTensor::from_i64(
            &(0..n).map(|_| rng.below(256) as i64).collect::<Vec<_>>(),
            shape,
            dtype,
        ),
        d if d.is_int() => HostTensor::from_i64(
            &(0..n)
                .map(|_| rng.range(lo, hi).round() as i64)
                .collect::<Vec<_>>(),
            shape,
            dtype,
        ),
        _ => HostTensor::from_f64(
            &(0..n).map(|_| rng.range(lo, hi)).collect::<Vec<_>>(),
            shape,
            dtype,
        ),
    }
}

/// Relative and absolute tolerance for comparing against the reference interpreter.
/// XLA computes in the dtype (with its own exp/tanh approximations) while the
/// interpreter computes in f64 and rounds once, so floats differ by a few ulps
/// per op; half types by their much larger ulp.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-12, 1e-12),
        DType::F32 => (2e-5, 2e-6),
        DType::F16 => (4e-3, 1e-3),
        DType::BF16 => (3e-2, 1e-2),
        _ => (0.0, 0.0),
    }
}

/// Asserts two host tensors agree: same shape and dtype; floats within the
/// dtype's tolerance (scaled by `slack`), NaN equal to NaN, infinities exact;
/// integers and bools exact.
pub fn assert_close(what: &str, actual: &HostTensor, expected: &HostTensor, slack: f64) {
    assert_eq!(actual.shape, expected.shape, "{what}: shape");
    assert_eq!(actual.dtype, expected.dtype, "{what}: dtype");
    if !actual.dtype.is_float() {
        assert_eq!(
            actual.bytes,
            expected.bytes,
            "{what}: values {:?} vs {:?}",
            actual.to_i64_vec(),
            expected.to_i64_vec()
        );
        return;
    }
    let (rtol, atol) = tolerance(actual.dtype);
    let (a, e) = (actual.to_f64_vec(), expected.to_f64_vec());
    for (i, (x, y)) in a.iter().zip(&e).enumerate() {
        let ok = (x.is_nan() && y.is_nan())
            || (x == y)
            || ((x - y).abs() <= slack * (atol + rtol * y.abs()) && x.is_finite() && y.is_finite());
        assert!(ok, "{what}: element {i}: got {x}, expected {y} (dtype {}, tol rtol {rtol} atol {atol} x{slack})\n got {a:?}\n exp {e:?}", actual.dtype);
    }
}

/// Uploads host tensors.
pub fn upload(hs: &[HostTensor]) -> Vec<Tensor> {
    hs.iter()
        .map(|h| Tensor::from_host(h, &dev()).unwrap())
        .collect()
}

/// Runs `api` on uploaded `inputs` fused and unfused and compares both with
/// the interpreter's evaluation of `op`.
pub fn check(
    what: &str,
    op: &Op,
    inputs: &[HostTensor],
    slack: f64,
    api: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) {
    let refs: Vec<&HostTensor> = inputs.iter().collect();
    let expected =
        interp::eval_op(op, &refs).unwrap_or_else(|e| panic!("{what}: interpreter rejected: {e}"));
    for fuse in [true, false] {
        let _g = FusionGuard::new(fuse);
        let ts = upload(inputs);
        let out = api(&ts).unwrap_or_else(|e| panic!("{what}: api error {e}"));
        let got = out
            .to_host()
            .unwrap_or_else(|e| panic!("{what} (fuse={fuse}): {e}"));
        assert_close(&format!("{what} fuse={fuse}"), &got, &expected, slack);
    }
}
