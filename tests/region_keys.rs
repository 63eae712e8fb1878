//! The same program compiles the same regions, flush for flush, in two runs
//! and on two threads: which live tensors a flush writes, which inputs it
//! donates and which scalars it lifts (all part of a region's key) follow
//! from what the program did, never from timing or the thread. Read from
//! the `LAZYFUSE_DUMP_DIR` flush log of child processes, which lists every
//! flush's regions and keys in order.

mod common;
use common::child::{figure, is_child, run_child, tmpdir};
use common::dev;
use common::mlp::{batch, Mlp};
use lazyfuse::optim::{params_of, AdamW, Optimizer};
use lazyfuse::{DType, FusionGuard, Tensor};

/// Natural code whose flushes leave tensors out, recompute them, donate
/// and lift scalars: a layer norm and GELU loop with named locals it never
/// reads, a training loop that reads one gradient late and holds a fresh
/// scalar each step, and pipelined flushes of an upload dropped after.
fn program() {
    let d = dev();
    let x = Tensor::randn(&[16, 32], 3, &d).unwrap();
    let g = Tensor::ones(&[32], DType::F32, &d).unwrap();
    for _ in 0..6 {
        let mu = x.mean([-1], true).unwrap();
        let xc = x.sub(&mu).unwrap();
        let var = xc.mul(&xc).unwrap().mean([-1], true).unwrap();
        let h = xc.div(var.add(1e-5).unwrap().sqrt().unwrap()).unwrap();
        let h = h.mul(&g).unwrap();
        let y = h.gelu().unwrap().add(&x).unwrap();
        y.sum(.., false).unwrap().item::<f32>().unwrap();
    }
    let m = Mlp::new(11);
    let mut opt = AdamW::new(params_of(&m.params()), 0.01, 0.01).unwrap();
    let (xb, yb) = batch(8, 12);
    for step in 0..6 {
        let scale = Tensor::full(1.0 + step as f64 / 10.0, &[], DType::F32, &d).unwrap();
        let loss = m.loss(&xb.mul(&scale).unwrap(), &yb).unwrap();
        opt.zero_grad();
        loss.backward().unwrap();
        opt.step().unwrap();
        if step == 4 {
            let (_, p) = &m.params()[0];
            p.grad()
                .expect("a gradient after backward")
                .to_vec::<f32>()
                .unwrap();
        }
        loss.item::<f32>().unwrap();
    }
    let mut acc = Tensor::zeros(&[64], DType::F32, &d).unwrap();
    for i in 0..4 {
        let up: Vec<f32> = (0..64).map(|k| ((k + i) % 7) as f32).collect();
        let u = Tensor::from_slice(&up, &[64], &d).unwrap();
        acc = acc.add(u.tanh().unwrap()).unwrap();
        lazyfuse::flush();
        drop(u);
    }
    acc.to_vec::<f32>().unwrap();
    lazyfuse::sync();
}

/// Each flush of the log in `dir`: the keys of its regions, in order.
fn flushes(dir: &std::path::Path) -> Vec<Vec<String>> {
    let log = std::fs::read_to_string(dir.join("flush-log.txt")).unwrap();
    let mut out: Vec<Vec<String>> = Vec::new();
    for line in log.lines() {
        if line.starts_with("flush ") {
            out.push(Vec::new());
        } else if let Some(rest) = line.trim_start().strip_prefix("region ") {
            let key = rest.split_whitespace().nth(2).expect("region i key K");
            out.last_mut()
                .expect("a region under a flush")
                .push(key.to_string());
        }
    }
    out
}

#[test]
fn child_region_keys() {
    if !is_child("child_region_keys") {
        return;
    }
    let _f = FusionGuard::new(true);
    let dir = std::env::var("LAZYFUSE_DUMP_DIR").unwrap();
    let on_new_thread = || {
        let b = common::current();
        std::thread::spawn(move || common::with_backend(b, program))
            .join()
            .unwrap();
    };
    on_new_thread();
    let first = flushes(std::path::Path::new(&dir)).len();
    on_new_thread();
    println!("CHILD first_thread_flushes={first}");
    println!("CHILD done=1");
}

/// Two runs of a program on two threads each: the same region keys, flush
/// for flush, on both threads and in both runs.
#[test]
fn the_same_program_gives_the_same_region_keys_in_two_runs_and_on_two_threads() {
    let runs: Vec<(Vec<Vec<String>>, usize)> = (0..2)
        .map(|i| {
            let dir = tmpdir(&format!("keys{i}"));
            let figures = run_child(
                "child_region_keys",
                &[("LAZYFUSE_DUMP_DIR", dir.to_str().unwrap())],
            );
            let log = std::fs::read_to_string(dir.join("flush-log.txt")).unwrap();
            assert!(log.contains("left out"), "nothing was left out:\n{log}");
            let keys = flushes(&dir);
            let _ = std::fs::remove_dir_all(&dir);
            (keys, figure(&figures, "first_thread_flushes") as usize)
        })
        .collect();
    let (keys, first) = &runs[0];
    assert_eq!(keys.len(), 2 * first, "both threads flush as often");
    assert_eq!(keys[..*first], keys[*first..], "the two threads' keys");
    let distinct: std::collections::HashSet<&String> = keys.iter().flatten().collect();
    assert!(
        distinct.len() > 4,
        "a program of several regions: {distinct:?}"
    );
    assert_eq!(runs[0], runs[1], "the two runs' keys");
}
