//! Convolution on the host: im2col and one GEMM per group (the `gemm`
//! crate's AVX-512 kernels on both cores), for the convolutions where
//! XLA's CPU convolution is slow (see `lower::conv` for which).
//!
//! It computes the IR's general convolution (`lazyfuse_ir::ConvSpec`):
//! `lhs [n, c, s..] x rhs [o, c / groups, k..] -> [n, o, y..]`, with
//! stride, padding (either sign), input and kernel dilation and feature
//! groups; batch groups are not taken (the lowering never sends them).
//! Along each spatial axis, output position `y` and tap `t` read the
//! dilated, padded input at `p = y * stride + t * rhs_dilation - pad_lo`:
//! the input element `p / lhs_dilation` where `p` is a multiple of the
//! input dilation inside the input, zero elsewhere. The product is summed
//! in the GEMM's order, not XLA's: the result differs from XLA's
//! convolution by rounding only, the same way on every run.

use super::Float;
use lazyfuse_ir::{ConvSpec, DType, HostArg, HostOut};
use rayon::prelude::*;

/// The kernel's registered name.
pub const NAME: &str = "lazyfuse.conv";

/// The most bytes of im2col columns made at once: the batch is taken in
/// blocks of samples whose columns fit.
const COLUMN_BYTES: usize = 32 << 20;

/// The kernel's third operand, an i64 vector: the feature groups, then
/// per spatial axis its stride, low padding, input and kernel dilation.
/// (The high padding follows from the result's shape.)
pub fn geometry(spec: &ConvSpec) -> Vec<i64> {
    let mut g = vec![spec.feature_groups as i64];
    for i in 0..spec.spatial_rank() {
        g.extend([
            spec.stride[i] as i64,
            spec.padding[i].0,
            spec.lhs_dilation[i] as i64,
            spec.rhs_dilation[i] as i64,
        ]);
    }
    g
}

/// One spatial axis of the convolution.
#[derive(Clone, Copy, Debug)]
struct Axis {
    input: usize,
    taps: usize,
    out: usize,
    stride: i64,
    pad_lo: i64,
    lhs_dilation: i64,
    rhs_dilation: i64,
}

impl Axis {
    /// The input element that output position `y` and tap `t` read, if
    /// any (`None`: padding or a hole of the input dilation).
    #[inline]
    fn source(&self, y: usize, t: usize) -> Option<usize> {
        let p = y as i64 * self.stride + t as i64 * self.rhs_dilation - self.pad_lo;
        if p < 0 || p % self.lhs_dilation != 0 {
            return None;
        }
        let i = (p / self.lhs_dilation) as usize;
        (i < self.input).then_some(i)
    }
}

/// The checked shapes of a call.
struct Geometry {
    n: usize,
    c: usize,
    o: usize,
    groups: usize,
    axes: Vec<Axis>,
}

impl Geometry {
    fn new(x: &[usize], w: &[usize], out: &[usize], g: &[i64]) -> Result<Geometry, String> {
        let d = x.len().saturating_sub(2);
        let bad = || {
            format!("operands {x:?}, {w:?}, result {out:?} and geometry {g:?} do not fit {NAME}")
        };
        if x.len() < 3 || w.len() != x.len() || out.len() != x.len() || g.len() != 1 + 4 * d {
            return Err(bad());
        }
        let groups = usize::try_from(g[0]).map_err(|_| bad())?;
        let (n, c, o) = (x[0], x[1], w[0]);
        if groups == 0 || c != w[1] * groups || o % groups != 0 || out[0] != n || out[1] != o {
            return Err(bad());
        }
        let axes: Vec<Axis> = (0..d)
            .map(|i| Axis {
                input: x[2 + i],
                taps: w[2 + i],
                out: out[2 + i],
                stride: g[1 + 4 * i],
                pad_lo: g[2 + 4 * i],
                lhs_dilation: g[3 + 4 * i],
                rhs_dilation: g[4 + 4 * i],
            })
            .collect();
        if axes
            .iter()
            .any(|a| a.stride < 1 || a.lhs_dilation < 1 || a.rhs_dilation < 1)
        {
            return Err(bad());
        }
        Ok(Geometry {
            n,
            c,
            o,
            groups,
            axes,
        })
    }

    fn taps(&self) -> usize {
        self.axes.iter().map(|a| a.taps).product()
    }

    fn out_len(&self) -> usize {
        self.axes.iter().map(|a| a.out).product()
    }

    fn in_len(&self) -> usize {
        self.axes.iter().map(|a| a.input).product()
    }
}

/// Runs the convolution on the call's buffers, by dtype.
pub(super) fn run(a: &[HostArg<'_>], out: &mut HostOut<'_>) -> Result<(), String> {
    match out.dtype {
        DType::F32 => typed::<f32>(a, out),
        DType::F64 => typed::<f64>(a, out),
        d => Err(format!("{d} is not supported by {NAME}")),
    }
}

fn typed<T: Float + Send + Sync>(a: &[HostArg<'_>], out: &mut HostOut<'_>) -> Result<(), String> {
    let [x, w, geo] = a else {
        return Err(format!("3 operands expected, got {}", a.len()));
    };
    let bad = || "operand dtypes differ from the result's".to_string();
    let (xs, ws) = (
        x.as_slice::<T>().ok_or_else(bad)?,
        w.as_slice::<T>().ok_or_else(bad)?,
    );
    let g = geo
        .as_slice::<i64>()
        .ok_or_else(|| format!("the geometry of {NAME} must be i64"))?;
    let geom = Geometry::new(x.dims, w.dims, out.dims, g)?;
    let ys = out.as_mut_slice::<T>().ok_or_else(bad)?;
    let (cg, og) = (geom.c / geom.groups, geom.o / geom.groups);
    let (rows, y_len) = (cg * geom.taps(), geom.out_len());
    if rows == 0 || y_len == 0 || geom.n == 0 {
        ys.iter_mut().for_each(|v| *v = T::ZERO);
        return Ok(());
    }
    let per_sample = rows * y_len * std::mem::size_of::<T>();
    let block = (COLUMN_BYTES / per_sample).clamp(1, geom.n);
    let tmp_len = if block > 1 { og * block * y_len } else { 0 };
    with_scratch(rows * block * y_len + tmp_len, |scratch: &mut [T]| {
        let (col, tmp) = scratch.split_at_mut(rows * block * y_len);
        for n0 in (0..geom.n).step_by(block) {
            let nb = block.min(geom.n - n0);
            let cols = nb * y_len;
            for grp in 0..geom.groups {
                im2col(&geom, xs, n0, nb, grp * cg, cg, &mut col[..rows * cols]);
                let wg = &ws[grp * og * rows..(grp + 1) * og * rows];
                if nb == 1 {
                    let at = (n0 * geom.o + grp * og) * y_len;
                    product(og, cols, rows, &mut ys[at..at + og * y_len], wg, col);
                } else {
                    product(og, cols, rows, &mut tmp[..og * cols], wg, col);
                    // tmp is [og, nb, y]; the result is [n, o, y].
                    for oi in 0..og {
                        for s in 0..nb {
                            let at = ((n0 + s) * geom.o + grp * og + oi) * y_len;
                            let from = (oi * nb + s) * y_len;
                            ys[at..at + y_len].copy_from_slice(&tmp[from..from + y_len]);
                        }
                    }
                }
            }
        }
    });
    Ok(())
}

/// Runs `f` on `len` elements of this thread's scratch memory, kept
/// between calls: the columns of a convolution are megabytes, and fresh
/// ones each call cost a page fault per 4 KiB. At most [`COLUMN_BYTES`]
/// plus one block's output stay allocated per calling thread. The
/// contents are whatever the last call left (callers write before they
/// read).
fn with_scratch<T: Float, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let words = (len * std::mem::size_of::<T>()).div_ceil(8);
    SCRATCH.with(|cell| {
        let mut buf = cell.borrow_mut();
        if buf.len() < words {
            buf.resize(words, 0);
        }
        // SAFETY: u64 storage is aligned for f32 and f64, and every bit
        // pattern is a value of both.
        let (_, mid, _) = unsafe { buf[..words].align_to_mut::<T>() };
        f(&mut mid[..len])
    })
}

/// `dst [m, n] = lhs [m, k] x rhs [k, n]`, all row-major and dense.
fn product<T: Float>(m: usize, n: usize, k: usize, dst: &mut [T], lhs: &[T], rhs: &[T]) {
    debug_assert!(dst.len() >= m * n && lhs.len() >= m * k && rhs.len() >= k * n);
    // SAFETY: the asserted lengths cover every element the strides address.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            lhs.as_ptr(),
            1,
            k as isize,
            rhs.as_ptr(),
            1,
            n as isize,
            T::ZERO,
            T::ONE,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        )
    }
}

/// The columns of samples `n0..n0 + nb`, channels `c0..c0 + cg`: row
/// `(ci, tap)` of `col` holds, for each sample and output position, the
/// input element that tap reads (`[cg * taps, nb * y]`). Every element is
/// written.
fn im2col<T: Float + Send + Sync>(
    geom: &Geometry,
    xs: &[T],
    n0: usize,
    nb: usize,
    c0: usize,
    cg: usize,
    col: &mut [T],
) {
    let (taps, y_len, x_len) = (geom.taps(), geom.out_len(), geom.in_len());
    let axes = three_axes(&geom.axes);
    // For each axis and tap, the input index each output position reads
    // (-1: none).
    let tables: Vec<Vec<Vec<i64>>> = axes
        .iter()
        .map(|a| {
            (0..a.taps)
                .map(|t| {
                    (0..a.out)
                        .map(|y| a.source(y, t).map_or(-1, |p| p as i64))
                        .collect()
                })
                .collect()
        })
        .collect();
    let row_len = nb * y_len;
    let fill = |r: usize, row: &mut [T]| {
        let (ci, tap) = (r / taps, r % taps);
        let t = [
            tap / (axes[1].taps * axes[2].taps),
            tap / axes[2].taps % axes[1].taps,
            tap % axes[2].taps,
        ];
        let tab = [&tables[0][t[0]], &tables[1][t[1]], &tables[2][t[2]]];
        for s in 0..nb {
            let plane = &xs[((n0 + s) * geom.c + c0 + ci) * x_len..][..x_len];
            fill_row(
                &axes,
                t[2],
                tab,
                plane,
                &mut row[s * y_len..(s + 1) * y_len],
            );
        }
    };
    if col.len() >= 1 << 16 {
        col.par_chunks_mut(row_len)
            .enumerate()
            .for_each(|(r, row)| fill(r, row));
    } else {
        col.chunks_mut(row_len)
            .enumerate()
            .for_each(|(r, row)| fill(r, row));
    }
    debug_assert_eq!(col.len(), cg * taps * row_len);
}

/// `axes` (1 to 3) as three, unit axes in front.
fn three_axes(axes: &[Axis]) -> [Axis; 3] {
    let unit = Axis {
        input: 1,
        taps: 1,
        out: 1,
        stride: 1,
        pad_lo: 0,
        lhs_dilation: 1,
        rhs_dilation: 1,
    };
    let mut a = [unit; 3];
    a[3 - axes.len()..].copy_from_slice(axes);
    a
}

/// One tap's values over every output position of one input plane
/// (`tab`: each axis's source table for this tap; `t2`: the inner tap).
fn fill_row<T: Float>(
    axes: &[Axis; 3],
    t2: usize,
    tab: [&Vec<i64>; 3],
    plane: &[T],
    row: &mut [T],
) {
    let [a0, a1, a2] = axes;
    let inner = a2.out;
    // The inner axis reads a contiguous run when stride and input
    // dilation are 1: output y reads line[y + shift] inside the line.
    let run = (a2.stride == 1 && a2.lhs_dilation == 1).then(|| {
        let shift = t2 as i64 * a2.rhs_dilation - a2.pad_lo;
        let lo = (-shift).clamp(0, inner as i64) as usize;
        let hi = (a2.input as i64 - shift).clamp(lo as i64, inner as i64) as usize;
        (lo, hi, (lo as i64 + shift).max(0) as usize)
    });
    for y0 in 0..a0.out {
        let p0 = tab[0][y0];
        for y1 in 0..a1.out {
            let p1 = tab[1][y1];
            let seg = &mut row[(y0 * a1.out + y1) * inner..][..inner];
            if p0 < 0 || p1 < 0 {
                seg.iter_mut().for_each(|v| *v = T::ZERO);
                continue;
            }
            let base = (p0 as usize * a1.input + p1 as usize) * a2.input;
            let line = &plane[base..base + a2.input];
            match run {
                Some((lo, hi, from)) => {
                    seg[..lo].iter_mut().for_each(|v| *v = T::ZERO);
                    seg[hi..].iter_mut().for_each(|v| *v = T::ZERO);
                    seg[lo..hi].copy_from_slice(&line[from..from + (hi - lo)]);
                }
                None => {
                    for (v, &p) in seg.iter_mut().zip(tab[2].iter()) {
                        *v = if p < 0 { T::ZERO } else { line[p as usize] };
                    }
                }
            }
        }
    }
}
