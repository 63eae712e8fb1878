//! The key-value store hook of `PJRT_Client_Create`: how the clients of
//! several processes find each other.
//!
//! Why it exists: a multi-process run (one process per host, or per GPU)
//! needs every process's client to exchange its local topology and the
//! collective library's ids (NCCL's unique id) before the first program.
//! XLA does not ship a transport for that through PJRT; the plugin calls
//! back into the host program's store (`kv_get` / `kv_try_get` /
//! `kv_put`), which the program backs with whatever its launcher has (a
//! coordination service, a shared file system). lazyfuse writes no
//! transport of its own: it passes the caller's [`KeyValueStore`] through.
//!
//! Only plugins with cross-process collectives call the store (XLA's GPU
//! and TPU plugins); the CPU plugin never does, and lazyfuse refuses a
//! multi-process CPU client before creating one (see `Device::cpu_with`).
//!
//! The callbacks are the only ones this binding registers. Each catches a
//! panic of the store and turns it, like any error the store returns, into
//! a `PJRT_Error` made with the plugin's own `callback_error` constructor,
//! so nothing unwinds across `extern "C"`.

use std::collections::HashMap;
use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::sys;

/// Why a store call failed, with the PJRT error code the plugin sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvError {
    /// No value under the key (for `get`: not within the timeout).
    NotFound(String),
    /// `get` waited its whole timeout.
    DeadlineExceeded(String),
    /// Anything else (an I/O error of the backing store, a panic).
    Internal(String),
}

impl KvError {
    fn code_and_message(&self) -> (sys::PJRT_Error_Code, &str) {
        match self {
            KvError::NotFound(m) => (sys::PJRT_Error_Code_NOT_FOUND, m),
            KvError::DeadlineExceeded(m) => (sys::PJRT_Error_Code_DEADLINE_EXCEEDED, m),
            KvError::Internal(m) => (sys::PJRT_Error_Code_INTERNAL, m),
        }
    }
}

impl std::fmt::Display for KvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (_, m) = self.code_and_message();
        f.write_str(m)
    }
}

/// A key-value store shared by the processes of one run, which the PJRT
/// plugin uses to exchange topology and collective ids at client creation.
/// Implement it over the launcher's coordination service;
/// [`InMemoryKeyValueStore`] serves one process (tests, a single host
/// whose processes are threads). Called from the plugin's threads.
pub trait KeyValueStore: Send + Sync {
    /// The value under `key`, waiting up to `timeout` for another process
    /// to put it (`KvError::DeadlineExceeded` after that).
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, KvError>;
    /// The value under `key` if it is there now (`KvError::NotFound` if not).
    fn try_get(&self, key: &str) -> Result<Vec<u8>, KvError>;
    /// Stores `value` under `key`, replacing any earlier value.
    fn put(&self, key: &str, value: &[u8]) -> Result<(), KvError>;
}

/// A [`KeyValueStore`] in this process's memory: `get` blocks until a
/// `put` of the key or the timeout.
#[derive(Default)]
pub struct InMemoryKeyValueStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl InMemoryKeyValueStore {
    /// An empty store.
    pub fn new() -> InMemoryKeyValueStore {
        InMemoryKeyValueStore::default()
    }
}

impl KeyValueStore for InMemoryKeyValueStore {
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, KvError> {
        let deadline = Instant::now() + timeout;
        let mut map = self.map.lock();
        loop {
            if let Some(v) = map.get(key) {
                return Ok(v.clone());
            }
            if self.changed.wait_until(&mut map, deadline).timed_out() {
                return map.get(key).cloned().ok_or_else(|| {
                    KvError::DeadlineExceeded(format!("key {key:?} was not put within {timeout:?}"))
                });
            }
        }
    }

    fn try_get(&self, key: &str) -> Result<Vec<u8>, KvError> {
        self.map
            .lock()
            .get(key)
            .cloned()
            .ok_or_else(|| KvError::NotFound(format!("no value under key {key:?}")))
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        self.map.lock().insert(key.to_string(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }
}

/// The store a client was created with, boxed so that its address (the
/// callbacks' `user_arg`) stays fixed; the client keeps it alive for as
/// long as the plugin may call back.
pub(crate) struct KvHook(Box<Arc<dyn KeyValueStore>>);

impl KvHook {
    pub(crate) fn new(store: Arc<dyn KeyValueStore>) -> KvHook {
        KvHook(Box::new(store))
    }

    /// Fills the callback fields of `a` with this hook.
    pub(crate) fn install(&self, a: &mut sys::PJRT_Client_Create_Args) {
        let arg = self.user_arg();
        a.kv_get_callback = Some(kv_get);
        a.kv_get_user_arg = arg;
        a.kv_try_get_callback = Some(kv_try_get);
        a.kv_try_get_user_arg = arg;
        a.kv_put_callback = Some(kv_put);
        a.kv_put_user_arg = arg;
    }

    fn user_arg(&self) -> *mut c_void {
        (&*self.0 as *const Arc<dyn KeyValueStore>)
            .cast_mut()
            .cast()
    }
}

/// The store behind a callback's `user_arg`.
///
/// # Safety
/// `arg` is a [`KvHook::user_arg`] whose hook is alive.
unsafe fn store<'a>(arg: *mut c_void) -> &'a dyn KeyValueStore {
    &**arg.cast::<Arc<dyn KeyValueStore>>()
}

/// `bytes` (of length `len`) as text, lossily.
///
/// # Safety
/// `ptr` points to `len` readable bytes, or `len` is 0.
unsafe fn text(ptr: *const c_char, len: usize) -> String {
    if len == 0 {
        return String::new();
    }
    String::from_utf8_lossy(std::slice::from_raw_parts(ptr.cast::<u8>(), len)).into_owned()
}

/// Runs a store call, turning a panic into `KvError::Internal`.
fn guarded<T>(f: impl FnOnce() -> Result<T, KvError>) -> Result<T, KvError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(KvError::Internal(
            "the key-value store panicked".to_string(),
        ))
    })
}

/// `e` as a `PJRT_Error` made by the plugin's constructor.
///
/// # Safety
/// `make` is null or points to the plugin's `PJRT_CallbackError`.
unsafe fn plugin_error(make: *mut sys::PJRT_CallbackError, e: &KvError) -> *mut sys::PJRT_Error {
    let (code, msg) = e.code_and_message();
    match make.as_ref().and_then(|f| *f) {
        Some(f) => f(code, msg.as_ptr().cast(), msg.len()),
        // Every XLA plugin passes its constructor; without one there is no
        // way to say why, and the plugin sees an empty value.
        None => std::ptr::null_mut(),
    }
}

/// A value handed to the plugin: an 8-byte length header, then the bytes.
/// The plugin frees it through [`free_value`], which reads the header.
fn leak_value(v: Vec<u8>) -> (*mut c_char, usize) {
    let len = v.len();
    let mut block = Vec::with_capacity(8 + len);
    block.extend_from_slice(&(len as u64).to_ne_bytes());
    block.extend_from_slice(&v);
    let block = Box::into_raw(block.into_boxed_slice()).cast::<u8>();
    // SAFETY: the block is 8 + len bytes long.
    (unsafe { block.add(8) }.cast(), len)
}

/// The value deleter the get callbacks give the plugin.
///
/// # Safety
/// `value` is null or came from [`leak_value`] and is freed once.
unsafe extern "C" fn free_value(value: *mut c_char) {
    if value.is_null() {
        return;
    }
    let block = value.cast::<u8>().sub(8);
    let mut len = [0u8; 8];
    std::ptr::copy_nonoverlapping(block, len.as_mut_ptr(), 8);
    let total = 8 + u64::from_ne_bytes(len) as usize;
    drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
        block, total,
    )));
}

/// `PJRT_KeyValueGetCallback`: a blocking get with the plugin's timeout.
///
/// # Safety
/// Called by the plugin with valid arguments and a live hook as `user_arg`.
unsafe extern "C" fn kv_get(args: *mut sys::PJRT_KeyValueGetCallback_Args) -> *mut sys::PJRT_Error {
    let a = &mut *args;
    let key = text(a.key, a.key_size);
    let timeout = Duration::from_millis(a.timeout_in_ms.max(0) as u64);
    let kv = store(a.user_arg);
    match guarded(|| kv.get(&key, timeout)) {
        Ok(v) => {
            (a.value, a.value_size) = leak_value(v);
            a.value_deleter_callback = Some(free_value);
            std::ptr::null_mut()
        }
        Err(e) => plugin_error(a.callback_error, &e),
    }
}

/// `PJRT_KeyValueTryGetCallback`: a get that does not wait.
///
/// # Safety
/// As [`kv_get`].
unsafe extern "C" fn kv_try_get(
    args: *mut sys::PJRT_KeyValueTryGetCallback_Args,
) -> *mut sys::PJRT_Error {
    let a = &mut *args;
    let key = text(a.key, a.key_size);
    let kv = store(a.user_arg);
    match guarded(|| kv.try_get(&key)) {
        Ok(v) => {
            (a.value, a.value_size) = leak_value(v);
            a.value_deleter_callback = Some(free_value);
            std::ptr::null_mut()
        }
        Err(e) => plugin_error(a.callback_error, &e),
    }
}

/// `PJRT_KeyValuePutCallback`.
///
/// # Safety
/// As [`kv_get`]; `value` points to `value_size` bytes.
unsafe extern "C" fn kv_put(args: *mut sys::PJRT_KeyValuePutCallback_Args) -> *mut sys::PJRT_Error {
    let a = &*args;
    let key = text(a.key, a.key_size);
    let value = if a.value_size == 0 {
        Vec::new()
    } else {
        std::slice::from_raw_parts(a.value.cast::<u8>(), a.value_size).to_vec()
    };
    let kv = store(a.user_arg);
    match guarded(|| kv.put(&key, &value)) {
        Ok(()) => std::ptr::null_mut(),
        Err(e) => plugin_error(a.callback_error, &e),
    }
}

#[cfg(test)]
mod tests {
    //! The callbacks driven the way a plugin drives them: argument structs
    //! from the header, a `callback_error` constructor that records what it
    //! was asked to make.
    use super::*;
    use crate::pjrt::PjrtStruct;

    thread_local! {
        static MADE: std::cell::RefCell<Vec<(sys::PJRT_Error_Code, String)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }

    /// Records the error and returns a non-null token (never dereferenced).
    unsafe extern "C" fn make_error(
        code: sys::PJRT_Error_Code,
        msg: *const c_char,
        len: usize,
    ) -> *mut sys::PJRT_Error {
        MADE.with(|m| m.borrow_mut().push((code, text(msg, len))));
        std::ptr::NonNull::dangling().as_ptr()
    }

    fn hooked(store: Arc<dyn KeyValueStore>) -> (KvHook, sys::PJRT_Client_Create_Args) {
        let hook = KvHook::new(store);
        let mut a = sys::PJRT_Client_Create_Args::new();
        hook.install(&mut a);
        (hook, a)
    }

    fn put(a: &sys::PJRT_Client_Create_Args, key: &str, value: &[u8]) -> *mut sys::PJRT_Error {
        let mut make: sys::PJRT_CallbackError = Some(make_error);
        let mut p = sys::PJRT_KeyValuePutCallback_Args::new();
        p.key = key.as_ptr().cast();
        p.key_size = key.len();
        p.value = value.as_ptr().cast();
        p.value_size = value.len();
        p.callback_error = &mut make;
        p.user_arg = a.kv_put_user_arg;
        unsafe { a.kv_put_callback.unwrap()(&mut p) }
    }

    fn get(
        a: &sys::PJRT_Client_Create_Args,
        key: &str,
        timeout_ms: i32,
    ) -> Result<Vec<u8>, sys::PJRT_Error_Code> {
        let mut make: sys::PJRT_CallbackError = Some(make_error);
        let mut g = sys::PJRT_KeyValueGetCallback_Args::new();
        g.key = key.as_ptr().cast();
        g.key_size = key.len();
        g.timeout_in_ms = timeout_ms;
        g.callback_error = &mut make;
        g.user_arg = a.kv_get_user_arg;
        let err = unsafe { a.kv_get_callback.unwrap()(&mut g) };
        if !err.is_null() {
            return Err(MADE.with(|m| m.borrow().last().unwrap().0));
        }
        let v = unsafe { std::slice::from_raw_parts(g.value.cast::<u8>(), g.value_size) }.to_vec();
        unsafe { g.value_deleter_callback.unwrap()(g.value) };
        Ok(v)
    }

    fn try_get(
        a: &sys::PJRT_Client_Create_Args,
        key: &str,
    ) -> Result<Vec<u8>, sys::PJRT_Error_Code> {
        let mut make: sys::PJRT_CallbackError = Some(make_error);
        let mut g = sys::PJRT_KeyValueTryGetCallback_Args::new();
        g.key = key.as_ptr().cast();
        g.key_size = key.len();
        g.callback_error = &mut make;
        g.user_arg = a.kv_try_get_user_arg;
        let err = unsafe { a.kv_try_get_callback.unwrap()(&mut g) };
        if !err.is_null() {
            return Err(MADE.with(|m| m.borrow().last().unwrap().0));
        }
        let v = unsafe { std::slice::from_raw_parts(g.value.cast::<u8>(), g.value_size) }.to_vec();
        unsafe { g.value_deleter_callback.unwrap()(g.value) };
        Ok(v)
    }

    #[test]
    fn put_then_get_through_the_callbacks() {
        let (_hook, a) = hooked(Arc::new(InMemoryKeyValueStore::new()));
        assert!(put(&a, "gpu:0:topology", b"\x00\x01nccl").is_null());
        assert_eq!(get(&a, "gpu:0:topology", 10), Ok(b"\x00\x01nccl".to_vec()));
        assert_eq!(try_get(&a, "gpu:0:topology"), Ok(b"\x00\x01nccl".to_vec()));
        // An empty value is a value.
        assert!(put(&a, "empty", b"").is_null());
        assert_eq!(try_get(&a, "empty"), Ok(Vec::new()));
    }

    #[test]
    fn missing_keys_are_plugin_errors_with_their_codes() {
        let (_hook, a) = hooked(Arc::new(InMemoryKeyValueStore::new()));
        assert_eq!(try_get(&a, "nope"), Err(sys::PJRT_Error_Code_NOT_FOUND));
        assert_eq!(
            get(&a, "nope", 20),
            Err(sys::PJRT_Error_Code_DEADLINE_EXCEEDED)
        );
        let msg = MADE.with(|m| m.borrow().last().unwrap().1.clone());
        assert!(msg.contains("\"nope\""), "{msg}");
    }

    #[test]
    fn a_get_waits_for_another_threads_put() {
        let store = Arc::new(InMemoryKeyValueStore::new());
        let (_hook, a) = hooked(store.clone());
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            store.put("late", b"there").unwrap();
        });
        assert_eq!(get(&a, "late", 10_000), Ok(b"there".to_vec()));
        writer.join().unwrap();
    }

    #[test]
    fn a_panicking_store_is_an_internal_error_not_an_unwind() {
        struct Broken;
        impl KeyValueStore for Broken {
            fn get(&self, _: &str, _: Duration) -> Result<Vec<u8>, KvError> {
                panic!("store down")
            }
            fn try_get(&self, _: &str) -> Result<Vec<u8>, KvError> {
                panic!("store down")
            }
            fn put(&self, _: &str, _: &[u8]) -> Result<(), KvError> {
                panic!("store down")
            }
        }
        let (_hook, a) = hooked(Arc::new(Broken));
        assert!(!put(&a, "k", b"v").is_null());
        assert_eq!(get(&a, "k", 10), Err(sys::PJRT_Error_Code_INTERNAL));
        assert_eq!(try_get(&a, "k"), Err(sys::PJRT_Error_Code_INTERNAL));
    }
}
