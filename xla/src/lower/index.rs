//! Lowering of the indexed read (`stablehlo.gather`), of slices and updates
//! at a run-time start (`stablehlo.dynamic_slice` / `dynamic_update_slice`)
//! and of the counter-based generator (`ui32` integer arithmetic), matching
//! `lazyfuse_ir::interp` bit for bit.

use super::emit::{i64_array, ty, Emitter};
use lazyfuse_ir::{DType, Shape};
use std::fmt::Write;

/// The start index operands of a dynamic slice or update: `start` on
/// `axis`, a zero of the same type on every other axis.
fn start_indices(
    e: &mut Emitter<'_>,
    start: &str,
    sdt: DType,
    rank: usize,
    axis: usize,
) -> Vec<(String, String)> {
    let st = ty(&Shape::scalar(), sdt);
    let zero = if rank > 1 {
        e.constant(lazyfuse_ir::Literal::Int(0), &Shape::scalar(), sdt)
    } else {
        String::new()
    };
    (0..rank)
        .map(|d| {
            let v = if d == axis {
                start.to_string()
            } else {
                zero.clone()
            };
            (v, st.clone())
        })
        .collect()
}

/// `len` elements of `x` along `axis` from the run-time `start`; XLA clamps
/// the start into range, as the IR says.
pub fn dynamic_slice(
    e: &mut Emitter<'_>,
    (x, xs): (&str, &Shape),
    (start, sdt): (&str, DType),
    axis: usize,
    out: &Shape,
    dt: DType,
) -> String {
    let starts = start_indices(e, start, sdt, xs.rank(), axis);
    let mut args: Vec<(&str, String)> = vec![(x, ty(xs, dt))];
    args.extend(starts.iter().map(|(v, t)| (v.as_str(), t.clone())));
    let attr = format!("slice_sizes = {}", i64_array(out.dims().iter().copied()));
    e.op("stablehlo.dynamic_slice", &args, &attr, &ty(out, dt))
}

/// `x` (of shape `out`) with `update` written along `axis` from the
/// run-time `start` (clamped by XLA, as the IR says).
pub fn dynamic_update_slice(
    e: &mut Emitter<'_>,
    x: &str,
    (u, us): (&str, &Shape),
    (start, sdt): (&str, DType),
    axis: usize,
    out: &Shape,
    dt: DType,
) -> String {
    let starts = start_indices(e, start, sdt, out.rank(), axis);
    let mut args: Vec<(&str, String)> = vec![(x, ty(out, dt)), (u, ty(us, dt))];
    args.extend(starts.iter().map(|(v, t)| (v.as_str(), t.clone())));
    e.op("stablehlo.dynamic_update_slice", &args, "", &ty(out, dt))
}

/// `index_select` as one gather: every index picks a full slice of `x` that
/// is 1 wide along `axis`; XLA clamps start indices into range, as the IR says.
pub fn index_select(
    e: &mut Emitter<'_>,
    (x, xs): (&str, &Shape),
    (idx, is, idt): (&str, &Shape, DType),
    axis: usize,
    out: &Shape,
    dt: DType,
) -> String {
    let k = is.dims()[0];
    let col = Shape::new(&[k, 1]);
    let idx2 = e.reshape(idx, is, &col, idt);
    let offset = (0..xs.rank()).filter(|&d| d != axis);
    let sizes = (0..xs.rank()).map(|d| if d == axis { 1 } else { xs.dims()[d] });
    let attr = format!(
        "dimension_numbers = #stablehlo.gather<offset_dims = [{}], collapsed_slice_dims = [{axis}], start_index_map = [{axis}], index_vector_dim = 1>, slice_sizes = {}, indices_are_sorted = false",
        offset.map(|d| d.to_string()).collect::<Vec<_>>().join(", "),
        i64_array(sizes)
    );
    e.op(
        "stablehlo.gather",
        &[(x, ty(xs, dt)), (&idx2, ty(&col, idt))],
        &attr,
        &ty(out, dt),
    )
}

/// `index_add` as one `stablehlo.scatter` with an adding body. Indices are
/// clamped into range first (XLA's scatter would drop an out-of-range
/// update; the IR clamps, as its gather does). Half types accumulate in
/// f32, like sums. No updates: `x` itself.
pub fn scatter_add(
    e: &mut Emitter<'_>,
    (x, xs): (&str, &Shape),
    (idx, is, idt): (&str, &Shape, DType),
    (src, ss): (&str, &Shape),
    axis: usize,
    dt: DType,
) -> String {
    let k = is.dims()[0];
    if k == 0 {
        return x.to_string();
    }
    let acc = if matches!(dt, DType::BF16 | DType::F16) {
        DType::F32
    } else {
        dt
    };
    let (x, src) = (e.convert(x, xs, dt, acc), e.convert(src, ss, dt, acc));
    let st = ty(&Shape::scalar(), idt);
    let lo = e.constant(lazyfuse_ir::Literal::Int(0), &Shape::scalar(), idt);
    let n = xs.dims()[axis].saturating_sub(1) as i64;
    let hi = e.constant(lazyfuse_ir::Literal::Int(n), &Shape::scalar(), idt);
    let clamped = e.op(
        "stablehlo.clamp",
        &[(&lo, st.clone()), (idx, ty(is, idt)), (&hi, st)],
        "",
        &ty(is, idt),
    );
    let col = Shape::new(&[k, 1]);
    let idx2 = e.reshape(&clamped, is, &col, idt);
    let window = (0..xs.rank())
        .filter(|&d| d != axis)
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let r = e.fresh();
    let s = ty(&Shape::scalar(), acc);
    let _ = writeln!(
        e.body,
        "    {r} = \"stablehlo.scatter\"({x}, {idx2}, {src}) ({{\n    ^bb0({r}a: {s}, {r}b: {s}):\n      {r}m = \"stablehlo.add\"({r}a, {r}b) : ({s}, {s}) -> {s}\n      \"stablehlo.return\"({r}m) : ({s}) -> ()\n    }}) {{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [{window}], inserted_window_dims = [{axis}], scatter_dims_to_operand_dims = [{axis}], index_vector_dim = 1>, unique_indices = false}} : ({}, {}, {}) -> {}",
        ty(xs, acc),
        ty(&col, idt),
        ty(ss, acc),
        ty(xs, acc)
    );
    e.convert(&r, xs, acc, dt)
}

/// `ui32` tensor type of rank 0 (`n = None`) or 1.
fn u32_ty(n: Option<usize>) -> String {
    match n {
        Some(n) => format!("tensor<{n}xui32>"),
        None => "tensor<ui32>".to_string(),
    }
}

/// Emits ui32 arithmetic on values of one shape (scalar or `[n]`).
struct U32<'a, 'g> {
    e: &'a mut Emitter<'g>,
    n: Option<usize>,
}

impl U32<'_, '_> {
    /// The constant `v` in this shape.
    fn konst(&mut self, v: u32) -> String {
        let s = u32_ty(None);
        let c = self.e.op(
            "stablehlo.constant",
            &[],
            &format!("value = dense<{v}> : {s}"),
            &s,
        );
        match self.n {
            None => c,
            Some(_) => self.e.op(
                "stablehlo.broadcast_in_dim",
                &[(&c, s)],
                "broadcast_dimensions = array<i64>",
                &u32_ty(self.n),
            ),
        }
    }
    /// Binary op `name` on `a` and `b`.
    fn bin(&mut self, name: &str, a: &str, b: &str) -> String {
        let t = u32_ty(self.n);
        self.e.op(name, &[(a, t.clone()), (b, t.clone())], "", &t)
    }
    /// Binary op `name` on `a` and the constant `k`.
    fn bin_k(&mut self, name: &str, a: &str, k: u32) -> String {
        let c = self.konst(k);
        self.bin(name, a, &c)
    }
    /// `lowbias32`, as `lazyfuse_ir::interp::mix32`.
    fn mix(&mut self, x: &str) -> String {
        let s = self.bin_k("stablehlo.shift_right_logical", x, 16);
        let x = self.bin("stablehlo.xor", x, &s);
        let x = self.bin_k("stablehlo.multiply", &x, 0x7feb_352d);
        let s = self.bin_k("stablehlo.shift_right_logical", &x, 15);
        let x = self.bin("stablehlo.xor", &x, &s);
        let x = self.bin_k("stablehlo.multiply", &x, 0x846c_a68b);
        let s = self.bin_k("stablehlo.shift_right_logical", &x, 16);
        self.bin("stablehlo.xor", &x, &s)
    }
}

/// `rand_uniform`: see `lazyfuse_ir::interp::random_bits` for the hash.
pub fn random_uniform(e: &mut Emitter<'_>, seed: &str, out: &Shape, dt: DType) -> String {
    let key = seed_key(e, seed);
    let n = out.numel();
    let top = counter_bits(e, &key, n);
    unit_floats(e, &top, out, dt)
}

/// The low and high 32-bit words of the i64 `seed`, as `ui32` scalars:
/// the generator's hash works on 32-bit words. Both conversions are in
/// range, so exact.
fn seed_words(e: &mut Emitter<'_>, seed: &str) -> (String, String) {
    let i64s = ty(&Shape::scalar(), DType::I64);
    let scalar_i64 = |e: &mut Emitter<'_>, v: i64| {
        e.op(
            "stablehlo.constant",
            &[],
            &format!("value = dense<{v}> : {i64s}"),
            &i64s,
        )
    };
    let mask = scalar_i64(e, 0xffff_ffff);
    let lo = e.op(
        "stablehlo.and",
        &[(seed, i64s.clone()), (&mask, i64s.clone())],
        "",
        &i64s,
    );
    let k32 = scalar_i64(e, 32);
    let hi = e.op(
        "stablehlo.shift_right_logical",
        &[(seed, i64s.clone()), (&k32, i64s.clone())],
        "",
        &i64s,
    );
    let lo = e.op(
        "stablehlo.convert",
        &[(&lo, i64s.clone())],
        "",
        &u32_ty(None),
    );
    let hi = e.op(
        "stablehlo.convert",
        &[(&hi, i64s.clone())],
        "",
        &u32_ty(None),
    );
    (lo, hi)
}

/// The `ui32` scalar key of the stream `seed` selects: both seed words
/// mixed together, computed once and shared by every element.
fn seed_key(e: &mut Emitter<'_>, seed: &str) -> String {
    let (lo, hi) = seed_words(e, seed);
    let mut s = U32 { e, n: None };
    let h = s.bin_k("stablehlo.add", &hi, 0x9e37_79b9);
    let h = s.mix(&h);
    let k = s.bin("stablehlo.xor", &lo, &h);
    s.mix(&k)
}

/// The top 24 random bits (`ui32[n]`) of each of the `n` elements: the
/// element's counter (an iota) hashed with `key`.
fn counter_bits(e: &mut Emitter<'_>, key: &str, n: usize) -> String {
    let keyv = e.op(
        "stablehlo.broadcast_in_dim",
        &[(key, u32_ty(None))],
        "broadcast_dimensions = array<i64>",
        &u32_ty(Some(n)),
    );
    let iota = e.op(
        "stablehlo.iota",
        &[],
        "iota_dimension = 0 : i64",
        &u32_ty(Some(n)),
    );
    let mut v = U32 { e, n: Some(n) };
    let x = v.bin("stablehlo.xor", &iota, &keyv);
    let x = v.mix(&x);
    let x = v.bin("stablehlo.add", &x, &keyv);
    let x = v.mix(&x);
    v.bin_k("stablehlo.shift_right_logical", &x, 8)
}

/// The 24-bit integers `top` scaled into `[0, 1)` as `dt` in the shape
/// `out`. The integer to f32 and the power-of-two scale are exact; there
/// is one rounding, to `dt`.
fn unit_floats(e: &mut Emitter<'_>, top: &str, out: &Shape, dt: DType) -> String {
    let n = out.numel();
    let flat = Shape::new(&[n]);
    let f = e.op(
        "stablehlo.convert",
        &[(top, u32_ty(Some(n)))],
        "",
        &ty(&flat, DType::F32),
    );
    let scale = e.constant(
        lazyfuse_ir::Literal::Float(2f64.powi(-24)),
        &flat,
        DType::F32,
    );
    let f = e.eltwise(
        "stablehlo.multiply",
        &[&f, &scale],
        &flat,
        DType::F32,
        DType::F32,
    );
    let f = e.convert(&f, &flat, DType::F32, dt);
    e.reshape(&f, &flat, out, dt)
}
