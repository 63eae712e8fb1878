//! Manual regions, in the manner of JAX's `shard_map`: a function written
//! for one device's piece of each input, run on every device of a mesh,
//! with explicit collectives (`all_reduce`, `all_gather`,
//! `reduce_scatter`) over named mesh axes.
//!
//! How: a [`Local`] value is one ordinary tensor holding every device's
//! piece, stacked along leading dimensions, one per mesh axis (device
//! `(i, j)` of a `[dp, tp]` mesh owns `[i, j, ..]`), kept split one
//! piece per device by a sharding constraint. A leading dimension of size
//! 1 says the piece is the same on every device along that axis
//! (replicated there, as after an `all_reduce`), so nothing is stored or
//! computed twice and the result needs no collective to leave the region.
//! Local ops are ordinary ops
//! on the trailing dimensions, so they run where the piece lives; a
//! collective is its global meaning written with ordinary ops (an
//! `all_reduce` over `dp` is a sum over the `dp` dimension broadcast back),
//! and XLA's partitioner turns the reduction of a split dimension into the
//! collective itself. Everything else comes for free: the interpreter
//! defines the result, fusion and `LAZYFUSE_FUSION=0` agree, autograd
//! differentiates through collectives (the gradient of an `all_reduce`
//! is an `all_reduce`), and the program is recorded lazily like any other.

use super::Tensor;
use crate::spmd::Mesh;
use crate::{Error, Result};
use lazyfuse_ir::Origin;
use lazyfuse_ir::SplitAxes;

/// One device's piece of a value inside a manual region
/// ([`Mesh::shard_map`]), for every device of the mesh at once. Its
/// [`Local::dims`] are the piece's; [`Local::per_device`] is the
/// underlying tensor, whose leading dimensions are the mesh axes.
#[derive(Clone)]
pub struct Local {
    t: Tensor,
    mesh: Mesh,
}

/// How a collective combines the pieces of the devices along a mesh axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// Their sum.
    Sum,
    /// Their mean (float).
    Mean,
    /// Their elementwise maximum.
    Max,
    /// Their elementwise minimum.
    Min,
}

/// The sizes of `mesh`'s axes, in order.
fn mesh_dims(mesh: &Mesh) -> Vec<usize> {
    mesh.axes().map(|(_, n)| n).collect()
}

/// The split of stacked pieces of shape `dims` over a mesh of `k` axes:
/// leading dimension `a` over mesh axis `a` (unless it has size 1: the
/// same piece on every device along `a`), the piece's own unsplit.
fn lead_split(dims: &[usize], k: usize) -> SplitAxes {
    (0..dims.len())
        .map(|a| (a < k && dims[a] > 1).then_some(a as u8))
        .collect()
}

/// Per dimension of `spec`, its mesh axis index (checked against the mesh).
fn spec_axes(
    mesh: &Mesh,
    spec: &[Option<&str>],
) -> std::result::Result<Vec<Option<usize>>, String> {
    spec.iter()
        .map(|s| s.map(|a| mesh.axis(a)).transpose())
        .collect()
}

impl Mesh {
    /// Runs `body` on every device's piece of `inputs` and assembles its
    /// results (JAX's `shard_map`). Input `(x, spec)` is split as `spec`
    /// says (one mesh axis or `None` per dimension; unnamed axes see the
    /// whole dimension), and `body` receives each as a [`Local`] of the
    /// piece's shape. Result `i` is assembled as `out_specs[i]` says: a
    /// dimension named with an axis is the devices' pieces along that
    /// axis concatenated; a mesh axis the spec does not name must hold
    /// the same piece on every device along it (after an `all_reduce`
    /// or `all_gather` over it, say; an `Err` otherwise, as JAX's
    /// replication check).
    ///
    /// Recorded lazily like any op: no sync point, except that an input
    /// that is not on this mesh yet is placed on it first
    /// ([`Tensor::shard`]). Inside, ops on [`Local`]s run on each device
    /// without communication; the collectives are the only exchange.
    ///
    /// `Err` at the call site for a spec that does not fit its tensor or
    /// the mesh, a result count other than `out_specs`' count, or a
    /// result of another mesh.
    #[track_caller]
    pub fn shard_map<F>(
        &self,
        inputs: &[(&Tensor, &[Option<&str>])],
        out_specs: &[&[Option<&str>]],
        body: F,
    ) -> Result<Vec<Tensor>>
    where
        F: FnOnce(&[Local]) -> Result<Vec<Local>>,
    {
        let at = crate::site::caller();
        let fail = |m: String, what: String| Error::op("shard_map", m, what, at);
        let mut locals = Vec::with_capacity(inputs.len());
        for (x, spec) in inputs {
            let axes = spec_axes(self, spec).map_err(|m| fail(m, x.describe()))?;
            crate::spmd::Sharding::new(self, x.shape(), spec).map_err(|m| fail(m, x.describe()))?;
            let placed = if x.0.mesh() == Some(self) {
                x.with_sharding_constraint(self, spec)?
            } else {
                x.shard(self, spec)?
            };
            locals.push(Local {
                t: enter(&placed, self, &axes)?,
                mesh: self.clone(),
            });
        }
        let outs = body(&locals)?;
        if outs.len() != out_specs.len() {
            return Err(fail(
                format!(
                    "the body returned {} values for {} out_specs",
                    outs.len(),
                    out_specs.len()
                ),
                String::new(),
            ));
        }
        outs.iter()
            .zip(out_specs)
            .map(|(y, spec)| {
                if &y.mesh != self {
                    return Err(fail(
                        format!("a result of the mesh {} returned from {self}", y.mesh),
                        y.t.describe(),
                    ));
                }
                if spec.len() != y.rank() {
                    return Err(fail(
                        format!(
                            "out spec {spec:?} needs one entry per dimension of the local \
                             result {:?}",
                            y.dims()
                        ),
                        y.t.describe(),
                    ));
                }
                let axes = spec_axes(self, spec).map_err(|m| fail(m, y.t.describe()))?;
                if let Some((name, _)) = self
                    .axes()
                    .enumerate()
                    .find(|&(a, _)| y.t.dims()[a] > 1 && !axes.contains(&Some(a)))
                    .map(|(_, x)| x)
                {
                    return Err(fail(
                        format!(
                            "a result differs across mesh axis {name:?}, which its out spec                              {spec:?} does not name: name the axis to concatenate the pieces,                              or all_reduce / all_gather over it first"
                        ),
                        y.t.describe(),
                    ));
                }
                for (i, a) in axes.iter().enumerate() {
                    if a.is_some() && axes[..i].contains(a) {
                        return Err(fail(
                            format!("out spec {spec:?} names one mesh axis twice"),
                            y.t.describe(),
                        ));
                    }
                }
                let global = exit(&y.t, self, &axes)?;
                global.with_sharding_constraint(self, spec)
            })
            .collect()
    }
}

/// The stacked pieces of `x` (split as `axes` says over `mesh`): each
/// split dimension `d` becomes `(n, d / n)`, the `n`s move to the front in
/// mesh order, mesh axes `x` is not split over get a dimension of size 1
/// (the same piece on every device along them), and the leading
/// dimensions are kept split one per device.
fn enter(x: &Tensor, mesh: &Mesh, axes: &[Option<usize>]) -> Result<Tensor> {
    let sizes = mesh_dims(mesh);
    let k = sizes.len();
    let mut split_dims = Vec::with_capacity(x.rank() + k);
    let mut at = vec![None; k];
    for (d, &n) in x.dims().iter().enumerate() {
        if let Some(a) = axes[d] {
            at[a] = Some(split_dims.len());
            split_dims.push(sizes[a]);
            split_dims.push(n / sizes[a]);
        } else {
            split_dims.push(n);
        }
    }
    let t = x.reshape(&split_dims)?;
    let front: Vec<usize> = at.iter().flatten().copied().collect();
    let perm: Vec<usize> = front
        .iter()
        .copied()
        .chain((0..split_dims.len()).filter(|p| !front.contains(p)))
        .collect();
    let t = t.permute_axes(&perm)?;
    let local: Vec<usize> = perm[front.len()..].iter().map(|&p| split_dims[p]).collect();
    let stacked: Vec<usize> = (0..k)
        .map(|a| if at[a].is_some() { sizes[a] } else { 1 })
        .chain(local.iter().copied())
        .collect();
    t.reshape(&stacked)?.constrain(&lead_split(&stacked, k))
}

/// The global value of the stacked pieces `y` (replicated along every
/// mesh axis `axes` does not name: checked by the caller): a local
/// dimension named with axis `a` becomes the pieces along `a`
/// concatenated (copies, where the piece is the same along `a`).
fn exit(y: &Tensor, mesh: &Mesh, axes: &[Option<usize>]) -> Result<Tensor> {
    let sizes = mesh_dims(mesh);
    let k = sizes.len();
    let local = &y.dims()[k..];
    let full: Vec<usize> = (0..k)
        .map(|a| if axes.contains(&Some(a)) { sizes[a] } else { 1 })
        .chain(local.iter().copied())
        .collect();
    let t = y.broadcast_to(&full)?;
    let used: Vec<usize> = (0..k).filter(|a| axes.contains(&Some(*a))).collect();
    let kept: Vec<usize> = used
        .iter()
        .map(|&a| sizes[a])
        .chain(local.iter().copied())
        .collect();
    let t = t.reshape(&kept)?;
    let mut perm = Vec::with_capacity(kept.len());
    let mut global = Vec::with_capacity(local.len());
    for (d, &m) in local.iter().enumerate() {
        if let Some(a) = axes[d] {
            perm.push(
                used.iter()
                    .position(|&u| u == a)
                    .expect("a named axis is used"),
            );
            global.push(sizes[a] * m);
        } else {
            global.push(m);
        }
        perm.push(used.len() + d);
    }
    t.permute_axes(&perm)?.reshape(&global)
}

impl Local {
    /// The piece's dimensions (one device's).
    pub fn dims(&self) -> &[usize] {
        &self.t.dims()[self.lead()..]
    }

    /// The piece's rank.
    pub fn rank(&self) -> usize {
        self.dims().len()
    }

    /// The mesh this region runs on.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// Every device's piece as one tensor: its leading dimensions are the
    /// mesh axes, in order, and the rest are the piece's.
    pub fn per_device(&self) -> &Tensor {
        &self.t
    }

    fn lead(&self) -> usize {
        self.mesh.axes().count()
    }

    /// `f` applied to every piece at once: `f` gets and returns the
    /// stacked tensor ([`Local::per_device`]), so it must treat the leading
    /// mesh dimensions as batch dimensions (elementwise ops, matmuls,
    /// reductions and softmaxes over axes counted from the end). A result
    /// that lost them is an `Err`.
    #[track_caller]
    pub fn map(&self, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Local> {
        let at = crate::site::caller();
        let y = f(&self.t)?;
        self.wrap(y, at)
    }

    /// `f` applied to the pieces of `self` and `other` on each device, as
    /// [`Local::map`].
    #[track_caller]
    pub fn zip(
        &self,
        other: &Local,
        f: impl FnOnce(&Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Local> {
        let at = crate::site::caller();
        if other.mesh != self.mesh {
            return Err(Error::op(
                "shard_map",
                format!("pieces of two meshes, {} and {}", self.mesh, other.mesh),
                self.t.describe(),
                at,
            ));
        }
        let y = f(&self.t, &other.t)?;
        self.wrap(y, at)
    }

    /// `y` as a local value, checked to keep the mesh dimensions in front.
    fn wrap(&self, y: Tensor, at: Origin) -> Result<Local> {
        let sizes = mesh_dims(&self.mesh);
        let lead_ok = |d: &[usize]| d.iter().zip(&sizes).all(|(&g, &n)| g == n || g == 1);
        if y.rank() < sizes.len() || !lead_ok(&y.dims()[..sizes.len()]) {
            return Err(Error::op(
                "shard_map",
                format!(
                    "a local op must keep the leading mesh dimensions {sizes:?} (address the \
                     piece's dimensions from the end, with negative axes); it gave {:?}",
                    y.dims()
                ),
                self.t.describe(),
                at,
            ));
        }
        Ok(Local {
            t: y,
            mesh: self.mesh.clone(),
        })
    }

    /// The index of `axis` and the piece's dimension `dim` (negative
    /// counts from the end) as a dimension of the stacked tensor.
    fn locate(
        &self,
        op: &'static str,
        axis: &str,
        dim: Option<isize>,
        at: Origin,
    ) -> Result<(usize, usize)> {
        let fail = |m: String| Error::op(op, m, self.t.describe(), at);
        let a = self.mesh.axis(axis).map_err(fail)?;
        let Some(dim) = dim else {
            return Ok((a, 0));
        };
        let r = self.rank() as isize;
        let d = if dim < 0 { dim + r } else { dim };
        if !(0..r).contains(&d) {
            return Err(fail(format!(
                "dimension {dim} is out of range for a piece of rank {r}"
            )));
        }
        Ok((a, self.lead() + d as usize))
    }

    /// The stacked `y`, kept split one piece per device.
    fn pieces(&self, y: Tensor) -> Result<Local> {
        let t = y.constrain(&lead_split(y.dims(), self.lead()))?;
        Ok(Local {
            t,
            mesh: self.mesh.clone(),
        })
    }

    /// Every device along mesh axis `axis` gets the pieces of all of them
    /// combined by `op` (`psum`, `pmean`, `pmax`, `pmin`); the shape is
    /// unchanged.
    /// The result is the same on every device along the axis. A piece
    /// that already was (replicated along the axis) is its own maximum,
    /// minimum and mean, and `n` times itself summed.
    #[track_caller]
    pub fn all_reduce(&self, axis: &str, op: Reduction) -> Result<Local> {
        let (a, _) = self.locate("all_reduce", axis, None, crate::site::caller())?;
        let axes = [a as isize];
        if self.t.dims()[a] == 1 {
            let n = mesh_dims(&self.mesh)[a];
            return match op {
                Reduction::Sum if n > 1 => self.map(|t| t.mul(n as f64)),
                _ => Ok(self.clone()),
            };
        }
        let r = match op {
            Reduction::Sum => self.t.sum(axes, true)?,
            Reduction::Mean => self.t.mean(axes, true)?,
            Reduction::Max => self.t.max(axes, true)?,
            Reduction::Min => self.t.min(axes, true)?,
        };
        self.pieces(r)
    }

    /// The stacked pieces with leading dimension `a` at its full size
    /// (copies where the piece is the same along it).
    fn spread(&self, a: usize) -> Result<Tensor> {
        let mut dims = self.t.dims().to_vec();
        dims[a] = mesh_dims(&self.mesh)[a];
        self.t.broadcast_to(&dims)
    }

    /// Every device along mesh axis `axis` gets the pieces of all of them
    /// concatenated along the piece's dimension `dim` (in device order;
    /// `all_gather(..., tiled=True)`).
    #[track_caller]
    pub fn all_gather(&self, axis: &str, dim: isize) -> Result<Local> {
        let (a, d) = self.locate("all_gather", axis, Some(dim), crate::site::caller())?;
        let t = self.spread(a)?;
        let dims = t.dims();
        // Move the axis just before the gathered dimension and merge them.
        let mut perm: Vec<usize> = (0..dims.len()).filter(|&p| p != a).collect();
        let before = perm.iter().position(|&p| p == d).expect("d is not a");
        perm.insert(before, a);
        let mut merged: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
        merged[before] *= merged.remove(before + 1);
        let g = t.permute_axes(&perm)?.reshape(&merged)?;
        // Every device along the axis holds the same gathered piece.
        merged.insert(a, 1);
        self.pieces(g.reshape(&merged)?)
    }

    /// The pieces along mesh axis `axis` summed, then split along the
    /// piece's dimension `dim`: device `i` along the axis gets block `i`
    /// (`psum_scatter(..., tiled=True)`). `Err` when that dimension does
    /// not divide by the axis size.
    #[track_caller]
    pub fn reduce_scatter(&self, axis: &str, dim: isize) -> Result<Local> {
        let at = crate::site::caller();
        let (a, d) = self.locate("reduce_scatter", axis, Some(dim), at)?;
        let t = self.spread(a)?;
        let dims = t.dims();
        let n = dims[a];
        if dims[d] % n != 0 {
            return Err(Error::op(
                "reduce_scatter",
                format!(
                    "dimension {dim} of the piece ({}) does not divide over mesh axis {axis:?} \
                     of size {n}",
                    dims[d]
                ),
                self.t.describe(),
                at,
            ));
        }
        let summed = t.sum([a as isize], false)?;
        // In `summed` the piece's dimension moved one place down.
        let d = d - 1;
        let mut blocks: Vec<usize> = summed.dims().to_vec();
        blocks[d] /= n;
        blocks.insert(d, n);
        let split = summed.reshape(&blocks)?;
        let mut perm: Vec<usize> = (0..blocks.len()).filter(|&p| p != d).collect();
        perm.insert(a, d);
        self.pieces(split.permute_axes(&perm)?)
    }

    /// Each device's coordinate along mesh axis `axis` (`axis_index`), as
    /// an i64 piece of shape `[]`.
    #[track_caller]
    pub fn axis_index(&self, axis: &str) -> Result<Local> {
        let (a, _) = self.locate("axis_index", axis, None, crate::site::caller())?;
        let sizes = mesh_dims(&self.mesh);
        let ids = Tensor::arange(
            0.0,
            sizes[a] as f64,
            lazyfuse_ir::DType::I64,
            self.t.device(),
        )?;
        let mut one = vec![1; sizes.len()];
        one[a] = sizes[a];
        self.pieces(ids.reshape(&one)?)
    }
}

impl Local {
    /// The stacked tensors of `self` and `other` with the piece of lower
    /// rank given leading ones after the mesh dimensions, so that the
    /// pieces broadcast against each other as they would alone.
    fn aligned(&self, other: &Local) -> Result<(Tensor, Tensor)> {
        let k = self.lead();
        let lift = |t: &Tensor, rank: usize| -> Result<Tensor> {
            if t.rank() >= rank {
                return Ok(t.clone());
            }
            let mut dims = t.dims().to_vec();
            for _ in t.rank()..rank {
                dims.insert(k, 1);
            }
            t.reshape(&dims)
        };
        let rank = self.t.rank().max(other.t.rank());
        Ok((lift(&self.t, rank)?, lift(&other.t, rank)?))
    }
}

/// Elementwise and contraction ops between pieces, on each device, with
/// the pieces broadcast against each other as they would be alone.
macro_rules! local_binary {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        impl Local {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self, other: &Local) -> Result<Local> {
                    let at = crate::site::caller();
                    if other.mesh != self.mesh {
                        return self.zip(other, |x, y| x.$name(y));
                    }
                    let (x, y) = self.aligned(other)?;
                    self.wrap(x.$name(&y)?, at)
                }
            )*
        }
    };
}

local_binary!(
    /// `self + other` on each device's pieces (broadcasting).
    add,
    /// `self - other` on each device's pieces.
    sub,
    /// `self * other` on each device's pieces.
    mul,
    /// `self / other` on each device's pieces.
    div,
    /// The matrix product of each device's pieces (of rank 2 or more).
    matmul,
);
