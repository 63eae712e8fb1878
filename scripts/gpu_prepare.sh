#!/usr/bin/env bash
# Builds, on the CPU machine, everything the GPU check runs, and strips it
# into target/gpu-carry (about 20 MB) so that it can be carried to a GPU
# machine that has no Rust toolchain and no network:
#   scripts/gpu_prepare.sh && <carry target/gpu-carry> scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/gpu-carry
rm -rf "$out" && mkdir -p "$out"
cargo build --release --example workloads
cp target/release/examples/workloads "$out/"
for t in ops lazy cuda; do
  exe=$(cargo test --release --test "$t" --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' | tail -1)
  cp "$exe" "$out/test-$t"
done
strip "$out"/*
ls -la "$out"
