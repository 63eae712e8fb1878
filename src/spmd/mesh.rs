//! Device meshes and shardings: the data that says where the pieces of a
//! tensor live, and the geometry of its shards. Pure data over `ir` shapes;
//! the device layer builds meshes, the runtime stores shards, the lowering
//! spells shardings as Shardy attributes.

use lazyfuse_ir::Shape;
use std::fmt;
use std::sync::Arc;

/// A logical arrangement of one client's devices as a grid with named axes
/// (`[("dp", 2), ("tp", 2)]`). Device `i` of the mesh (row-major over the
/// axes, the last axis fastest) is partition `i` of every SPMD program
/// compiled for it. Cheap to clone; two meshes are equal when they have the
/// same client, axes and devices.
#[derive(Clone)]
pub struct Mesh(Arc<MeshParts>);

#[derive(PartialEq, Eq, Hash)]
struct MeshParts {
    /// The runtime id of the client whose devices these are.
    client: u32,
    axes: Vec<(String, usize)>,
    /// Addressable device ordinal of each mesh position.
    devices: Vec<usize>,
}

/// What a [`Mesh`] is laid over: one client's devices. [`crate::Device`]
/// implements it; a trait, so the mesh code names no device type (the
/// device layer sits above this one).
pub trait MeshDevices: fmt::Debug {
    /// The client's runtime id and its number of addressable devices, or
    /// why it runs no SPMD programs.
    fn mesh_devices(&self) -> Result<(u32, usize), String>;
}

impl Mesh {
    /// A mesh with named axes over the devices of `device`'s client, in
    /// order: `&[("dp", 4)]`, or `&[("dp", 2), ("tp", 2)]` (row-major, the
    /// last axis fastest). `Err` for a mesh larger than the client (see
    /// `Device::cpu_with_devices`), an axis named twice or of size 0, or
    /// the interpreter device (it has no SPMD programs).
    #[track_caller]
    pub fn new(device: &impl MeshDevices, axes: &[(&str, usize)]) -> crate::Result<Mesh> {
        let at = crate::site::caller();
        let fail = |m: String| crate::Error::op("Mesh::new", m, format!("{device:?}"), at);
        let (client, available) = device.mesh_devices().map_err(fail)?;
        Mesh::build(client, available, axes).map_err(fail)
    }

    /// A mesh of `axes` over the first devices of a client (`client` its
    /// runtime id) that has `available` devices. `Err` (a message for the
    /// caller's error) for an empty, unnamed
    /// or repeated axis, an axis of size 0, or more devices than the client
    /// has.
    pub(crate) fn build(
        client: u32,
        available: usize,
        axes: &[(&str, usize)],
    ) -> Result<Mesh, String> {
        if axes.is_empty() {
            return Err("a mesh needs at least one axis".to_string());
        }
        for (i, &(name, size)) in axes.iter().enumerate() {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!(
                    "mesh axis name {name:?} must be non-empty letters, digits or '_'"
                ));
            }
            if size == 0 {
                return Err(format!("mesh axis {name:?} has size 0"));
            }
            if axes[..i].iter().any(|&(n, _)| n == name) {
                return Err(format!("mesh axis {name:?} is named twice"));
            }
        }
        let n: usize = axes.iter().map(|&(_, s)| s).product();
        if n > available {
            return Err(format!(
                "a mesh of {n} devices ({}) is larger than its client, which has {available}; \
                 create the client with Device::cpu_with_devices({n})",
                describe(axes.iter().map(|&(a, s)| (a, s)))
            ));
        }
        Ok(Mesh(Arc::new(MeshParts {
            client,
            axes: axes.iter().map(|&(a, s)| (a.to_string(), s)).collect(),
            devices: (0..n).collect(),
        })))
    }

    /// The axes, in order, with their sizes.
    pub fn axes(&self) -> impl Iterator<Item = (&str, usize)> {
        self.0.axes.iter().map(|(a, s)| (a.as_str(), *s))
    }

    /// Number of devices.
    pub fn size(&self) -> usize {
        self.0.devices.len()
    }

    /// The addressable device ordinal of each mesh position.
    pub fn devices(&self) -> &[usize] {
        &self.0.devices
    }

    /// The runtime id of the mesh's client.
    pub(crate) fn client(&self) -> u32 {
        self.0.client
    }

    /// The index of axis `name`, or an `Err` naming the mesh's axes.
    pub(crate) fn axis(&self, name: &str) -> Result<usize, String> {
        self.0
            .axes
            .iter()
            .position(|(a, _)| a == name)
            .ok_or_else(|| format!("the mesh has no axis {name:?} (it has {self})"))
    }

    /// Size of axis `a`.
    pub(crate) fn axis_size(&self, a: usize) -> usize {
        self.0.axes[a].1
    }

    /// The coordinate along axis `a` of mesh position `p`.
    fn coordinate(&self, p: usize, a: usize) -> usize {
        let inner: usize = self.0.axes[a + 1..].iter().map(|(_, s)| s).product();
        (p / inner) % self.0.axes[a].1
    }

    /// A stable 64-bit description for compile keys.
    pub(crate) fn key(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = lazyfuse_ir::stable_hasher();
        self.0.axes.hash(&mut h);
        self.0.devices.hash(&mut h);
        h.finish()
    }
}

fn describe<'a>(axes: impl Iterator<Item = (&'a str, usize)>) -> String {
    axes.map(|(a, s)| format!("{a}={s}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl PartialEq for Mesh {
    fn eq(&self, other: &Mesh) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}
impl Eq for Mesh {}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}]", describe(self.axes()))
    }
}

impl fmt::Debug for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mesh{self}")
    }
}

/// How a tensor is laid out over a mesh: per tensor dimension, the mesh
/// axis it is split over, or none. Mesh axes no dimension names are
/// replicated: every device along them holds the same shard.
#[derive(Clone, PartialEq, Eq)]
pub struct Sharding {
    mesh: Mesh,
    /// Per dimension, the index of its mesh axis.
    dims: Vec<Option<usize>>,
}

impl Sharding {
    /// The sharding of a tensor of `shape` split as `spec` says (one entry
    /// per dimension: a mesh axis name, or `None`). `Err` for a spec of the
    /// wrong length, an unknown axis, an axis used twice, or a dimension
    /// the axis size does not divide.
    pub(crate) fn new(
        mesh: &Mesh,
        shape: &Shape,
        spec: &[Option<&str>],
    ) -> Result<Sharding, String> {
        if spec.len() != shape.rank() {
            return Err(format!(
                "a sharding spec needs one entry per dimension: {} given for shape {shape}",
                spec.len()
            ));
        }
        let mut dims = Vec::with_capacity(spec.len());
        for (d, s) in spec.iter().enumerate() {
            let Some(name) = s else {
                dims.push(None);
                continue;
            };
            let a = mesh.axis(name)?;
            if dims.contains(&Some(a)) {
                return Err(format!(
                    "mesh axis {name:?} splits two dimensions of one tensor"
                ));
            }
            let (n, size) = (shape.dims()[d], mesh.axis_size(a));
            if n % size != 0 {
                return Err(format!(
                    "dimension {d} of shape {shape} ({n}) does not divide over mesh axis \
                     {name:?} of size {size}"
                ));
            }
            dims.push(Some(a));
        }
        Ok(Sharding {
            mesh: mesh.clone(),
            dims,
        })
    }

    /// Every device holds the whole tensor of rank `rank`.
    pub(crate) fn replicated(mesh: &Mesh, rank: usize) -> Sharding {
        Sharding {
            mesh: mesh.clone(),
            dims: vec![None; rank],
        }
    }

    /// A sharding from per-dimension axis indices (the propagation's
    /// result), `None` where a dimension is not split.
    pub(crate) fn from_axes(mesh: &Mesh, dims: Vec<Option<usize>>) -> Sharding {
        Sharding {
            mesh: mesh.clone(),
            dims,
        }
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// Per dimension, the mesh axis it is split over.
    pub fn spec(&self) -> Vec<Option<&str>> {
        self.dims
            .iter()
            .map(|a| a.map(|a| self.mesh.0.axes[a].0.as_str()))
            .collect()
    }

    /// Per dimension, the index of its mesh axis.
    pub(crate) fn axes(&self) -> &[Option<usize>] {
        &self.dims
    }

    /// True when no dimension is split.
    pub fn is_replicated(&self) -> bool {
        self.dims.iter().all(Option::is_none)
    }

    /// The shape of one shard of a tensor of (global) shape `global`.
    pub fn shard_shape(&self, global: &Shape) -> Shape {
        let dims: Vec<usize> = global
            .dims()
            .iter()
            .zip(&self.dims)
            .map(|(&n, a)| a.map_or(n, |a| n / self.mesh.axis_size(a)))
            .collect();
        Shape::new(&dims)
    }

    /// The offset, per dimension, of the shard on mesh position `p` in a
    /// tensor of shape `global`.
    pub fn shard_offset(&self, global: &Shape, p: usize) -> Vec<usize> {
        let local = self.shard_shape(global);
        self.dims
            .iter()
            .zip(local.dims())
            .map(|(a, &n)| a.map_or(0, |a| self.mesh.coordinate(p, a) * n))
            .collect()
    }

    /// A stable 64-bit description for compile keys.
    pub(crate) fn key(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = lazyfuse_ir::stable_hasher();
        self.mesh.key().hash(&mut h);
        self.dims.hash(&mut h);
        h.finish()
    }
}

impl fmt::Debug for Sharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spec: Vec<&str> = self.spec().iter().map(|a| a.unwrap_or("-")).collect();
        write!(f, "Sharding({} over {})", spec.join(", "), self.mesh)
    }
}
