//! What an optimized program runs: its ops, and the collective ones with
//! what they communicate, read from the `HloModuleProto` the plugin returns
//! for a compiled executable (`PJRT_Executable_OptimizedProgram`). Only the
//! fields needed are declared, under XLA's field numbers
//! (`xla/service/hlo.proto`, `xla/xla_data.proto`); protobuf skips the rest.

use prost::Message;

/// `xla.HloModuleProto`: `computations = 3`.
#[derive(Clone, PartialEq, prost::Message)]
struct HloModuleProto {
    #[prost(message, repeated, tag = "3")]
    computations: Vec<HloComputationProto>,
}

/// `xla.HloModuleProtoWithConfig`: `hlo_module = 1`.
#[derive(Clone, PartialEq, prost::Message)]
struct HloModuleProtoWithConfig {
    #[prost(message, optional, tag = "1")]
    hlo_module: Option<HloModuleProto>,
}

/// `xla.HloComputationProto`: `instructions = 2`.
#[derive(Clone, PartialEq, prost::Message)]
struct HloComputationProto {
    #[prost(message, repeated, tag = "2")]
    instructions: Vec<HloInstructionProto>,
}

/// `xla.HloInstructionProto`: `opcode = 2`, `shape = 3`.
#[derive(Clone, PartialEq, prost::Message)]
struct HloInstructionProto {
    #[prost(string, tag = "2")]
    opcode: String,
    #[prost(message, optional, tag = "3")]
    shape: Option<ShapeProto>,
}

/// `xla.ShapeProto`: `element_type = 2`, `dimensions = 3`, `tuple_shapes = 4`.
#[derive(Clone, PartialEq, prost::Message)]
struct ShapeProto {
    #[prost(int32, tag = "2")]
    element_type: i32,
    #[prost(int64, repeated, tag = "3")]
    dimensions: Vec<i64>,
    #[prost(message, repeated, tag = "4")]
    tuple_shapes: Vec<ShapeProto>,
}

/// Bytes of an array of `xla.PrimitiveType` `t`, or 0 for tuples, tokens
/// and types lazyfuse does not use.
fn element_bytes(t: i32) -> u64 {
    match t {
        1 | 2 | 6 => 1,       // PRED, S8, U8
        3 | 7 | 10 | 16 => 2, // S16, U16, F16, BF16
        4 | 8 | 11 => 4,      // S32, U32, F32
        5 | 9 | 12 | 15 => 8, // S64, U64, F64, C64
        18 => 16,             // C128
        _ => 0,
    }
}

fn shape_bytes(s: &ShapeProto) -> u64 {
    if !s.tuple_shapes.is_empty() {
        return s.tuple_shapes.iter().map(shape_bytes).sum();
    }
    let n: i64 = s.dimensions.iter().product();
    n.max(0) as u64 * element_bytes(s.element_type)
}

/// One collective op of a compiled program, as each device runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collective {
    /// XLA's opcode: `all-reduce`, `all-gather`, `reduce-scatter`,
    /// `all-to-all` or `collective-permute` (asynchronous forms counted
    /// once, at their `-start`).
    pub opcode: String,
    /// Bytes of its result on one device.
    pub bytes: u64,
}

/// Decodes the serialized module `bytes` (an `HloModuleProto`, or one with
/// its config for format `hlo_with_config`).
fn decode(bytes: &[u8], format: &str) -> Option<HloModuleProto> {
    if format == "hlo_with_config" {
        HloModuleProtoWithConfig::decode(bytes).ok()?.hlo_module
    } else {
        HloModuleProto::decode(bytes).ok()
    }
}

/// The opcode of every instruction of every computation of the serialized
/// module `bytes` (fused computations included); `None` when the bytes do
/// not decode.
pub fn opcodes(bytes: &[u8], format: &str) -> Option<Vec<String>> {
    let module = decode(bytes, format)?;
    Some(
        module
            .computations
            .into_iter()
            .flat_map(|c| c.instructions)
            .map(|i| i.opcode)
            .collect(),
    )
}

/// The collective ops of the serialized module `bytes` (see [`decode`]).
/// `None` when the bytes do not decode.
pub fn collectives(bytes: &[u8], format: &str) -> Option<Vec<Collective>> {
    let module = decode(bytes, format)?;
    const KINDS: [&str; 5] = [
        "all-reduce",
        "all-gather",
        "reduce-scatter",
        "all-to-all",
        "collective-permute",
    ];
    let mut out = Vec::new();
    for c in &module.computations {
        for i in &c.instructions {
            let op = i.opcode.strip_suffix("-start").unwrap_or(&i.opcode);
            if KINDS.contains(&op) {
                out.push(Collective {
                    opcode: op.to_string(),
                    bytes: i.shape.as_ref().map_or(0, shape_bytes),
                });
            }
        }
    }
    Some(out)
}
