//! Custom kernels: the escape hatch for an op lazyfuse lacks or runs slowly.
//!
//! A [`CustomOp`] is either a host kernel, a Rust function XLA calls on
//! the CPU (see [`host`]), or a StableHLO function (text, as `jax.jit(f).lower(..)
//! .as_text()` or a hand-written module gives it) with a declared
//! signature. Applied to tensors it records like any op: it fuses with its
//! neighbours (its function is called from the region's `@main`, and XLA
//! inlines it), its regions are cached, it runs op by op under
//! `LAZYFUSE_FUSION=0`, and with [`CustomOp::with_grad`] autograd
//! differentiates through it.
//!
//! ```no_run
//! # fn main() -> lazyfuse::Result<()> {
//! use lazyfuse::{custom, DType, Device, Tensor};
//! let dev = Device::cpu()?;
//! let softplus = custom::stablehlo(
//!     "softplus",
//!     r#"func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
//!          %e = stablehlo.exponential %x : tensor<4xf32>
//!          %y = stablehlo.log_plus_one %e : tensor<4xf32>
//!          return %y : tensor<4xf32>
//!        }"#,
//!     &[(&[4], DType::F32)],
//!     (&[4], DType::F32),
//!     &dev,
//! )?
//! .with_grad(|x, _y, g| Ok(vec![Some(g.mul(&x[0].sigmoid()?)?)]));
//! let x = Tensor::from_slice(&[0.5f32, -1.0, 2.0, 0.0], &[4], &dev)?;
//! let y = softplus.apply(&[&x])?;
//! # Ok(()) }
//! ```
//!
//! The text is checked when the op is made: it is compiled once on the
//! device, on a thread of its own (the caller's pending ops are not
//! flushed), so a malformed module or a signature that disagrees with the
//! declared one is an `Err` naming the caller's line, not a failure at a
//! later sync point. The reference interpreter cannot run StableHLO: on the
//! interpreter device, applying a custom op is an `Err`.

use crate::autograd::custom::{register, GradFn};
use crate::{Device, Error, Result, Tensor};
use lazyfuse_ir::{host_kernels, CustomKernel, DType, HostFn, KernelBody, Op, Shape};
use std::sync::Arc;

pub use lazyfuse_ir::{HostArg, HostElement, HostOut};

/// A StableHLO function usable as an op (see the [module docs](self)).
#[derive(Clone)]
pub struct CustomOp {
    kernel: Arc<CustomKernel>,
}

impl std::fmt::Debug for CustomOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CustomOp({})", self.kernel.name)
    }
}

/// The functions of `text`: a module's body, or the text itself when it is
/// bare `func.func`s.
fn functions(text: &str) -> &str {
    let t = text.trim();
    if t.starts_with("module") {
        if let (Some(open), Some(close)) = (t.find('{'), t.rfind('}')) {
            if open < close {
                return t[open + 1..close].trim();
            }
        }
    }
    t
}

/// Makes a custom op from StableHLO `text` whose entry function is
/// `@main`, taking operands of the `params` shapes and dtypes and
/// returning one tensor of `result`'s. `name` names it in errors and dumps.
/// The text is compiled once on `device` to check it.
#[track_caller]
pub fn stablehlo(
    name: &str,
    text: &str,
    params: &[(&[usize], DType)],
    result: (&[usize], DType),
    device: &Device,
) -> Result<CustomOp> {
    let loc = crate::site::caller();
    let fail = |why: String| Error::op("custom::stablehlo", why, name.to_string(), loc);
    let body = functions(text);
    if !body.contains("func.func") || !body.contains("@main") {
        return Err(fail(
            "the text must define a `func.func @main` (alone or in a module)".into(),
        ));
    }
    if params.is_empty() {
        return Err(fail("a custom op takes at least one operand".into()));
    }
    let kernel = Arc::new(CustomKernel {
        name: name.to_string(),
        body: KernelBody::StableHlo(body.to_string()),
        params: params.iter().map(|(d, t)| (Shape::new(d), *t)).collect(),
        result: (Shape::new(result.0), result.1),
    });
    let op = CustomOp { kernel };
    op.check(device).map_err(|e| fail(e.message()))?;
    Ok(op)
}

/// Makes a custom op from a Rust function run on the host: `kernel`
/// reads the operands (shapes and dtypes as `params` declares) and writes
/// the result (`result`'s shape and dtype). On the CPU plugin XLA calls it
/// as a typed-FFI custom call in the middle of a fused region, on its
/// buffers, with no copy; the interpreter device calls it directly. It is
/// registered under `name`, which must be unique in the process (letters,
/// digits, `_`, `.`, `-`): another function under a taken name is an
/// `Err`. A kernel's `Err` (or panic) fails the execution that ran it,
/// with its message, and the runtime stays usable. On a plugin without
/// FFI handler registration (or a GPU), running it is an `Err` saying so.
///
/// ```no_run
/// # fn main() -> lazyfuse::Result<()> {
/// use lazyfuse::{custom, DType, Device, Tensor};
/// let dev = Device::cpu()?;
/// let cube = custom::host("cube", &[(&[3], DType::F32)], (&[3], DType::F32), |x, out| {
///     let x = x[0].as_slice::<f32>().ok_or("f32 expected")?;
///     for (o, v) in out.as_mut_slice::<f32>().ok_or("f32 expected")?.iter_mut().zip(x) {
///         *o = v * v * v;
///     }
///     Ok(())
/// })?;
/// let y = cube.apply(&[&Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &dev)?])?;
/// # Ok(()) }
/// ```
#[track_caller]
pub fn host(
    name: &str,
    params: &[(&[usize], DType)],
    result: (&[usize], DType),
    kernel: impl Fn(&[HostArg<'_>], &mut HostOut<'_>) -> std::result::Result<(), String>
        + Send
        + Sync
        + 'static,
) -> Result<CustomOp> {
    let loc = crate::site::caller();
    let fail = |why: String| Error::op("custom::host", why, name.to_string(), loc);
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if name.is_empty() || !name.chars().all(valid) {
        return Err(fail(
            "a host kernel's name is letters, digits, `_`, `.` and `-`".into(),
        ));
    }
    if params.is_empty() {
        return Err(fail("a custom op takes at least one operand".into()));
    }
    let f = HostFn::new(kernel);
    host_kernels::register(name, &f).map_err(fail)?;
    Ok(CustomOp {
        kernel: Arc::new(CustomKernel {
            name: name.to_string(),
            body: KernelBody::Host(f),
            params: params.iter().map(|(d, t)| (Shape::new(d), *t)).collect(),
            result: (Shape::new(result.0), result.1),
        }),
    })
}

impl CustomOp {
    /// Gives the op a gradient: `f(operands, result, result_grad)` returns
    /// each operand's gradient (`None` for an operand that gets none),
    /// written with tensor ops (or other custom ops). Without one, a
    /// backward pass through the op is an `Err`.
    pub fn with_grad(
        self,
        f: impl Fn(&[Tensor], &Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
    ) -> CustomOp {
        let f: Arc<GradFn> = Arc::new(f);
        register(&self.kernel, f);
        self
    }

    /// The op's name.
    pub fn name(&self) -> &str {
        &self.kernel.name
    }

    /// Records the op on `args` (shapes and dtypes as declared); an `Err`
    /// at the caller's line otherwise.
    #[track_caller]
    pub fn apply(&self, args: &[&Tensor]) -> Result<Tensor> {
        let loc = crate::site::caller();
        if let Some(t) = args.first() {
            if t.device().is_interpreter() && self.kernel.host().is_none() {
                return Err(Error::op(
                    "custom",
                    format!(
                        "kernel {} is StableHLO, which the interpreter device cannot run",
                        self.kernel.name
                    ),
                    t.describe(),
                    loc,
                ));
            }
        }
        Tensor::apply(Op::Custom(self.kernel.clone()), args, loc)
    }

    /// Compiles (and runs once, on zeros) the op alone on `device`, on a
    /// thread of its own so no pending op of the caller is flushed.
    fn check(&self, device: &Device) -> Result<()> {
        if device.is_interpreter() {
            return Ok(());
        }
        let (op, device) = (self.clone(), device.clone());
        std::thread::spawn(move || -> Result<()> {
            let args = op
                .kernel
                .params
                .iter()
                .map(|(s, d)| Tensor::zeros(s.dims(), *d, &device))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&Tensor> = args.iter().collect();
            op.apply(&refs)?.realize()?;
            Ok(())
        })
        .join()
        .unwrap_or_else(|_| Err(Error::internal("checking a custom op panicked")))
    }
}
