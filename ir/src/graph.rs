//! The recorded program: an append-only DAG of nodes in topological order,
//! each with a structural hash computed when it is appended.

use crate::Origin;
use crate::{infer, DType, InferError, Op, Shape};
use petgraph::graph::NodeIndex;
use smallvec::SmallVec;
use std::hash::{BuildHasher, Hash, Hasher};

/// Index of a node in its [`Graph`].
pub type NodeId = NodeIndex<u32>;

/// Operand list of a node, inline for the common arities.
pub type Inputs = SmallVec<[NodeId; 3]>;

/// One recorded op with its inferred result type.
#[derive(Clone, Debug)]
pub struct Node {
    /// The operation with its attributes.
    pub op: Op,
    /// Operand nodes, in the op's operand order.
    pub inputs: Inputs,
    /// Inferred result shape.
    pub shape: Shape,
    /// Inferred result dtype.
    pub dtype: DType,
    /// Structural hash of the op, its attributes, its operands' hashes, shape
    /// and dtype. Never depends on tensor identity, node ids or addresses,
    /// nor on the value of a liftable scalar ([`Op::is_liftable_scalar`]):
    /// that value is a region parameter, so it changes no code.
    pub hash: u64,
    /// The user source line that recorded this node (for errors and dumps).
    pub origin: Origin,
}

/// Fixed-key hasher so hashes are identical across runs, threads and processes.
pub fn stable_hasher() -> ahash::AHasher {
    ahash::RandomState::with_seeds(
        0x243f_6a88_85a3_08d3,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    )
    .build_hasher()
}

/// The structural hash of a node from its parts (a liftable scalar's value
/// left out: see [`Node::hash`]).
#[inline]
pub fn node_hash(op: &Op, input_hashes: &[u64], shape: &Shape, dtype: DType) -> u64 {
    let lifted = op.is_liftable_scalar();
    if lifted && input_hashes.is_empty() && shape.rank() == 0 {
        return lifted_scalar_hash(dtype);
    }
    hash_parts(lifted, op, input_hashes, shape, dtype)
}

/// [`node_hash`] computed in full.
fn hash_parts(lifted: bool, op: &Op, input_hashes: &[u64], shape: &Shape, dtype: DType) -> u64 {
    let mut h = stable_hasher();
    if lifted {
        LIFTED_SCALAR.hash(&mut h);
    } else {
        op.hash(&mut h);
    }
    input_hashes.hash(&mut h);
    shape.hash(&mut h);
    dtype.hash(&mut h);
    h.finish()
}

/// The hash of a lifted rank-0 scalar, which depends on its dtype alone:
/// every `x * 0.5` records one, so it is computed once per dtype and
/// remembered (0 = not yet; a hash that is 0 is merely recomputed).
fn lifted_scalar_hash(dtype: DType) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static MEMO: [AtomicU64; DType::ALL.len()] = [const { AtomicU64::new(0) }; DType::ALL.len()];
    let slot = &MEMO[dtype as usize];
    match slot.load(Ordering::Relaxed) {
        0 => {
            let op = Op::Constant {
                value: crate::Literal::Float(0.5),
                shape: Shape::scalar(),
                dtype,
            };
            let h = hash_parts(true, &op, &[], &Shape::scalar(), dtype);
            slot.store(h, Ordering::Relaxed);
            h
        }
        h => h,
    }
}

/// `ids` as a node's operand list (up to three copied inline, see
/// [`crate::shape::copy_inline`]).
#[inline]
fn inputs_of(ids: &[NodeId]) -> Inputs {
    crate::shape::copy_inline(ids, NodeId::new(0))
}

/// Stands in for a liftable scalar's op in structural hashes.
const LIFTED_SCALAR: u64 = 0x6c69_6674_6564_5f73;

/// Odd multiplier of the rolling structure hash (from the golden ratio).
const ROLL: u64 = 0x9E37_79B9_7F4A_7C15;

/// An append-only DAG. Nodes are appended after their operands, so index
/// order is a topological order. A plain vector: appending is on the
/// recording hot path, so no edge lists are kept (a node's operands are in
/// the node; [`Graph::users`] scans).
#[derive(Clone, Debug, Default)]
pub struct Graph {
    g: Vec<Node>,
    /// Rolling hash of every node's structural hash and operand indices, in
    /// append order: see [`Graph::structure`].
    structure: u64,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty graph with room for `nodes` nodes (a recorder that flushes
    /// graphs of one size over and over never regrows its next one).
    pub fn with_capacity(nodes: usize) -> Self {
        Graph {
            g: Vec::with_capacity(nodes),
            structure: 0,
        }
    }

    /// Validates `op` on `inputs`, then appends it. Nothing is appended on error.
    pub fn push(
        &mut self,
        op: Op,
        inputs: &[NodeId],
        origin: Origin,
    ) -> Result<NodeId, InferError> {
        let mut operands: SmallVec<[(&Shape, DType); 3]> = SmallVec::new();
        for &i in inputs {
            let n = self
                .g
                .get(i.index())
                .ok_or_else(|| InferError(format!("unknown operand {i:?}")))?;
            operands.push((&n.shape, n.dtype));
        }
        let (shape, dtype) = infer(&op, &operands)?;
        drop(operands);
        Ok(self.push_inferred(op, inputs, &shape, dtype, origin))
    }

    /// Appends a node whose type was already inferred by the caller. The
    /// shape is borrowed and copied into the node where it is stored: a
    /// copy passed in was read back whole from the caller's narrower
    /// stores, a store-forwarding stall on every recorded op.
    pub fn push_inferred(
        &mut self,
        op: Op,
        inputs: &[NodeId],
        shape: &Shape,
        dtype: DType,
        origin: Origin,
    ) -> NodeId {
        let mut hashes = [0u64; 3];
        let hash = if inputs.len() <= 3 {
            for (h, &i) in hashes.iter_mut().zip(inputs) {
                *h = self.g[i.index()].hash;
            }
            node_hash(&op, &hashes[..inputs.len()], shape, dtype)
        } else {
            let all: Vec<u64> = inputs.iter().map(|&i| self.g[i.index()].hash).collect();
            node_hash(&op, &all, shape, dtype)
        };
        let id = NodeId::new(self.g.len());
        self.roll(hash, inputs);
        self.append_node(Node {
            op,
            inputs: inputs_of(inputs),
            shape: shape.clone(),
            dtype,
            hash,
            origin,
        });
        id
    }

    /// Appends the rank-0 constant `value` of `dtype`: the node
    /// [`Graph::push_inferred`] appends for that `Op::Constant`, built in
    /// place. Every op with a host scalar operand (`x * 0.5`) records one,
    /// and an `Op` passed in was read back from the caller's stack, where
    /// its narrower stores could not be forwarded to the wide loads.
    #[inline(always)]
    pub fn push_scalar(&mut self, value: crate::Literal, dtype: DType, origin: Origin) -> NodeId {
        let op = Op::Constant {
            value,
            shape: Shape::scalar(),
            dtype,
        };
        let hash = node_hash(&op, &[], &Shape::scalar(), dtype);
        let id = NodeId::new(self.g.len());
        self.roll(hash, &[]);
        self.append_node(Node {
            op,
            inputs: Inputs::new(),
            shape: Shape::scalar(),
            dtype,
            hash,
            origin,
        });
        id
    }

    /// Folds a new node (its structural hash and operand indices) into the
    /// rolling [`Graph::structure`] hash.
    #[inline(always)]
    fn roll(&mut self, hash: u64, inputs: &[NodeId]) {
        let mut roll = (self.structure.rotate_left(23) ^ hash).wrapping_mul(ROLL);
        for &i in inputs {
            roll = (roll.rotate_left(17) ^ i.index() as u64).wrapping_mul(ROLL);
        }
        self.structure = roll;
    }

    /// Appends `node`, written field by field into the vector's spare slot.
    /// A `Node` is too large for the inline copy LLVM emits for a move, so
    /// `Vec::push` called `memcpy` (a `rep movsb` on this machine): about a
    /// tenth of a scalar op's recording time, and the next node's read of
    /// this one's hash could not be forwarded from its stores.
    #[inline(always)]
    fn append_node(&mut self, node: Node) {
        let Node {
            op,
            inputs,
            shape,
            dtype,
            hash,
            origin,
        } = node;
        self.g.reserve(1);
        let len = self.g.len();
        let slot = self.g.spare_capacity_mut()[0].as_mut_ptr();
        // SAFETY: `slot` is the first spare slot (`reserve` made one), every
        // field is written exactly once before `set_len` exposes it, and
        // nothing in between can unwind.
        unsafe {
            std::ptr::addr_of_mut!((*slot).op).write(op);
            std::ptr::addr_of_mut!((*slot).inputs).write(inputs);
            std::ptr::addr_of_mut!((*slot).shape).write(shape);
            std::ptr::addr_of_mut!((*slot).dtype).write(dtype);
            std::ptr::addr_of_mut!((*slot).hash).write(hash);
            std::ptr::addr_of_mut!((*slot).origin).write(origin);
            self.g.set_len(len + 1);
        }
    }

    /// A hash of the whole graph's structure: every node's structural hash
    /// and its wiring (operand node indices), in order. Two graphs with equal
    /// length and structure differ at most in liftable scalar values, so
    /// everything a planner decides from structure carries over from one to
    /// the other (the way a jit cache replays a trace). Kept up to date as
    /// nodes are appended, so asking costs nothing.
    pub fn structure(&self) -> u64 {
        self.structure
    }

    /// The node with this id.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.g[id.index()]
    }

    /// Every node, in topological (append) order.
    pub fn nodes(&self) -> &[Node] {
        &self.g
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.g.len()
    }

    /// True when nothing has been recorded.
    pub fn is_empty(&self) -> bool {
        self.g.is_empty()
    }

    /// All node ids in topological (append) order.
    pub fn ids(&self) -> impl DoubleEndedIterator<Item = NodeId> + ExactSizeIterator {
        (0..self.g.len()).map(NodeId::new)
    }

    /// Nodes that use `id` as an operand (each once per use), in order. A
    /// scan of the nodes after `id`: for tools, not for hot paths.
    pub fn users(&self, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        let after = id.index() + 1;
        self.g[after.min(self.g.len())..]
            .iter()
            .enumerate()
            .flat_map(move |(k, n)| {
                let user = NodeId::new(after + k);
                n.inputs
                    .iter()
                    .filter(move |&&i| i == id)
                    .map(move |_| user)
            })
    }

    /// Removes every node (start of a new recording generation).
    pub fn clear(&mut self) {
        self.g.clear();
        self.structure = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BinaryOp, Literal};

    /// Operand lists of every length keep their ids in order (up to three
    /// through the fixed buffer, more spilled).
    #[test]
    fn operand_lists_keep_their_ids_at_every_length() {
        for n in 0..=5 {
            let ids: Vec<NodeId> = (0..n).map(|i| NodeId::new(7 * i + 1)).collect();
            assert_eq!(&inputs_of(&ids)[..], &ids[..]);
        }
    }

    #[test]
    fn a_remembered_lifted_scalar_hash_is_the_computed_one() {
        for dtype in DType::ALL {
            let scalar = |value| Op::Constant {
                value,
                shape: Shape::scalar(),
                dtype,
            };
            let dim = scalar(Literal::Dim(7));
            let want = hash_parts(true, &dim, &[], &Shape::scalar(), dtype);
            // Computed on first use, remembered after: the same either way.
            for _ in 0..2 {
                assert_eq!(node_hash(&dim, &[], &Shape::scalar(), dtype), want);
            }
            if dtype.is_float() {
                // The value never enters the hash of a lifted scalar.
                let a = node_hash(&scalar(Literal::Float(0.25)), &[], &Shape::scalar(), dtype);
                let b = node_hash(&scalar(Literal::Float(3.0)), &[], &Shape::scalar(), dtype);
                assert_eq!((a, b), (want, want));
            }
        }
        // Every number is lifted, 1 and 0 included; a boolean is baked in
        // and hashes apart, as do other dtypes.
        for value in [Literal::Float(1.0), Literal::Float(-1.0), Literal::Int(0)] {
            let c = Op::Constant {
                value,
                shape: Shape::scalar(),
                dtype: DType::F32,
            };
            assert!(c.is_liftable_scalar());
        }
        let yes = Op::Constant {
            value: Literal::Bool(true),
            shape: Shape::scalar(),
            dtype: DType::Bool,
        };
        assert!(!yes.is_liftable_scalar());
        let f32_lifted = lifted_scalar_hash(DType::F32);
        assert_ne!(
            node_hash(&yes, &[], &Shape::scalar(), DType::Bool),
            f32_lifted
        );
        assert_ne!(lifted_scalar_hash(DType::F64), f32_lifted);
    }

    #[test]
    fn a_graph_records_scalar_operands_with_either_side_broadcast() {
        let mut g = Graph::new();
        let here = Origin::caller();
        let x = g
            .push(
                Op::Input {
                    shape: Shape::from(&[2, 3][..]),
                    dtype: DType::F32,
                },
                &[],
                here,
            )
            .unwrap();
        let c = g
            .push(
                Op::Constant {
                    value: Literal::Float(0.5),
                    shape: Shape::scalar(),
                    dtype: DType::F32,
                },
                &[],
                here,
            )
            .unwrap();
        let mul = Op::Binary(BinaryOp::Mul);
        let xc = g.push(mul.clone(), &[x, c], here).unwrap();
        let cx = g.push(mul, &[c, x], here).unwrap();
        assert_eq!(g.node(xc).shape, Shape::from(&[2, 3][..]));
        assert_eq!(g.node(cx).shape, Shape::from(&[2, 3][..]));
    }

    /// A scalar appended in place is the node `push` appends for the same
    /// constant: op, type, hash, and the same change to the structure hash,
    /// for lifted and baked-in values of every dtype.
    #[test]
    fn push_scalar_appends_what_push_appends() {
        let here = Origin::caller();
        let values = [
            Literal::Float(0.5),
            Literal::Float(1.0),
            Literal::Int(0),
            Literal::Int(-3),
            Literal::Bool(true),
            Literal::Dim(9),
        ];
        for dtype in DType::ALL {
            for value in values {
                if crate::check_literal(value, dtype).is_err() {
                    continue;
                }
                let (mut a, mut b) = (Graph::new(), Graph::new());
                let input = Op::Input {
                    shape: Shape::from(&[4][..]),
                    dtype,
                };
                a.push(input.clone(), &[], here).unwrap();
                b.push(input, &[], here).unwrap();
                let op = Op::Constant {
                    value,
                    shape: Shape::scalar(),
                    dtype,
                };
                let ia = a.push(op, &[], here).unwrap();
                let ib = b.push_scalar(value, dtype, here);
                assert_eq!(ia, ib);
                let (na, nb) = (a.node(ia), b.node(ib));
                assert_eq!(na.op, nb.op, "{value:?} {dtype:?}");
                assert_eq!(
                    (&na.shape, na.dtype, na.hash),
                    (&nb.shape, nb.dtype, nb.hash)
                );
                assert!(nb.inputs.is_empty());
                assert_eq!(a.structure(), b.structure());
            }
        }
    }
}
