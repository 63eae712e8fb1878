//! Repeated upload/execute/download/drop cycles must not grow the process.
//! Its own test binary (one process) so other tests do not disturb RSS.

#[path = "common/mod.rs"]
mod common;

use std::time::Instant;

use common::*;
use lazyfuse_ir::DType;

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

const ADD_16K: &str = r#"module @m {
  func.func public @main(%a: tensor<128x128xf32>, %b: tensor<128x128xf32>) -> (tensor<128x128xf32>) {
    %0 = "stablehlo.add"(%a, %b) : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
    "func.return"(%0) : (tensor<128x128xf32>) -> ()
  }
}"#;

#[test]
fn cycles_do_not_leak() {
    let c = client();
    let exe = c.compile(ADD_16K).unwrap();
    let host = f32_bytes(&vec![1.5f32; 128 * 128]); // 64 KiB per buffer
    let mut out = vec![0u8; host.len()];
    let n = c.addressable_device_count();
    let cycle = |i: usize, out: &mut [u8]| {
        let dev = i % n;
        let a = c
            .buffer_from_host(&host, DType::F32, &[128, 128], dev)
            .unwrap();
        let b = c
            .buffer_from_host(&host, DType::F32, &[128, 128], dev)
            .unwrap();
        let outs = exe.execute(&[&a, &b], dev).unwrap();
        outs[0].to_host(out).unwrap();
    };
    for i in 0..200 {
        cycle(i, &mut out);
    }
    let before = rss_bytes();
    let t = Instant::now();
    for i in 0..1000 {
        cycle(i, &mut out);
    }
    let elapsed = t.elapsed();
    let after = rss_bytes();
    assert_eq!(f32_vec(&out[..8]), [3.0, 3.0]);
    let growth = after as isize - before as isize;
    eprintln!(
        "1000 cycles (3 x 64 KiB buffers each) in {elapsed:?}: RSS {} -> {} KiB ({growth:+} bytes)",
        before / 1024,
        after / 1024
    );
    // Leaking one 64 KiB buffer per cycle would be ~64 MB.
    assert!(growth < 8 << 20, "RSS grew by {growth} bytes");

    // Compile / serialize / deserialize / drop cycles.
    for _ in 0..5 {
        drop(
            c.deserialize_executable(&c.compile(ADD_2X3).unwrap().serialize().unwrap())
                .unwrap(),
        );
    }
    let before = rss_bytes();
    let t = Instant::now();
    for _ in 0..100 {
        let e = c.compile(ADD_2X3).unwrap();
        let d = c.deserialize_executable(&e.serialize().unwrap()).unwrap();
        drop((e, d));
    }
    let after = rss_bytes();
    let growth = after as isize - before as isize;
    eprintln!(
        "100 compile+serialize+deserialize cycles in {:?}: RSS {} -> {} KiB ({growth:+} bytes)",
        t.elapsed(),
        before / 1024,
        after / 1024
    );
    assert!(growth < 16 << 20, "RSS grew by {growth} bytes");
}
