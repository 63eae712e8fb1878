//! lazyfuse's own host kernels: Rust functions XLA's CPU backend calls as
//! custom calls (see `pjrt::ffi`) where its own code for an op is slow.
//! They are registered by name in the IR's host-kernel registry
//! ([`register_builtins`], also run when a CPU client enables host
//! kernels, so an executable from the persistent cache finds them); the
//! core records them as custom ops where they apply.
//!
//! A general matrix product was tried here too (the `gemm` crate in place
//! of the plugin's dot for f32 products of 8 rows or more): alone it ran
//! 1.2-2x faster than the dot, but in whole steps it gained 4% on
//! `mlp_train_step`, nothing on `transformer_block_fwd`, and a 16-row
//! decode step of the serving model got slower (38 ms against 33), the
//! kernel's threads competing with XLA's on two cores. It was not kept.
//!
//! Nor was a host convolution (im2col into per-thread scratch, one gemm
//! per group; commit `9effcee`, reverted next): alone, forward
//! convolutions of ResNet-18's and the UNet's shapes ran at XLA's speed
//! (both near 185 GFLOP/s on 2.4 GFLOP), 3.3x faster only where the
//! output is tiny and the channels deep (512 channels at 2x2: 2.3 against
//! 7.5 ms), and gradient convolutions through im2col were 2-7x slower
//! than XLA's; in whole steps `unet_fwd` got slower (176-195 ms against
//! 162) and `resnet18_train_step` with only the tiny-output forward
//! convolutions on the host did not move (279-289 against 288-292 ms).

mod ragged;

pub use ragged::RaggedForm;

use lazyfuse_ir::{host_kernels, HostArg, HostElement, HostFn, HostOut};
use std::sync::OnceLock;

/// The float types the kernels run on.
trait Float: HostElement {
    const ZERO: Self;
    const ONE: Self;
}

impl Float for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
}

impl Float for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
}

/// The built-in kernels' functions, made once.
struct Builtins {
    ragged: [HostFn; 3],
}

fn builtins() -> &'static Builtins {
    static B: OnceLock<Builtins> = OnceLock::new();
    B.get_or_init(|| {
        let r = |f: RaggedForm| {
            HostFn::new(move |a: &[HostArg<'_>], o: &mut HostOut<'_>| ragged::run(f, a, o))
        };
        Builtins {
            ragged: RaggedForm::ALL.map(r),
        }
    })
}

/// Registers every built-in kernel under its name (idempotent).
pub fn register_builtins() -> Result<(), String> {
    let b = builtins();
    for (f, form) in b.ragged.iter().zip(RaggedForm::ALL) {
        host_kernels::register(form.name(), f)?;
    }
    Ok(())
}

/// The kernel of a ragged product form, registered.
pub fn ragged_dot(form: RaggedForm) -> Result<HostFn, String> {
    register_builtins()?;
    Ok(builtins().ragged[form as usize].clone())
}
