//! Saving and loading named tensors in the safetensors format: raw
//! little-endian element bytes plus a JSON header, so a round trip is
//! bit-exact for every dtype (NaN payloads and -0.0 included).

use super::Param;
use crate::{DType, Device, Error, HostTensor, Result, Shape, Tensor};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::HashMap;
use std::path::Path;

#[track_caller]
fn io_err(op: &'static str, detail: impl std::fmt::Display, path: &Path) -> Error {
    Error::op(
        op,
        detail,
        path.display().to_string(),
        crate::site::caller(),
    )
}

fn to_st(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

fn from_st(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::BF16 => DType::BF16,
        Dtype::F16 => DType::F16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// Writes `tensors` (a sync point: values are copied to the host) to `path`.
#[track_caller]
pub fn save_tensors(path: impl AsRef<Path>, tensors: &[(String, Tensor)]) -> Result<()> {
    let path = path.as_ref();
    let hosts: Vec<(String, HostTensor)> = tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), t.to_host()?)))
        .collect::<Result<_>>()?;
    let views = hosts
        .iter()
        .map(|(n, h)| {
            TensorView::new(to_st(h.dtype), h.shape.dims().to_vec(), &h.bytes)
                .map(|v| (n.clone(), v))
                .map_err(|e| io_err("save", format!("{n}: {e}"), path))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, &None, path).map_err(|e| io_err("save", e, path))
}

/// Reads every tensor of a safetensors file onto `device`, in file order.
#[track_caller]
pub fn load_tensors(path: impl AsRef<Path>, device: &Device) -> Result<Vec<(String, Tensor)>> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| io_err("load", e, path))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| io_err("load", e, path))?;
    let mut out = Vec::new();
    for (name, view) in st.tensors() {
        let dtype = from_st(view.dtype()).ok_or_else(|| {
            io_err(
                "load",
                format!("{name}: unsupported dtype {:?}", view.dtype()),
                path,
            )
        })?;
        let host = HostTensor {
            shape: Shape::new(view.shape()),
            dtype,
            bytes: view.data().to_vec(),
        };
        out.push((name, Tensor::from_host(&host, device)?));
    }
    Ok(out)
}

/// Saves the parameters (e.g. `module.parameters()`) under their names.
#[track_caller]
pub fn save(path: impl AsRef<Path>, params: &[(String, Param)]) -> Result<()> {
    let ts: Vec<(String, Tensor)> = params
        .iter()
        .map(|(n, p)| (n.clone(), p.tensor()))
        .collect();
    save_tensors(path, &ts)
}

/// Loads values into `params` by name. Every parameter must be in the file
/// with its shape and dtype; extra tensors in the file are an error too, so a
/// mismatched checkpoint never loads silently.
#[track_caller]
pub fn load(path: impl AsRef<Path>, params: &[(String, Param)]) -> Result<()> {
    let path = path.as_ref();
    let Some((_, first)) = params.first() else {
        return Ok(());
    };
    let mut file: HashMap<String, Tensor> = load_tensors(path, first.tensor().device())?
        .into_iter()
        .collect();
    // Check everything before changing anything: a bad file loads nothing.
    let mut values = Vec::with_capacity(params.len());
    for (name, p) in params {
        let t = file.remove(name).ok_or_else(|| {
            io_err(
                "load",
                format!("parameter {name} is missing from the file"),
                path,
            )
        })?;
        let cur = p.tensor();
        if t.shape() != cur.shape() || t.dtype() != cur.dtype() {
            return Err(io_err(
                "load",
                format!(
                    "{name}: file has {}, the parameter is {}",
                    t.describe(),
                    cur.describe()
                ),
                path,
            ));
        }
        values.push((p, t));
    }
    if let Some(extra) = file.keys().next() {
        return Err(io_err(
            "load",
            format!("the file has an unknown tensor {extra}"),
            path,
        ));
    }
    for (p, t) in values {
        p.set(t)?;
    }
    Ok(())
}
