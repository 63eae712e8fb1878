//! Creating tensors: from host data (uploaded at once), constants and ranges
//! (recorded lazily, so they fuse into their consumers), and seeded random data.

use super::Tensor;
use crate::{Device, Error, Key, Result};
use lazyfuse_ir::{DType, Element, HostTensor, Literal, Op, Origin, Shape};

/// The literal that `value` denotes in `dtype`.
pub(crate) fn literal_for(value: f64, dtype: DType) -> Literal {
    match dtype {
        DType::Bool => Literal::Bool(value != 0.0),
        d if d.is_int() && value.fract() == 0.0 && value.abs() < 9.2e18 => {
            Literal::Int(value as i64)
        }
        _ => Literal::Float(value),
    }
}

/// Counter-based generator: the i-th draw depends only on (seed, i), so
/// results never depend on threads, chunking or fusion.
fn splitmix(seed: u64, i: u64) -> u64 {
    use lazyfuse_ir::SplitMix64;
    lazyfuse_ir::splitmix64(
        seed.wrapping_mul(SplitMix64::GAMMA)
            .wrapping_add(i.wrapping_mul(0xD1B5_4A32_D192_ED03))
            .wrapping_add(SplitMix64::GAMMA),
    )
}

/// Uniform in [0, 1) with 53 random bits.
fn uniform(seed: u64, i: u64) -> f64 {
    (splitmix(seed, i) >> 11) as f64 / (1u64 << 53) as f64
}

impl Tensor {
    /// Uploads `data` with the given dimensions. Errors if the lengths disagree.
    #[track_caller]
    pub fn from_slice<T: Element>(data: &[T], dims: &[usize], device: &Device) -> Result<Tensor> {
        let loc = crate::site::caller();
        let shape = Shape::new(dims);
        if data.len() != shape.numel() {
            return Err(Error::op(
                "from_slice",
                format!(
                    "{} values do not fill shape {shape} ({} elements)",
                    data.len(),
                    shape.numel()
                ),
                format!("{}[{}]", T::DTYPE, data.len()),
                loc,
            ));
        }
        Tensor::upload_at(HostTensor::from_slice(data, shape), device, loc)
    }

    /// Uploads a host array as an upload site (the caller's line, or the
    /// origin a binding declares with [`crate::with_origin`]): a length that
    /// changes there from step to step is bucketed as `from_slice`'s is, so
    /// inputs of varying size compile once per bucket. [`Tensor::from_host`]
    /// uploads exactly.
    #[track_caller]
    pub fn upload(host: HostTensor, device: &Device) -> Result<Tensor> {
        Tensor::upload_at(host, device, crate::site::caller())
    }

    /// Uploads borrowed host bytes (little-endian, row-major, `dims` of
    /// `dtype`), an upload site as [`Tensor::upload`] is: one copy, into
    /// the device buffer, where `upload` takes an owned [`HostTensor`]
    /// (bindings upload another library's tensor memory this way).
    #[track_caller]
    pub fn upload_bytes(
        bytes: &[u8],
        dims: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let loc = crate::site::caller();
        let shape = Shape::new(dims);
        if shape.numel() * dtype.size_in_bytes() != bytes.len() {
            return Err(Error::op(
                "upload_bytes",
                format!("{} bytes do not hold {dtype}{shape}", bytes.len()),
                format!("u8[{}]", bytes.len()),
                loc,
            ));
        }
        let (mask, _) =
            super::dynamic::sites::observe(loc, super::dynamic::sites::Kind::Upload, dims, 0);
        if mask != 0 {
            let host = HostTensor {
                shape,
                dtype,
                bytes: bytes.to_vec(),
            };
            return Tensor::upload_masked(host, device, loc, mask);
        }
        let slice = crate::backend::HostSlice {
            bytes,
            shape: &shape,
            dtype,
        };
        let buf = device.rt.upload_slice(slice, device.ordinal)?;
        Ok(Tensor::ready(buf, device))
    }

    /// Uploads `host` as recorded at `loc`, an upload site like any other:
    /// a length that changes there from step to step is uploaded padded to
    /// its bucket's capacity, so what the program does with it compiles
    /// once per bucket.
    fn upload_at(host: HostTensor, device: &Device, loc: Origin) -> Result<Tensor> {
        let (mask, _) = super::dynamic::sites::observe(
            loc,
            super::dynamic::sites::Kind::Upload,
            host.shape.dims(),
            0,
        );
        Tensor::upload_masked(host, device, loc, mask)
    }

    /// `host` uploaded for site `loc`, already observed: padded to its
    /// buckets' capacities along the axes `mask` marks as varying.
    fn upload_masked(host: HostTensor, device: &Device, loc: Origin, mask: u32) -> Result<Tensor> {
        if mask == 0 {
            return Tensor::from_host(&host, device);
        }
        let caps: Vec<(usize, usize)> = (0..host.shape.rank())
            .filter(|a| mask & (1 << a) != 0)
            .map(|a| {
                let len = host.shape.dims()[a];
                let kind = super::dynamic::sites::Kind::Upload;
                (a, super::dynamic::sites::capacity(loc, kind, a, len))
            })
            .collect();
        let padded = super::dynamic::pad_host(&host, &caps);
        let t = Tensor::from_host(&padded, device)?;
        t.0.set_logical(crate::lazy::Logical {
            shape: host.shape.clone(),
            mask,
            limit: Shape(smallvec::SmallVec::from_elem(0, host.shape.rank())),
            zero_padded: false,
        });
        Ok(t)
    }

    /// Like [`Tensor::from_slice`], taking ownership of the data.
    #[track_caller]
    pub fn from_vec<T: Element>(data: Vec<T>, dims: &[usize], device: &Device) -> Result<Tensor> {
        Tensor::from_slice(&data, dims, device)
    }

    /// Uploads a host array.
    pub fn from_host(host: &HostTensor, device: &Device) -> Result<Tensor> {
        let buf = device.rt.upload(host, device.ordinal)?;
        Ok(Tensor::ready(buf, device))
    }

    /// A tensor filled with `value` (converted to `dtype`; must be representable).
    #[track_caller]
    pub fn full(value: f64, dims: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        // A rank-0 constant (a lifted host scalar, not code) broadcast to
        // `dims`: a value that changes from step to step compiles nothing
        // new. As a constant of the full shape it was part of the code.
        let op = Op::Constant {
            value: literal_for(value, dtype),
            shape: Shape::scalar(),
            dtype,
        };
        let v = Tensor::apply_nullary("full", op, device, crate::site::caller())?;
        if dims.is_empty() {
            Ok(v)
        } else {
            v.broadcast_to(dims)
        }
    }

    /// A tensor of zeros.
    #[track_caller]
    pub fn zeros(dims: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(0.0, dims, dtype, device)
    }

    /// A tensor of ones.
    #[track_caller]
    pub fn ones(dims: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(1.0, dims, dtype, device)
    }

    /// Zeros with this tensor's shape, dtype and device.
    #[track_caller]
    pub fn zeros_like(&self) -> Result<Tensor> {
        self.full_like(0.0)
    }

    /// Ones with this tensor's shape, dtype and device.
    #[track_caller]
    pub fn ones_like(&self) -> Result<Tensor> {
        self.full_like(1.0)
    }

    /// `value` with this tensor's shape, dtype and device. A tensor with
    /// dynamic axes gives one with the same axes and capacities, so the
    /// result of every length in a bucket shares one executable.
    #[track_caller]
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        let loc = crate::site::caller();
        if self.logical().is_none() {
            return crate::with_origin(loc, || {
                Tensor::full(value, self.dims(), self.dtype(), self.device())
            });
        }
        let v = crate::with_origin(loc, || {
            Tensor::full(value, &[], self.dtype(), self.device())
        })?;
        super::dynamic::broadcast_like(&v, self, loc)
    }

    /// The `n` x `n` identity matrix: ones on the diagonal. Built from one
    /// `arange` compared with itself, so an `n` that changes at a line
    /// buckets like `arange` does (one executable per bucket).
    #[track_caller]
    pub fn eye(n: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        crate::with_origin(crate::site::caller(), || {
            let i = Tensor::arange(0.0, n as f64, DType::I32, device)?;
            i.unsqueeze(1)?.eq(&i.unsqueeze(0)?)?.to_dtype(dtype)
        })
    }

    /// `[start, end)` with step 1, like `numpy.arange`.
    #[track_caller]
    pub fn arange(start: f64, end: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::arange_step(start, end, 1.0, dtype, device)
    }

    /// `[start, end)` with `step` (non-zero, may be negative).
    #[track_caller]
    pub fn arange_step(
        start: f64,
        end: f64,
        step: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let loc = crate::site::caller();
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(Error::op(
                "arange",
                format!("needs finite bounds and a non-zero step, got {start}..{end} step {step}"),
                String::new(),
                loc,
            ));
        }
        let len = ((end - start) / step).ceil().max(0.0) as usize;
        // `start + i * step`, in f64 (rounded once into a float dtype) or
        // in wrapping i64, as `Op::Arange` defines it; but with `start` and
        // `step` recorded as host scalars (region parameters) on an `i`
        // that only depends on the length, so that a moving start (the
        // position ids `arange(past, past + t)` of a decoding loop)
        // compiles nothing new. As attributes of the op they were part of
        // the code: one compile per step.
        let wide = if dtype.is_float() {
            DType::F64
        } else {
            DType::I64
        };
        let (start, step) = if dtype.is_float() {
            (start, step)
        } else {
            let int = |v: f64| literal_for(v, dtype).as_i64() as f64;
            (int(start), int(step))
        };
        let iota = Op::Arange {
            start: literal_for(0.0, wide),
            step: literal_for(1.0, wide),
            len,
            dtype: wide,
        };
        let i = Tensor::apply_nullary("arange", iota, device, loc)?;
        let v = i.mul(step)?.add(start)?;
        if dtype == wide {
            Ok(v)
        } else {
            v.to_dtype(dtype)
        }
    }

    /// Uniform `[0, 1)` f32 values from `key` (an explicit [`Key`], a
    /// `u64` seed, or `device.next_key()`), generated on the host with 53
    /// random bits each: for initialisation. [`Tensor::rand_uniform`] draws
    /// on the device instead, fused with its consumers.
    #[track_caller]
    pub fn rand(dims: &[usize], key: impl Into<Key>, device: &Device) -> Result<Tensor> {
        let loc = crate::site::caller();
        let seed = key.into().bits();
        let n = dims.iter().product::<usize>();
        let v: Vec<f32> = (0..n as u64).map(|i| uniform(seed, i) as f32).collect();
        // An upload site of its own: a size that varies from step to step
        // (noise per batch) buckets like any upload; the logical values do
        // not depend on the capacity.
        Tensor::upload_at(HostTensor::from_slice(&v, Shape::new(dims)), device, loc)
    }

    /// Standard normal f32 values from `key` (Box-Muller on the host, as
    /// [`Tensor::rand`]).
    #[track_caller]
    pub fn randn(dims: &[usize], key: impl Into<Key>, device: &Device) -> Result<Tensor> {
        let loc = crate::site::caller();
        let seed = key.into().bits();
        let n = dims.iter().product::<usize>();
        let v: Vec<f32> = (0..n as u64)
            .map(|i| {
                let u1 = 1.0 - uniform(seed, 2 * i); // (0, 1]
                let u2 = uniform(seed, 2 * i + 1);
                ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
            })
            .collect();
        // An upload site of its own: a size that varies from step to step
        // (noise per batch) buckets like any upload; the logical values do
        // not depend on the capacity.
        Tensor::upload_at(HostTensor::from_slice(&v, Shape::new(dims)), device, loc)
    }
}
