//! Waiting for executions by polling their completion before sleeping
//! (`Completion::wait_polling`, what the runtime does for
//! `LAZYFUSE_WAIT_POLL_US`): every window gives the blocking wait's
//! results, for executions that end inside the window and for ones that
//! outlast it, and through the lazy runtime in a child process with
//! polling off and with a long window.

#[path = "../xla/tests/common/mod.rs"]
mod common;

use common::*;
use lazyfuse::xla::pjrt::Buffer;
use std::process::Command;
use std::time::Duration;

/// `%x * %x + %x` on tensor<256x256xf32>, through a matrix product so one
/// execution takes longer than a tiny polling window.
const SQUARE_PLUS: &str = r#"module @m {
  func.func public @main(%x: tensor<256x256xf32>) -> (tensor<256x256xf32>) {
    %0 = "stablehlo.dot_general"(%x, %x) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>} : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
    %1 = "stablehlo.add"(%0, %x) : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
    "func.return"(%1) : (tensor<256x256xf32>) -> ()
  }
}"#;

/// Runs `ADD_2X3` ten times, each on the previous result, waiting with
/// `poll`; returns the final values.
fn doubling_chain(poll: Duration) -> Vec<f32> {
    let c = client();
    let exe = c.compile(ADD_2X3).unwrap();
    let mut x: Buffer = c
        .buffer_from_host(
            &f32_bytes(&[1., 2., 3., 4., 5., 6.]),
            lazyfuse_ir::DType::F32,
            &[2, 3],
            0,
        )
        .unwrap();
    for _ in 0..10 {
        let (mut outs, done) = exe.launch(&[&x, &x], 0, &[]).unwrap();
        done.wait_polling(poll).unwrap();
        x = outs.remove(0);
    }
    f32_vec(&download(&x))
}

#[test]
fn polled_waits_give_the_blocking_waits_results() {
    let want: Vec<f32> = [1., 2., 3., 4., 5., 6.].iter().map(|v| v * 1024.).collect();
    for poll in [0, 1, 200, 50_000] {
        assert_eq!(
            doubling_chain(Duration::from_micros(poll)),
            want,
            "poll window {poll} us"
        );
    }
}

#[test]
fn an_execution_longer_than_the_window_is_still_awaited() {
    let c = client();
    let exe = c.compile(SQUARE_PLUS).unwrap();
    let host: Vec<f32> = (0..256 * 256)
        .map(|i| ((i % 7) as f32 - 3.0) / 64.0)
        .collect();
    let x = c
        .buffer_from_host(&f32_bytes(&host), lazyfuse_ir::DType::F32, &[256, 256], 0)
        .unwrap();
    let blocking = {
        let (outs, done) = exe.launch(&[&x], 0, &[]).unwrap();
        done.wait().unwrap();
        download(&outs[0])
    };
    // A 1 us window ends long before a 256^3 product: the wait must fall
    // back to the plugin's blocking await, and the arguments must stay
    // valid until it returns.
    for _ in 0..5 {
        let (outs, done) = exe.launch(&[&x], 0, &[]).unwrap();
        done.wait_polling(Duration::from_micros(1)).unwrap();
        assert_eq!(download(&outs[0]), blocking);
    }
}

const CHILD: &str = "LAZYFUSE_WAIT_TEST_CHILD";

/// The child's work: a few dependent steps through the lazy runtime, each
/// read on the host (every read waits for an execution).
#[test]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let d = lazyfuse::Device::cpu().unwrap();
    let mut x = lazyfuse::Tensor::from_slice(&[0.5f32, -1.0, 2.0, 3.5], &[4], &d).unwrap();
    let mut seen = Vec::new();
    for _ in 0..20 {
        x = x.mul(1.5).unwrap().tanh().unwrap().add(0.25).unwrap();
        seen.extend(x.to_vec::<f32>().unwrap());
    }
    let bits: Vec<String> = seen.iter().map(|v| v.to_bits().to_string()).collect();
    println!("values={}", bits.join(","));
}

fn child_values(poll_us: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("LAZYFUSE_WAIT_POLL_US", poll_us)
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{s}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.lines()
        .find_map(|l| l.split_once("values=").map(|(_, v)| v))
        .unwrap_or_else(|| panic!("no values in {s}"))
        .to_string()
}

#[test]
fn the_runtime_gives_the_same_bits_with_polling_off_and_on() {
    let off = child_values("0");
    assert_eq!(off, child_values("100000"));
    assert_eq!(off, child_values("not a number"));
}
