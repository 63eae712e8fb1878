//! Shared helpers for the integration tests: the device under test (the real
//! XLA plugin, or the reference-interpreter device), deterministic data and
//! comparisons against the interpreter.
//!
//! The XLA backend is the CPU plugin, or GPU 0 with
//! `LAZYFUSE_TEST_DEVICE=cuda` (the op tables, the lazy tests and every
//! other test built on [`dev`] then run on the GPU).
//!
//! Backends: `LAZYFUSE_TEST_BACKENDS` is a comma list of `xla` and `interp`
//! (default both). Tests declared with [`test_device!`] run once per backend
//! (`name::xla`, `name::interp`); a backend that is not selected is skipped
//! with a printed reason, so `LAZYFUSE_TEST_BACKENDS=interp` passes on a
//! machine with no plugin. [`dev`] is the device of the backend the calling
//! test runs on.
#![allow(dead_code)]

pub mod child;
pub mod gradcheck;
pub mod mlp;

use lazyfuse::ir::{interp, DType, HostTensor, Op, Shape};
use lazyfuse::{Device, FusionGuard, Result, Tensor};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// A backend the integration tests run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// XLA's CPU plugin (provisioned, or `LAZYFUSE_PJRT_PLUGIN`).
    Xla,
    /// `Device::interpreter()`.
    Interp,
}

/// The backends `LAZYFUSE_TEST_BACKENDS` selects (default: both, XLA
/// first; the interpreter alone when lazyfuse is built without `xla`).
pub fn backends() -> &'static [Backend] {
    static B: OnceLock<Vec<Backend>> = OnceLock::new();
    B.get_or_init(|| {
        let Ok(v) = std::env::var("LAZYFUSE_TEST_BACKENDS") else {
            if cfg!(feature = "xla") {
                return vec![Backend::Xla, Backend::Interp];
            }
            return vec![Backend::Interp];
        };
        let picked: Vec<Backend> = v
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| match s {
                "xla" | "cpu" | "pjrt" => Backend::Xla,
                "interp" | "interpreter" => Backend::Interp,
                other => panic!("LAZYFUSE_TEST_BACKENDS: unknown backend {other:?} (xla, interp)"),
            })
            .collect();
        assert!(
            !picked.is_empty(),
            "LAZYFUSE_TEST_BACKENDS selects no backend"
        );
        picked
    })
}

thread_local! {
    static CURRENT: std::cell::Cell<Option<Backend>> = const { std::cell::Cell::new(None) };
}

/// The backend the calling test runs on: the one [`run_on`] set, else the
/// first selected.
pub fn current() -> Backend {
    CURRENT.with(|c| c.get()).unwrap_or(backends()[0])
}

/// The XLA device under test: the CPU plugin (provisioned, or
/// `LAZYFUSE_PJRT_PLUGIN`), or GPU 0 with `LAZYFUSE_TEST_DEVICE=cuda`.
#[cfg(feature = "xla")]
pub fn xla_dev() -> Device {
    static D: OnceLock<Device> = OnceLock::new();
    D.get_or_init(|| {
        match std::env::var("LAZYFUSE_TEST_DEVICE")
            .as_deref()
            .map(str::trim)
        {
            Ok("cuda") => {
                Device::cuda(0).unwrap_or_else(|e| panic!("LAZYFUSE_TEST_DEVICE=cuda: {e}"))
            }
            Ok("cpu" | "") | Err(_) => {
                Device::cpu().expect("the XLA CPU plugin must load for integration tests")
            }
            Ok(other) => panic!("LAZYFUSE_TEST_DEVICE={other:?}: use cpu or cuda"),
        }
    })
    .clone()
}

/// Without the `xla` feature there is no XLA device to test.
#[cfg(not(feature = "xla"))]
pub fn xla_dev() -> Device {
    panic!("lazyfuse was built without its `xla` feature: select LAZYFUSE_TEST_BACKENDS=interp")
}

/// The device under test: see [`current`].
pub fn dev() -> Device {
    device_of(current())
}

/// The device of backend `b`.
pub fn device_of(b: Backend) -> Device {
    match b {
        Backend::Xla => xla_dev(),
        Backend::Interp => Device::interpreter(),
    }
}

/// Runs `f` with [`dev`] returning backend `b`'s device (this thread only).
pub fn with_backend<R>(b: Backend, f: impl FnOnce() -> R) -> R {
    struct Reset(Option<Backend>);
    impl Drop for Reset {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(CURRENT.with(|c| c.replace(Some(b))));
    f()
}

/// Runs test `f` on backend `b`, or says why it is skipped.
pub fn run_on(b: Backend, name: &str, f: fn()) {
    if !backends().contains(&b) {
        eprintln!("skipped {name} on {b:?}: not selected by LAZYFUSE_TEST_BACKENDS");
        return;
    }
    with_backend(b, f)
}

/// Declares each named `fn()` as one test per backend: `name::xla` and
/// `name::interp` (in the manner of candle's `test_device!`).
#[macro_export]
macro_rules! test_device {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[test]
                fn xla() {
                    $crate::common::run_on($crate::common::Backend::Xla, stringify!($name), super::$name)
                }
                #[test]
                fn interp() {
                    $crate::common::run_on($crate::common::Backend::Interp, stringify!($name), super::$name)
                }
            }
        )+
    };
}

/// Serialises tests that assert on process-wide metric deltas.
pub fn metrics_lock() -> MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    L.lock().unwrap_or_else(|e| e.into_inner())
}

/// Deterministic test data: lazyfuse's splitmix64 stream.
pub use lazyfuse::ir::SplitMix64 as Rng;

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
    let run = |fuse: bool| {
        let _g = FusionGuard::new(fuse);
        let ts = upload(inputs);
        let out = api(&ts).unwrap_or_else(|e| panic!("{what}: api error {e}"));
        out.to_host()
            .unwrap_or_else(|e| panic!("{what} (fuse={fuse}, {:?}): {e}", current()))
    };
    let fused = run(true);
    assert_close(&format!("{what} fuse=true"), &fused, &expected, slack);
    assert_close(&format!("{what} fuse=false"), &run(false), &expected, slack);
    // The interpreter device gives the XLA device's values for every op.
    if current() == Backend::Xla && backends().contains(&Backend::Interp) {
        let on_interp = with_backend(Backend::Interp, || run(true));
        assert_close(
            &format!("{what}: interpreter device vs XLA"),
            &on_interp,
            &fused,
            2.0 * slack,
        );
    }
}

/// A u64 in decimal or `0x` hex (the fuzzers' seeds).
pub fn parse_u64(v: &str) -> Option<u64> {
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// The u64 in environment variable `name`, if set; panics on a malformed
/// value, so a mistyped knob is never silently ignored.
pub fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(parse_u64(&v).unwrap_or_else(|| panic!("{name}={v} is not a u64")))
}
