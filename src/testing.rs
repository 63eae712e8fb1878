//! Test-only fault injection. XLA rarely fails on valid input, so tests that
//! prove failures are reported at the right op, poison only dependent tensors
//! and leave the runtime usable need a switch that makes a real XLA compile
//! or a launch fail.
//!
//! Compiled only with the `test-util` feature (the crate's own tests turn it
//! on through a dev-dependency on itself); without it the two hooks below are
//! constant `false`/`Ok` and vanish from the hot path. With it, an unarmed
//! hook costs one relaxed atomic load.

#[cfg(feature = "test-util")]
mod armed {
    use parking_lot::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

    static ANY: AtomicBool = AtomicBool::new(false);
    static COMPILE: Mutex<Option<String>> = Mutex::new(None);
    static EXECUTION: Mutex<Option<String>> = Mutex::new(None);

    fn set(slot: &Mutex<Option<String>>, op: Option<&str>) {
        *slot.lock() = op.map(str::to_string);
        let any = COMPILE.lock().is_some() || EXECUTION.lock().is_some();
        ANY.store(any, Relaxed);
    }

    /// Makes the lowering of every op named `op` emit an invalid StableHLO
    /// op, so XLA rejects the region at compile time. `None` switches it off.
    /// Process-wide: tests using it must not run concurrently with others
    /// that record that op.
    pub fn inject_compile_fault(op: Option<&str>) {
        set(&COMPILE, op);
    }

    /// Makes every region containing an op named `op` fail when it is
    /// launched, as if the device had reported an execution error for it
    /// (the XLA CPU plugin has no natural run-time failure for valid
    /// programs). `None` switches it off. Process-wide, like
    /// [`inject_compile_fault`].
    pub fn inject_execution_fault(op: Option<&str>) {
        set(&EXECUTION, op);
    }

    pub(crate) fn compile_fault_op() -> Option<String> {
        if !ANY.load(Relaxed) {
            return None;
        }
        COMPILE.lock().clone()
    }

    pub(crate) fn execution_fault(
        graph: &lazyfuse_ir::Graph,
        region: &lazyfuse_fusion::Region,
    ) -> Result<(), String> {
        if !ANY.load(Relaxed) {
            return Ok(());
        }
        let fault = EXECUTION.lock();
        let Some(op) = fault.as_deref() else {
            return Ok(());
        };
        if region.nodes.iter().any(|&n| graph.node(n).op.name() == op) {
            return Err(format!("INTERNAL: injected execution fault in `{op}`"));
        }
        Ok(())
    }
}

#[cfg(all(feature = "test-util", feature = "xla"))]
pub(crate) use armed::compile_fault_op;
#[cfg(feature = "test-util")]
pub(crate) use armed::execution_fault;
#[cfg(feature = "test-util")]
pub use armed::{inject_compile_fault, inject_execution_fault};

/// The op whose lowering is sabotaged (none, without `test-util`).
#[cfg(not(feature = "test-util"))]
#[inline(always)]
pub(crate) fn compile_fault_op() -> Option<String> {
    None
}

/// `Err` when an execution fault is injected for an op of `region` (never,
/// without `test-util`).
#[cfg(not(feature = "test-util"))]
#[inline(always)]
pub(crate) fn execution_fault(
    _graph: &lazyfuse_ir::Graph,
    _region: &lazyfuse_fusion::Region,
) -> Result<(), String> {
    Ok(())
}
