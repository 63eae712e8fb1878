//! The concrete program a fuzz case runs: a list of steps over the public
//! API, each value-producing step defining the next value id, plus sync
//! events. [`Program::to_rust_test`] prints it as a ready-to-paste `#[test]`.

use lazyfuse::ir::{DType, HostTensor, Op, Shape};
use std::fmt::Write;

/// One step. Value-producing steps (`Input`, `Full`, `Arange`, `Apply`,
/// `Scalar`) define value ids `0, 1, 2, ...` in order; the others refer to them.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// A materialised leaf, `Tensor::from_host`.
    Input(HostTensor),
    /// `Tensor::full(value, dims, dtype)` (recorded lazily, fuses into users).
    Full {
        value: f64,
        dims: Vec<usize>,
        dtype: DType,
    },
    /// `Tensor::arange_step(start, start + (len - 0.5) * step, step, dtype)`.
    Arange {
        start: f64,
        step: f64,
        len: usize,
        dtype: DType,
    },
    /// `Tensor::apply_op(op, args)`.
    Apply { op: Op, args: Vec<usize> },
    /// An op with a host scalar operand (`x.add(1.5)`, `x.lt(0.0)`, ...): `op` is the
    /// `Op::Binary` or `Op::Compare` it records, with `value` as a rank-0 rhs.
    Scalar { op: Op, arg: usize, value: f64 },
    /// Read a value in the middle of the program (`to_host`, a sync point).
    Read(usize),
    /// Drop the handle: the value may never be materialised.
    Drop(usize),
    /// Read a (possibly pending) value from a freshly spawned thread.
    ReadOnThread(usize),
    /// `lazyfuse::sync()`.
    Sync,
}

impl Step {
    /// True when the step defines a new value id.
    pub fn defines_value(&self) -> bool {
        matches!(
            self,
            Step::Input(_)
                | Step::Full { .. }
                | Step::Arange { .. }
                | Step::Apply { .. }
                | Step::Scalar { .. }
        )
    }
}

/// A whole fuzz case.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    pub steps: Vec<Step>,
}

impl Program {
    /// Number of value ids the program defines.
    pub fn num_values(&self) -> usize {
        self.steps.iter().filter(|s| s.defines_value()).count()
    }

    /// Number of computed ops (everything but inputs and sync events).
    pub fn num_ops(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| {
                matches!(
                    s,
                    Step::Apply { .. }
                        | Step::Scalar { .. }
                        | Step::Full { .. }
                        | Step::Arange { .. }
                )
            })
            .count()
    }

    /// The program as Rust source of a `#[test]` for `tests/fuzz_ops.rs`
    /// (where `fuzz_support` and `common` are in scope), readable as a
    /// straight-line public-API program, one step per line.
    pub fn to_rust_test(&self, name: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "#[test]\nfn {name}() {{");
        let _ = writeln!(s, "    let program = Program {{\n        steps: vec![");
        let mut v = 0;
        for step in &self.steps {
            let comment = if step.defines_value() {
                v += 1;
                format!(" // v{}", v - 1)
            } else {
                String::new()
            };
            let _ = writeln!(s, "            {},{comment}", step_rust(step));
        }
        let _ = writeln!(s, "        ],\n    }};");
        let _ = writeln!(
            s,
            "    fuzz_support::check_program(&program, &common::dev()).unwrap();\n}}"
        );
        s
    }
}

fn step_rust(step: &Step) -> String {
    match step {
        Step::Input(h) => format!("Step::Input({})", host_rust(h)),
        Step::Full { value, dims, dtype } => format!(
            "Step::Full {{ value: {}, dims: vec!{dims:?}, dtype: DType::{dtype:?} }}",
            f64_rust(*value)
        ),
        Step::Arange {
            start,
            step,
            len,
            dtype,
        } => format!(
            "Step::Arange {{ start: {}, step: {}, len: {len}, dtype: DType::{dtype:?} }}",
            f64_rust(*start),
            f64_rust(*step)
        ),
        Step::Apply { op, args } => {
            format!("Step::Apply {{ op: {}, args: vec!{args:?} }}", op_rust(op))
        }
        Step::Scalar { op, arg, value } => format!(
            "Step::Scalar {{ op: {}, arg: {arg}, value: {} }}",
            op_rust(op),
            f64_rust(*value)
        ),
        Step::Read(i) => format!("Step::Read({i})"),
        Step::Drop(i) => format!("Step::Drop({i})"),
        Step::ReadOnThread(i) => format!("Step::ReadOnThread({i})"),
        Step::Sync => "Step::Sync".to_string(),
    }
}

/// An f64 as a Rust expression that evaluates to exactly the same bits
/// (modulo NaN payload).
pub fn f64_rust(v: f64) -> String {
    if v.is_nan() {
        "f64::NAN".into()
    } else if v == f64::INFINITY {
        "f64::INFINITY".into()
    } else if v == f64::NEG_INFINITY {
        "f64::NEG_INFINITY".into()
    } else {
        format!("{v:?}")
    }
}

fn shape_rust(s: &Shape) -> String {
    format!("Shape::new(&{:?})", s.dims())
}

/// A host tensor as a Rust expression that rebuilds it exactly.
pub fn host_rust(h: &HostTensor) -> String {
    if h.dtype.is_float() {
        let v: Vec<String> = h.to_f64_vec().into_iter().map(f64_rust).collect();
        format!(
            "HostTensor::from_f64(&[{}], {}, DType::{:?})",
            v.join(", "),
            shape_rust(&h.shape),
            h.dtype
        )
    } else {
        let v: Vec<String> = h
            .to_i64_vec()
            .into_iter()
            .map(|x| match x {
                i64::MIN => "i64::MIN".to_string(),
                x => x.to_string(),
            })
            .collect();
        format!(
            "HostTensor::from_i64(&[{}], {}, DType::{:?})",
            v.join(", "),
            shape_rust(&h.shape),
            h.dtype
        )
    }
}

/// An IR op as the Rust expression that builds it.
pub fn op_rust(op: &Op) -> String {
    use lazyfuse::ir::Literal;
    let lit = |l: &Literal| match l {
        Literal::Float(v) => format!("Literal::Float({})", f64_rust(*v)),
        Literal::Int(i) => format!("Literal::Int({i})"),
        Literal::Bool(b) => format!("Literal::Bool({b})"),
        Literal::Dim(i) => format!("Literal::Dim({i})"),
    };
    match op {
        Op::Input { shape, dtype } => {
            format!("Op::Input {{ shape: {}, dtype: DType::{dtype:?} }}", shape_rust(shape))
        }
        Op::Constant {
            value,
            shape,
            dtype,
        } => format!(
            "Op::Constant {{ value: {}, shape: {}, dtype: DType::{dtype:?} }}",
            lit(value),
            shape_rust(shape)
        ),
        Op::Arange {
            start,
            step,
            len,
            dtype,
        } => format!(
            "Op::Arange {{ start: {}, step: {}, len: {len}, dtype: DType::{dtype:?} }}",
            lit(start),
            lit(step)
        ),
        Op::Unary(u) => format!("Op::Unary(UnaryOp::{u:?})"),
        Op::Binary(b) => format!("Op::Binary(BinaryOp::{b:?})"),
        Op::Compare(c) => format!("Op::Compare(CmpOp::{c:?})"),
        Op::Select => "Op::Select".into(),
        Op::Convert(d) => format!("Op::Convert(DType::{d:?})"),
        Op::Reduce { op, axes, keepdim } => format!(
            "Op::Reduce {{ op: ReduceOp::{op:?}, axes: Axes::from_slice(&{:?}), keepdim: {keepdim} }}",
            axes.as_slice()
        ),
        Op::ArgMax { axis, keepdim } => {
            format!("Op::ArgMax {{ axis: {axis}, keepdim: {keepdim} }}")
        }
        Op::Reshape(s) => format!("Op::Reshape({})", shape_rust(s)),
        Op::Permute(p) => format!("Op::Permute(Axes::from_slice(&{:?}))", p.as_slice()),
        Op::BroadcastTo(s) => format!("Op::BroadcastTo({})", shape_rust(s)),
        Op::ShardingConstraint(a) => format!(
            "Op::ShardingConstraint(SplitAxes::from_slice(&{:?}))",
            a.as_slice()
        ),
        Op::Slice { axis, start, len } => {
            format!("Op::Slice {{ axis: {axis}, start: {start}, len: {len} }}")
        }
        Op::Concat { axis } => format!("Op::Concat {{ axis: {axis} }}"),
        Op::MatMul => "Op::MatMul".into(),
        Op::ScatterAdd { axis } => format!("Op::ScatterAdd {{ axis: {axis} }}"),
        Op::Reverse(a) => format!("Op::Reverse(Axes::from_slice(&{:?}))", a.as_slice()),
        Op::Conv(s) => format!(
            "Op::Conv(Box::new(ConvSpec {{ stride: Spatial::from_slice(&{:?}), padding: Spatial::from_slice(&{:?}), \
             lhs_dilation: Spatial::from_slice(&{:?}), rhs_dilation: Spatial::from_slice(&{:?}), \
             feature_groups: {}, batch_groups: {} }}))",
            s.stride.as_slice(),
            s.padding.as_slice(),
            s.lhs_dilation.as_slice(),
            s.rhs_dilation.as_slice(),
            s.feature_groups,
            s.batch_groups
        ),
        Op::IndexSelect { axis } => format!("Op::IndexSelect {{ axis: {axis} }}"),
        Op::DynamicSlice { axis, len } => {
            format!("Op::DynamicSlice {{ axis: {axis}, len: {len} }}")
        }
        Op::DynamicUpdateSlice { axis } => format!("Op::DynamicUpdateSlice {{ axis: {axis} }}"),
        Op::RandomUniform { shape, dtype } => format!(
            "Op::RandomUniform {{ shape: {}, dtype: DType::{dtype:?} }}",
            shape_rust(shape)
        ),
        // The op fuzzer draws IR ops the interpreter can run; custom
        // kernels are StableHLO (tested in tests/custom.rs).
        Op::Custom(k) => format!("/* custom kernel {} */ unimplemented!()", k.name),
    }
}
