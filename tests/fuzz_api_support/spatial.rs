//! The API fuzzer's spatial calls: pooling, upsampling and the vision
//! norms, on a pool entry viewed as NCHW (rank 2 as `[1, 1, h, w]`, rank 3
//! as `[1, c, h, w]`), the result flattened back to rank 3 so later calls
//! keep the pool's ranks.

use super::Sp;
use lazyfuse::nn::{BatchNorm, GroupNorm, Module};
use lazyfuse::{Device, Result, Tensor};

/// Applies `sp` to `x` on `dev`. The view and the norm module are made
/// first, then `mark` is called: the API call under test is the op alone
/// (its `Err` must leave nothing recorded after the mark).
pub fn spatial(sp: Sp, x: &Tensor, dev: &Device, mark: impl FnOnce()) -> Result<Tensor> {
    let x4 = match x.rank() {
        2 => x.reshape(&[1, 1, x.dims()[0], x.dims()[1]])?,
        3 => x.unsqueeze(0)?,
        _ => x.clone(),
    };
    let c = x4.dims().get(1).copied().unwrap_or(1);
    let bn = match sp {
        Sp::BatchNorm(_) => Some(BatchNorm::new(c, dev)?),
        _ => None,
    };
    let gn = match sp {
        Sp::GroupNorm(g) => GroupNorm::new(g, c, 1e-5, dev).ok(),
        _ => None,
    };
    mark();
    let y = match sp {
        Sp::MaxPool(k, s, p) => x4.max_pool2d((k, k), (s, s), (p, p))?,
        Sp::AvgPool(k, s, p) => x4.avg_pool2d((k, k), (s, s), (p, p))?,
        Sp::Nearest(h, w) => x4.upsample_nearest(&[h, w])?,
        Sp::Bilinear(h, w, align) => x4.upsample_bilinear((h, w), align)?,
        Sp::BatchNorm(stats) => {
            let bn = bn.expect("made above");
            let y = bn.forward(&x4)?;
            if stats {
                bn.running_var().reshape(&[1, c, 1, 1])?
            } else {
                y
            }
        }
        Sp::GroupNorm(g) => match gn {
            Some(gn) => gn.forward(&x4)?,
            // Groups that do not divide the channels: the constructor's Err.
            None => GroupNorm::new(g, c, 1e-5, dev)?.forward(&x4)?,
        },
    };
    if y.rank() == 4 {
        let d = y.dims().to_vec();
        y.reshape(&[d[0] * d[1], d[2], d[3]])
    } else {
        Ok(y)
    }
}
