//! The PJRT backend: XLA through a plugin's C API, the `lazyfuse-xla`
//! crate driven through the [`Backend`] seam (cargo feature `xla`).
//! Compiling a region means lowering it to StableHLO, trying the persistent
//! cache (`LAZYFUSE_CACHE_DIR`), then asking the plugin's compiler;
//! executing means enqueueing on the plugin's device stream and returning
//! its completion event. SPMD layouts are handed to the lowering as Shardy
//! specs (mesh axes, one axis name or none per dimension).

use super::{foreign, Backend, Completion, HostSlice, RawBuffer, RawExecutable};
use crate::metrics::{self, COUNTERS as C};
use crate::spmd::{constraint_axes, Mesh, Sharding, SpmdLayout};
use crate::Result;
use lazyfuse_fusion::{Region, RegionKey};
use lazyfuse_ir::{DType, Graph, Shape};
use lazyfuse_xla::lower::{self, ShardSpec, SpmdLowering};
use lazyfuse_xla::{pjrt, plugin};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How a client is made: what `PJRT_Client_Create` is given and what
/// is added to lazyfuse's compile options. Empty for the CPU plugin.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ClientSetup {
    /// Create options, typed as the plugin reads them.
    pub create: Vec<pjrt::CreateOption>,
    /// Debug options set for every compile on this client.
    pub compile: Vec<pjrt::CompileOverride>,
    /// The process's place in a multi-process run, whose store the plugin
    /// is given (`None`: one process).
    pub distributed: Option<plugin::Distributed>,
}

/// Stack of the thread an XLA compile runs on. XLA's fusion emitter
/// recurses once per op along a chain of fused elementwise ops, so a long
/// chain (two integer `pow`s, each a square-and-multiply ladder, feeding
/// more ops) overflowed the 2 MiB of a spawned thread and aborted the
/// process (`fuzz_campaign` seed 1000, program 3463). Reserved, not
/// committed: only the pages a compile touches are used.
const COMPILE_STACK: usize = 256 << 20;

/// `client.compile(text)` on a thread of its own with [`COMPILE_STACK`]:
/// compiles run on executor threads, or on the caller's with
/// `LAZYFUSE_LAUNCH_BLOCKING=1`, whose stacks lazyfuse does not choose.
fn compile_on_big_stack(client: &pjrt::Client, text: &str) -> Result<pjrt::LoadedExecutable> {
    on_big_stack(|| client.compile(text))
}

/// Runs the compile `f` on a thread with [`COMPILE_STACK`].
fn on_big_stack(
    f: impl FnOnce() -> pjrt::Result<pjrt::LoadedExecutable> + Send,
) -> Result<pjrt::LoadedExecutable> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("lazyfuse-compile".into())
            .stack_size(COMPILE_STACK)
            .spawn_scoped(s, f)
            .map_err(|e| crate::Error::internal(format!("spawning a compile thread: {e}")))?
            .join()
            .map_err(|_| crate::Error::internal("the compile thread panicked"))?
            .map_err(crate::Error::from)
    })
}

/// One loaded plugin's client.
pub(crate) struct PjrtBackend {
    client: pjrt::Client,
    plugin_path: PathBuf,
}

impl PjrtBackend {
    /// Loads the plugin at `path` and creates its client with `options`
    /// (create options and compile-option additions; see [`ClientSetup`]).
    pub(crate) fn load(path: &Path, setup: &ClientSetup) -> Result<PjrtBackend> {
        quiet_xla_info_logs();
        let plugin = pjrt::Plugin::load(path).map_err(|e| {
            crate::Error::Plugin(format!(
                "cannot load {}: {e}. Set LAZYFUSE_PJRT_PLUGIN=/path/to/a/pjrt_plugin.so, or unset it to use the provisioned CPU plugin",
                path.display()
            ))
        })?;
        let store = setup.distributed.as_ref().map(|d| d.store.clone());
        let client = pjrt::Client::with_store(plugin, &setup.create, &setup.compile, store)
            .map_err(|e| {
                crate::Error::Plugin(format!(
                    "cannot create a client from {}: {e}",
                    path.display()
                ))
            })?;
        Ok(PjrtBackend {
            client,
            plugin_path: path.to_path_buf(),
        })
    }
}

/// Sets XLA's log threshold to warnings (`TF_CPP_MIN_LOG_LEVEL=1`) unless
/// the user chose one, before the first plugin loads: XLA logs a line at
/// info level for every SPMD compile ("Using Shardy for XLA SPMD
/// propagation") and others a user did not ask for; warnings and errors
/// still show. Once per process, before the plugin's first log reads it.
fn quiet_xla_info_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os(lazyfuse_xla::env::XLA_LOG_LEVEL).is_none() {
            std::env::set_var(lazyfuse_xla::env::XLA_LOG_LEVEL, "1");
        }
    });
}

impl PjrtBackend {
    /// The SPMD executable of `text` over `devices`. The key covers the
    /// mesh and its devices, so the SPMD options (a device assignment) are
    /// determined by it and the text.
    fn spmd_text(
        &self,
        key: RegionKey,
        text: &str,
        devices: &[usize],
        on_compile: &mut dyn FnMut(),
    ) -> Result<RawExecutable> {
        let exe = self.load_or_compile(key, text, on_compile, devices, || {
            on_big_stack(|| self.client.compile_spmd(text, devices))
        })?;
        Ok(RawExecutable::Pjrt(exe))
    }

    /// The executable of `text` (key `key`): from the persistent cache
    /// (given back its SPMD `devices`, if any), else from `compile`, timed,
    /// counted and stored; `on_compile` runs just before compiling.
    fn load_or_compile(
        &self,
        key: RegionKey,
        text: &str,
        on_compile: &mut dyn FnMut(),
        devices: &[usize],
        compile: impl FnOnce() -> Result<pjrt::LoadedExecutable>,
    ) -> Result<pjrt::LoadedExecutable> {
        crate::dump::region_text(key, text);
        if text.contains(lower::HOST_TARGET) {
            self.client.enable_host_kernels()?;
        }
        let t0 = Instant::now();
        if let Some(mut exe) = crate::persist::load(&self.client, &self.plugin_path, key, text) {
            if !devices.is_empty() {
                exe.set_devices(devices.to_vec());
            }
            metrics::observe_since(metrics::Phase::DiskCacheLoad, t0);
            return Ok(exe);
        }
        on_compile();
        let _span = tracing::debug_span!("compile", region = %key, bytes = text.len()).entered();
        let t0 = Instant::now();
        let result = compile();
        metrics::add(&C.compile_ns, t0.elapsed().as_nanos() as u64);
        metrics::observe_since(metrics::Phase::Compile, t0);
        let exe = result?;
        metrics::add(&C.compiles, 1);
        crate::persist::store(&self.client, &self.plugin_path, key, text, &exe);
        Ok(exe)
    }
}

impl Backend for PjrtBackend {
    fn platform_name(&self) -> String {
        self.client
            .platform_name()
            .unwrap_or_else(|_| "unknown".into())
    }

    fn device_count(&self) -> usize {
        self.client.addressable_device_count()
    }

    fn upload(&self, host: HostSlice<'_>, ordinal: usize) -> Result<RawBuffer> {
        let buf =
            self.client
                .buffer_from_host(host.bytes, host.dtype, host.shape.dims(), ordinal)?;
        Ok(RawBuffer::Pjrt(buf))
    }

    fn download(&self, buf: &RawBuffer, out: &mut [u8]) -> Result<bool> {
        match buf {
            RawBuffer::Pjrt(b) => Ok(b.to_host(out)? == pjrt::HostCopy::InPlace),
            RawBuffer::Host(_) => Err(foreign("buffer")),
        }
    }

    fn host_bytes<'a>(&self, buf: &'a RawBuffer, rank: usize) -> Result<Option<&'a [u8]>> {
        match buf {
            RawBuffer::Pjrt(b) => Ok(b.host_bytes(rank)?),
            RawBuffer::Host(_) => Err(foreign("buffer")),
        }
    }

    fn compile(
        &self,
        key: RegionKey,
        graph: &Graph,
        region: &Region,
        on_compile: &mut dyn FnMut(),
    ) -> Result<RawExecutable> {
        let sabotage = crate::testing::compile_fault_op();
        let options = lower::Options {
            spmd: None,
            sabotage: sabotage.as_deref(),
        };
        let text = lower::lower_region_with(graph, region, &options);
        let exe = self.load_or_compile(key, &text, on_compile, &[], || {
            compile_on_big_stack(&self.client, &text)
        })?;
        Ok(RawExecutable::Pjrt(exe))
    }

    fn execute(
        &self,
        exe: &RawExecutable,
        args: &[&RawBuffer],
        donate: &[usize],
        ordinal: usize,
        _outputs: &[(Shape, DType)],
    ) -> Result<(Vec<RawBuffer>, Completion)> {
        let RawExecutable::Pjrt(exe) = exe else {
            return Err(foreign("executable"));
        };
        let mut raw: smallvec::SmallVec<[&pjrt::Buffer; 8]> = smallvec::SmallVec::new();
        for a in args {
            match a {
                RawBuffer::Pjrt(b) => raw.push(b),
                RawBuffer::Host(_) => return Err(foreign("argument")),
            }
        }
        let (outs, done) = exe.launch(&raw, ordinal, donate)?;
        Ok((
            outs.into_iter().map(RawBuffer::Pjrt).collect(),
            Completion::Pjrt(done),
        ))
    }

    fn wait(&self, done: Completion, poll: std::time::Duration) -> Result<()> {
        match done {
            Completion::Pjrt(c) => Ok(c.wait_polling(poll)?),
            Completion::PjrtAll(all) => {
                // Await every device before reporting the first error.
                let results: Vec<pjrt::Result<()>> =
                    all.into_iter().map(|c| c.wait_polling(poll)).collect();
                results.into_iter().collect::<pjrt::Result<()>>()?;
                Ok(())
            }
            Completion::Done => Ok(()),
        }
    }

    fn compile_spmd(
        &self,
        key: RegionKey,
        graph: &Graph,
        region: &Region,
        layout: &SpmdLayout,
        on_compile: &mut dyn FnMut(),
    ) -> Result<RawExecutable> {
        let spmd = spmd_lowering(graph, region, layout);
        let sabotage = crate::testing::compile_fault_op();
        let options = lower::Options {
            spmd: Some(&spmd),
            sabotage: sabotage.as_deref(),
        };
        let text = lower::lower_region_with(graph, region, &options);
        self.spmd_text(key, &text, layout.mesh.devices(), on_compile)
    }

    fn compile_reshard(
        &self,
        key: RegionKey,
        shape: &Shape,
        dtype: DType,
        from: &Sharding,
        to: &Sharding,
    ) -> Result<RawExecutable> {
        let mesh = to.mesh();
        let text = lower::reshard_module(
            shape,
            dtype,
            mesh.size(),
            &mesh_axes(mesh),
            &spec(from),
            &spec(to),
        );
        self.spmd_text(key, &text, mesh.devices(), &mut || {})
    }

    fn execute_spmd(
        &self,
        exe: &RawExecutable,
        args: &[Vec<&RawBuffer>],
        donate: &[usize],
    ) -> Result<(Vec<Vec<RawBuffer>>, Completion)> {
        let RawExecutable::Pjrt(exe) = exe else {
            return Err(foreign("executable"));
        };
        let lists = args
            .iter()
            .map(|l| {
                l.iter()
                    .map(|a| match a {
                        RawBuffer::Pjrt(b) => Ok(b),
                        RawBuffer::Host(_) => Err(foreign("argument")),
                    })
                    .collect::<Result<Vec<&pjrt::Buffer>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let (outs, done) = exe.launch_spmd(&lists, donate)?;
        metrics::add(&C.spmd_launches, 1);
        for c in exe.collectives() {
            metrics::add(&C.collectives, 1);
            metrics::add(&C.collective_bytes, c.bytes);
        }
        let outs = outs
            .into_iter()
            .map(|l| l.into_iter().map(RawBuffer::Pjrt).collect())
            .collect();
        Ok((outs, Completion::PjrtAll(done)))
    }
}

/// `sharding` as the lowering spells it: one mesh axis name (or none) per
/// dimension.
fn spec(sharding: &Sharding) -> ShardSpec {
    sharding
        .spec()
        .into_iter()
        .map(|a| a.map(str::to_string))
        .collect()
}

/// The axes of `mesh` with their sizes, in order.
fn mesh_axes(mesh: &Mesh) -> Vec<(String, usize)> {
    mesh.axes().map(|(a, s)| (a.to_string(), s)).collect()
}

/// `layout` for the lowering: the mesh, the shardings of parameters and
/// results, and the split each sharding constraint of `region` keeps
/// (propagation decides it; the lowering only spells it).
fn spmd_lowering(graph: &Graph, region: &Region, layout: &SpmdLayout) -> SpmdLowering {
    let mesh = &layout.mesh;
    let constraints = region
        .nodes
        .iter()
        .filter_map(|&id| {
            let node = graph.node(id);
            let lazyfuse_ir::Op::ShardingConstraint(split) = &node.op else {
                return None;
            };
            let axes = constraint_axes(split, &node.shape, mesh);
            Some((id, spec(&Sharding::from_axes(mesh, axes))))
        })
        .collect();
    SpmdLowering {
        partitions: mesh.size(),
        mesh_axes: mesh_axes(mesh),
        params: layout.params.iter().map(spec).collect(),
        outputs: layout.outputs.iter().map(spec).collect(),
        aliases: layout.aliases.clone(),
        constraints,
    }
}
