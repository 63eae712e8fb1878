//! [`GraphBuilder`]: terse, panicking graph construction for tests.

use crate::Origin;
use crate::{
    Axes, BinaryOp, CmpOp, DType, Graph, InferError, Literal, Node, NodeId, Op, ReduceOp, Shape,
    UnaryOp,
};

/// A [`Graph`] under construction, for tests.
///
/// It exists so tests build graphs in one line per op instead of repeating
/// `graph.push(op, inputs, Origin::caller()).unwrap()` with the op's
/// attribute struct spelled out. Every method is `#[track_caller]`: node
/// origins (and the panic location of an invalid op) are the test's lines,
/// not this file's. Invalid ops panic with the inference error; use
/// [`try_push`](Self::try_push) to test the error itself.
#[derive(Clone, Debug, Default)]
pub struct GraphBuilder {
    graph: Graph,
}

impl GraphBuilder {
    /// An empty graph, so a test starts from nothing recorded.
    pub fn new() -> Self {
        Self::default()
    }

    /// Continues building on an existing graph (e.g. one a helper returned).
    pub fn from_graph(graph: Graph) -> Self {
        GraphBuilder { graph }
    }

    /// The graph built so far, for planners, interpreters and assertions.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The finished graph, for code that takes ownership of it.
    pub fn into_graph(self) -> Graph {
        self.graph
    }

    /// A node built so far, to look at its inferred shape, dtype or hash.
    pub fn node(&self, id: NodeId) -> &Node {
        self.graph.node(id)
    }

    /// Appends `op` on `inputs` or returns the inference error, for tests of
    /// the validation itself. The node's origin is the caller's line.
    #[track_caller]
    pub fn try_push(&mut self, op: Op, inputs: &[NodeId]) -> Result<NodeId, InferError> {
        self.graph.push(op, inputs, Origin::caller())
    }

    /// Appends `op` on `inputs`: the general case behind every shortcut, for
    /// ops (or attribute combinations) without one.
    ///
    /// # Panics
    /// When inference rejects the op: a test graph is expected to be valid.
    #[track_caller]
    pub fn push(&mut self, op: Op, inputs: &[NodeId]) -> NodeId {
        match self.try_push(op.clone(), inputs) {
            Ok(id) => id,
            Err(e) => panic!("invalid test graph: {} on {inputs:?}: {e}", op.name()),
        }
    }

    /// A graph input (region parameter) of shape `dims` and `dtype`.
    #[track_caller]
    pub fn input(&mut self, dims: &[usize], dtype: DType) -> NodeId {
        self.push(
            Op::Input {
                shape: Shape::new(dims),
                dtype,
            },
            &[],
        )
    }

    /// An f32 graph input, the common case in planner tests.
    #[track_caller]
    pub fn input_f32(&mut self, dims: &[usize]) -> NodeId {
        self.input(dims, DType::F32)
    }

    /// A constant: `value` converted to `dtype`, broadcast to `dims`.
    #[track_caller]
    pub fn constant(&mut self, value: Literal, dims: &[usize], dtype: DType) -> NodeId {
        self.push(
            Op::Constant {
                value,
                shape: Shape::new(dims),
                dtype,
            },
            &[],
        )
    }

    /// A rank-0 f32 constant, the host scalar of `x * 0.5` (liftable by the
    /// planner unless it is 0, 1 or -1).
    #[track_caller]
    pub fn scalar(&mut self, v: f64) -> NodeId {
        self.constant(Literal::Float(v), &[], DType::F32)
    }

    /// An elementwise binary op with broadcasting.
    #[track_caller]
    pub fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        self.push(Op::Binary(op), &[a, b])
    }

    /// `a op v` for a host scalar `v`: a rank-0 constant of `a`'s dtype
    /// followed by the binary op, as the tensor API records `x * 0.5`.
    #[track_caller]
    pub fn binary_scalar(&mut self, op: BinaryOp, a: NodeId, v: f64) -> NodeId {
        let dtype = self.node(a).dtype;
        let c = self.constant(Literal::Float(v), &[], dtype);
        self.binary(op, a, c)
    }

    /// An elementwise unary op.
    #[track_caller]
    pub fn unary(&mut self, op: UnaryOp, a: NodeId) -> NodeId {
        self.push(Op::Unary(op), &[a])
    }

    /// An elementwise comparison with broadcasting (bool result).
    #[track_caller]
    pub fn compare(&mut self, op: CmpOp, a: NodeId, b: NodeId) -> NodeId {
        self.push(Op::Compare(op), &[a, b])
    }

    /// `where(cond, on_true, on_false)`.
    #[track_caller]
    pub fn select(&mut self, cond: NodeId, on_true: NodeId, on_false: NodeId) -> NodeId {
        self.push(Op::Select, &[cond, on_true, on_false])
    }

    /// Element type conversion of `a` to `dtype`.
    #[track_caller]
    pub fn convert(&mut self, a: NodeId, dtype: DType) -> NodeId {
        self.push(Op::Convert(dtype), &[a])
    }

    /// A reduction of `a` over `axes` (sorted, unique).
    #[track_caller]
    pub fn reduce(&mut self, op: ReduceOp, a: NodeId, axes: &[usize], keepdim: bool) -> NodeId {
        self.push(
            Op::Reduce {
                op,
                axes: Axes::from_slice(axes),
                keepdim,
            },
            &[a],
        )
    }

    /// The mean over the last axis, kept as size 1 (the normalisation step
    /// of layer norm and softmax-like tests).
    #[track_caller]
    pub fn mean_last(&mut self, a: NodeId) -> NodeId {
        let last = self.node(a).shape.rank().saturating_sub(1);
        self.reduce(ReduceOp::Mean, a, &[last], true)
    }

    /// Index of the first maximum along `axis` (i64 result).
    #[track_caller]
    pub fn argmax(&mut self, a: NodeId, axis: usize, keepdim: bool) -> NodeId {
        self.push(Op::ArgMax { axis, keepdim }, &[a])
    }

    /// The same elements in shape `dims`.
    #[track_caller]
    pub fn reshape(&mut self, a: NodeId, dims: &[usize]) -> NodeId {
        self.push(Op::Reshape(Shape::new(dims)), &[a])
    }

    /// Output dim `i` is `a`'s dim `perm[i]`.
    #[track_caller]
    pub fn permute(&mut self, a: NodeId, perm: &[usize]) -> NodeId {
        self.push(Op::Permute(Axes::from_slice(perm)), &[a])
    }

    /// NumPy-style broadcast of `a` to `dims`.
    #[track_caller]
    pub fn broadcast_to(&mut self, a: NodeId, dims: &[usize]) -> NodeId {
        self.push(Op::BroadcastTo(Shape::new(dims)), &[a])
    }

    /// `len` elements of `a` from `start` along `axis`.
    #[track_caller]
    pub fn slice(&mut self, a: NodeId, axis: usize, start: usize, len: usize) -> NodeId {
        self.push(Op::Slice { axis, start, len }, &[a])
    }

    /// Concatenation of `parts` along `axis`.
    #[track_caller]
    pub fn concat(&mut self, parts: &[NodeId], axis: usize) -> NodeId {
        self.push(Op::Concat { axis }, parts)
    }

    /// Batched matrix product `a x b`.
    #[track_caller]
    pub fn matmul(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.push(Op::MatMul, &[a, b])
    }

    /// `index_select(a, axis, idx)` with a 1-D integer `idx`.
    #[track_caller]
    pub fn index_select(&mut self, a: NodeId, axis: usize, idx: NodeId) -> NodeId {
        self.push(Op::IndexSelect { axis }, &[a, idx])
    }

    /// Uniform `[0, 1)` values of `dims` and float `dtype` from an i64 scalar
    /// `seed` node.
    #[track_caller]
    pub fn random_uniform(&mut self, seed: NodeId, dims: &[usize], dtype: DType) -> NodeId {
        self.push(
            Op::RandomUniform {
                shape: Shape::new(dims),
                dtype,
            },
            &[seed],
        )
    }

    /// Layer norm over the last axis without affine parameters:
    /// `(x - mean) / sqrt(mean((x - mean)^2) + eps)`, recorded op by op as
    /// the tensor API would (7 computed nodes and the `eps` scalar), the
    /// standard reduction-heavy block of planner tests.
    #[track_caller]
    pub fn layer_norm(&mut self, x: NodeId, eps: f64) -> NodeId {
        let mu = self.mean_last(x);
        let c = self.binary(BinaryOp::Sub, x, mu);
        let sq = self.binary(BinaryOp::Mul, c, c);
        let var = self.mean_last(sq);
        let ve = self.binary_scalar(BinaryOp::Add, var, eps);
        let sd = self.unary(UnaryOp::Sqrt, ve);
        self.binary(BinaryOp::Div, c, sd)
    }
}

impl From<GraphBuilder> for Graph {
    fn from(b: GraphBuilder) -> Graph {
        b.into_graph()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_the_callers_lines() {
        let mut g = GraphBuilder::new();
        let line = line!() + 1;
        let x = g.input_f32(&[4, 8]);
        let y = g.layer_norm(x, 1e-5);
        assert_eq!(g.node(x).origin.line(), line);
        assert_eq!(g.node(x).origin.file(), file!());
        // Composite helpers attribute every node to the calling line too.
        assert!(g
            .graph()
            .ids()
            .all(|id| g.node(id).origin.file() == file!()));
        assert_eq!(g.node(y).origin.line(), line + 1);
        assert_eq!(g.graph().len(), 9);
        assert_eq!(g.node(y).shape, Shape::new(&[4, 8]));
    }

    #[test]
    fn shortcuts_infer_types_and_reject_invalid_ops() {
        let mut g = GraphBuilder::new();
        let x = g.input(&[2, 3], DType::I32);
        let h = g.binary_scalar(BinaryOp::Mul, x, 2.0);
        assert_eq!(g.node(h).dtype, DType::I32);
        let m = g.argmax(h, 1, false);
        assert_eq!(g.node(m).dtype, DType::I64);
        let p = g.permute(x, &[1, 0]);
        assert_eq!(g.node(p).shape, Shape::new(&[3, 2]));
        let c = g.concat(&[x, x], 0);
        assert_eq!(g.node(c).shape, Shape::new(&[4, 3]));
        let before = g.graph().len();
        assert!(g.try_push(Op::MatMul, &[x, x]).is_err());
        assert_eq!(g.graph().len(), before, "nothing appended on error");
        let err = std::panic::catch_unwind(move || g.unary(UnaryOp::Exp, x)).unwrap_err();
        let msg = err.downcast_ref::<String>().expect("formatted panic");
        assert!(msg.contains("exp") && msg.contains("float"), "{msg}");
    }
}
