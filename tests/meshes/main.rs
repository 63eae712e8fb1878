//! Meshes and SPMD on an 8-device CPU client: sharded values and their
//! propagation (`spmd`), `shard_map` (`shard_map`) and its differential
//! fuzzer (`fuzz_shard_map`). One test binary: each `tests/*.rs` is a
//! separate link.
mod fuzz_shard_map;
mod shard_map;
mod spmd;
#[path = "../spmd_support/mod.rs"]
mod spmd_support;
