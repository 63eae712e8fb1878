#!/usr/bin/env bash
# The GPU check, run on a machine with an NVIDIA GPU and JAX's CUDA plugin
# installed (no Rust needed): the op tables, the lazy tests and the CUDA
# tests on GPU 0, then the workload runner against jax.jit on the same GPU.
# Binaries come from scripts/gpu_prepare.sh (target/gpu-carry). Results go
# to $OUT (default target/gpu-results): logs and workloads.json.
#   GPU_CHECK_ITERS (default 10) sets the runner's timed iterations.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=target/gpu-carry
out=${OUT:-target/gpu-results}
mkdir -p "$out"
if [ -z "${LAZYFUSE_PJRT_PLUGIN:-}" ]; then
  # The plugin JAX loads: jax_plugins/xla_cuda13 (or xla_cuda12) in site-packages.
  LAZYFUSE_PJRT_PLUGIN=$(python3 - <<'P'
import importlib, os
for m in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
    try:
        d = os.path.dirname(importlib.import_module(m).__file__)
    except Exception:
        continue
    p = os.path.join(d, "xla_cuda_plugin.so")
    if os.path.exists(p):
        print(p)
        break
P
)
fi
export LAZYFUSE_PJRT_PLUGIN LAZYFUSE_TEST_DEVICE=cuda LAZYFUSE_TEST_BACKENDS=xla
echo "plugin: $LAZYFUSE_PJRT_PLUGIN" | tee "$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$out/summary.txt"
python3 -c 'import jax; print("jax", jax.__version__, jax.devices())' 2>&1 | tail -1 | tee -a "$out/summary.txt"
for t in cuda ops lazy; do
  start=$(date +%s)
  timeout 240 "$bin/test-$t" --test-threads 4 > "$out/test-$t.log" 2>&1
  rc=$?
  echo "test $t: rc=$rc, $(( $(date +%s) - start )) s, $(grep -E '^test result' "$out/test-$t.log" | tail -1)" | tee -a "$out/summary.txt"
done
timeout 300 "$bin/workloads" --device cuda --fusion both --iters "${GPU_CHECK_ITERS:-10}" --warmup 3 \
  --peers python3 --json "$out/workloads.json" > "$out/workloads.md" 2> "$out/workloads.log"
echo "workloads: rc=$?" | tee -a "$out/summary.txt"
cat "$out/workloads.md"
