//! Shared helpers for the PJRT tests: the plugin under test and host-byte codecs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use lazyfuse_xla::pjrt::{Client, Plugin};

/// The default (provisioned) plugin; override with PJRT_TEST_PLUGIN.
pub fn plugin_path() -> PathBuf {
    std::env::var_os("PJRT_TEST_PLUGIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            lazyfuse_xla::plugin::default_plugin_path().expect("provision the CPU plugin")
        })
}

pub fn plugin() -> Arc<Plugin> {
    static P: OnceLock<Arc<Plugin>> = OnceLock::new();
    P.get_or_init(|| Plugin::load(&plugin_path()).expect("load plugin"))
        .clone()
}

/// One client shared by all tests of a binary (PJRT clients are thread-safe,
/// and the tests run on several threads, which exercises that).
pub fn client() -> &'static Client {
    static C: OnceLock<Client> = OnceLock::new();
    C.get_or_init(|| Client::new(plugin()).expect("create client"))
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn f32_vec(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn i32_vec(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// bf16 = the high half of an f32 (exact for the values used in tests).
pub fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
        .collect()
}

pub fn bf16_vec(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|c| f32::from_bits((u16::from_le_bytes(c.try_into().unwrap()) as u32) << 16))
        .collect()
}

/// Uploads `v` as an f32 array of `dims` to `device`.
pub fn upload_f32(
    c: &lazyfuse_xla::pjrt::Client,
    v: &[f32],
    dims: &[usize],
    device: usize,
) -> lazyfuse_xla::pjrt::Buffer {
    c.buffer_from_host(&f32_bytes(v), lazyfuse_ir::DType::F32, dims, device)
        .unwrap()
}

/// Downloads a buffer into a fresh, correctly sized vector.
pub fn download(b: &lazyfuse_xla::pjrt::Buffer) -> Vec<u8> {
    let n: usize = b.dims().unwrap().iter().product::<usize>() * b.dtype().unwrap().size_in_bytes();
    let mut out = vec![0u8; n];
    b.to_host(&mut out).unwrap();
    out
}

/// `%a + %b` on two tensor<2x3xf32>.
pub const ADD_2X3: &str = r#"module @m {
  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> (tensor<2x3xf32>) {
    %0 = "stablehlo.add"(%a, %b) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    "func.return"(%0) : (tensor<2x3xf32>) -> ()
  }
}"#;

/// A unique, empty scratch directory (removed by `TempDir::drop`).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "pjrtdev-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `ADD_2X3` compiled on `c` and run on `[1, ..., 6]` twice over: the
/// buffer holding `[2, 4, ..., 12]`.
pub fn doubled_1_to_6(c: &Client) -> lazyfuse_xla::pjrt::Buffer {
    let exe = c.compile(ADD_2X3).unwrap();
    let a = c
        .buffer_from_host(
            &f32_bytes(&[1., 2., 3., 4., 5., 6.]),
            lazyfuse_ir::DType::F32,
            &[2, 3],
            0,
        )
        .unwrap();
    exe.execute(&[&a, &a], 0).unwrap().remove(0)
}
