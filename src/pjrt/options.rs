//! The serialized `xla.CompileOptionsProto` passed to `PJRT_Client_Compile`.
//!
//! The plugin requires compile options (an empty buffer aborts the process),
//! and lazyfuse needs only "one replica, one partition, any device". Rather
//! than vendoring XLA's protos, the two messages are declared here with just
//! the fields used, under XLA's field numbers; protobuf's wire format makes
//! that a valid encoding of the full messages.
//!
//! One XLA default is overridden: `xla_allow_excess_precision` (on by
//! default) lets XLA drop a `convert` pair such as f32 -> bf16 -> f32 inside
//! a fused computation, so a fused region returned values with more
//! precision than the same ops run one by one (found by the differential
//! fuzzer: `tests/fuzz_ops.rs::fusion_keeps_half_precision_rounding`).
//! lazyfuse promises that fusion never changes an answer, so it is off.
//! It is set through `env_option_overrides`, which XLA applies on top of its
//! default debug options (a `debug_options` message would reset all others).

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
}

/// The options lazyfuse compiles with.
pub(crate) fn compile_options() -> CompileOptionsProto {
    CompileOptionsProto {
        executable_build_options: Some(ExecutableBuildOptionsProto {
            num_replicas: 1,
            num_partitions: 1,
        }),
        // Without this the executable is bound to device 0 by the default
        // device assignment, and launching it on another device with
        // `execute_device` fails ("ExecuteShard attempted to execute on device
        // id 1 which is not addressable"). A portable executable runs on
        // whichever addressable device it is launched on.
        compile_portable_executable: true,
        env_option_overrides: BTreeMap::from([(
            "xla_allow_excess_precision".to_string(),
            OptionOverrideProto {
                value: Some(OptionValue::Bool(false)),
            },
        )]),
    }
}

/// The exact serialized `CompileOptionsProto` that [`super::Client::compile`]
/// sends: `executable_build_options { num_replicas: 1 num_partitions: 1 }
/// compile_portable_executable: true`. Public so that caches of serialized
/// executables can include it in their key, and so tests can pin it.
pub fn compile_options_bytes() -> Vec<u8> {
    compile_options().encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_options_encode_to_known_bytes() {
        let build = CompileOptionsProto {
            executable_build_options: compile_options().executable_build_options,
            compile_portable_executable: false,
            env_option_overrides: BTreeMap::new(),
        };
        // executable_build_options (field 3, 4 bytes) { num_replicas: 1, num_partitions: 1 }
        assert_eq!(build.encode_to_vec(), [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01]);
        // ... followed by compile_portable_executable (field 4): true and one
        // env_option_overrides entry (field 7): { key (1): "xla_allow_excess_precision",
        // value (2): { bool_field (2): false } }.
        let key = b"xla_allow_excess_precision";
        let mut want = vec![0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01];
        want.extend_from_slice(&[0x3a, key.len() as u8 + 6, 0x0a, key.len() as u8]);
        want.extend_from_slice(key);
        want.extend_from_slice(&[0x12, 0x02, 0x10, 0x00]);
        assert_eq!(compile_options_bytes(), want);
    }
}
