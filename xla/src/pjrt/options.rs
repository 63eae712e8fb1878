//! The serialized `xla.CompileOptionsProto` passed to `PJRT_Client_Compile`.
//!
//! The plugin requires compile options (an empty buffer aborts the process),
//! and lazyfuse needs only "one replica, one partition, any device". Rather
//! than vendoring XLA's protos, the two messages are declared here with just
//! the fields used, under XLA's field numbers; protobuf's wire format makes
//! that a valid encoding of the full messages.
//!
//! Fusion must never change an answer, so a few XLA defaults are
//! overridden (each found to change IEEE results when ops that ran as
//! separate regions land in one; regression tests in `tests/semantics/ieee.rs`). They
//! are set through `env_option_overrides`, which XLA applies on top of its
//! default debug options (a `debug_options` message would reset all others).
//! - `xla_allow_excess_precision` off: XLA would drop a `convert` pair such
//!   as f32 -> bf16 -> f32 inside a fused computation, returning more
//!   precision than the same ops run one by one
//!   (`tests/fuzz_regressions/numerics.rs::fusion_keeps_half_precision_rounding`).
//! - `xla_disable_hlo_passes = "algsimp"`: XLA's algebraic simplifier
//!   rewrites patterns that span ops without regard to NaN, infinities or
//!   the sign of zero: `multiply(convert(pred), x)` becomes
//!   `select(pred, x, 0)` (0 where IEEE gives NaN for `x` = NaN or ±Inf, and
//!   +0 for -0), `(a/b)/c` becomes `a/(b*c)` (overflows), `sqrt(a*a)`
//!   becomes `|a|`, `abs(x) >= 0` folds to true (false for NaN), `a/sqrt(b)`
//!   becomes `a*rsqrt(b)` (an approximation), constants are reassociated. No
//!   option guards those rewrites; the pass is off as a whole.
//! - `xla_disable_hlo_passes` also names `constant_folding`: it evaluates
//!   expressions of constants at compile time with the host's arithmetic
//!   (IEEE subnormals, libm transcendentals) where the same ops at run time
//!   flush subnormals and use XLA's own approximations, so a region whose
//!   operands were constants could answer differently from the ops run one
//!   by one. Subnormal constants are also stored flushed
//!   (`lazyfuse_ir::interp::scalar_constant`), because LLVM folds what it
//!   sees inside a fused kernel as well
//!   (`tests/semantics/ieee.rs::subnormal_constants_are_zeros_for_the_compiler_too`).
//! - On XLA's CPU backend only ([`platform_overrides`]), also
//!   `tree_reduction_rewriter`: it turns every reduction of more than 32
//!   elements into a `reduce-window` of 32-element windows and a second
//!   reduce, and XLA fuses no producer into that `reduce-window`, so a
//!   layer norm's `(x - mean)^2` is written out in full and read back, and
//!   each row reduction runs as two kernels. Without it a row reduction is
//!   one loop that computes its operand in place (`layernorm_gelu` ~25 %
//!   faster). The pass was there for the accuracy of long sums; lowering
//!   sums more than 65,536 elements in stages of 1,024 itself
//!   (`xla/src/lower/contract.rs`), so long sums keep their accuracy. Not on
//!   GPUs, whose reduction emitters rely on it, and not in SPMD programs:
//!   there XLA runs the pass after partitioning, on each device's share,
//!   while lazyfuse's stages would reshape (and pad) a sharded axis before
//!   it, which made the partitioner gather a long sharded sum's operand
//!   (201,764 bytes moved for 100,000 values over four devices instead of
//!   one 4-byte all-reduce).
//! - On XLA's CPU backend, `xla_cpu_copy_insertion_use_region_analysis`
//!   on. A training step donates its parameters, so each updated weight is
//!   written over its input buffer; the weight is also read by a backward
//!   product. XLA's default copy insertion cannot prove that read comes
//!   before the in-place update and copies the weight first (three copies
//!   per `mlp_train_step`, 4 MiB for the 1,024 x 1,024 weight). Region
//!   analysis proves the order and drops them. It changes which buffers
//!   hold what, never an answer.
//! - `xla_cpu_enable_fast_min_max` off: on by default, `max`/`min` then
//!   drop a NaN depending on operand order; off, they propagate it.
//! - With `LAZYFUSE_STRICT_FP=1`, `xla_cpu_max_isa = "AVX"`: fused loops
//!   may otherwise contract `a*b + c` into one fused multiply-add (one
//!   rounding instead of two; docs/semantics.md). AVX has no FMA, so
//!   fused results then equal unfused ones bit for bit, at some speed.
//!   Newer CPU plugins (PJRT API 0.100 and later) take the ISA from the
//!   process's `XLA_FLAGS` when the client is made, not from a compile's
//!   options, so there the flag also goes into `XLA_FLAGS`
//!   ([`strict_fp_xla_flags`]).
//! - On those newer CPU plugins, `xla_cpu_experimental_ynn_fusion_type =
//!   "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"`: their XLA hands dots,
//!   reductions and elementwise chains to YNNPACK by default, and YNNPACK's max/min reductions drop a
//!   NaN that is followed by a number (x86 `maxps` returns its second
//!   operand on NaN; `xla_cpu_enable_fast_min_max` does not reach them).
//!   Each dot alone stays in YNNPACK, where it is fast and where IEEE
//!   arithmetic cannot tell the difference; reductions and elementwise
//!   code are XLA's own again
//!   (`tests/semantics/ieee.rs::max_and_min_reductions_propagate_nan_at_every_position`).

use prost::Message;
use std::collections::BTreeMap;

/// The subset of `xla.CompileOptionsProto` lazyfuse sets.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CompileOptionsProto {
    /// `executable_build_options = 3`.
    #[prost(message, optional, tag = "3")]
    pub executable_build_options: Option<ExecutableBuildOptionsProto>,
    /// `compile_portable_executable = 4`.
    #[prost(bool, tag = "4")]
    pub compile_portable_executable: bool,
    /// `env_option_overrides = 7`: debug options by name, applied over XLA's defaults.
    #[prost(btree_map = "string, message", tag = "7")]
    pub env_option_overrides: BTreeMap<String, OptionOverrideProto>,
}

/// `xla.OptionOverrideProto`: one typed option value.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct OptionOverrideProto {
    /// The `value` oneof (fields 1 to 4), by type.
    #[prost(oneof = "OptionValue", tags = "1, 2, 3, 4")]
    pub value: Option<OptionValue>,
}

/// The `value` oneof of `xla.OptionOverrideProto`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum OptionValue {
    /// `string_field = 1`.
    #[prost(string, tag = "1")]
    String(String),
    /// `bool_field = 2`.
    #[prost(bool, tag = "2")]
    Bool(bool),
    /// `int_field = 3`.
    #[prost(int64, tag = "3")]
    Int(i64),
    /// `double_field = 4`.
    #[prost(double, tag = "4")]
    Double(f64),
}

/// The subset of `xla.ExecutableBuildOptionsProto` lazyfuse sets.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ExecutableBuildOptionsProto {
    /// `num_replicas = 4`.
    #[prost(int64, tag = "4")]
    pub num_replicas: i64,
    /// `num_partitions = 5`.
    #[prost(int64, tag = "5")]
    pub num_partitions: i64,
    /// `use_spmd_partitioning = 6`: one program partitioned over
    /// `num_partitions` devices by XLA's SPMD partitioner.
    #[prost(bool, tag = "6")]
    pub use_spmd_partitioning: bool,
    /// `device_assignment = 9`: which device runs which partition.
    #[prost(message, optional, tag = "9")]
    pub device_assignment: Option<DeviceAssignmentProto>,
    /// `use_shardy_partitioner = 19`: Shardy (`sdy` attributes) rather than
    /// the deprecated GSPMD `mhlo.sharding` propagation.
    #[prost(bool, tag = "19")]
    pub use_shardy_partitioner: bool,
}

/// `xla.DeviceAssignmentProto`: the device of each (replica, computation).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DeviceAssignmentProto {
    /// `replica_count = 1`.
    #[prost(int32, tag = "1")]
    pub replica_count: i32,
    /// `computation_count = 2` (partitions).
    #[prost(int32, tag = "2")]
    pub computation_count: i32,
    /// `computation_devices = 3`: per partition, its device per replica.
    #[prost(message, repeated, tag = "3")]
    pub computation_devices: Vec<ComputationDevice>,
}

/// `xla.DeviceAssignmentProto.ComputationDevice`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ComputationDevice {
    /// `replica_device_ids = 1`: global device ids, one per replica.
    #[prost(int64, repeated, tag = "1")]
    pub replica_device_ids: Vec<i64>,
}

/// A debug option a client adds to (or changes in) lazyfuse's overrides,
/// by XLA's `DebugOptions` field name: for example where a GPU client finds
/// CUDA's `libdevice` and `ptxas` (`xla_gpu_cuda_data_dir`).
#[derive(Clone, Debug, PartialEq)]
pub enum CompileOverride {
    /// A string-valued option.
    Str(String, String),
    /// A bool-valued option.
    Bool(String, bool),
    /// An integer-valued option.
    Int(String, i64),
}

/// The options lazyfuse compiles with.
pub(crate) fn compile_options() -> CompileOptionsProto {
    CompileOptionsProto {
        executable_build_options: Some(ExecutableBuildOptionsProto {
            num_replicas: 1,
            num_partitions: 1,
            ..Default::default()
        }),
        // Without this the executable is bound to device 0 by the default
        // device assignment, and launching it on another device with
        // `execute_device` fails ("ExecuteShard attempted to execute on device
        // id 1 which is not addressable"). A portable executable runs on
        // whichever addressable device it is launched on.
        compile_portable_executable: true,
        env_option_overrides: overrides(crate::env::strict_fp()),
    }
}

/// XLA's passes lazyfuse turns off on every platform (see the module doc).
const DISABLED_PASSES: &str = "algsimp,constant_folding";

/// The first PJRT C API version whose CPU plugins have YNNPACK fusions
/// and read the ISA limit from `XLA_FLAGS` only (the plugins lazyfuse has
/// seen: 0.81 without, 0.106 and 0.115 with).
pub const NEWER_CPU_API: (i32, i32) = (0, 100);

/// The debug options lazyfuse adds for a client of `platform` (its
/// `PJRT_Client_PlatformName`) on a plugin of PJRT C API version `api` to
/// its single-device compiles, or to its SPMD compiles (`spmd`): on `cpu`,
/// copy insertion uses region analysis, YNNPACK keeps only single dots on
/// the newer plugins, and XLA's tree reduction rewriter is also off for
/// single-device programs only (see the module doc). A client's own
/// additions go on top.
pub(crate) fn platform_overrides(
    platform: &str,
    api: (i32, i32),
    spmd: bool,
) -> Vec<CompileOverride> {
    if !platform.eq_ignore_ascii_case("cpu") {
        return Vec::new();
    }
    let mut o = vec![CompileOverride::Bool(
        "xla_cpu_copy_insertion_use_region_analysis".into(),
        true,
    )];
    if api >= NEWER_CPU_API {
        o.push(CompileOverride::Str(
            "xla_cpu_experimental_ynn_fusion_type".into(),
            "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT".into(),
        ));
    }
    if !spmd {
        o.push(CompileOverride::Str(
            "xla_disable_hlo_passes".into(),
            format!("{DISABLED_PASSES},tree_reduction_rewriter"),
        ));
    }
    o
}

/// The debug options lazyfuse overrides (see the module doc).
fn overrides(strict_fp: bool) -> BTreeMap<String, OptionOverrideProto> {
    let set = |v: OptionValue| OptionOverrideProto { value: Some(v) };
    let mut m = BTreeMap::from([
        (
            "xla_allow_excess_precision".to_string(),
            set(OptionValue::Bool(false)),
        ),
        (
            "xla_disable_hlo_passes".to_string(),
            set(OptionValue::String(DISABLED_PASSES.into())),
        ),
        (
            "xla_cpu_enable_fast_min_max".to_string(),
            set(OptionValue::Bool(false)),
        ),
    ]);
    if strict_fp {
        m.insert(
            "xla_cpu_max_isa".to_string(),
            set(OptionValue::String("AVX".into())),
        );
    }
    m
}

/// The `XLA_FLAGS` entry that keeps a newer CPU plugin from contracting
/// `a*b + c` under `LAZYFUSE_STRICT_FP=1` (see the module doc), or `None`
/// when strict floating point is off.
pub fn strict_fp_xla_flags() -> Option<&'static str> {
    crate::env::strict_fp().then_some("--xla_cpu_max_isa=AVX")
}

/// The exact serialized `CompileOptionsProto` that [`super::Client::compile`]
/// sends: `executable_build_options { num_replicas: 1 num_partitions: 1 }
/// compile_portable_executable: true`. Public so that caches of serialized
/// executables can include it in their key, and so tests can pin it.
pub fn compile_options_bytes() -> Vec<u8> {
    compile_options().encode_to_vec()
}

/// [`compile_options_bytes`] with `extra` debug options set on top (a name
/// lazyfuse already sets takes the value given here).
pub fn compile_options_bytes_with(extra: &[CompileOverride]) -> Vec<u8> {
    with_overrides(compile_options(), extra).encode_to_vec()
}

/// The serialized options of an SPMD compile: one program partitioned by
/// Shardy over `device_ids.len()` devices, partition `i` on the device with
/// global id `device_ids[i]`, with lazyfuse's debug options and `extra`.
/// Not portable: XLA refuses a portable executable of more than one device.
pub fn spmd_compile_options_bytes(device_ids: &[i64], extra: &[CompileOverride]) -> Vec<u8> {
    let n = device_ids.len() as i64;
    let mut o = compile_options();
    o.compile_portable_executable = false;
    o.executable_build_options = Some(ExecutableBuildOptionsProto {
        num_replicas: 1,
        num_partitions: n,
        use_spmd_partitioning: true,
        device_assignment: Some(DeviceAssignmentProto {
            replica_count: 1,
            computation_count: n as i32,
            computation_devices: device_ids
                .iter()
                .map(|&id| ComputationDevice {
                    replica_device_ids: vec![id],
                })
                .collect(),
        }),
        use_shardy_partitioner: true,
    });
    with_overrides(o, extra).encode_to_vec()
}

/// `o` with `extra` debug options set over lazyfuse's.
fn with_overrides(mut o: CompileOptionsProto, extra: &[CompileOverride]) -> CompileOptionsProto {
    for e in extra {
        let (name, value) = match e {
            CompileOverride::Str(n, v) => (n, OptionValue::String(v.clone())),
            CompileOverride::Bool(n, v) => (n, OptionValue::Bool(*v)),
            CompileOverride::Int(n, v) => (n, OptionValue::Int(*v)),
        };
        o.env_option_overrides
            .insert(name.clone(), OptionOverrideProto { value: Some(value) });
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The official plugin's API version.
    const OLD: (i32, i32) = (0, 81);

    #[test]
    fn compile_options_encode_to_known_bytes() {
        let build = CompileOptionsProto {
            executable_build_options: compile_options().executable_build_options,
            compile_portable_executable: false,
            env_option_overrides: BTreeMap::new(),
        };
        // executable_build_options (field 3, 4 bytes) { num_replicas: 1, num_partitions: 1 }
        assert_eq!(build.encode_to_vec(), [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01]);
        // ... followed by compile_portable_executable (field 4): true and the
        // env_option_overrides entries (field 7), in key order: { key (1),
        // value (2): { bool_field (2) | string_field (1) } }.
        let mut want = vec![0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01];
        let mut entry = |key: &[u8], value: &[u8]| {
            want.extend_from_slice(&[0x3a, (key.len() + value.len() + 4) as u8]);
            want.extend_from_slice(&[0x0a, key.len() as u8]);
            want.extend_from_slice(key);
            want.extend_from_slice(&[0x12, value.len() as u8]);
            want.extend_from_slice(value);
        };
        entry(b"xla_allow_excess_precision", &[0x10, 0x00]);
        entry(b"xla_cpu_enable_fast_min_max", &[0x10, 0x00]);
        let passes = b"algsimp,constant_folding";
        let mut algsimp = vec![0x0a, passes.len() as u8];
        algsimp.extend_from_slice(passes);
        entry(b"xla_disable_hlo_passes", &algsimp);
        if crate::env::strict_fp() {
            let mut avx = vec![0x0a, 3];
            avx.extend_from_slice(b"AVX");
            entry(b"xla_cpu_max_isa", &avx);
        }
        assert_eq!(compile_options_bytes(), want);
    }

    #[test]
    fn the_cpu_platform_also_disables_the_tree_reduction_rewriter() {
        let cpu = compile_options_bytes_with(&platform_overrides("cpu", OLD, false));
        let o = CompileOptionsProto::decode(cpu.as_slice()).unwrap();
        let passes = &o.env_option_overrides["xla_disable_hlo_passes"];
        assert_eq!(
            passes.value,
            Some(OptionValue::String(
                "algsimp,constant_folding,tree_reduction_rewriter".into()
            ))
        );
        assert!(platform_overrides("cuda", OLD, false).is_empty());
        assert_eq!(
            compile_options_bytes_with(&platform_overrides("cuda", OLD, false)),
            compile_options_bytes()
        );
        // SPMD programs keep it, on every platform (their sums are not staged).
        let spmd = platform_overrides("cpu", OLD, true);
        assert!(!spmd
            .iter()
            .any(|o| matches!(o, CompileOverride::Str(n, _) if n == "xla_disable_hlo_passes")));
        assert!(platform_overrides("cuda", OLD, true).is_empty());
    }

    #[test]
    fn cpu_copy_insertion_uses_region_analysis() {
        for spmd in [false, true] {
            let cpu = compile_options_bytes_with(&platform_overrides("cpu", OLD, spmd));
            let o = CompileOptionsProto::decode(cpu.as_slice()).unwrap();
            assert_eq!(
                o.env_option_overrides["xla_cpu_copy_insertion_use_region_analysis"].value,
                Some(OptionValue::Bool(true))
            );
        }
        let cuda = compile_options_bytes_with(&platform_overrides("cuda", OLD, false));
        let o = CompileOptionsProto::decode(cuda.as_slice()).unwrap();
        assert!(!o
            .env_option_overrides
            .contains_key("xla_cpu_copy_insertion_use_region_analysis"));
    }

    #[test]
    fn newer_cpu_plugins_keep_only_single_dots_in_ynnpack() {
        let ynn = |platform: &str, api, spmd| {
            let bytes = compile_options_bytes_with(&platform_overrides(platform, api, spmd));
            CompileOptionsProto::decode(bytes.as_slice())
                .unwrap()
                .env_option_overrides
                .get("xla_cpu_experimental_ynn_fusion_type")
                .map(|o| o.value.clone())
        };
        for spmd in [false, true] {
            assert_eq!(ynn("cpu", OLD, spmd), None, "0.81 has no such option");
            for api in [NEWER_CPU_API, (0, 115)] {
                assert_eq!(
                    ynn("cpu", api, spmd),
                    Some(Some(OptionValue::String(
                        "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT".into()
                    )))
                );
            }
            assert_eq!(ynn("cuda", (0, 115), spmd), None);
        }
    }
}
