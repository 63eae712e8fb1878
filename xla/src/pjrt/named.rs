//! Typed `PJRT_NamedValue` lists: the client create options a plugin reads.
//!
//! Why typed: a plugin reads each option it knows with one exact type and
//! aborts the process on any other (XLA's CPU plugin dies with
//! `bad_variant_access` when `cpu_device_count` is a bool), while a name it
//! does not know is ignored silently. So callers state the type of every
//! value, and only names read off the plugin's own source are sent (see
//! the CUDA provisioning module for the GPU plugin's list).

use super::sys;
use super::PjrtStruct;

/// One create-option value, with its C API type.
#[derive(Clone, Debug, PartialEq)]
pub enum NamedValue {
    /// `PJRT_NamedValue_kString`.
    Str(String),
    /// `PJRT_NamedValue_kInt64`.
    Int(i64),
    /// `PJRT_NamedValue_kInt64List`.
    IntList(Vec<i64>),
    /// `PJRT_NamedValue_kFloat` (a C `float`).
    Float(f32),
    /// `PJRT_NamedValue_kBool`.
    Bool(bool),
}

/// A named create option, as sent to `PJRT_Client_Create`.
#[derive(Clone, Debug, PartialEq)]
pub struct CreateOption {
    /// The option's name as the plugin spells it.
    pub name: String,
    /// Its value.
    pub value: NamedValue,
}

impl CreateOption {
    /// A named option.
    pub fn new(name: impl Into<String>, value: NamedValue) -> CreateOption {
        CreateOption {
            name: name.into(),
            value,
        }
    }
}

/// The C structs for `options`, pointing into `options`' own strings and
/// lists: valid while `options` is borrowed and unchanged.
pub(crate) fn raw_named_values(options: &[CreateOption]) -> Vec<sys::PJRT_NamedValue> {
    options
        .iter()
        .map(|o| {
            let mut v = sys::PJRT_NamedValue::new();
            v.name = o.name.as_ptr().cast();
            v.name_size = o.name.len();
            match &o.value {
                NamedValue::Str(s) => {
                    v.type_ = sys::PJRT_NamedValue_kString;
                    v.__bindgen_anon_1.string_value = s.as_ptr().cast();
                    v.value_size = s.len();
                }
                NamedValue::Int(i) => {
                    v.type_ = sys::PJRT_NamedValue_kInt64;
                    v.__bindgen_anon_1.int64_value = *i;
                    v.value_size = 1;
                }
                NamedValue::IntList(l) => {
                    v.type_ = sys::PJRT_NamedValue_kInt64List;
                    v.__bindgen_anon_1.int64_array_value = super::api::slice_ptr(l);
                    v.value_size = l.len();
                }
                NamedValue::Float(f) => {
                    v.type_ = sys::PJRT_NamedValue_kFloat;
                    v.__bindgen_anon_1.float_value = *f;
                    v.value_size = 1;
                }
                NamedValue::Bool(b) => {
                    v.type_ = sys::PJRT_NamedValue_kBool;
                    v.__bindgen_anon_1.bool_value = *b;
                    v.value_size = 1;
                }
            }
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_carry_type_name_and_size() {
        let opts = vec![
            CreateOption::new("preallocate", NamedValue::Bool(false)),
            CreateOption::new("memory_fraction", NamedValue::Float(0.5)),
            CreateOption::new("visible_devices", NamedValue::IntList(vec![0, 2])),
            CreateOption::new("allocator", NamedValue::Str("bfc".into())),
        ];
        let raw = raw_named_values(&opts);
        assert_eq!(raw.len(), 4);
        assert_eq!(raw[0].type_, sys::PJRT_NamedValue_kBool);
        assert_eq!(raw[0].name_size, "preallocate".len());
        assert_eq!(raw[1].type_, sys::PJRT_NamedValue_kFloat);
        // SAFETY: the union member written for this type.
        assert_eq!(unsafe { raw[1].__bindgen_anon_1.float_value }, 0.5);
        assert_eq!(raw[2].type_, sys::PJRT_NamedValue_kInt64List);
        assert_eq!(raw[2].value_size, 2);
        assert_eq!(raw[3].type_, sys::PJRT_NamedValue_kString);
        assert_eq!(raw[3].value_size, 3);
        assert_eq!(
            raw[0].struct_size,
            sys::PJRT_NamedValue_STRUCT_SIZE as usize
        );
    }
}
