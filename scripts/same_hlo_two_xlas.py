"""One StableHLO module, two XLA builds: the same text compiled and run by
jaxlib's own CPU client and by the `xla_cpu_pjrt.so` plugin lazyfuse uses
(loaded into the same process as a jax PJRT plugin, with the same compile
options), median of 100 runs each (ms).

It separates what lazyfuse controls (the module it emits, its runtime) from
what it does not (the XLA build inside the plugin wheel): lower a workload
with jax (`jax.jit(f).lower(*args).as_text()` into a file), dump lazyfuse's
regions with `LAZYFUSE_DUMP_DIR=d`, and run both here. If the two modules take
the same time under each client, the gap between lazyfuse and jax.jit is the
gap between the two clients.

    python scripts/same_hlo_two_xlas.py d/region-<key>.mlir jax_step.mlir

Needs jax (CPU). The plugin is found as lazyfuse finds it: `LAZYFUSE_PJRT_PLUGIN`,
else `~/.cache/lazyfuse/xla-cpu-pjrt-0.0.1/xla_cpu_pjrt.so`. Inputs are
random (boolean ones false, integer ones 0), which is enough for timing.
"""
import os
import subprocess
import sys
import time

import numpy as np

RUNS = 100
PLUGIN = os.environ.get("LAZYFUSE_PJRT_PLUGIN") or os.path.expanduser(
    "~/.cache/lazyfuse/xla-cpu-pjrt-0.0.1/xla_cpu_pjrt.so"
)
# `SAME_HLO_OPTIONS="name=value,..."`: XLA debug options set on both
# clients' compiles (values `true`/`false` are booleans), for example
# lazyfuse's own: `xla_cpu_enable_fast_min_max=false,
# xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT`.
OVERRIDES = [
    (k, {"true": True, "false": False}.get(v, v))
    for k, v in (
        kv.strip().split("=", 1) for kv in os.environ.get("SAME_HLO_OPTIONS", "").split(",") if kv.strip()
    )
]
DTYPES = {"f32": np.float32, "f64": np.float64, "i64": np.int64, "i32": np.int32, "i1": np.bool_}


def time_modules(client_name, paths):
    """Median ms of each module in `paths` on one client, in this process."""
    import jax

    jax.config.update("jax_enable_x64", True)  # i64 parameters stay i64
    if client_name == "plugin":
        from jax._src import xla_bridge

        xla_bridge.register_plugin("lazyfuse_cpu", priority=500, library_path=PLUGIN)
        jax.config.update("jax_platforms", "lazyfuse_cpu")
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir

    dev = jax.devices()[0]
    rng = np.random.default_rng(0)
    for path in paths:
        with mlir.make_ir_context():
            module = ir.Module.parse(open(path).read())
            main = next(
                op
                for op in module.body.operations
                if ir.StringAttr(op.attributes["sym_name"]).value == "main"
            )
            args = []
            for t in main.type.inputs:
                t = ir.RankedTensorType(t)
                dtype = DTYPES[str(t.element_type)]
                shape = tuple(t.shape)
                if dtype == np.bool_:
                    args.append(np.zeros(shape, np.bool_))
                elif np.issubdtype(dtype, np.integer):
                    args.append(np.zeros(shape, dtype))
                else:
                    args.append(np.asarray(rng.random(shape)).astype(dtype))
            code = mlir.module_to_bytecode(module)
        options = xla_client.CompileOptions()
        options.env_option_overrides = OVERRIDES
        exe = dev.client.compile_and_load(code, xla_client.DeviceList((dev,)), options)
        # Fresh buffers for every run, made outside the timing: a module
        # that donates its parameters (lazyfuse's `tf.aliasing_output`)
        # consumes them.
        def run():
            bufs = [jax.device_put(a, dev) for a in args]
            for b in bufs:
                b.block_until_ready()
            t0 = time.perf_counter()
            for out in exe.execute(bufs):
                out.block_until_ready()
            return (time.perf_counter() - t0) * 1e3

        for _ in range(5):
            run()
        ts = [run() for _ in range(RUNS)]
        ts.sort()
        print("%-8s %-40s %.3f" % (client_name, os.path.basename(path)[:40], ts[RUNS // 2]))
        sys.stdout.flush()


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--client":
        time_modules(sys.argv[2], sys.argv[3:])
        return
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    # One process per client: a process holds one CPU platform.
    for client_name in ("jaxlib", "plugin"):
        subprocess.run(
            [sys.executable, __file__, "--client", client_name, *sys.argv[1:]],
            check=True,
            stderr=subprocess.DEVNULL,
        )


if __name__ == "__main__":
    main()
