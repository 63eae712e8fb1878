//! The gradient of every IR op, as recorded tensor ops (vector-Jacobian
//! products). One rule per [`Op`] variant: the API's composites need none of
//! their own. Gradients of broadcasting operands are summed back to the
//! operand's shape ([`sum_to`]).

use crate::tensor::Tensor;
use crate::Result;
use lazyfuse_ir::{reduced_shape, BinaryOp, Op, ReduceOp, Shape, UnaryOp};
use smallvec::SmallVec;

/// Per-operand gradients (`None`: no gradient flows to that operand).
pub(super) type Grads = SmallVec<[Option<Tensor>; 3]>;

/// Sums `g` over the dims that broadcasting added or stretched, so the result
/// has `shape` (the operand's shape before broadcasting).
pub(crate) fn sum_to(g: &Tensor, shape: &Shape) -> Result<Tensor> {
    if g.shape() == shape {
        return Ok(g.clone());
    }
    let lead = g.rank() - shape.rank();
    let mut axes: Vec<isize> = (0..lead as isize).collect();
    for (i, &d) in shape.dims().iter().enumerate() {
        if d == 1 && g.dims()[lead + i] != 1 {
            axes.push((lead + i) as isize);
        }
    }
    g.sum(&axes, true)?.reshape(shape.dims())
}

/// `where(mask, g, 0)`: passes `g` where `mask` holds (no NaN from `inf * 0`).
fn pass(mask: &Tensor, g: &Tensor) -> Result<Tensor> {
    let zero = Tensor::zeros(&[], g.dtype(), g.device())?;
    mask.where_cond(g, &zero)
}

fn unary(u: UnaryOp, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Tensor> {
    match u {
        UnaryOp::Neg => g.neg(),
        UnaryOp::Abs => {
            let sign = (x.gt(0.0)?.to_dtype(x.dtype())? - x.lt(0.0)?.to_dtype(x.dtype())?)?;
            g * sign
        }
        UnaryOp::Exp => g * y,
        UnaryOp::Log => g / x,
        UnaryOp::Sqrt => (g / y)? * 0.5,
        UnaryOp::Rsqrt => (g * y.mul(y)?.mul(y)?)? * -0.5,
        UnaryOp::Tanh => g * (1.0 - y.mul(y)?)?,
        UnaryOp::Sigmoid => g * y.mul(&(1.0 - y)?)?,
        UnaryOp::Relu => pass(&x.gt(0.0)?, g),
        UnaryOp::Gelu => {
            // d/dx 0.5x(1+tanh(u)), u = c(x + k x^3):
            // 0.5(1+t) + 0.5x(1-t^2) c(1 + 3k x^2).
            let (c, k) = (0.797_884_560_802_865_4, 0.044715);
            let x2 = x.mul(x)?;
            let t = (x.add(&x2.mul(x)?.mul(k)?)? * c)?.tanh()?;
            let left = ((t.add(1.0))? * 0.5)?;
            let du = (x2.mul(3.0 * k)?.add(1.0)? * c)?;
            let right = ((x * 0.5)?.mul(&(1.0 - t.mul(&t)?)?)?).mul(&du)?;
            g * left.add(&right)?
        }
        UnaryOp::Sin => g * x.cos()?,
        UnaryOp::Cos => g * x.sin()?.neg()?,
        UnaryOp::Floor => g.zeros_like(),
        UnaryOp::Erf => {
            let d = (x.mul(x)?.neg()?.exp()? * std::f64::consts::FRAC_2_SQRT_PI)?;
            g * d
        }
    }
}

/// Gradients of `y = a <op> b` (broadcast), before summing back to the operand shapes.
fn binary(
    b: BinaryOp,
    x: &[Tensor],
    y: &Tensor,
    g: &Tensor,
    need: &[bool],
) -> Result<[Option<Tensor>; 2]> {
    let (a, c) = (&x[0], &x[1]);
    let when = |i: usize, f: &dyn Fn() -> Result<Tensor>| -> Result<Option<Tensor>> {
        if need[i] {
            f().map(Some)
        } else {
            Ok(None)
        }
    };
    // Ties of maximum/minimum split the gradient evenly (as PyTorch does).
    let extremum =
        |first: &Tensor, second: &Tensor, win: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>| {
            let half = (g * 0.5)?;
            let zero = Tensor::zeros(&[], g.dtype(), g.device())?;
            let tie = first.eq(second)?.where_cond(&half, &zero)?;
            win(first, second)?.where_cond(g, &tie)
        };
    Ok(match b {
        BinaryOp::Add => [when(0, &|| Ok(g.clone()))?, when(1, &|| Ok(g.clone()))?],
        BinaryOp::Sub => [when(0, &|| Ok(g.clone()))?, when(1, &|| g.neg())?],
        BinaryOp::Mul => [when(0, &|| g * c)?, when(1, &|| g * a)?],
        BinaryOp::Div => [when(0, &|| g / c)?, when(1, &|| (g * y)?.div(c)?.neg())?],
        BinaryOp::Pow => [
            when(0, &|| g.mul(c)?.mul(&a.pow(&c.sub(1.0)?)?))?,
            when(1, &|| g.mul(y)?.mul(&a.log()?))?,
        ],
        BinaryOp::Maximum => [
            when(0, &|| extremum(a, c, &|p, q| p.gt(q)))?,
            when(1, &|| extremum(c, a, &|p, q| p.gt(q)))?,
        ],
        BinaryOp::Minimum => [
            when(0, &|| extremum(a, c, &|p, q| p.lt(q)))?,
            when(1, &|| extremum(c, a, &|p, q| p.lt(q)))?,
        ],
    })
}

fn reduce(op: ReduceOp, axes: &[usize], x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Tensor> {
    let kept = reduced_shape(x.shape(), axes, true);
    let gk = g.reshape(kept.dims())?;
    match op {
        ReduceOp::Sum => gk.broadcast_to(x.dims()),
        ReduceOp::Mean => {
            let n: usize = axes.iter().map(|&a| x.dims()[a]).product();
            (gk / n as f64)?.broadcast_to(x.dims())
        }
        ReduceOp::Max | ReduceOp::Min => {
            // Ties share the gradient evenly.
            let yk = y.reshape(kept.dims())?;
            let mask = x.eq(&yk)?.to_dtype(x.dtype())?;
            let axes: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
            let count = mask.sum(&axes, true)?;
            mask.mul(&gk.div(&count)?)
        }
    }
}

/// Scatter-add of `g` (shaped like `x` with `k` slices along `axis`) back into
/// `x`'s shape: a one-hot `[k, n]` matrix contracted with `g` along `axis`.
/// The gradient of a lookup: the output gradient's slices added back at
/// the (clamped) indices they were read from, one scatter.
fn index_select(x: &Tensor, idx: &Tensor, axis: usize, g: &Tensor) -> Result<Tensor> {
    let zeros = Tensor::zeros(x.dims(), g.dtype(), g.device())?;
    zeros.index_add(axis as isize, idx, g)
}

fn slice_back(x: &Tensor, axis: usize, start: usize, len: usize, g: &Tensor) -> Result<Tensor> {
    let dim = x.dims()[axis];
    let zeros = |w: usize| {
        let mut d = x.dims().to_vec();
        d[axis] = w;
        Tensor::zeros(&d, g.dtype(), g.device())
    };
    let (before, after) = (zeros(start)?, zeros(dim - start - len)?);
    let parts: Vec<&Tensor> = [&before, g, &after]
        .into_iter()
        .filter(|t| t.dims()[axis] > 0)
        .collect();
    if parts.is_empty() {
        return x.zeros_like();
    }
    Tensor::cat(&parts, axis as isize)
}

/// The gradient flowing to each operand `x[i]` (where `need[i]`) of `op`,
/// given its output `y` and the output's gradient `g`.
pub(super) fn input_grads(
    op: &Op,
    x: &[Tensor],
    y: &Tensor,
    g: &Tensor,
    need: &[bool],
) -> Result<Grads> {
    let mut out: Grads = SmallVec::from_elem(None, x.len());
    let float = |t: &Tensor| t.dtype().is_float();
    match op {
        Op::Input { .. }
        | Op::Constant { .. }
        | Op::Arange { .. }
        | Op::Compare(_)
        | Op::ArgMax { .. }
        | Op::RandomUniform { .. } => {}
        Op::Custom(k) => {
            let grads = super::custom::gradient(k, x, y, g)?;
            for (o, gi) in out.iter_mut().zip(grads) {
                *o = gi;
            }
        }
        Op::Unary(u) => out[0] = Some(unary(*u, &x[0], y, g)?),
        Op::Binary(b) => {
            let [ga, gb] = binary(*b, x, y, g, need)?;
            out[0] = ga.map(|t| sum_to(&t, x[0].shape())).transpose()?;
            out[1] = gb.map(|t| sum_to(&t, x[1].shape())).transpose()?;
        }
        Op::Select => {
            let zero = Tensor::zeros(&[], g.dtype(), g.device())?;
            if need[1] {
                out[1] = Some(sum_to(&x[0].where_cond(g, &zero)?, x[1].shape())?);
            }
            if need[2] {
                out[2] = Some(sum_to(&x[0].where_cond(&zero, g)?, x[2].shape())?);
            }
        }
        Op::Convert(_) if float(&x[0]) => out[0] = Some(g.to_dtype(x[0].dtype())?),
        Op::Convert(_) => {}
        Op::Reduce { op, axes, .. } => out[0] = Some(reduce(*op, axes, &x[0], y, g)?),
        Op::Reshape(_) => out[0] = Some(g.reshape(x[0].dims())?),
        Op::Permute(perm) => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            out[0] = Some(g.permute_axes(&inv)?);
        }
        Op::BroadcastTo(_) => out[0] = Some(sum_to(g, x[0].shape())?),
        // The gradient keeps the value's layout.
        Op::ShardingConstraint(split) => out[0] = Some(g.constrain(split)?),
        Op::Slice { axis, start, len } => out[0] = Some(slice_back(&x[0], *axis, *start, *len, g)?),
        Op::Concat { axis } => {
            let mut at = 0;
            for (i, t) in x.iter().enumerate() {
                let w = t.dims()[*axis];
                if need[i] {
                    out[i] = Some(g.narrow(*axis as isize, at, w)?);
                }
                at += w;
            }
        }
        Op::Reverse(axes) => {
            let axes: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
            out[0] = Some(g.flip(&axes)?)
        }
        Op::Conv(spec) => {
            let [a, b] = super::conv::conv_grads(spec, &x[0], &x[1], g, need)?;
            (out[0], out[1]) = (a, b);
        }
        Op::MatMul => {
            let (a, b) = (&x[0], &x[1]);
            if need[0] {
                out[0] = Some(sum_to(&g.matmul(&b.transpose(-1, -2)?)?, a.shape())?);
            }
            if need[1] {
                out[1] = Some(sum_to(&a.transpose(-1, -2)?.matmul(g)?, b.shape())?);
            }
        }
        Op::IndexSelect { axis } => out[0] = Some(index_select(&x[0], &x[1], *axis, g)?),
        Op::ScatterAdd { axis } => {
            out[0] = Some(g.clone());
            if need[2] {
                out[2] = Some(g.index_select(*axis as isize, &x[1])?);
            }
        }
        // The start is clamped the same way forward and backward, so the
        // gradient lands where the values were read or written.
        Op::DynamicSlice { axis, .. } => {
            let zeros = Tensor::zeros(x[0].dims(), g.dtype(), g.device())?;
            out[0] = Some(zeros.dynamic_update_slice(g, *axis as isize, &x[1])?);
        }
        Op::DynamicUpdateSlice { axis } => {
            let (u, start) = (&x[1], &x[2]);
            if need[0] {
                let hole = Tensor::zeros(u.dims(), g.dtype(), g.device())?;
                out[0] = Some(g.dynamic_update_slice(&hole, *axis as isize, start)?);
            }
            if need[1] {
                out[1] = Some(g.dynamic_slice(*axis as isize, start, u.dims()[*axis])?);
            }
        }
    }
    for (o, &n) in out.iter_mut().zip(need) {
        if !n {
            *o = None;
        }
    }
    debug_assert!(out
        .iter()
        .zip(x)
        .all(|(o, t)| o.as_ref().is_none_or(|o| o.dtype() == t.dtype())));
    Ok(out)
}
