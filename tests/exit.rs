//! Process exit while another thread's work is still compiling: `main`
//! returns without touching a device, a worker's first compiles are in
//! flight, and the process must still end cleanly. The plugin registers
//! the destructors of statics its compiles create with `atexit`; before
//! the drain ran from the main thread's thread-local destructors, exit
//! destroyed them under the running compile and about half of these
//! children crashed (SIGSEGV in MLIR's type registry).

use lazyfuse::{Device, Tensor};
use std::process::Command;
use std::time::Duration;

const CHILD: &str = "LAZYFUSE_EXIT_TEST_CHILD";

/// The child: a worker flushes four fresh programs without waiting and
/// sleeps holding their results; the test thread returns 20 ms later and
/// the harness exits the process while they compile.
#[test]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let dev = Device::cpu().unwrap();
        let x = Tensor::randn(&[64, 64], 1, &dev).unwrap();
        let mut keep = Vec::new();
        for k in 0..4 {
            let mut y = x.tanh().unwrap();
            for _ in 0..30 + k {
                y = y.matmul(&x).unwrap().tanh().unwrap().add(&x).unwrap();
            }
            keep.push(y.sum([-1], false).unwrap());
            lazyfuse::flush();
        }
        tx.send(()).unwrap();
        std::thread::sleep(Duration::from_secs(120));
        drop(keep);
    });
    rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(20));
}

#[test]
fn exit_waits_for_a_worker_threads_compiles() {
    for run in 0..4 {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "run {run}: {:?}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
