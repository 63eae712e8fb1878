//! The PJRT binding against the real XLA CPU plugin.

#[path = "common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::Instant;

use common::*;
use lazyfuse_ir::DType;
use lazyfuse_xla::pjrt::{compile_options_bytes, Buffer, Client, ErrorCode, Plugin};

#[test]
fn compile_options_bytes_are_pinned() {
    // executable_build_options { num_replicas: 1 num_partitions: 1 },
    // compile_portable_executable: true, then the env_option_overrides
    // entries (their exact bytes are pinned by the unit test in
    // `xla/src/pjrt/options.rs`).
    let bytes = compile_options_bytes();
    assert!(bytes.starts_with(&[0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01]));
    let has = |s: &[u8]| bytes.windows(s.len()).any(|w| w == s);
    for key in [
        &b"xla_allow_excess_precision"[..],
        b"xla_disable_hlo_passes",
        b"algsimp",
        b"xla_cpu_enable_fast_min_max",
    ] {
        assert!(has(key), "{}", String::from_utf8_lossy(key));
    }
}

#[test]
fn load_checks_version_and_is_idempotent() {
    let p = plugin();
    let (major, minor) = p.api_version();
    assert_eq!(major, 0);
    assert!(minor >= 57, "minor {minor}");
    eprintln!("plugin API version {major}.{minor}");
    // Loading again (even through another path spelling) yields the same plugin,
    // so PJRT_Plugin_Initialize ran once.
    let again = Plugin::load(&plugin_path()).unwrap();
    assert!(Arc::ptr_eq(&p, &again));
    let path = plugin_path();
    let dotted = path
        .parent()
        .unwrap()
        .join(".")
        .join(path.file_name().unwrap());
    assert!(Arc::ptr_eq(&p, &Plugin::load(&dotted).unwrap()));
}

#[test]
fn client_basics() {
    let c = client();
    assert_eq!(c.platform_name().unwrap(), "cpu");
    let v = c.platform_version().unwrap();
    assert!(!v.is_empty());
    assert!(c.addressable_device_count() > 0);
    eprintln!(
        "platform {} / {v}, {} addressable devices",
        c.platform_name().unwrap(),
        c.addressable_device_count()
    );
    // A second, independent client on the same plugin works too, and dropping
    // it does not disturb the shared one.
    let c2 = Client::new(plugin()).unwrap();
    assert_eq!(c2.addressable_device_count(), c.addressable_device_count());
    drop(c2);
    assert_eq!(c.platform_name().unwrap(), "cpu");
}

fn run_add(c: &Client, exe: &lazyfuse_xla::pjrt::LoadedExecutable, device: usize) {
    let a = c
        .buffer_from_host(
            &f32_bytes(&[1., 2., 3., 4., 5., 6.]),
            DType::F32,
            &[2, 3],
            device,
        )
        .unwrap();
    let b = c
        .buffer_from_host(
            &f32_bytes(&[10., 20., 30., 40., 50., 60.]),
            DType::F32,
            &[2, 3],
            device,
        )
        .unwrap();
    let t = Instant::now();
    let outs = exe.execute(&[&a, &b], device).unwrap();
    let dt = t.elapsed();
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].dims().unwrap(), [2, 3]);
    assert_eq!(outs[0].dtype().unwrap(), DType::F32);
    assert!(outs[0].on_device_size().unwrap() >= 24);
    let mut out = vec![0u8; 24];
    outs[0].to_host(&mut out).unwrap();
    assert_eq!(f32_vec(&out), [11., 22., 33., 44., 55., 66.]);
    eprintln!("execute on device {device}: {dt:?}");
    // Arguments are not donated: still readable after the execution.
    assert_eq!(f32_vec(&download(&a)), [1., 2., 3., 4., 5., 6.]);
}

#[test]
fn add_two_matrices_on_every_device() {
    let c = client();
    let t = Instant::now();
    let exe = c.compile(ADD_2X3).unwrap();
    eprintln!("compile add: {:?}", t.elapsed());
    assert_eq!(exe.num_outputs().unwrap(), 1);
    run_add(c, &exe, 0);
    if c.addressable_device_count() >= 2 {
        run_add(c, &exe, 1);
    }
    run_add(c, &exe, c.addressable_device_count() - 1);
}

#[test]
fn execute_checks_devices_and_arguments() {
    let c = client();
    let exe = c.compile(ADD_2X3).unwrap();
    let a = c
        .buffer_from_host(&f32_bytes(&[1.; 6]), DType::F32, &[2, 3], 0)
        .unwrap();
    let n = c.addressable_device_count();

    let e = exe.execute(&[&a, &a], n).unwrap_err();
    assert!(e.message.contains("out of range"), "{e}");
    assert_eq!(e.code, None);

    // Wrong argument count.
    let e = exe.execute(&[&a], 0).unwrap_err();
    assert!(e.code.is_some(), "{e}");
    eprintln!("wrong arg count: {e}");

    // Wrong byte size (shape or dtype): rejected by the plugin.
    let small = c
        .buffer_from_host(&f32_bytes(&[1.; 2]), DType::F32, &[2], 0)
        .unwrap();
    let e = exe.execute(&[&a, &small], 0).unwrap_err();
    assert_eq!(e.code, Some(ErrorCode::InvalidArgument), "{e}");
    eprintln!("wrong size: {e}");
    let wide = c
        .buffer_from_host(&[0u8; 48], DType::F64, &[2, 3], 0)
        .unwrap();
    let e = exe.execute(&[&a, &wide], 0).unwrap_err();
    assert_eq!(e.code, Some(ErrorCode::InvalidArgument), "{e}");
    // Same byte size, different shape or dtype: the plugin only checks byte
    // sizes, so this runs (reinterpreting the bytes). Documented limitation;
    // the caller must pass what it compiled for.
    let same_size = c
        .buffer_from_host(&f32_bytes(&[1.; 6]), DType::F32, &[3, 2], 0)
        .unwrap();
    eprintln!(
        "same-size wrong shape: {:?}",
        exe.execute(&[&a, &same_size], 0).map(|o| o.len())
    );

    // Arguments must live on the execution device.
    if n >= 2 {
        let e = exe.execute(&[&a, &a], 1).unwrap_err();
        assert_eq!(e.code, Some(ErrorCode::InvalidArgument), "{e}");
        eprintln!("argument on another device: {e}");
    }

    // A buffer from another client is rejected before reaching the plugin.
    let other = Client::new(plugin()).unwrap();
    let foreign = other
        .buffer_from_host(&f32_bytes(&[1.; 6]), DType::F32, &[2, 3], 0)
        .unwrap();
    let e = exe.execute(&[&a, &foreign], 0).unwrap_err();
    assert!(e.message.contains("different client"), "{e}");

    // Still works afterwards.
    run_add(c, &exe, 0);
}

#[test]
fn upload_and_download_size_checks() {
    let c = client();
    let e = c
        .buffer_from_host(&[0u8; 20], DType::F32, &[2, 3], 0)
        .unwrap_err();
    assert!(e.message.contains("needs exactly 24"), "{e}");
    let e = c
        .buffer_from_host(&[0u8; 24], DType::F32, &[2, 3], 999)
        .unwrap_err();
    assert!(e.message.contains("out of range"), "{e}");
    let e = c
        .buffer_from_host(&[], DType::F32, &[usize::MAX, 2], 0)
        .unwrap_err();
    assert!(e.message.contains("overflow"), "{e}");

    let b = c
        .buffer_from_host(&f32_bytes(&[1.; 6]), DType::F32, &[2, 3], 0)
        .unwrap();
    let e = b.to_host(&mut [0u8; 23]).unwrap_err();
    assert!(e.message.contains("needs exactly 24"), "{e}");
    let e = b.to_host(&mut [0u8; 25]).unwrap_err();
    assert!(e.message.contains("needs exactly 24"), "{e}");
    assert_eq!(f32_vec(&download(&b)), [1.; 6]);
}

#[test]
fn every_dtype_round_trips() {
    let c = client();
    for dtype in DType::ALL {
        let n = 5;
        let bytes: Vec<u8> = match dtype {
            DType::Bool => vec![1, 0, 0, 1, 1],
            DType::BF16 => bf16_bytes(&[1.5, -2.0, 0.0, 3.25, 1e10]),
            _ => (0..n * dtype.size_in_bytes())
                .map(|i| (i * 37 % 251) as u8)
                .collect(),
        };
        let dev = c.addressable_device_count() - 1;
        let b = c.buffer_from_host(&bytes, dtype, &[n], dev).unwrap();
        assert_eq!(b.dtype().unwrap(), dtype);
        assert_eq!(b.dims().unwrap(), [n]);
        assert_eq!(download(&b), bytes, "{dtype}");
    }
}

#[test]
fn rank0_scalars() {
    let c = client();
    let exe = c
        .compile(
            r#"module @m {
  func.func public @main(%a: tensor<f32>, %b: tensor<f32>) -> (tensor<f32>) {
    %0 = "stablehlo.multiply"(%a, %b) : (tensor<f32>, tensor<f32>) -> tensor<f32>
    "func.return"(%0) : (tensor<f32>) -> ()
  }
}"#,
        )
        .unwrap();
    let a = c
        .buffer_from_host(&2.5f32.to_le_bytes(), DType::F32, &[], 0)
        .unwrap();
    let b = c
        .buffer_from_host(&4.0f32.to_le_bytes(), DType::F32, &[], 0)
        .unwrap();
    assert_eq!(a.dims().unwrap(), Vec::<usize>::new());
    let outs = exe.execute(&[&a, &b], 0).unwrap();
    assert_eq!(outs[0].dims().unwrap(), Vec::<usize>::new());
    assert_eq!(f32_vec(&download(&outs[0])), [10.0]);
}

#[test]
fn zero_size_tensors() {
    let c = client();
    for dims in [vec![0usize], vec![2, 0, 3], vec![0, 0]] {
        let b = c.buffer_from_host(&[], DType::F32, &dims, 0).unwrap();
        assert_eq!(b.dims().unwrap(), dims);
        b.to_host(&mut []).unwrap();
        assert!(b.to_host(&mut [0u8; 4]).is_err());
    }
    let exe = c
        .compile(
            r#"module @m {
  func.func public @main(%a: tensor<2x0xf32>) -> (tensor<2x0xf32>, tensor<0xi32>) {
    %0 = "stablehlo.negate"(%a) : (tensor<2x0xf32>) -> tensor<2x0xf32>
    %1 = "stablehlo.constant"() {value = dense<> : tensor<0xi32>} : () -> tensor<0xi32>
    "func.return"(%0, %1) : (tensor<2x0xf32>, tensor<0xi32>) -> ()
  }
}"#,
        )
        .unwrap();
    assert_eq!(exe.num_outputs().unwrap(), 2);
    let dev = c.addressable_device_count() - 1;
    let a = c.buffer_from_host(&[], DType::F32, &[2, 0], dev).unwrap();
    let outs = exe.execute(&[&a], dev).unwrap();
    assert_eq!(outs[0].dims().unwrap(), [2, 0]);
    assert_eq!(outs[1].dims().unwrap(), [0]);
    assert_eq!(outs[1].dtype().unwrap(), DType::I32);
    for o in &outs {
        o.to_host(&mut []).unwrap();
    }
}

#[test]
fn bool_and_bf16_programs() {
    let c = client();
    let exe = c
        .compile(
            r#"module @m {
  func.func public @main(%p: tensor<4xi1>, %x: tensor<4xbf16>, %y: tensor<4xbf16>) -> (tensor<4xi1>, tensor<4xbf16>, tensor<4xi1>) {
    %0 = "stablehlo.not"(%p) : (tensor<4xi1>) -> tensor<4xi1>
    %1 = "stablehlo.add"(%x, %y) : (tensor<4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
    %2 = "stablehlo.compare"(%x, %y) {comparison_direction = #stablehlo<comparison_direction LT>} : (tensor<4xbf16>, tensor<4xbf16>) -> tensor<4xi1>
    "func.return"(%0, %1, %2) : (tensor<4xi1>, tensor<4xbf16>, tensor<4xi1>) -> ()
  }
}"#,
        )
        .unwrap();
    assert_eq!(exe.num_outputs().unwrap(), 3);
    let p = c
        .buffer_from_host(&[1, 0, 0, 1], DType::Bool, &[4], 0)
        .unwrap();
    let x = c
        .buffer_from_host(&bf16_bytes(&[1.5, -2.0, 8.0, 0.25]), DType::BF16, &[4], 0)
        .unwrap();
    let y = c
        .buffer_from_host(&bf16_bytes(&[0.5, 4.0, -8.0, 0.5]), DType::BF16, &[4], 0)
        .unwrap();
    let outs = exe.execute(&[&p, &x, &y], 0).unwrap();
    assert_eq!(outs[0].dtype().unwrap(), DType::Bool);
    assert_eq!(download(&outs[0]), [0, 1, 1, 0]);
    assert_eq!(outs[1].dtype().unwrap(), DType::BF16);
    assert_eq!(bf16_vec(&download(&outs[1])), [2.0, 2.0, 0.0, 0.75]);
    assert_eq!(download(&outs[2]), [0, 1, 0, 1]);
}

#[test]
fn multiple_outputs_and_zero_arguments() {
    let c = client();
    let exe = c
        .compile(
            r#"module @m {
  func.func public @main() -> (tensor<2xi32>, tensor<f32>, tensor<3xi64>) {
    %0 = "stablehlo.constant"() {value = dense<[7, -8]> : tensor<2xi32>} : () -> tensor<2xi32>
    %1 = "stablehlo.constant"() {value = dense<1.25> : tensor<f32>} : () -> tensor<f32>
    %2 = "stablehlo.iota"() {iota_dimension = 0 : i64} : () -> tensor<3xi64>
    "func.return"(%0, %1, %2) : (tensor<2xi32>, tensor<f32>, tensor<3xi64>) -> ()
  }
}"#,
        )
        .unwrap();
    assert_eq!(exe.num_outputs().unwrap(), 3);
    for dev in [0, c.addressable_device_count() - 1] {
        let outs = exe.execute(&[], dev).unwrap();
        assert_eq!(outs.len(), 3);
        assert_eq!(i32_vec(&download(&outs[0])), [7, -8]);
        assert_eq!(f32_vec(&download(&outs[1])), [1.25]);
        let i64s: Vec<i64> = download(&outs[2])
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(i64s, [0, 1, 2]);
    }
}

#[test]
fn pretty_syntax_and_transposed_output_layout() {
    // Outputs come back dense row-major even when XLA picks the layout.
    let c = client();
    let exe = c
        .compile(
            r#"module @m {
  func.func public @main(%a: tensor<2x3xi32>) -> tensor<3x2xi32> {
    %0 = stablehlo.transpose %a, dims = [1, 0] : (tensor<2x3xi32>) -> tensor<3x2xi32>
    return %0 : tensor<3x2xi32>
  }
}"#,
        )
        .unwrap();
    let a = c
        .buffer_from_host(&i32_bytes(&[1, 2, 3, 4, 5, 6]), DType::I32, &[2, 3], 0)
        .unwrap();
    let outs = exe.execute(&[&a], 0).unwrap();
    assert_eq!(outs[0].dims().unwrap(), [3, 2]);
    assert_eq!(i32_vec(&download(&outs[0])), [1, 4, 2, 5, 3, 6]);
}

#[test]
fn bad_modules_are_errors_and_client_survives() {
    let c = client();
    for (what, text) in [
        ("syntax", "module @m { this is not mlir }"),
        ("empty", ""),
        (
            "type error",
            r#"module @m {
  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>) -> (tensor<2x3xf32>) {
    %0 = "stablehlo.add"(%a, %b) : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x3xf32>
    "func.return"(%0) : (tensor<2x3xf32>) -> ()
  }
}"#,
        ),
        (
            "unknown op",
            r#"module @m {
  func.func public @main(%a: tensor<f32>) -> (tensor<f32>) {
    %0 = "stablehlo.frobnicate"(%a) : (tensor<f32>) -> tensor<f32>
    "func.return"(%0) : (tensor<f32>) -> ()
  }
}"#,
        ),
        (
            "no main",
            r#"module @m {
  func.func public @other(%a: tensor<f32>) -> (tensor<f32>) {
    "func.return"(%a) : (tensor<f32>) -> ()
  }
}"#,
        ),
    ] {
        match c.compile(text) {
            Err(e) => {
                assert!(e.code.is_some(), "{what}: {e}");
                assert!(
                    e.message.starts_with("PJRT_Client_Compile: "),
                    "{what}: {e}"
                );
                assert!(
                    e.message.len() > "PJRT_Client_Compile: ".len() + 5,
                    "{what}: {e}"
                );
                eprintln!("{what}: {e}");
            }
            Ok(_) => panic!("{what}: compiled"),
        }
    }
    let exe = c.compile(ADD_2X3).unwrap();
    run_add(c, &exe, 0);
}

#[test]
fn serialize_deserialize_execute() {
    let c = client();
    let exe = c.compile(ADD_2X3).unwrap();
    let bytes = exe.serialize().unwrap();
    eprintln!("serialized executable: {} bytes", bytes.len());
    drop(exe);
    let t = Instant::now();
    let loaded = c.deserialize_executable(&bytes).unwrap();
    eprintln!("deserialize: {:?}", t.elapsed());
    assert_eq!(loaded.num_outputs().unwrap(), 1);
    run_add(c, &loaded, 0);
    if c.addressable_device_count() >= 2 {
        run_add(c, &loaded, 1);
    }
    // Round-trips again: a deserialized executable serializes to the bytes it
    // came from (the plugin's own re-serialization loses the machine code).
    let reserialized = loaded.serialize().unwrap();
    assert_eq!(reserialized, bytes);
    let again = c.deserialize_executable(&reserialized).unwrap();
    run_add(c, &again, 0);

    let e = c
        .deserialize_executable(b"definitely not an executable")
        .unwrap_err();
    assert!(e.code.is_some(), "{e}");
    eprintln!("garbage executable: {e}");
    let e = c
        .deserialize_executable(&bytes[..bytes.len() / 2])
        .unwrap_err();
    eprintln!("truncated executable: {e}");
    run_add(c, &loaded, 0);
}

#[test]
fn load_errors_are_clear() {
    let missing = std::path::Path::new("/nonexistent/dir/xla_cpu_pjrt.so");
    let e = Plugin::load(missing).unwrap_err();
    assert!(
        e.message.contains("/nonexistent/dir/xla_cpu_pjrt.so"),
        "{e}"
    );
    assert!(e.message.contains("No such file"), "{e}");
    eprintln!("missing: {e}");

    let e = Plugin::load(std::path::Path::new("/tmp")).unwrap_err();
    assert!(e.message.contains("not a regular file"), "{e}");

    let e = Plugin::load(std::path::Path::new("/bin/ls")).unwrap_err();
    assert!(e.message.contains("/bin/ls"), "{e}");
    eprintln!("/bin/ls: {e}");

    let dir = TempDir::new("load");
    let text = dir.path().join("plugin.so");
    std::fs::write(&text, "this is a text file, not a shared library\n").unwrap();
    let e = Plugin::load(&text).unwrap_err();
    assert!(e.message.contains("dynamic loader rejected"), "{e}");
    eprintln!("text file: {e}");

    // A genuine shared library that is not a PJRT plugin.
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .map(std::path::Path::new)
    .find(|p| p.exists());
    if let Some(libm) = libm {
        let e = Plugin::load(libm).unwrap_err();
        assert!(e.message.contains("not a PJRT plugin"), "{e}");
        eprintln!("libm: {e}");
    }
}

#[test]
fn concurrent_executions() {
    let c = client();
    let exe = Arc::new(c.compile(ADD_2X3).unwrap());
    let n = c.addressable_device_count();
    std::thread::scope(|s| {
        for t in 0..4 {
            let exe = Arc::clone(&exe);
            s.spawn(move || {
                for i in 0..50 {
                    run_add_quiet(c, &exe, (t + i) % n);
                }
            });
        }
    });
}

fn run_add_quiet(c: &Client, exe: &lazyfuse_xla::pjrt::LoadedExecutable, device: usize) {
    let a = c
        .buffer_from_host(
            &f32_bytes(&[1., 2., 3., 4., 5., 6.]),
            DType::F32,
            &[2, 3],
            device,
        )
        .unwrap();
    let outs: Vec<Buffer> = exe.execute(&[&a, &a], device).unwrap();
    assert_eq!(f32_vec(&download(&outs[0])), [2., 4., 6., 8., 10., 12.]);
}

#[test]
fn buffers_and_executables_outlive_their_client_handle() {
    let c = Client::new(plugin()).unwrap();
    let exe = c.compile(ADD_2X3).unwrap();
    let a = c
        .buffer_from_host(&f32_bytes(&[1.; 6]), DType::F32, &[2, 3], 0)
        .unwrap();
    drop(c);
    let outs = exe.execute(&[&a, &a], 0).unwrap();
    assert_eq!(f32_vec(&download(&outs[0])), [2.; 6]);
}

#[test]
fn error_display_includes_code() {
    let e = client().compile("nonsense").unwrap_err();
    let shown = e.to_string();
    assert!(shown.starts_with("PJRT_Client_Compile: "), "{shown}");
    assert!(
        shown.ends_with(&format!("[{}]", e.code.unwrap())),
        "{shown}"
    );
}

/// The CPU plugin's buffers are host memory: `to_host` copies them in
/// place (no asynchronous plugin copy), for every dtype, rank 0, an empty
/// array, an executable's output, and from several threads at once, with
/// the same bytes the plugin's own copy gives.
#[test]
fn host_reads_of_cpu_buffers_are_in_place() {
    use lazyfuse_xla::pjrt::HostCopy;
    let c = client();
    let cases: Vec<(DType, Vec<usize>, Vec<u8>)> = vec![
        (
            DType::F32,
            vec![2, 3],
            f32_bytes(&[1.5, -2., 3., 4., 5., 6.25]),
        ),
        (DType::BF16, vec![4], bf16_bytes(&[1., -0.5, 2., 3.])),
        (DType::I32, vec![3, 1], i32_bytes(&[7, -8, 9])),
        (DType::Bool, vec![5], vec![1, 0, 0, 1, 1]),
        (DType::U8, vec![2, 2, 2], (0..8).collect()),
        (DType::F32, vec![], f32_bytes(&[42.])),
        (DType::F32, vec![0, 3], vec![]),
    ];
    for (dtype, dims, bytes) in &cases {
        let b = c.buffer_from_host(bytes, *dtype, dims, 0).unwrap();
        let mut out = vec![0xAAu8; bytes.len()];
        assert_eq!(
            b.to_host(&mut out).unwrap(),
            HostCopy::InPlace,
            "{dtype}{dims:?}"
        );
        assert_eq!(&out, bytes, "{dtype}{dims:?}");
    }
    let out = Arc::new(doubled_1_to_6(c));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let out = out.clone();
            std::thread::spawn(move || {
                let mut got = vec![0u8; 24];
                let how = out.to_host(&mut got).unwrap();
                (how, f32_vec(&got))
            })
        })
        .collect();
    for r in readers {
        let (how, got) = r.join().unwrap();
        assert_eq!(how, HostCopy::InPlace);
        assert_eq!(got, [2., 4., 6., 8., 10., 12.]);
    }
}
