//! Text emission helpers shared by the op lowerings.

use lazyfuse_ir::Origin;
use lazyfuse_ir::{CmpOp, DType, Graph, HostTensor, Literal, NodeId, Shape};
use std::fmt::Write;

/// MLIR tensor type, e.g. `tensor<2x3xf32>` or `tensor<f32>`.
pub fn ty(shape: &Shape, dtype: DType) -> String {
    let mut s = String::from("tensor<");
    for d in shape.dims() {
        let _ = write!(s, "{d}x");
    }
    s.push_str(dtype.mlir_name());
    s.push('>');
    s
}

/// `array<i64: ...>` attribute body.
pub fn i64_array<T: std::fmt::Display>(v: impl IntoIterator<Item = T>) -> String {
    let items: Vec<String> = v.into_iter().map(|x| x.to_string()).collect();
    if items.is_empty() {
        "array<i64>".to_string()
    } else {
        format!("array<i64: {}>", items.join(", "))
    }
}

/// Exact MLIR spelling of `value` converted to `dtype` (hex bit patterns for
/// floats so NaN, infinities, -0.0 and subnormals survive).
/// The bits are the interpreter's (`interp::scalar_constant`: subnormals of
/// flushing dtypes stored as zero), so nothing the compiler folds from a
/// constant can differ from run-time arithmetic.
pub fn literal(value: Literal, dtype: DType) -> String {
    host_literal(&lazyfuse_ir::interp::scalar_constant(value, dtype))
}

/// Exact MLIR spelling of the rank-0 value `t` (hex bit patterns for
/// floats, as [`literal`]).
pub fn host_literal(t: &HostTensor) -> String {
    match t.dtype {
        DType::Bool => (if t.bytes[0] != 0 { "true" } else { "false" }).to_string(),
        DType::U8 => t.bytes[0].to_string(),
        DType::I32 | DType::I64 => t.to_i64_vec()[0].to_string(),
        _ => {
            let mut s = String::from("0x");
            for b in t.bytes.iter().rev() {
                let _ = write!(s, "{b:02X}");
            }
            s
        }
    }
}

/// Accumulates the body of `@main`, naming SSA values.
pub struct Emitter<'g> {
    /// The graph whose nodes are lowered (operand shapes and dtypes).
    pub graph: &'g Graph,
    /// The emitted op lines of `@main`, one per line, indented for the module.
    pub body: String,
    /// The SSA name bound to each node, by node index.
    names: Vec<Option<String>>,
    /// The number of the last fresh SSA name (`%v<next>`).
    next: usize,
    /// The `loc(...)` attached to ops emitted next.
    loc: String,
    /// The value of each node known when lowering to be one scalar
    /// repeated (constants, and what `fold.rs` computes from them), rank 0.
    splats: Vec<Option<HostTensor>>,
    /// Lowering one SPMD program: reductions must use bodies XLA's
    /// partitioner can turn into all-reduces.
    pub spmd: bool,
    /// The SPMD program's layout (what sharding constraints name).
    pub layout: Option<&'g super::SpmdLowering>,
    /// The op name whose lowering is sabotaged ([`super::Options::sabotage`]).
    pub sabotage: Option<&'g str>,
    /// Custom kernels' functions the body calls, by symbol, each once.
    pub funcs: Vec<(String, String)>,
}

impl<'g> Emitter<'g> {
    /// An empty body for lowering nodes of `graph`, no names bound yet.
    pub fn new(graph: &'g Graph) -> Self {
        Emitter {
            graph,
            body: String::new(),
            names: vec![None; graph.len()],
            next: 0,
            loc: String::new(),
            splats: vec![None; graph.len()],
            spmd: false,
            layout: None,
            sabotage: None,
            funcs: Vec::new(),
        }
    }

    /// Records that node `id` is `value` (rank 0) in every element.
    pub fn set_splat(&mut self, id: NodeId, value: HostTensor) {
        self.splats[id.index()] = Some(value);
    }

    /// The scalar node `id` repeats, when known at lowering time.
    pub fn splat(&self, id: NodeId) -> Option<&HostTensor> {
        self.splats[id.index()].as_ref()
    }

    /// Names the value of node `id`.
    pub fn bind(&mut self, id: NodeId, name: String) {
        self.names[id.index()] = Some(name);
    }

    /// The SSA name holding node `id`'s value.
    pub fn value(&self, id: NodeId) -> String {
        self.names[id.index()]
            .clone()
            .unwrap_or_else(|| panic!("lowering bug: node {id:?} used before it was lowered"))
    }

    /// The SSA name holding node `id`'s value, if it is lowered in this
    /// region (an input of an input may not be).
    pub fn value_if_lowered(&self, id: NodeId) -> Option<String> {
        self.names[id.index()].clone()
    }

    /// Sets the location attached to the ops emitted next.
    pub fn set_loc(&mut self, op: &str, origin: Origin) {
        let file = origin.file().replace('\\', "/").replace('"', "'");
        self.loc = format!(
            "loc(\"{op} @ {file}:{}:{}\")",
            origin.line(),
            origin.column()
        );
    }

    /// A fresh SSA name.
    pub fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%v{}", self.next)
    }

    /// Emits `%r = "name"(args) {attrs} : (arg types) -> result type`, returns `%r`.
    pub fn op(&mut self, name: &str, args: &[(&str, String)], attrs: &str, result: &str) -> String {
        let r = self.fresh();
        let names: Vec<&str> = args.iter().map(|(n, _)| *n).collect();
        let types: Vec<&str> = args.iter().map(|(_, t)| t.as_str()).collect();
        let attrs = if attrs.is_empty() {
            String::new()
        } else {
            format!(" {{{attrs}}}")
        };
        let _ = writeln!(
            self.body,
            "    {r} = \"{name}\"({}){attrs} : ({}) -> {result} {}",
            names.join(", "),
            types.join(", "),
            self.loc
        );
        r
    }

    /// A constant of `dtype` broadcast to `shape`.
    pub fn constant(&mut self, value: Literal, shape: &Shape, dtype: DType) -> String {
        let st = ty(&Shape::scalar(), dtype);
        let attr = format!("value = dense<{}> : {st}", literal(value, dtype));
        let c = self.op("stablehlo.constant", &[], &attr, &st);
        self.broadcast(&c, &Shape::scalar(), shape, dtype)
    }

    /// The rank-0 host value `t` as a constant broadcast to `shape`, its
    /// bits exactly as they are.
    pub fn host_constant(&mut self, t: &HostTensor, shape: &Shape) -> String {
        let st = ty(&Shape::scalar(), t.dtype);
        let attr = format!("value = dense<{}> : {st}", host_literal(t));
        let c = self.op("stablehlo.constant", &[], &attr, &st);
        self.broadcast(&c, &Shape::scalar(), shape, t.dtype)
    }

    /// Elementwise `name` (`stablehlo.exponential`, `stablehlo.logistic`) of
    /// `x`, NaN in where `x` is NaN even when LLVM sees the NaN.
    ///
    /// A NaN literal (a user's `full(NaN)`, or `sqrt(-inf)` folded by
    /// `fold.rs`) lets LLVM fold `NaN + x` to NaN whatever the run-time `x`,
    /// and then fold XLA's expansion of `exp`, whose float-to-int conversion
    /// of NaN is poison in LLVM, into an arbitrary finite value: 1.6e-5 where
    /// run-time code gives NaN (`fuzz_campaign` seed 1001, program 53468;
    /// `tests/fuzz_regressions/numerics.rs::a_nan_constant_through_arithmetic_into_exp_stays_nan`).
    /// So `select(x != x, x, exp(x))`: LLVM folds the compare of a known NaN
    /// to true and never evaluates the expansion, and at run time the
    /// select changes nothing (`exp(NaN)` is NaN). Every float `exp` is
    /// guarded, not only those of regions holding a NaN literal: the same
    /// program must compile to the same code whether or not its padding is
    /// poisoned with NaN (`LAZYFUSE_POISON_PADDING`), or the two could
    /// round differently.
    pub fn nan_guarded(&mut self, name: &str, x: &str, s: &Shape, dt: DType) -> String {
        let r = self.eltwise(name, &[x], s, dt, dt);
        if !dt.is_float() {
            return r;
        }
        let attr = compare_attr(CmpOp::Ne, dt);
        let t = ty(s, dt);
        let nan = self.op(
            "stablehlo.compare",
            &[(x, t.clone()), (x, t)],
            &attr,
            &ty(s, DType::Bool),
        );
        self.select(&nan, x, &r, s, dt)
    }

    /// NumPy broadcast of value `v` from `from` to `to` (no-op when equal).
    pub fn broadcast(&mut self, v: &str, from: &Shape, to: &Shape, dtype: DType) -> String {
        if from == to {
            return v.to_string();
        }
        let off = to.rank() - from.rank();
        let attr = format!("broadcast_dimensions = {}", i64_array(off..to.rank()));
        self.op(
            "stablehlo.broadcast_in_dim",
            &[(v, ty(from, dtype))],
            &attr,
            &ty(to, dtype),
        )
    }

    /// Elementwise op whose operands already share `shape`.
    pub fn eltwise(
        &mut self,
        name: &str,
        args: &[&str],
        shape: &Shape,
        dtype: DType,
        out: DType,
    ) -> String {
        let t = ty(shape, dtype);
        let a: Vec<(&str, String)> = args.iter().map(|&x| (x, t.clone())).collect();
        self.op(name, &a, "", &ty(shape, out))
    }

    /// Element type conversion.
    pub fn convert(&mut self, v: &str, shape: &Shape, from: DType, to: DType) -> String {
        if from == to {
            return v.to_string();
        }
        self.op(
            "stablehlo.convert",
            &[(v, ty(shape, from))],
            "",
            &ty(shape, to),
        )
    }

    /// Element `slot` of the rank-1 pack `v` of `n` scalars, as a scalar.
    pub fn unpack(&mut self, v: &str, n: usize, slot: usize, dtype: DType) -> String {
        let packed = Shape::new(&[n]);
        let one = Shape::new(&[1]);
        let attr = format!(
            "start_indices = {}, limit_indices = {}, strides = {}",
            i64_array([slot]),
            i64_array([slot + 1]),
            i64_array([1])
        );
        let s = self.op(
            "stablehlo.slice",
            &[(v, ty(&packed, dtype))],
            &attr,
            &ty(&one, dtype),
        );
        self.reshape(&s, &one, &Shape::scalar(), dtype)
    }

    /// `select(c, p, q)` on values of shape `s` and dtype `dt`.
    pub fn select(&mut self, c: &str, p: &str, q: &str, s: &Shape, dt: DType) -> String {
        let (b, t) = (ty(s, DType::Bool), ty(s, dt));
        self.op(
            "stablehlo.select",
            &[(c, b), (p, t.clone()), (q, t.clone())],
            "",
            &t,
        )
    }

    /// `v` (of shape `from`) with its dims reordered: result dim `i` is
    /// its dim `perm[i]`.
    pub fn transpose(&mut self, v: &str, from: &Shape, perm: &[usize], dtype: DType) -> String {
        let to: Vec<usize> = perm.iter().map(|&p| from.dims()[p]).collect();
        self.op(
            "stablehlo.transpose",
            &[(v, ty(from, dtype))],
            &format!("permutation = {}", i64_array(perm.iter().copied())),
            &ty(&Shape::new(&to), dtype),
        )
    }

    /// Reshape.
    pub fn reshape(&mut self, v: &str, from: &Shape, to: &Shape, dtype: DType) -> String {
        if from == to {
            return v.to_string();
        }
        self.op(
            "stablehlo.reshape",
            &[(v, ty(from, dtype))],
            "",
            &ty(to, dtype),
        )
    }
}

/// The `comparison_type` of `stablehlo.compare` on `dt` operands.
fn compare_type(dt: DType) -> &'static str {
    match dt {
        d if d.is_float() => "FLOAT",
        DType::I32 | DType::I64 => "SIGNED",
        _ => "UNSIGNED",
    }
}

/// The attributes of a `stablehlo.compare` of direction `c` on `dt` operands.
pub(super) fn compare_attr(c: CmpOp, dt: DType) -> String {
    let dir = match c {
        CmpOp::Eq => "EQ",
        CmpOp::Ne => "NE",
        CmpOp::Lt => "LT",
        CmpOp::Le => "LE",
        CmpOp::Gt => "GT",
        CmpOp::Ge => "GE",
    };
    format!(
        "comparison_direction = #stablehlo<comparison_direction {dir}>, compare_type = #stablehlo<comparison_type {}>",
        compare_type(dt)
    )
}
