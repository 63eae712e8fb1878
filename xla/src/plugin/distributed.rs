//! The multi-process shape of a client: which process this is, how many
//! the run has, and the key-value store their clients meet through.
//!
//! Why it is a client option: XLA's plugins set up cross-process
//! collectives when the client is created (the GPU plugin's `node_id` and
//! `num_nodes`, with NCCL ids exchanged through the store), so the choice
//! is made once per process, before the first device is used. Only plugins
//! with cross-process collectives accept it: the GPU and TPU ones. XLA's
//! CPU plugin has none (its key-value callbacks are never called), so a
//! CPU client of more than one process is refused with an `Err` rather
//! than created as a silent single-process client.

use crate::pjrt::{CreateOption, KeyValueStore, NamedValue};
use std::fmt;
use std::sync::Arc;

/// This process's place in a multi-process run, and the store the
/// plugin's clients use to exchange their set-up (see
/// [`crate::pjrt::KeyValueStore`]; every process passes a handle to the
/// same store). A run of one process needs none of this.
#[derive(Clone)]
pub struct Distributed {
    /// This process's index, `0..process_count`.
    pub process_index: usize,
    /// Number of processes in the run.
    pub process_count: usize,
    /// The run's shared key-value store.
    pub store: Arc<dyn KeyValueStore>,
}

impl Distributed {
    /// Process `process_index` of `process_count`, meeting the others
    /// through `store`.
    pub fn new(
        process_index: usize,
        process_count: usize,
        store: Arc<dyn KeyValueStore>,
    ) -> Distributed {
        Distributed {
            process_index,
            process_count,
            store,
        }
    }

    /// `Err` (a sentence) for a count of 0 or an index outside it.
    pub fn check(&self) -> Result<(), String> {
        if self.process_count == 0 {
            return Err("a run needs at least one process (process_count is 0)".into());
        }
        if self.process_index >= self.process_count {
            return Err(format!(
                "process index {} is outside a run of {} processes",
                self.process_index, self.process_count
            ));
        }
        Ok(())
    }

    /// The create options XLA's GPU plugin reads for it (`node_id`,
    /// `num_nodes`, both Int64), checked first.
    pub fn gpu_create_options(&self) -> Result<Vec<CreateOption>, String> {
        self.check()?;
        Ok(vec![
            CreateOption::new("node_id", NamedValue::Int(self.process_index as i64)),
            CreateOption::new("num_nodes", NamedValue::Int(self.process_count as i64)),
        ])
    }

    /// Why a CPU client cannot take part in this run, if it cannot: XLA's
    /// CPU plugin has no cross-process collectives.
    pub fn cpu_refusal(&self) -> Result<(), String> {
        self.check()?;
        if self.process_count > 1 {
            return Err(format!(
                "XLA's CPU plugin has no cross-process collectives (it never calls the \
                 key-value store), so process {} of {} cannot join a multi-process run on it; \
                 multi-process runs need the GPU or TPU plugin (Device::cuda_with with \
                 CudaOptions::distributed), or use one process with \
                 Device::cpu_with_devices(n) for n logical devices",
                self.process_index, self.process_count
            ));
        }
        Ok(())
    }
}

impl PartialEq for Distributed {
    /// The same place in a run with the same store (by identity).
    fn eq(&self, other: &Distributed) -> bool {
        self.process_index == other.process_index
            && self.process_count == other.process_count
            && Arc::ptr_eq(&self.store, &other.store)
    }
}

impl fmt::Debug for Distributed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Distributed(process {} of {})",
            self.process_index, self.process_count
        )
    }
}

/// Options for a client of XLA's CPU plugin.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuOptions {
    /// Number of logical devices (the plugin's `cpu_device_count`; 4 by
    /// default). They share the host's cores.
    pub devices: usize,
    /// This process's place in a multi-process run: only a run of one
    /// process is possible on the CPU plugin (see [`Distributed`]).
    pub distributed: Option<Distributed>,
}

impl Default for CpuOptions {
    fn default() -> CpuOptions {
        CpuOptions {
            devices: 4,
            distributed: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pjrt::InMemoryKeyValueStore;

    fn run(index: usize, count: usize) -> Distributed {
        Distributed::new(index, count, Arc::new(InMemoryKeyValueStore::new()))
    }

    #[test]
    fn gpu_options_are_int64_node_id_and_num_nodes() {
        let o = run(1, 4).gpu_create_options().unwrap();
        assert_eq!(
            o,
            vec![
                CreateOption::new("node_id", NamedValue::Int(1)),
                CreateOption::new("num_nodes", NamedValue::Int(4)),
            ]
        );
        assert!(run(4, 4)
            .gpu_create_options()
            .unwrap_err()
            .contains("outside"));
        assert!(run(0, 0).check().unwrap_err().contains("at least one"));
    }

    #[test]
    fn the_cpu_plugin_takes_one_process_only() {
        assert_eq!(run(0, 1).cpu_refusal(), Ok(()));
        let e = run(0, 2).cpu_refusal().unwrap_err();
        assert!(e.contains("no cross-process collectives"), "{e}");
        assert!(e.contains("GPU or TPU"), "{e}");
    }

    #[test]
    fn equality_is_by_place_and_store_identity() {
        let store: Arc<dyn KeyValueStore> = Arc::new(InMemoryKeyValueStore::new());
        let a = Distributed::new(0, 2, store.clone());
        assert_eq!(a, Distributed::new(0, 2, store));
        assert_ne!(a, run(0, 2));
    }
}
