//! The backward pass: order the recorded grad nodes reachable from the root,
//! then walk them from the root down, applying each op's rule and summing
//! gradients per node; leaves accumulate into their `grad` slot.

use super::{meta_arc, requires, rules, GradNode, Meta, NoGradGuard, Saved};
use crate::tensor::{Arg, Tensor};
use crate::{Error, Result};
use lazyfuse_ir::Origin;
use smallvec::SmallVec;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

fn key(m: &Arc<Meta>) -> usize {
    Arc::as_ptr(m) as usize
}

fn saved_inputs(node: &GradNode, loc: Origin) -> Result<SmallVec<[Saved; 3]>> {
    node.inputs.lock().clone().ok_or_else(|| {
        Error::op(
            "backward",
            format!(
                "the graph through {} (recorded at {}) was already released by an earlier backward; use backward_retain_graph to run backward twice",
                node.op.name(),
                node.origin
            ),
            String::new(),
            loc,
        )
    })
}

/// Grad nodes reachable from `root`, each after every node that uses it
/// (reverse post-order of an iterative depth-first search).
fn topo_order(root: &Arc<Meta>, loc: Origin) -> Result<Vec<Arc<Meta>>> {
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    let mut stack: Vec<(Arc<Meta>, bool)> = vec![(root.clone(), false)];
    while let Some((m, expanded)) = stack.pop() {
        if expanded {
            order.push(m);
            continue;
        }
        if !seen.insert(key(&m)) {
            continue;
        }
        stack.push((m.clone(), true));
        if let Meta::Node(n) = &*m {
            for s in saved_inputs(n, loc)? {
                if let Saved::T(t) = s {
                    if let Some(c) = meta_arc(&t) {
                        if matches!(*c, Meta::Node(_)) && !seen.contains(&key(&c)) {
                            stack.push((c, false));
                        }
                    }
                }
            }
        }
    }
    order.reverse();
    Ok(order)
}

fn accumulate(slot: &mut Option<Tensor>, g: Tensor) -> Result<()> {
    *slot = Some(match slot.take() {
        Some(old) => old.add(&g)?,
        None => g,
    });
    Ok(())
}

/// `root.backward()`: see [`Tensor::backward`].
pub(super) fn run(root: &Tensor, retain: bool, loc: Origin) -> Result<()> {
    let rm = check_root(root, loc)?;
    let _ng = NoGradGuard::new();
    if let Meta::Leaf { grad, .. } = &*rm {
        accumulate(&mut grad.lock(), root.ones_like()?)?;
        return Ok(());
    }
    // Ordering first: a released graph is an `Err` that must record nothing.
    let order = topo_order(&rm, loc)?;
    let seed = root.ones_like()?;
    let mut grads: HashMap<usize, Tensor> = HashMap::new();
    grads.insert(key(&rm), seed);
    // The outputs of nodes still to visit, as their consumers saved them:
    // held here once a consumer releases its operands, so every node's
    // rule gets its own output rather than recording its op again.
    // Otherwise whether the output survived would depend on who else held
    // it, an executor job among them, and the recorded backward (its
    // regions and their keys) on when that job ran.
    let mut outs: HashMap<usize, Tensor> = HashMap::new();
    for m in &order {
        let Meta::Node(node) = &**m else { continue };
        let inputs = if retain {
            saved_inputs(node, loc)?
        } else {
            node.inputs.lock().take().unwrap_or_default()
        };
        let Some(g) = grads.remove(&key(m)) else {
            continue;
        };
        let (gs, need) = node_grads(node, &inputs, outs.remove(&key(m)), &g)?;
        for ((s, gi), needed) in inputs.iter().zip(gs).zip(need) {
            let (Saved::T(t), Some(gi), true) = (s, gi, needed) else {
                continue;
            };
            debug_assert_eq!(gi.shape(), t.shape(), "{} gradient shape", node.op.name());
            deliver(t, gi, &mut grads, (!retain).then_some(&mut outs))?;
        }
    }
    drop(order);
    // No sync: the gradients stay pending like any other tensor, so the
    // forward pass, the backward pass and the optimizer update (which syncs)
    // fuse into one executable; reading a gradient flushes as usual.
    Ok(())
}

/// The root's grad metadata, or why `backward` cannot start from it (an
/// `Err` that records nothing).
fn check_root(root: &Tensor, loc: Origin) -> Result<Arc<Meta>> {
    let bad = |why: String| Err(Error::op("backward", why, root.describe(), loc));
    if root.numel() != 1 {
        return bad(format!(
            "needs a one-element (scalar) tensor, got {} elements; reduce it first (e.g. mean(.., false))",
            root.numel()
        ));
    }
    if !root.dtype().is_float() {
        return bad("needs a float tensor".into());
    }
    match meta_arc(root).filter(|_| requires(root)) {
        Some(rm) => Ok(rm),
        None => bad("this tensor does not require grad: no input was marked with set_requires_grad(true) (or it was computed under no_grad)".into()),
    }
}

/// The gradients of `node`'s inputs from the gradient `g` of its output,
/// and which inputs need one. The rule gets the node's own output: `saved`
/// (kept by a consumer), else the live output, else the op recorded again
/// from its operands.
fn node_grads(
    node: &GradNode,
    inputs: &[Saved],
    saved: Option<Tensor>,
    g: &Tensor,
) -> Result<(rules::Grads, SmallVec<[bool; 3]>)> {
    let need: SmallVec<[bool; 3]> = inputs
        .iter()
        .map(|s| matches!(s, Saved::T(t) if requires(t)))
        .collect();
    let device = g.device().clone();
    let xs: Vec<Tensor> = inputs
        .iter()
        .map(|s| match s {
            Saved::T(t) => Ok(t.clone()),
            Saved::Scalar(l, d) => Tensor::full(l.as_f64(), &[], *d, &device),
        })
        .collect::<Result<_>>()?;
    let out = match saved.or_else(|| node.out.upgrade().map(Tensor)) {
        Some(out) => out,
        None => {
            let args: SmallVec<[Arg<'_>; 3]> = xs.iter().map(Arg::T).collect();
            Tensor::apply_args(node.op.clone(), &args, node.origin)?
        }
    };
    let gs = rules::input_grads(&node.op, &xs, &out, g, &need)?;
    Ok((gs, need))
}

/// Adds the gradient `gi` of input `t`: into its `grad` slot for a leaf,
/// into the pending sum of its node otherwise (and, with `outs` when the
/// graph is being released, keeps `t` as that node's output).
fn deliver(
    t: &Tensor,
    gi: Tensor,
    grads: &mut HashMap<usize, Tensor>,
    outs: Option<&mut HashMap<usize, Tensor>>,
) -> Result<()> {
    let m = meta_arc(t);
    match m.as_deref() {
        Some(Meta::Leaf { grad, .. }) => {
            // A parameter split over a mesh (FSDP) gets its gradient split
            // the same way: XLA reduce-scatters it instead of leaving the
            // whole sum on every device, in whatever region computes it.
            let gi = match t.placed_split() {
                Some(split) => gi.constrain(&split)?,
                None => gi,
            };
            accumulate(&mut grad.lock(), gi)
        }
        Some(Meta::Node(_)) => {
            let k = key(m.as_ref().expect("checked above"));
            let mut slot = grads.remove(&k);
            accumulate(&mut slot, gi)?;
            grads.insert(k, slot.expect("just accumulated"));
            if let Some(outs) = outs {
                outs.entry(k).or_insert_with(|| t.clone());
            }
            Ok(())
        }
        None => Ok(()),
    }
}
