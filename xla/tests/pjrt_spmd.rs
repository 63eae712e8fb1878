//! SPMD through the PJRT binding against the real XLA CPU plugin: a client
//! with several logical devices, a Shardy-annotated module compiled as one
//! program over them, launched with one argument list of shards per device.

#[path = "common/mod.rs"]
mod common;

use std::sync::OnceLock;

use common::*;
use lazyfuse_xla::pjrt::{Buffer, Client, CreateOption, NamedValue};

/// A client with 8 logical CPU devices (`cpu_device_count`, typed Int64:
/// the plugin aborts on any other type).
fn client8() -> &'static Client {
    static C: OnceLock<Client> = OnceLock::new();
    C.get_or_init(|| {
        let count = CreateOption::new("cpu_device_count", NamedValue::Int(8));
        Client::with_options(plugin(), &[count], &[]).expect("create an 8-device client")
    })
}

fn upload(c: &Client, v: &[f32], dims: &[usize], device: usize) -> Buffer {
    upload_f32(c, v, dims, device)
}

fn download(b: &Buffer) -> Vec<f32> {
    let n: usize = b.dims().unwrap().iter().product();
    let mut out = vec![0u8; n * 4];
    b.to_host(&mut out).unwrap();
    f32_vec(&out)
}

/// `x @ w` with `x` split by rows over `dp` and `w` replicated, returned
/// row-sharded, and the total sum of the product, returned replicated: XLA
/// all-reduces the partial sums.
const MATMUL_SUM: &str = r#"
module @spmd attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["dp"=4]>
  func.func public @main(
      %x: tensor<8x3xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {}]>},
      %w: tensor<3x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>})
      -> (tensor<8x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {}]>},
          tensor<f32> {sdy.sharding = #sdy.sharding<@mesh, []>}) {
    %y = "stablehlo.dot_general"(%x, %w) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>} : (tensor<8x3xf32>, tensor<3x2xf32>) -> tensor<8x2xf32>
    %zero = "stablehlo.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
    %s = "stablehlo.reduce"(%y, %zero) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %t = "stablehlo.add"(%a, %b) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 0, 1>} : (tensor<8x2xf32>, tensor<f32>) -> tensor<f32>
    "func.return"(%y, %s) : (tensor<8x2xf32>, tensor<f32>) -> ()
  }
}
"#;

#[test]
fn a_client_has_the_device_count_it_was_created_with() {
    assert_eq!(client8().addressable_device_count(), 8);
}

#[test]
fn a_sharded_matmul_runs_as_one_program_on_four_devices() {
    let c = client8();
    // Devices 4..8: partition i runs on device 4 + i.
    let devices = [4, 5, 6, 7];
    let exe = c.compile_spmd(MATMUL_SUM, &devices).unwrap();
    assert_eq!(exe.devices(), &devices);
    // The partial sums are all-reduced: one f32 per device.
    let comms = exe.collectives();
    assert_eq!(comms.len(), 1, "{comms:?}");
    assert_eq!(
        (comms[0].opcode.as_str(), comms[0].bytes),
        ("all-reduce", 4)
    );
    let x: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
    let w = [1.0f32, -2.0, 0.5, 3.0, -1.5, 0.25];
    let shards: Vec<Buffer> = (0..4)
        .map(|p| upload(c, &x[p * 6..p * 6 + 6], &[2, 3], devices[p]))
        .collect();
    let ws: Vec<Buffer> = devices.iter().map(|&d| upload(c, &w, &[3, 2], d)).collect();
    let args: Vec<Vec<&Buffer>> = (0..4).map(|p| vec![&shards[p], &ws[p]]).collect();
    let (outs, done) = exe.launch_spmd(&args, &[]).unwrap();
    for d in done {
        d.wait().unwrap();
    }
    let mut want_y = [0f32; 16];
    for r in 0..8 {
        for j in 0..2 {
            want_y[r * 2 + j] = (0..3).map(|k| x[r * 3 + k] * w[k * 2 + j]).sum();
        }
    }
    let want_sum: f32 = want_y.iter().sum();
    for (p, out) in outs.iter().enumerate() {
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].dims().unwrap(), [2, 2], "partition {p}: a row shard");
        assert_eq!(download(&out[0]), want_y[p * 4..p * 4 + 4], "partition {p}");
        assert_eq!(out[1].dims().unwrap(), Vec::<usize>::new());
        let s = download(&out[1])[0];
        assert!(
            (s - want_sum).abs() <= 1e-4 * want_sum.abs(),
            "partition {p}: {s} vs {want_sum}"
        );
    }
}

#[test]
fn spmd_launch_errors_are_errs() {
    let c = client8();
    let exe = c.compile_spmd(MATMUL_SUM, &[0, 1, 2, 3]).unwrap();
    let x = upload(c, &[0.0; 6], &[2, 3], 0);
    let w = upload(c, &[0.0; 6], &[3, 2], 0);
    // Three lists for four partitions.
    let three: Vec<Vec<&Buffer>> = (0..3).map(|_| vec![&x, &w]).collect();
    assert!(exe.launch_spmd(&three, &[]).is_err());
    // A list one argument short.
    let mut short: Vec<Vec<&Buffer>> = (0..4).map(|_| vec![&x, &w]).collect();
    short[2].pop();
    assert!(exe.launch_spmd(&short, &[]).is_err());
    // A device out of range.
    assert!(c.compile_spmd(MATMUL_SUM, &[0, 1, 2, 8]).is_err());
    // A one-device executable has no partitions to launch.
    let single = client().compile(
        "func.func public @main(%a: tensor<f32>) -> tensor<f32> {\n  \"func.return\"(%a) : (tensor<f32>) -> ()\n}\n",
    );
    assert!(single.unwrap().launch_spmd(&[], &[]).is_err());
}
