//! Host kernels in a region: a typed-FFI `custom_call` to lazyfuse's one
//! registered handler ([`HOST_TARGET`], see `pjrt::ffi`), naming the
//! kernel in its attributes (so a cached executable finds its kernels by
//! name in a new process).

use super::emit::Emitter;

/// The custom-call target of every host kernel.
pub const HOST_TARGET: &str = "lazyfuse_host_kernel";

/// The attribute naming the host kernel a call runs.
pub const HOST_KERNEL_ATTR: &str = "kernel";

/// Emits a call of host kernel `kernel` on `args` (values and types),
/// giving a value of type `result`.
pub(super) fn call(
    e: &mut Emitter<'_>,
    kernel: &str,
    args: &[(&str, String)],
    result: &str,
) -> String {
    let name: String = kernel.escape_default().collect();
    e.op(
        "stablehlo.custom_call",
        args,
        &format!(
            "call_target_name = \"{HOST_TARGET}\", api_version = 4 : i32, has_side_effect = false, backend_config = {{{HOST_KERNEL_ATTR} = \"{name}\"}}"
        ),
        result,
    )
}
