//! Test-only fault injection. XLA rarely fails on valid input, so tests that
//! prove failures are reported at the right op, poison only dependent tensors
//! and leave the runtime usable need a switch that makes a real XLA compile fail.

use parking_lot::Mutex;

static FAULT: Mutex<Option<String>> = Mutex::new(None);

/// Makes the lowering of every op named `op` emit an invalid StableHLO op, so
/// XLA rejects the region at compile time. `None` switches it off.
/// Process-wide: tests using it must not run concurrently with others that
/// record that op.
pub fn inject_compile_fault(op: Option<&str>) {
    *FAULT.lock() = op.map(str::to_string);
}

/// True when lowering of `op` should be sabotaged.
pub(crate) fn compile_fault(op: &str) -> bool {
    FAULT.lock().as_deref() == Some(op)
}
