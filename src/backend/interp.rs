//! The interpreter backend: `lazyfuse-ir`'s reference interpreter as a
//! device. Buffers are host arrays; "compiling" a region extracts it into a
//! standalone graph (parameters become inputs), and executing evaluates that
//! graph on the host, synchronously. It is slow by design and exact by
//! definition: the interpreter is the executable specification of every op.
//!
//! Compiles are counted like XLA compiles, so tests that pin "compiles
//! once, then 0" hold on both backends.

use super::{foreign, Backend, Completion, HostSlice, RawBuffer, RawExecutable};
use crate::metrics::{self, COUNTERS as C};
use crate::{Error, Result};
use lazyfuse_fusion::{Region, RegionKey};
use lazyfuse_ir::{interp, DType, Graph, HostTensor, NodeId, Op, Shape};
use std::collections::HashMap;
use std::time::Instant;

/// A region as a standalone graph: `params[i]` is the input node of the
/// executable's argument `i` (buffer parameters, then scalar packs),
/// `outputs[j]` the node of its output `j`.
pub(crate) struct Program {
    graph: Graph,
    params: Vec<NodeId>,
    outputs: Vec<NodeId>,
}

impl Program {
    /// Copies `region` out of `graph`.
    fn extract(graph: &Graph, region: &Region) -> Result<Program> {
        let mut g = Graph::new();
        let mut map: HashMap<NodeId, NodeId> = HashMap::new();
        let bad = |e: lazyfuse_ir::InferError| Error::internal(format!("extracting a region: {e}"));
        // Buffer parameters, then one rank-1 input per scalar pack, each of
        // its scalars a slice of it (the argument order XLA's module has).
        let mut params = Vec::with_capacity(region.params.len());
        for (k, &p) in region.params.iter().enumerate() {
            if region.is_lifted(k) {
                continue;
            }
            let n = graph.node(p);
            let op = Op::Input {
                shape: n.shape.clone(),
                dtype: n.dtype,
            };
            let id = g.push(op, &[], n.origin).map_err(bad)?;
            map.insert(p, id);
            params.push(id);
        }
        for pack in region.scalar_packs() {
            let first = graph.node(region.params[pack.params[0]]).origin;
            let op = Op::Input {
                shape: Shape::new(&[pack.params.len()]),
                dtype: pack.dtype,
            };
            let packed = g.push(op, &[], first).map_err(bad)?;
            params.push(packed);
            for (slot, &k) in pack.params.iter().enumerate() {
                let p = region.params[k];
                let origin = graph.node(p).origin;
                let one = Op::Slice {
                    axis: 0,
                    start: slot,
                    len: 1,
                };
                let s = g.push(one, &[packed], origin).map_err(bad)?;
                let v = g
                    .push(Op::Reshape(Shape::scalar()), &[s], origin)
                    .map_err(bad)?;
                map.insert(p, v);
            }
        }
        for &id in &region.nodes {
            let n = graph.node(id);
            let inputs: Vec<NodeId> = n
                .inputs
                .iter()
                .map(|i| {
                    map.get(i)
                        .copied()
                        .ok_or_else(|| Error::internal("region node reads a value it lacks"))
                })
                .collect::<Result<_>>()?;
            let new = g.push(n.op.clone(), &inputs, n.origin).map_err(bad)?;
            map.insert(id, new);
        }
        let outputs = region
            .outputs
            .iter()
            .map(|o| {
                map.get(o)
                    .copied()
                    .ok_or_else(|| Error::internal("region output is not computed by it"))
            })
            .collect::<Result<_>>()?;
        Ok(Program {
            graph: g,
            params,
            outputs,
        })
    }
}

/// The reference-interpreter device (one device, host memory).
pub(crate) struct InterpBackend;

impl Backend for InterpBackend {
    fn platform_name(&self) -> String {
        "interpreter".into()
    }

    fn device_count(&self) -> usize {
        1
    }

    fn upload(&self, host: HostSlice<'_>, _ordinal: usize) -> Result<RawBuffer> {
        Ok(RawBuffer::Host(HostTensor {
            shape: host.shape.clone(),
            dtype: host.dtype,
            bytes: host.bytes.to_vec(),
        }))
    }

    fn host_bytes<'a>(&self, buf: &'a RawBuffer, _rank: usize) -> Result<Option<&'a [u8]>> {
        match buf {
            // The interpreter's values are immutable host arrays.
            RawBuffer::Host(h) => Ok(Some(&h.bytes)),
            #[cfg(feature = "xla")]
            RawBuffer::Pjrt(_) => Err(foreign("buffer")),
        }
    }

    fn download(&self, buf: &RawBuffer, out: &mut [u8]) -> Result<bool> {
        match buf {
            // A copy of the interpreter's value, not a read of device
            // memory in place: counted as a transfer like any other.
            RawBuffer::Host(h) if h.bytes.len() == out.len() => {
                out.copy_from_slice(&h.bytes);
                Ok(false)
            }
            RawBuffer::Host(h) => Err(Error::internal(format!(
                "download of {} bytes into {}",
                h.bytes.len(),
                out.len()
            ))),
            #[cfg(feature = "xla")]
            RawBuffer::Pjrt(_) => Err(foreign("buffer")),
        }
    }

    fn compile(
        &self,
        _key: RegionKey,
        graph: &Graph,
        region: &Region,
        on_compile: &mut dyn FnMut(),
    ) -> Result<RawExecutable> {
        on_compile();
        let t0 = Instant::now();
        let p = Program::extract(graph, region)?;
        metrics::add(&C.compile_ns, t0.elapsed().as_nanos() as u64);
        metrics::observe_since(metrics::Phase::Compile, t0);
        metrics::add(&C.compiles, 1);
        Ok(RawExecutable::Interp(p))
    }

    fn reuses_donated(&self) -> bool {
        false
    }

    fn execute(
        &self,
        exe: &RawExecutable,
        args: &[&RawBuffer],
        _donate: &[usize],
        _ordinal: usize,
        outputs: &[(Shape, DType)],
    ) -> Result<(Vec<RawBuffer>, Completion)> {
        #[allow(irrefutable_let_patterns)] // without the `xla` feature
        let RawExecutable::Interp(p) = exe
        else {
            return Err(foreign("executable"));
        };
        if args.len() != p.params.len() {
            return Err(Error::internal(format!(
                "{} arguments for {} parameters",
                args.len(),
                p.params.len()
            )));
        }
        let mut inputs = HashMap::with_capacity(args.len());
        for (&id, a) in p.params.iter().zip(args) {
            match a {
                RawBuffer::Host(h) => inputs.insert(id, h.clone()),
                #[cfg(feature = "xla")]
                RawBuffer::Pjrt(_) => return Err(foreign("argument")),
            };
        }
        let values = interp::eval_graph(&p.graph, &inputs, &p.outputs)
            .map_err(|e| Error::internal(format!("interpreter: {e}")))?;
        for (v, (s, d)) in values.iter().zip(outputs) {
            if &v.shape != s || v.dtype != *d {
                return Err(Error::internal("interpreter result of an unexpected type"));
            }
        }
        Ok((
            values.into_iter().map(RawBuffer::Host).collect(),
            Completion::Done,
        ))
    }

    fn wait(&self, done: Completion, _poll: std::time::Duration) -> Result<()> {
        match done {
            Completion::Done => Ok(()),
            #[cfg(feature = "xla")]
            Completion::Pjrt(_) | Completion::PjrtAll(_) => Err(foreign("completion")),
        }
    }
}
