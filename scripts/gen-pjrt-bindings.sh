#!/usr/bin/env bash
# Regenerates xla/src/pjrt/sys.rs, the raw FFI declarations of the PJRT C API.
#
# The header is taken from the exact plugin wheel lazyfuse provisions at run
# time (xla-cpu-pjrt==0.0.1, PJRT C API 0.81), so the struct layouts and
# *_STRUCT_SIZE constants always match the plugin we load. Run this only when
# bumping the pinned plugin version (and then also bump the pin in
# xla/src/plugin/mod.rs and the minimum version checked in xla/src/pjrt/api.rs).
#
# Requirements: python3 with pip, and the bindgen CLI (`cargo install
# bindgen-cli`) with a libclang it can find.
#
# Usage: scripts/gen-pjrt-bindings.sh
#   PJRT_WHEEL=/path/to/xla_cpu_pjrt-0.0.1-...whl  use a local wheel instead of
#                                                  downloading it from PyPI.
set -euo pipefail

PLUGIN_REQ="xla-cpu-pjrt==0.0.1"
HEADER_IN_WHEEL="xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo_root/xla/src/pjrt/sys.rs"
bindgen="${BINDGEN:-bindgen}"

command -v "$bindgen" >/dev/null || {
    echo "error: bindgen CLI not found (cargo install bindgen-cli, or set BINDGEN=)" >&2
    exit 1
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

if [[ -n "${PJRT_WHEEL:-}" ]]; then
    wheel="$PJRT_WHEEL"
else
    python3 -m pip download --no-deps --only-binary=:all: --dest "$tmp/wheel" "$PLUGIN_REQ"
    wheel="$(ls "$tmp"/wheel/*.whl)"
fi

python3 - "$wheel" "$HEADER_IN_WHEEL" "$tmp/pjrt_c_api.h" <<'PY'
import sys, zipfile
wheel, member, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, open(dest, "wb") as f:
    f.write(z.read(member))
PY

{
    cat <<EOF
//! Raw FFI declarations of the PJRT C API (\`pjrt_c_api.h\`, API 0.81).
//!
//! GENERATED FILE, DO NOT EDIT. Regenerate with \`scripts/gen-pjrt-bindings.sh\`,
//! which runs bindgen $("$bindgen" --version | awk '{print $2}') on \`$HEADER_IN_WHEEL\` from the
//! \`$PLUGIN_REQ\` wheel on PyPI, allowlisting \`PJRT_.*\` types and vars.
//! The safe wrapper lives in the sibling modules; nothing outside \`crate::pjrt\` should
//! need this.

#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    unused_imports,
    missing_docs,
    clippy::all,
    clippy::pedantic,
    rustdoc::all
)]

EOF
    "$bindgen" "$tmp/pjrt_c_api.h" \
        --allowlist-type 'PJRT_.*' \
        --allowlist-var 'PJRT_.*' \
        --default-enum-style consts \
        --no-prepend-enum-name \
        --rust-target 1.80 \
        -- -x c -std=c11
} >"$out.tmp"

mv "$out.tmp" "$out"
echo "wrote $out"
