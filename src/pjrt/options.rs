//! The serialized `xla.CompileOptionsProto` passed to `PJRT_Client_Compile`.
//!
//! The plugin requires compile options (an empty buffer aborts the process),
//! and lazyfuse needs only "one replica, one partition". Rather than vendoring
//! XLA's protos, the two messages are declared here with just the fields used,
//! with XLA's field numbers; protobuf's wire format makes that a valid
//! encoding of the full messages.

use prost::Message;

/// The subset of `xla.CompileOptionsProto` lazyfuse sets.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CompileOptionsProto {
    /// `executable_build_options = 3`.
    #[prost(message, optional, tag = "3")]
    pub executable_build_options: Option<ExecutableBuildOptionsProto>,
    /// `compile_portable_executable = 4`: compile without binding the
    /// executable to a device, so it can be launched on any addressable device
    /// (`execute_device` in `PJRT_LoadedExecutable_Execute`).
    #[prost(bool, tag = "4")]
    pub compile_portable_executable: bool,
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

fn single_device_options(portable: bool) -> CompileOptionsProto {
    CompileOptionsProto {
        executable_build_options: Some(ExecutableBuildOptionsProto {
            num_replicas: 1,
            num_partitions: 1,
        }),
        compile_portable_executable: portable,
    }
}

/// Serialized compile options for a single-replica, single-partition program
/// (`executable_build_options { num_replicas: 1 num_partitions: 1 }`), the
/// base configuration for everything lazyfuse compiles. Public so tests and
/// tools can inspect exactly what is sent to the compiler.
pub fn compile_options_bytes() -> Vec<u8> {
    single_device_options(false).encode_to_vec()
}

/// The options [`super::Client::compile`] actually sends: the base options
/// plus `compile_portable_executable: true`, so one executable can run on any
/// addressable device.
pub(crate) fn portable_compile_options_bytes() -> Vec<u8> {
    single_device_options(true).encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_options_encode_to_known_bytes() {
        assert_eq!(
            compile_options_bytes(),
            [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01]
        );
        assert_eq!(
            portable_compile_options_bytes(),
            [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01]
        );
    }
}
