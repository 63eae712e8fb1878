//! Bad input is an `Err` at the call site naming the op, the operands and the
//! caller's line; nothing is recorded. XLA failures surface at the sync point
//! naming the op and line, poison only dependents, and leave the runtime usable.

mod common;
use common::{dev, metrics_lock};
use lazyfuse::{pending_ops, DType, Error, FusionGuard, Tensor};

/// Asserts `r` is an op error for `op` reported at `line` of this file, and
/// that the pending graph did not grow.
#[track_caller]
fn assert_op_err<T: std::fmt::Debug>(
    r: lazyfuse::Result<T>,
    op: &str,
    line: u32,
    pending_before: usize,
) {
    let e = r.expect_err("expected an error");
    match &e {
        Error::Op {
            op: got, location, ..
        } => {
            assert_eq!(*got, op, "error names the op: {e}");
            assert!(
                location.file().ends_with("errors.rs"),
                "names the caller's file: {e}"
            );
            assert_eq!(location.line(), line, "names the caller's line: {e}");
        }
        other => panic!("expected Error::Op, got {other}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains(op) && msg.contains("errors.rs"),
        "message: {msg}"
    );
    assert_eq!(
        pending_ops(&dev()),
        pending_before,
        "the graph is unchanged after an error"
    );
}

#[test]
fn shape_and_dtype_errors_name_the_call_site() {
    let _f = FusionGuard::new(true);
    let d = dev();
    let a = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    let b = Tensor::zeros(&[4], DType::F32, &d).unwrap();
    let i = Tensor::zeros(&[2, 3], DType::I32, &d).unwrap();
    let m = Tensor::zeros(&[3, 5], DType::F32, &d).unwrap();
    let empty = Tensor::zeros(&[0, 2], DType::F32, &d).unwrap();
    let p = pending_ops(&d);
    macro_rules! check {
        ($e:expr, $op:expr) => {{
            let line = line!();
            assert_op_err($e, $op, line, p);
        }};
    }
    check!(a.add(&b), "add");
    check!(&a * &b, "mul");
    check!(a.add(&i), "add");
    check!(a.lt(&i), "lt");
    check!(i.exp(), "exp");
    check!(i.mean([0], false), "mean");
    check!(a.sum([2], false), "sum");
    check!(a.sum([0, 0], false), "sum");
    check!(a.argmax(5, false), "argmax");
    check!(a.reshape(&[4, 2]), "reshape");
    check!(a.permute(&[0, 0]), "permute");
    check!(a.permute(&[0]), "permute");
    check!(a.transpose(0, 2), "transpose");
    check!(a.broadcast_to(&[3, 3]), "broadcast_to");
    check!(a.narrow(1, 2, 2), "narrow");
    check!(a.narrow(1, usize::MAX, 2), "narrow");
    check!(Tensor::cat(&[&a, &m], 0), "cat");
    check!(Tensor::cat(&[], 0), "cat");
    check!(a.squeeze(0), "squeeze");
    check!(a.unsqueeze(4), "unsqueeze");
    check!(a.matmul(&a), "matmul");
    check!(b.matmul(&m), "matmul");
    check!(a.where_cond(&a, &a), "where_cond");
    check!(i.add(0.5), "add");
    check!(a.to_vec::<i32>(), "to_vec");
    check!(a.item::<f32>(), "item");
    check!(Tensor::from_slice(&[1.0f32, 2.0], &[3], &d), "from_slice");
    check!(Tensor::arange_step(0.0, 1.0, 0.0, DType::F32, &d), "arange");
    check!(empty.max([0], false), "max");
    let u = Tensor::zeros(&[2], DType::U8, &d).unwrap();
    let p = pending_ops(&d);
    let line = line!() + 1;
    assert_op_err(u.full_like_check(), "full", line, p);
}

trait FullLikeCheck {
    fn full_like_check(&self) -> lazyfuse::Result<Tensor>;
}
impl FullLikeCheck for Tensor {
    #[track_caller]
    fn full_like_check(&self) -> lazyfuse::Result<Tensor> {
        Tensor::full(300.0, self.dims(), self.dtype(), self.device())
    }
}

#[test]
fn xla_compile_failure_names_the_op_and_line_and_the_runtime_recovers() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let x = Tensor::from_slice(&[1.0f32, 4.0, 9.0], &[3], &d).unwrap();
    let ok = x.add(1.0).unwrap().realize().unwrap().clone();
    lazyfuse::testing::inject_compile_fault(Some("floor"));
    let line = line!() + 1;
    let bad = x.sqrt().unwrap().floor().unwrap();
    let also_bad = bad.mul(2.0).unwrap();
    let r = also_bad.to_vec::<f32>();
    lazyfuse::testing::inject_compile_fault(None);
    let e = r.expect_err("the injected fault must fail the compile");
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            Error::Xla {
                stage: "compile",
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("floor @ {}:{line}", file!())),
        "names op and line: {msg}"
    );
    assert!(bad.to_vec::<f32>().is_err(), "dependents are poisoned");
    assert!(bad.add(1.0).is_err(), "using a poisoned tensor is an error");
    // Tensors that did not depend on it are fine, and new work runs.
    assert_eq!(ok.to_vec::<f32>().unwrap(), vec![2.0, 5.0, 10.0]);
    let again = x.sqrt().unwrap().floor().unwrap().mul(2.0).unwrap();
    assert_eq!(again.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
}

#[test]
fn unfused_failure_is_reported_by_the_op_itself() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(false);
    let d = dev();
    let x = Tensor::from_slice(&[1.5f32, -2.5], &[2], &d).unwrap();
    lazyfuse::testing::inject_compile_fault(Some("floor"));
    let line = line!() + 1;
    let y = x.floor().unwrap();
    let r = y.to_vec::<f32>();
    lazyfuse::testing::inject_compile_fault(None);
    let msg = r.unwrap_err().to_string();
    assert!(
        msg.contains(&format!("[floor @ {}:{line}]", file!())),
        "{msg}"
    );
    assert_eq!(x.floor().unwrap().to_vec::<f32>().unwrap(), vec![1.0, -3.0]);
}

/// Inside `with_origin` (what a binding does for the user's Python frame),
/// an error names the declared site, not the Rust line that recorded it,
/// and records nothing.
#[test]
fn errors_name_a_declared_site() {
    let d = dev();
    let a = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    let b = Tensor::zeros(&[4], DType::F32, &d).unwrap();
    let site = lazyfuse::Origin::site("model.py", 12, 0, "aten::add");
    let before = pending_ops(&d);
    let e = lazyfuse::with_origin(site, || a.add(&b)).unwrap_err();
    match &e {
        Error::Op { op, location, .. } => {
            assert_eq!(*op, "add");
            assert_eq!(*location, site);
        }
        other => panic!("expected Error::Op, got {other}"),
    }
    assert!(e.to_string().contains("at model.py:12"), "{e}");
    assert_eq!(pending_ops(&d), before, "nothing recorded");
    // Outside the scope, errors name this file again.
    let e = a.add(&b).unwrap_err().to_string();
    assert!(e.contains("errors.rs"), "{e}");
}
