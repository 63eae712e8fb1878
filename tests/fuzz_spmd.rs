//! Differential fuzzing of sharded programs (issue 12): random programs of
//! the op fuzzer (`tests/fuzz_ops.rs`) run with each input split over a
//! mesh of logical CPU devices by a random sharding (rows, columns, both,
//! or replicated; one input in three also constrained to another split
//! inside the program), fused and unfused, and every value they observe is
//! checked against the reference interpreter with the fuzzer's tolerances
//! (XLA's partitioned reductions sum in another order; the oracle allows
//! any). `LAZYFUSE_FUZZ_SPMD_CASES` sets the program count (CI: 48),
//! `LAZYFUSE_FUZZ_SPMD_SEED` another set of programs.

mod fuzz_support;

use fuzz_support::oracle::{run_placed, verify};
use fuzz_support::values::Rng;
use fuzz_support::{build, random_genes};
use lazyfuse::{Device, Mesh, Tensor};
use std::cell::Cell;

/// A random spec for `dims` over `mesh`: each dimension split over an
/// axis not used yet that divides it, with probability one half.
fn random_spec(rng: &mut Rng, dims: &[usize], mesh: &Mesh) -> Vec<Option<String>> {
    let axes: Vec<(String, usize)> = mesh.axes().map(|(a, s)| (a.to_string(), s)).collect();
    let mut used = vec![false; axes.len()];
    dims.iter()
        .map(|&n| {
            if rng.below(2) == 0 {
                return None;
            }
            let a = rng.below(axes.len());
            (!used[a] && n % axes[a].1 == 0).then(|| {
                used[a] = true;
                axes[a].0.clone()
            })
        })
        .collect()
}

#[test]
fn random_programs_on_sharded_inputs_match_the_interpreter() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let cases = env("LAZYFUSE_FUZZ_SPMD_CASES").unwrap_or(48) as usize;
    let seed = env("LAZYFUSE_FUZZ_SPMD_SEED").unwrap_or(0);
    let dev = Device::cpu_with_devices(4).unwrap();
    let meshes = [
        Mesh::new(&dev, &[("dp", 4)]).unwrap(),
        Mesh::new(&dev, &[("dp", 2), ("tp", 2)]).unwrap(),
    ];
    let split = Cell::new(0usize);
    for i in 0..cases {
        let mut rng = Rng::new(
            0x5eed_5bd0 ^ seed.rotate_left(32) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        let n = 1 + rng.below(12);
        let program = build(&random_genes(&mut rng, n));
        let mesh = &meshes[i % 2];
        let place = |k: usize, t: Tensor| {
            let mut r = Rng::new(seed ^ ((i as u64) << 16 | k as u64));
            let spec = random_spec(&mut r, t.dims(), mesh);
            if spec.iter().any(Option::is_some) {
                split.set(split.get() + 1);
            }
            let spec: Vec<Option<&str>> = spec.iter().map(|s| s.as_deref()).collect();
            let placed = t.shard(mesh, &spec)?;
            // One input in three is also constrained to another random
            // split inside the program (an identity that moves it).
            if r.below(3) != 0 {
                return Ok(placed);
            }
            let other = random_spec(&mut r, placed.dims(), mesh);
            let other: Vec<Option<&str>> = other.iter().map(|s| s.as_deref()).collect();
            placed.with_sharding_constraint(mesh, &other)
        };
        for fuse in [true, false] {
            if !fuse && i % 4 != 0 {
                continue;
            }
            let run = if fuse { "fused" } else { "unfused" };
            let seen = run_placed(&program, &dev, fuse, true, &place).unwrap_or_else(|e| {
                panic!(
                    "program {i} over {mesh}, {run}: {e}\n{}",
                    program.to_rust_test("sharded")
                )
            });
            verify(&program, &seen).unwrap_or_else(|e| {
                panic!(
                    "program {i} over {mesh}, {run}: {e}\n{}",
                    program.to_rust_test("sharded")
                )
            });
        }
    }
    assert!(
        split.get() >= cases / 4,
        "only {} inputs split",
        split.get()
    );
}
