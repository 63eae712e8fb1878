//! The devices of one client: each ordinal computes on its own (with its
//! own executor), answers agree across ordinals, and misuse is an `Err`.

use lazyfuse::{DType, Device, Tensor};

fn program(d: &Device) -> Vec<f32> {
    let x = Tensor::arange(0.0, 64.0, DType::F32, d)
        .unwrap()
        .reshape(&[8, 8])
        .unwrap();
    let y = x
        .matmul(&x.transpose(0, 1).unwrap())
        .unwrap()
        .tanh()
        .unwrap();
    y.sum([-1], false).unwrap().to_vec().unwrap()
}

#[test]
fn every_ordinal_computes_the_same_answer_concurrently() {
    let d0 = Device::cpu().unwrap();
    let n = d0.device_count();
    assert!(n >= 2, "the CPU plugin exposes {n} devices");
    let d1 = d0.with_ordinal(1).unwrap();
    assert_eq!(
        format!("{d1:?}"),
        format!("{}:1", format!("{d0:?}").trim_end_matches(":0"))
    );
    assert!(!d0.same_device(&d1) && d1.same_device(&d0.with_ordinal(1).unwrap()));
    let want = program(&d0);
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let d = d0.with_ordinal(i).unwrap();
            std::thread::spawn(move || (0..20).map(|_| program(&d)).collect::<Vec<_>>())
        })
        .collect();
    for h in handles {
        for got in h.join().unwrap() {
            assert_eq!(got, want);
        }
    }
    let e = d0.with_ordinal(n).unwrap_err().to_string();
    assert!(e.contains("out of range"), "{e}");
}

#[test]
fn mixing_devices_in_one_op_is_an_err() {
    let d0 = Device::cpu().unwrap();
    let d1 = d0.with_ordinal(1).unwrap();
    let a = Tensor::ones(&[4], DType::F32, &d0).unwrap();
    let b = Tensor::ones(&[4], DType::F32, &d1).unwrap();
    let e = a.add(&b);
    assert!(
        e.is_err(),
        "an op across devices must be an Err, got {:?}",
        e.map(|t| t.dims().to_vec())
    );
}

/// The multi-process options on the CPU plugin: one process is the plain
/// client; more is an `Err` naming why (the plugin has no cross-process
/// collectives), never a silent single-process client.
#[test]
fn a_multi_process_cpu_client_is_refused_and_one_process_is_plain() {
    use lazyfuse::{CpuOptions, Distributed, InMemoryKeyValueStore};
    use std::sync::Arc;
    let store = Arc::new(InMemoryKeyValueStore::new());
    let two = CpuOptions {
        devices: 4,
        distributed: Some(Distributed::new(1, 2, store.clone())),
    };
    let e = Device::cpu_with(&two).unwrap_err().to_string();
    assert!(e.contains("no cross-process collectives"), "{e}");
    assert!(e.contains("process 1 of 2"), "{e}");
    let outside = CpuOptions {
        devices: 4,
        distributed: Some(Distributed::new(3, 2, store.clone())),
    };
    let e = Device::cpu_with(&outside).unwrap_err().to_string();
    assert!(e.contains("outside a run of 2"), "{e}");

    let one = CpuOptions {
        devices: 4,
        distributed: Some(Distributed::new(0, 1, store)),
    };
    let d = Device::cpu_with(&one).unwrap();
    assert_eq!((d.process_index(), d.process_count()), (0, 1));
    assert_eq!(d.device_count(), 4);
    assert_eq!(program(&d), program(&Device::cpu().unwrap()));
}
