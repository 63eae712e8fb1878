//! `Tensor::upload_bytes`: borrowed host bytes (a binding's tensor memory)
//! uploaded with one copy, as an upload site like `Tensor::upload`.

mod common;
use common::{dev, metrics_lock};
use lazyfuse::metrics::snapshot;
use lazyfuse::{DType, Error, HostTensor, Tensor};

fn bytes_of(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The values are the bytes given, for several dtypes, a scalar and an
/// empty array; each upload is one transfer of exactly its bytes.
#[test]
fn uploads_the_bytes_given_in_one_transfer() {
    let _l = metrics_lock();
    let d = dev();
    let v: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
    let b = bytes_of(&v);
    let before = snapshot();
    let t = Tensor::upload_bytes(&b, &[3, 4], DType::F32, &d).unwrap();
    let after = snapshot();
    assert_eq!(after.h2d_transfers - before.h2d_transfers, 1);
    assert_eq!(after.h2d_bytes - before.h2d_bytes, 48);
    assert_eq!(t.dims(), &[3, 4]);
    assert_eq!(t.to_vec::<f32>().unwrap(), v);
    // The same bytes as the owned path gives, in a computation too.
    let owned = Tensor::upload(HostTensor::from_slice(&v, [3, 4][..].into()), &d).unwrap();
    let sum = |t: &Tensor| {
        t.mul(2.0)
            .unwrap()
            .sum(.., false)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    assert_eq!(sum(&t), sum(&owned));

    let i: Vec<u8> = [7i64, -3].iter().flat_map(|x| x.to_le_bytes()).collect();
    let ti = Tensor::upload_bytes(&i, &[2], DType::I64, &d).unwrap();
    assert_eq!(ti.to_vec::<i64>().unwrap(), vec![7, -3]);
    let s = Tensor::upload_bytes(&2.5f32.to_le_bytes(), &[], DType::F32, &d).unwrap();
    assert_eq!(s.dims(), &[] as &[usize]);
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![2.5]);
    let e = Tensor::upload_bytes(&[], &[0, 3], DType::F32, &d).unwrap();
    assert_eq!(e.dims(), &[0, 3]);
    assert!(e.to_vec::<f32>().unwrap().is_empty());
}

/// Bytes that do not fill the shape are an `Err` naming `upload_bytes`
/// and the caller's line; nothing is uploaded.
#[test]
fn the_wrong_byte_count_is_an_error_at_the_call_site() {
    let _l = metrics_lock();
    let d = dev();
    let before = snapshot().h2d_transfers;
    let line = line!() + 1;
    let r = Tensor::upload_bytes(&[0u8; 10], &[3], DType::F32, &d);
    match r {
        Err(Error::Op { op, location, .. }) => {
            assert_eq!(op, "upload_bytes");
            assert!(location.file().ends_with("upload_bytes.rs"));
            assert_eq!(location.line(), line);
        }
        other => panic!("expected an op error, got {other:?}"),
    }
    assert_eq!(snapshot().h2d_transfers, before);
}

/// One line uploading arrays whose length changes is a bucketed upload
/// site, as with `Tensor::upload`: the logical shapes and values are the
/// ones given.
#[test]
fn a_site_of_varying_length_keeps_each_logical_shape() {
    let _l = metrics_lock();
    let d = dev();
    for len in [3usize, 5, 7, 9, 4] {
        let v: Vec<f32> = (0..len * 2).map(|i| (i as f32 * 0.37).sin()).collect();
        let t = Tensor::upload_bytes(&bytes_of(&v), &[len, 2], DType::F32, &d).unwrap();
        assert_eq!(t.dims(), &[len, 2]);
        let got = t.add(1.0).unwrap().to_vec::<f32>().unwrap();
        let want: Vec<f32> = v.iter().map(|x| x + 1.0).collect();
        assert_eq!(got, want);
    }
}
