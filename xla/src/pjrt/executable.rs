//! Compiled programs: execution on one device and serialization.

use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::api::Event;
use super::buffer::Buffer;
use super::error::{Error, Result};
use super::inner::ClientInner;
use super::sys;
use super::PjrtStruct;

/// A compiled program loaded on a client, ready to execute.
///
/// Owns the `PJRT_LoadedExecutable` and the `PJRT_Executable` view obtained
/// from it (used for metadata and serialization); both are destroyed on drop.
/// `Send + Sync`: PJRT executables may be launched concurrently from several
/// threads.
pub struct LoadedExecutable {
    client: Arc<ClientInner>,
    raw: NonNull<sys::PJRT_LoadedExecutable>,
    /// From `PJRT_LoadedExecutable_GetExecutable`; null only while constructing.
    exec: *mut sys::PJRT_Executable,
    num_outputs: usize,
    /// The bytes this executable was deserialized from, if it was. Returned by
    /// [`LoadedExecutable::serialize`] because the XLA CPU plugin re-serializes
    /// a deserialized executable without its machine code (see there).
    source: Option<Vec<u8>>,
    /// For an SPMD executable, the addressable device of each partition
    /// ([`super::Client::compile_spmd`]); empty for a one-device program.
    devices: Vec<usize>,
    /// The collective ops of the optimized program, read on first ask.
    collectives: std::sync::OnceLock<Vec<super::hlo::Collective>>,
    /// Nanoseconds from launch to observed completion of the latest awaited
    /// run (0 before the first): whether a wait polls (see
    /// [`Completion::wait_polling`]).
    last_run_ns: Arc<AtomicU64>,
}

// SAFETY: PJRT executables are thread-safe: concurrent `Execute` calls and
// metadata queries are allowed; destruction happens once, through the owner.
unsafe impl Send for LoadedExecutable {}
// SAFETY: as above.
unsafe impl Sync for LoadedExecutable {}

impl std::fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedExecutable")
            .field("num_outputs", &self.num_outputs)
            .finish_non_exhaustive()
    }
}

impl LoadedExecutable {
    /// Takes ownership of a loaded executable the plugin returned (from
    /// compile or deserialize) and caches its metadata.
    pub(crate) fn from_raw(
        client: Arc<ClientInner>,
        raw: *mut sys::PJRT_LoadedExecutable,
        what: &str,
    ) -> Result<LoadedExecutable> {
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::binding(format!(
                "{what}: plugin returned no executable and no error"
            ))
        })?;
        // Owned from here: Drop cleans up if anything below fails.
        let mut exe = LoadedExecutable {
            client,
            raw,
            exec: ptr::null_mut(),
            num_outputs: 0,
            source: None,
            devices: Vec::new(),
            collectives: std::sync::OnceLock::new(),
            last_run_ns: Arc::new(AtomicU64::new(0)),
        };
        let plugin = &*exe.client.plugin;

        let mut g = sys::PJRT_LoadedExecutable_GetExecutable_Args::new();
        g.loaded_executable = raw.as_ptr();
        pjrt_call!(plugin, PJRT_LoadedExecutable_GetExecutable, &mut g)?;
        exe.exec = g.executable;
        if exe.exec.is_null() {
            return Err(Error::binding(
                "PJRT_LoadedExecutable_GetExecutable: plugin returned no executable and no error",
            ));
        }

        let mut n = sys::PJRT_Executable_NumOutputs_Args::new();
        n.executable = exe.exec;
        pjrt_call!(plugin, PJRT_Executable_NumOutputs, &mut n)?;
        exe.num_outputs = n.num_outputs;
        Ok(exe)
    }

    /// Number of results one execution returns (a `func.return` of N values
    /// gives N separate buffers; they are not packed into a tuple).
    pub fn num_outputs(&self) -> Result<usize> {
        Ok(self.num_outputs)
    }

    /// Runs the program once on addressable device `device` with `args` as
    /// its parameters, waits for completion, and returns the results.
    ///
    /// Every argument must come from this executable's client and live on
    /// `device`. Arguments are never donated, so they stay valid. Errors
    /// (`Err`, never a crash): bad device index, foreign buffers, wrong
    /// argument count, an argument on another device or with a different byte
    /// size than the parameter, and failures during execution.
    ///
    /// Not checked: the XLA CPU plugin compares only byte sizes, so an
    /// argument with the same byte size but a different dtype or dims (e.g.
    /// `i32[2,3]` or `f32[3,2]` for an `f32[2,3]` parameter) runs and
    /// reinterprets the bytes. Callers must pass what they compiled for.
    pub fn execute(&self, args: &[&Buffer], device: usize) -> Result<Vec<Buffer>> {
        let (outs, done) = self.launch(args, device, &[])?;
        // The arguments (borrowed for this whole call) stay alive until the
        // execution has completed.
        done.wait()?;
        Ok(outs)
    }

    /// Enqueues one execution like [`LoadedExecutable::execute`] but returns
    /// at once, with the result buffers and the execution's completion. The
    /// results may be used as arguments of further executions right away
    /// (the plugin orders them). The caller must keep every argument alive
    /// until the completion is awaited or dropped after being awaited;
    /// execution errors surface from [`Completion::wait`] (or when a result
    /// is read).
    ///
    /// `donate` lists argument positions whose device memory XLA may reuse
    /// for an output the executable aliases to it (`tf.aliasing_output`).
    /// A donated buffer is invalid afterwards: the caller must hold the only
    /// handle to it and never use it again except to drop it.
    pub fn launch(
        &self,
        args: &[&Buffer],
        device: usize,
        donate: &[usize],
    ) -> Result<(Vec<Buffer>, Completion)> {
        const WHAT: &str = "PJRT_LoadedExecutable_Execute";
        let dev = self.client.device(device, WHAT)?;
        for (i, b) in args.iter().enumerate() {
            if !Arc::ptr_eq(&b.client, &self.client) {
                return Err(Error::binding(format!(
                    "{WHAT}: argument {i} belongs to a different client"
                )));
            }
        }
        let plugin = &*self.client.plugin;

        // One device: argument_lists[0] = args, output_lists[0] = outputs.
        let arg_ptrs: Vec<*mut sys::PJRT_Buffer> = args.iter().map(|b| b.raw.as_ptr()).collect();
        let arg_lists: [*const *mut sys::PJRT_Buffer; 1] = [arg_ptrs.as_ptr()];
        let mut outs: Vec<*mut sys::PJRT_Buffer> = vec![ptr::null_mut(); self.num_outputs];
        let out_lists: [*mut *mut sys::PJRT_Buffer; 1] = [outs.as_mut_ptr()];
        let mut complete: [*mut sys::PJRT_Event; 1] = [ptr::null_mut()];

        let non_donatable = non_donatable(args.len(), donate);
        let mut options = execute_options(&non_donatable);

        let mut a = sys::PJRT_LoadedExecutable_Execute_Args::new();
        a.executable = self.raw.as_ptr();
        a.options = &mut options;
        a.argument_lists = arg_lists.as_ptr();
        a.num_devices = 1;
        a.num_args = args.len();
        a.output_lists = out_lists.as_ptr();
        a.device_complete_events = complete.as_mut_ptr();
        a.execute_device = dev;
        let r = pjrt_call!(plugin, PJRT_LoadedExecutable_Execute, &mut a);

        // Own everything the plugin may have produced before looking at `r`.
        let done = Completion {
            client: Arc::clone(&self.client),
            raw: complete[0],
            launched: Instant::now(),
            last_run_ns: Arc::clone(&self.last_run_ns),
        };
        let produced: Vec<Option<Buffer>> = outs
            .iter()
            .map(|&p| NonNull::new(p).map(|p| Buffer::from_raw(Arc::clone(&self.client), p)))
            .collect();
        if let Err(e) = r {
            // Nothing may still use the arguments once we return an error.
            let _ = done.wait();
            return Err(e);
        }
        let outs = produced
            .into_iter()
            .enumerate()
            .map(|(i, b)| {
                b.ok_or_else(|| {
                    Error::binding(format!("{WHAT}: plugin returned no buffer for output {i}"))
                })
            })
            .collect::<Result<Vec<Buffer>>>();
        match outs {
            Ok(o) => Ok((o, done)),
            Err(e) => {
                let _ = done.wait();
                Err(e)
            }
        }
    }

    /// Runs an SPMD executable once on all its devices: `args[i]` is the
    /// argument list (the per-device shards) of partition `i`, which runs
    /// on the `i`-th device given to [`super::Client::compile_spmd`].
    /// Returns each partition's results and the completion of each device's
    /// execution; the arguments must stay alive until all are awaited.
    /// `donate` as in [`LoadedExecutable::launch`], for every partition.
    pub fn launch_spmd(
        &self,
        args: &[Vec<&Buffer>],
        donate: &[usize],
    ) -> Result<(Vec<Vec<Buffer>>, Vec<Completion>)> {
        let num_args = self.check_spmd_args(args)?;
        let plugin = &*self.client.plugin;
        let n = args.len();
        let arg_ptrs: Vec<Vec<*mut sys::PJRT_Buffer>> = args
            .iter()
            .map(|l| l.iter().map(|b| b.raw.as_ptr()).collect())
            .collect();
        let arg_lists: Vec<*const *mut sys::PJRT_Buffer> =
            arg_ptrs.iter().map(|l| l.as_ptr()).collect();
        let mut outs: Vec<Vec<*mut sys::PJRT_Buffer>> =
            vec![vec![ptr::null_mut(); self.num_outputs]; n];
        let out_lists: Vec<*mut *mut sys::PJRT_Buffer> =
            outs.iter_mut().map(|l| l.as_mut_ptr()).collect();
        let mut complete: Vec<*mut sys::PJRT_Event> = vec![ptr::null_mut(); n];
        let non_donatable = non_donatable(num_args, donate);
        let mut options = execute_options(&non_donatable);

        let mut a = sys::PJRT_LoadedExecutable_Execute_Args::new();
        a.executable = self.raw.as_ptr();
        a.options = &mut options;
        a.argument_lists = arg_lists.as_ptr();
        a.num_devices = n;
        a.num_args = num_args;
        a.output_lists = out_lists.as_ptr();
        a.device_complete_events = complete.as_mut_ptr();
        a.execute_device = ptr::null_mut();
        let r = pjrt_call!(plugin, PJRT_LoadedExecutable_Execute, &mut a);
        self.take_spmd_results(r, &complete, &outs)
    }

    /// Checks [`LoadedExecutable::launch_spmd`]'s `args` before the plugin
    /// sees them, so a mismatch is an `Err`: one argument list per
    /// partition, all of one length, every buffer from this executable's
    /// client. Returns the number of arguments per partition.
    fn check_spmd_args(&self, args: &[Vec<&Buffer>]) -> Result<usize> {
        const WHAT: &str = "PJRT_LoadedExecutable_Execute";
        if self.devices.is_empty() || args.len() != self.devices.len() {
            return Err(Error::binding(format!(
                "{WHAT}: {} argument lists for an executable of {} partitions",
                args.len(),
                self.devices.len()
            )));
        }
        let num_args = args[0].len();
        for (p, list) in args.iter().enumerate() {
            if list.len() != num_args {
                return Err(Error::binding(format!(
                    "{WHAT}: partition {p} has {} arguments, partition 0 has {num_args}",
                    list.len()
                )));
            }
            if let Some(i) = list
                .iter()
                .position(|b| !Arc::ptr_eq(&b.client, &self.client))
            {
                return Err(Error::binding(format!(
                    "{WHAT}: argument {i} of partition {p} belongs to a different client"
                )));
            }
        }
        Ok(num_args)
    }

    /// Takes ownership of what one SPMD execute call (result `r`) produced:
    /// each device's completion event in `complete` and each partition's
    /// result buffers in `outs`. Owned before `r` is looked at, so nothing
    /// leaks on failure; when the call failed or a result is missing, every
    /// execution is awaited before the error returns, since the caller may
    /// then free the arguments.
    fn take_spmd_results(
        &self,
        r: Result<()>,
        complete: &[*mut sys::PJRT_Event],
        outs: &[Vec<*mut sys::PJRT_Buffer>],
    ) -> Result<(Vec<Vec<Buffer>>, Vec<Completion>)> {
        const WHAT: &str = "PJRT_LoadedExecutable_Execute";
        let done: Vec<Completion> = complete
            .iter()
            .map(|&raw| Completion {
                client: Arc::clone(&self.client),
                raw,
                launched: Instant::now(),
                last_run_ns: Arc::clone(&self.last_run_ns),
            })
            .collect();
        let produced: Vec<Vec<Option<Buffer>>> = outs
            .iter()
            .map(|l| {
                l.iter()
                    .map(|&p| {
                        NonNull::new(p).map(|p| Buffer::from_raw(Arc::clone(&self.client), p))
                    })
                    .collect()
            })
            .collect();
        let wait_all = |done: Vec<Completion>| {
            for d in done {
                let _ = d.wait();
            }
        };
        if let Err(e) = r {
            wait_all(done);
            return Err(e);
        }
        let mut results = Vec::with_capacity(outs.len());
        for (p, list) in produced.into_iter().enumerate() {
            let list = list.into_iter().enumerate().map(|(i, b)| {
                b.ok_or_else(|| {
                    Error::binding(format!(
                        "{WHAT}: plugin returned no buffer for output {i} of partition {p}"
                    ))
                })
            });
            match list.collect::<Result<Vec<Buffer>>>() {
                Ok(l) => results.push(l),
                Err(e) => {
                    wait_all(done);
                    return Err(e);
                }
            }
        }
        Ok((results, done))
    }

    /// The optimized program XLA compiled (after SPMD partitioning: what
    /// each device runs), serialized, with its format (`hlo`: an
    /// `HloModuleProto`).
    pub fn optimized_program(&self) -> Result<(String, Vec<u8>)> {
        const WHAT: &str = "PJRT_Executable_OptimizedProgram";
        let plugin = &*self.client.plugin;
        let mut program = sys::PJRT_Program::new();
        let mut a = sys::PJRT_Executable_OptimizedProgram_Args::new();
        a.executable = self.exec;
        a.program = &mut program;
        // First call: the plugin reports the size (code is null).
        pjrt_call!(plugin, PJRT_Executable_OptimizedProgram, &mut a)?;
        let mut code = vec![0u8; program.code_size];
        program.code = code.as_mut_ptr().cast();
        let mut a = sys::PJRT_Executable_OptimizedProgram_Args::new();
        a.executable = self.exec;
        a.program = &mut program;
        pjrt_call!(plugin, PJRT_Executable_OptimizedProgram, &mut a)?;
        if program.code_size > code.len() {
            return Err(Error::binding(format!(
                "{WHAT}: the program grew between calls"
            )));
        }
        code.truncate(program.code_size);
        // SAFETY: the format string is owned by the plugin and valid for
        // `format_size` bytes while the executable lives.
        let format = unsafe { super::api::plugin_string(program.format, program.format_size) };
        Ok((format, code))
    }

    /// The opcode of every instruction of the optimized program (fused
    /// computations included), so a test can see what XLA made of a
    /// program: for example, whether it copies a donated input.
    pub fn optimized_opcodes(&self) -> Result<Vec<String>> {
        let (format, bytes) = self.optimized_program()?;
        super::hlo::opcodes(&bytes, &format).ok_or_else(|| {
            Error::binding(format!("the optimized program ({format}) does not decode"))
        })
    }

    /// The collective ops (all-reduce, all-gather, reduce-scatter, ...) one
    /// device runs per execution of this program, with their bytes; empty
    /// when the optimized program cannot be read.
    pub fn collectives(&self) -> &[super::hlo::Collective] {
        self.collectives.get_or_init(|| {
            self.optimized_program()
                .ok()
                .and_then(|(format, bytes)| super::hlo::collectives(&bytes, &format))
                .unwrap_or_default()
        })
    }

    /// Marks this executable as an SPMD program over `devices` (also one
    /// loaded from the persistent cache: the serialized form keeps its
    /// device assignment, not this list).
    pub fn set_devices(&mut self, devices: Vec<usize>) {
        self.devices = devices;
    }

    /// The addressable device of each partition of an SPMD executable
    /// (empty for a one-device program).
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// Records the serialized form this executable was loaded from.
    pub(crate) fn set_source(&mut self, bytes: &[u8]) {
        self.source = Some(bytes.to_vec());
    }

    /// Serializes the compiled program so it can be cached and loaded later
    /// with [`super::Client::deserialize_executable`], skipping compilation.
    ///
    /// The bytes are only valid for the same plugin build, and (for the CPU
    /// plugin) contain machine code for the host CPU's features, so a cache of
    /// them must not be shared between different machines.
    ///
    /// For an executable that was itself deserialized, this returns the bytes
    /// it was loaded from: the XLA CPU plugin (0.0.1) re-serializes such an
    /// executable without its object code, producing bytes that load but fail
    /// at execution with `NOT_FOUND: Function ... not found`.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        if let Some(source) = &self.source {
            return Ok(source.clone());
        }
        let mut a = sys::PJRT_Executable_Serialize_Args::new();
        a.executable = self.exec;
        pjrt_call!(&*self.client.plugin, PJRT_Executable_Serialize, &mut a)?;
        let bytes = if a.serialized_bytes.is_null() {
            Vec::new()
        } else {
            // SAFETY: valid for `serialized_bytes_size` bytes until the deleter runs.
            unsafe {
                std::slice::from_raw_parts(a.serialized_bytes.cast::<u8>(), a.serialized_bytes_size)
            }
            .to_vec()
        };
        if let Some(deleter) = a.serialized_executable_deleter {
            if !a.serialized_executable.is_null() {
                // SAFETY: called exactly once, on the object it belongs to.
                unsafe { deleter(a.serialized_executable) };
            }
        }
        if bytes.is_empty() {
            return Err(Error::binding(
                "PJRT_Executable_Serialize: plugin returned an empty serialization",
            ));
        }
        Ok(bytes)
    }
}

/// Every argument position of `n` the caller did not offer in `donate`:
/// buffers are shared (`&Buffer`), and a donated buffer is invalidated.
fn non_donatable(n: usize, donate: &[usize]) -> Vec<i64> {
    (0..n)
        .filter(|i| !donate.contains(i))
        .map(|i| i as i64)
        .collect()
}

/// Execute options forbidding donation of `non_donatable` (which must
/// outlive the call they are passed to).
fn execute_options(non_donatable: &[i64]) -> sys::PJRT_ExecuteOptions {
    let mut options = sys::PJRT_ExecuteOptions::new();
    options.non_donatable_input_indices = super::api::slice_ptr(non_donatable);
    options.num_non_donatable_input_indices = non_donatable.len();
    options
}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let plugin = &*self.client.plugin;
        if !self.exec.is_null() {
            let mut a = sys::PJRT_Executable_Destroy_Args::new();
            a.executable = self.exec;
            let r = pjrt_call!(plugin, PJRT_Executable_Destroy, &mut a);
            plugin.log_drop_error("executable", r);
        }
        let mut a = sys::PJRT_LoadedExecutable_Destroy_Args::new();
        a.executable = self.raw.as_ptr();
        let r = pjrt_call!(plugin, PJRT_LoadedExecutable_Destroy, &mut a);
        plugin.log_drop_error("loaded executable", r);
    }
}

/// The completion of one launched execution (an owned `PJRT_Event`).
///
/// Dropping it without waiting blocks until the execution finishes, so the
/// arguments the caller keeps alive for it are never freed too early.
pub struct Completion {
    client: Arc<ClientInner>,
    raw: *mut sys::PJRT_Event,
    /// When `PJRT_LoadedExecutable_Execute` returned.
    launched: Instant,
    /// The executable's `last_run_ns`.
    last_run_ns: Arc<AtomicU64>,
}

// SAFETY: PJRT events may be awaited and destroyed from any thread.
unsafe impl Send for Completion {}

impl Completion {
    /// Blocks until the execution has finished; returns its error, if any.
    pub fn wait(self) -> Result<()> {
        self.wait_polling(Duration::ZERO)
    }

    /// [`Completion::wait`], polling for completion instead of sleeping
    /// until `poll` after the launch when the executable's previous run
    /// ended within `poll` (or it has not run yet): a short execution is
    /// then collected without a thread wake-up (see `Event::wait_polling`),
    /// while a waiter for a longer one sleeps at once and leaves the cores
    /// to the execution's own threads.
    pub fn wait_polling(mut self, poll: Duration) -> Result<()> {
        let raw = std::mem::replace(&mut self.raw, ptr::null_mut());
        let short = self.last_run_ns.load(Relaxed) <= poll.as_nanos() as u64;
        let until = (short && !poll.is_zero()).then(|| self.launched + poll);
        let r = Event::new(&self.client.plugin, raw)
            .wait_polling(until, "PJRT_LoadedExecutable_Execute");
        let took = self.launched.elapsed().as_nanos() as u64;
        self.last_run_ns.store(took.max(1), Relaxed);
        r
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            let raw = std::mem::replace(&mut self.raw, ptr::null_mut());
            let r = Event::new(&self.client.plugin, raw).wait("dropped execution");
            self.client.plugin.log_drop_error("execution", r);
        }
    }
}
