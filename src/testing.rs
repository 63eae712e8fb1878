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

static EXEC_FAULT: Mutex<Option<String>> = Mutex::new(None);

/// Makes every region containing an op named `op` fail when it is launched,
/// as if the device had reported an execution error for it (the XLA CPU
/// plugin has no natural run-time failure for valid programs). `None`
/// switches it off. Process-wide, like [`inject_compile_fault`].
pub fn inject_execution_fault(op: Option<&str>) {
    *EXEC_FAULT.lock() = op.map(str::to_string);
}

/// `Err` when an execution fault is injected for an op of `region`.
pub(crate) fn execution_fault(
    graph: &lazyfuse_ir::Graph,
    region: &lazyfuse_fusion::Region,
) -> Result<(), String> {
    let fault = EXEC_FAULT.lock();
    let Some(op) = fault.as_deref() else {
        return Ok(());
    };
    if region.nodes.iter().any(|&n| graph.node(n).op.name() == op) {
        return Err(format!("INTERNAL: injected execution fault in `{op}`"));
    }
    Ok(())
}
