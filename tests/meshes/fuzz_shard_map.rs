//! Differential fuzzing of manual regions (issue 12): random chains of
//! collectives (`all_reduce` with each reduction, `all_gather`,
//! `reduce_scatter`) and local ops on random inputs, specs and out specs,
//! over 1-D and 2-D meshes, run fused and unfused and checked against a
//! host simulation that keeps one array per device and exchanges them as
//! each collective's definition says. A result that differs across an axis
//! its out spec does not name must be an `Err`. `LAZYFUSE_FUZZ_SHARD_MAP_CASES`
//! sets the case count (CI: 16), `LAZYFUSE_FUZZ_SHARD_MAP_SEED` another set.

use crate::spmd_support::{close, data};
use lazyfuse::ir::SplitMix64;
use lazyfuse::{Device, FusionGuard, Local, Mesh, Reduction, Tensor};

/// A row-major host array.
#[derive(Clone, Debug)]
struct H {
    dims: Vec<usize>,
    v: Vec<f32>,
}

impl H {
    fn at(&self, idx: &[usize]) -> f32 {
        self.v[offset(&self.dims, idx)]
    }

    /// Block `i` of `n` equal blocks along `d`.
    fn block(&self, d: usize, n: usize, i: usize) -> H {
        let mut dims = self.dims.clone();
        dims[d] /= n;
        let v = each(&dims)
            .map(|mut idx| {
                idx[d] += i * dims[d];
                self.at(&idx)
            })
            .collect();
        H { dims, v }
    }

    /// `parts` concatenated along `d`.
    fn concat(parts: &[H], d: usize) -> H {
        let m = parts[0].dims[d];
        let mut dims = parts[0].dims.clone();
        dims[d] *= parts.len();
        let v = each(&dims)
            .map(|mut idx| {
                let p = idx[d] / m;
                idx[d] %= m;
                parts[p].at(&idx)
            })
            .collect();
        H { dims, v }
    }

    /// `parts` combined elementwise.
    fn combine(parts: &[&H], op: Reduction) -> H {
        let n = parts.len() as f32;
        let v = (0..parts[0].v.len())
            .map(|k| {
                let xs = parts.iter().map(|p| p.v[k]);
                match op {
                    Reduction::Sum => xs.sum(),
                    Reduction::Mean => xs.sum::<f32>() / n,
                    Reduction::Max => xs.fold(f32::MIN, f32::max),
                    Reduction::Min => xs.fold(f32::MAX, f32::min),
                }
            })
            .collect();
        H {
            dims: parts[0].dims.clone(),
            v,
        }
    }
}

fn offset(dims: &[usize], idx: &[usize]) -> usize {
    dims.iter().zip(idx).fold(0, |o, (&n, &i)| o * n + i)
}

/// Every index of an array of `dims`, row-major.
fn each(dims: &[usize]) -> impl Iterator<Item = Vec<usize>> + '_ {
    let total: usize = dims.iter().product();
    (0..total).map(move |mut k| {
        let mut idx = vec![0; dims.len()];
        for d in (0..dims.len()).rev() {
            idx[d] = k % dims[d];
            k /= dims[d];
        }
        idx
    })
}

/// One step of a program.
#[derive(Clone, Copy, Debug)]
enum Step {
    AllReduce(usize, Reduction),
    AllGather(usize, usize),
    ReduceScatter(usize, usize),
    Tanh,
}

/// Every device's piece, and the mesh axes along which they may differ.
struct Sim {
    sizes: Vec<usize>,
    pieces: Vec<H>,
    varies: Vec<bool>,
}

impl Sim {
    fn coords(&self, p: usize) -> Vec<usize> {
        let mut c = vec![0; self.sizes.len()];
        let mut p = p;
        for a in (0..self.sizes.len()).rev() {
            c[a] = p % self.sizes[a];
            p /= self.sizes[a];
        }
        c
    }

    /// The devices along axis `a` through device `p`, in coordinate order.
    fn group(&self, p: usize, a: usize) -> Vec<usize> {
        let c = self.coords(p);
        (0..self.sizes[a])
            .map(|i| {
                let mut c = c.clone();
                c[a] = i;
                offset(&self.sizes, &c)
            })
            .collect()
    }

    fn step(&mut self, s: Step) {
        let n = self.pieces.len();
        let new: Vec<H> = (0..n)
            .map(|p| match s {
                Step::AllReduce(a, op) => {
                    let g: Vec<&H> = self.group(p, a).iter().map(|&q| &self.pieces[q]).collect();
                    H::combine(&g, op)
                }
                Step::AllGather(a, d) => {
                    let g: Vec<H> = self
                        .group(p, a)
                        .iter()
                        .map(|&q| self.pieces[q].clone())
                        .collect();
                    H::concat(&g, d)
                }
                Step::ReduceScatter(a, d) => {
                    let g: Vec<&H> = self.group(p, a).iter().map(|&q| &self.pieces[q]).collect();
                    H::combine(&g, Reduction::Sum).block(d, self.sizes[a], self.coords(p)[a])
                }
                Step::Tanh => H {
                    dims: self.pieces[p].dims.clone(),
                    v: self.pieces[p].v.iter().map(|x| x.tanh()).collect(),
                },
            })
            .collect();
        self.pieces = new;
        match s {
            Step::AllReduce(a, _) | Step::AllGather(a, _) => self.varies[a] = false,
            Step::ReduceScatter(a, _) => self.varies[a] = true,
            Step::Tanh => {}
        }
    }

    /// The global result assembled as `out` (an axis per piece dimension).
    fn assemble(&self, out: &[Option<usize>]) -> H {
        let local = &self.pieces[0].dims;
        let dims: Vec<usize> = local
            .iter()
            .zip(out)
            .map(|(&m, a)| a.map_or(m, |a| m * self.sizes[a]))
            .collect();
        let v = each(&dims)
            .map(|idx| {
                let mut c = vec![0; self.sizes.len()];
                let mut l = idx.clone();
                for (d, a) in out.iter().enumerate() {
                    if let Some(a) = *a {
                        c[a] = idx[d] / local[d];
                        l[d] = idx[d] % local[d];
                    }
                }
                self.pieces[offset(&self.sizes, &c)].at(&l)
            })
            .collect();
        H { dims, v }
    }
}

fn apply(x: &Local, s: Step, names: &[&str]) -> lazyfuse::Result<Local> {
    match s {
        Step::AllReduce(a, op) => x.all_reduce(names[a], op),
        Step::AllGather(a, d) => x.all_gather(names[a], d as isize),
        Step::ReduceScatter(a, d) => x.reduce_scatter(names[a], d as isize),
        Step::Tanh => x.map(|t| t.tanh()),
    }
}

#[test]
fn random_collective_chains_match_a_host_simulation() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let cases = env("LAZYFUSE_FUZZ_SHARD_MAP_CASES").unwrap_or(16);
    let seed = env("LAZYFUSE_FUZZ_SHARD_MAP_SEED").unwrap_or(0);
    let dev = Device::cpu_with_devices(8).unwrap();
    let meshes: [(&[(&str, usize)], Mesh); 3] = [
        (&[("dp", 4)], Mesh::new(&dev, &[("dp", 4)]).unwrap()),
        (
            &[("dp", 2), ("tp", 2)],
            Mesh::new(&dev, &[("dp", 2), ("tp", 2)]).unwrap(),
        ),
        (
            &[("dp", 2), ("tp", 4)],
            Mesh::new(&dev, &[("dp", 2), ("tp", 4)]).unwrap(),
        ),
    ];
    let (mut checked, mut refused) = (0, 0);
    for case in 0..cases {
        let mut rng = SplitMix64(seed.rotate_left(17) ^ case.wrapping_mul(SplitMix64::GAMMA));
        let mut below = |n: usize| rng.below(n);
        let (axes, mesh) = &meshes[below(3)];
        let names: Vec<&str> = axes.iter().map(|(a, _)| *a).collect();
        let sizes: Vec<usize> = axes.iter().map(|(_, s)| *s).collect();
        // Input: rank 1 to 3, each mesh axis splitting one dimension or none.
        let rank = 1 + below(3);
        let mut spec_axes = vec![None; rank];
        for a in 0..sizes.len() {
            let d = below(rank + 1);
            if d < rank && spec_axes[d].is_none() {
                spec_axes[d] = Some(a);
            }
        }
        let dims: Vec<usize> = spec_axes
            .iter()
            .map(|a| a.map_or(1, |a| sizes[a]) * [1, 2, 4][below(3)])
            .collect();
        let n: usize = dims.iter().product();
        let xs = data(n, case as u32 + 1);
        let x_host = H {
            dims: dims.clone(),
            v: xs.clone(),
        };
        let coords_of = |p: usize| {
            let mut c = vec![0; sizes.len()];
            let mut p = p;
            for a in (0..sizes.len()).rev() {
                c[a] = p % sizes[a];
                p /= sizes[a];
            }
            c
        };
        let mut sim = Sim {
            sizes: sizes.clone(),
            pieces: (0..sizes.iter().product())
                .map(|p| {
                    let c = coords_of(p);
                    let mut h = x_host.clone();
                    for (d, a) in spec_axes.iter().enumerate() {
                        if let Some(a) = *a {
                            h = h.block(d, sizes[a], c[a]);
                        }
                    }
                    h
                })
                .collect(),
            varies: (0..sizes.len())
                .map(|a| spec_axes.contains(&Some(a)))
                .collect(),
        };
        // A chain of 1 to 3 steps, each valid for the current piece.
        let mut steps = Vec::new();
        for _ in 0..1 + below(3) {
            let local = &sim.pieces[0].dims;
            let a = below(sizes.len());
            let d = below(local.len());
            let s = match below(4) {
                0 => Step::AllReduce(
                    a,
                    [
                        Reduction::Sum,
                        Reduction::Mean,
                        Reduction::Max,
                        Reduction::Min,
                    ][below(4)],
                ),
                1 if local[d] * sizes[a] <= 64 => Step::AllGather(a, d),
                2 if local[d] % sizes[a] == 0 => Step::ReduceScatter(a, d),
                _ => Step::Tanh,
            };
            sim.step(s);
            steps.push(s);
        }
        // Out spec: a differing axis mostly names a free dimension where
        // one is left (else the region must refuse the result); a
        // replicated axis sometimes names one too (copies).
        let rank = sim.pieces[0].dims.len();
        let mut out = vec![None; rank];
        for a in 0..sizes.len() {
            let name = if sim.varies[a] {
                below(6) != 0
            } else {
                below(3) == 0
            };
            if name {
                let free: Vec<usize> = (0..rank).filter(|&d| out[d].is_none()).collect();
                if !free.is_empty() {
                    out[free[below(free.len())]] = Some(a);
                }
            }
        }
        let named: Vec<Option<&str>> = out.iter().map(|a| a.map(|a| names[a])).collect();
        let spec: Vec<Option<&str>> = spec_axes.iter().map(|a| a.map(|a| names[a])).collect();
        let expect_err = (0..sizes.len()).any(|a| sim.varies[a] && !out.contains(&Some(a)));
        let what = format!(
            "case {case}: mesh {axes:?}, x {dims:?} split {spec:?}, {steps:?}, out {named:?}"
        );
        for fused in [true, false] {
            let _g = FusionGuard::new(fused);
            let x = Tensor::from_slice(&xs, &dims, &dev).unwrap();
            let got = mesh.shard_map(&[(&x, &spec)], &[&named], |p| {
                let mut v = p[0].clone();
                for &s in &steps {
                    v = apply(&v, s, &names)?;
                }
                Ok(vec![v])
            });
            match got {
                Err(e) => {
                    assert!(expect_err, "{what} (fused {fused}): {e}");
                    assert!(
                        e.to_string().contains("differs across mesh axis"),
                        "{what}: {e}"
                    );
                }
                Ok(y) => {
                    assert!(!expect_err, "{what} (fused {fused}): no Err");
                    let want = sim.assemble(&out);
                    assert_eq!(y[0].dims(), want.dims, "{what}");
                    let got = y[0].to_vec::<f32>().unwrap();
                    close(&got, &want.v, &format!("{what} (fused {fused})"));
                }
            }
        }
        if expect_err {
            refused += 1;
        } else {
            checked += 1;
        }
    }
    eprintln!("{checked} results checked, {refused} refused");
    assert!(checked >= cases / 2, "{checked} of {cases} checked");
}
