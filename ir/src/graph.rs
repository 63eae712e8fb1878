//! The recorded program: an append-only DAG of nodes in topological order,
//! each with a structural hash computed when it is appended.

use crate::{infer, DType, InferError, Op, Shape};
use petgraph::graph::{DiGraph, NodeIndex};
use smallvec::SmallVec;
use std::hash::{BuildHasher, Hash, Hasher};
use std::panic::Location;

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
    /// and dtype. Never depends on tensor identity, node ids or addresses.
    pub hash: u64,
    /// The user source line that recorded this node (for errors and dumps).
    pub origin: &'static Location<'static>,
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

/// The structural hash of a node from its parts.
pub fn node_hash(op: &Op, input_hashes: &[u64], shape: &Shape, dtype: DType) -> u64 {
    let mut h = stable_hasher();
    op.hash(&mut h);
    input_hashes.hash(&mut h);
    shape.hash(&mut h);
    dtype.hash(&mut h);
    h.finish()
}

/// An append-only DAG. Nodes are appended after their operands, so index
/// order is a topological order; petgraph edges (operand position as weight)
/// give planners the users of each node.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    g: DiGraph<Node, u8, u32>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Validates `op` on `inputs`, then appends it. Nothing is appended on error.
    pub fn push(
        &mut self,
        op: Op,
        inputs: &[NodeId],
        origin: &'static Location<'static>,
    ) -> Result<NodeId, InferError> {
        let mut operands: SmallVec<[(&Shape, DType); 3]> = SmallVec::new();
        for &i in inputs {
            let n = self
                .g
                .node_weight(i)
                .ok_or_else(|| InferError(format!("unknown operand {i:?}")))?;
            operands.push((&n.shape, n.dtype));
        }
        let (shape, dtype) = infer(&op, &operands)?;
        drop(operands);
        Ok(self.push_inferred(op, inputs, shape, dtype, origin))
    }

    /// Appends a node whose type was already inferred by the caller.
    pub fn push_inferred(
        &mut self,
        op: Op,
        inputs: &[NodeId],
        shape: Shape,
        dtype: DType,
        origin: &'static Location<'static>,
    ) -> NodeId {
        let mut hashes = [0u64; 3];
        let hash = if inputs.len() <= 3 {
            for (h, &i) in hashes.iter_mut().zip(inputs) {
                *h = self.g[i].hash;
            }
            node_hash(&op, &hashes[..inputs.len()], &shape, dtype)
        } else {
            let all: Vec<u64> = inputs.iter().map(|&i| self.g[i].hash).collect();
            node_hash(&op, &all, &shape, dtype)
        };
        let id = self.g.add_node(Node {
            op,
            inputs: Inputs::from_slice(inputs),
            shape,
            dtype,
            hash,
            origin,
        });
        for (pos, &i) in inputs.iter().enumerate() {
            self.g.add_edge(i, id, pos as u8);
        }
        id
    }

    /// The node with this id.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.g[id]
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.g.node_count()
    }

    /// True when nothing has been recorded.
    pub fn is_empty(&self) -> bool {
        self.g.node_count() == 0
    }

    /// All node ids in topological (append) order.
    pub fn ids(&self) -> impl DoubleEndedIterator<Item = NodeId> + ExactSizeIterator {
        self.g.node_indices()
    }

    /// Nodes that use `id` as an operand (each once per use).
    pub fn users(&self, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        self.g.neighbors_directed(id, petgraph::Direction::Outgoing)
    }

    /// The underlying petgraph graph, for algorithms.
    pub fn petgraph(&self) -> &DiGraph<Node, u8, u32> {
        &self.g
    }

    /// Removes every node (start of a new recording generation).
    pub fn clear(&mut self) {
        self.g.clear();
    }
}
