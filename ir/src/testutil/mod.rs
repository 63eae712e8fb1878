//! Helpers for the tests of lazyfuse's crates, behind the `test-util`
//! feature so they never reach a normal build.
//!
//! They exist so every crate's tests build graphs and pin long texts the
//! same way instead of each test file carrying its own copy:
//! [`GraphBuilder`] records test graphs one line per op, and
//! [`check_golden`] (or the [`golden!`](crate::golden) macro) compares text
//! with a golden file that `LAZYFUSE_BLESS=1` regenerates.
//!
//! Enable it from a dev-dependency:
//! `lazyfuse-ir = { workspace = true, features = ["test-util"] }`.

mod builder;
mod golden;

pub use builder::GraphBuilder;
pub use golden::{check_golden, line_diff, BLESS_VAR};

/// Compares text with the golden file `tests/golden/<name>.txt` of the
/// calling crate: `golden!("plan_name", dump)` is
/// [`check_golden`](crate::testutil::check_golden) on that path under the
/// caller's `CARGO_MANIFEST_DIR`.
///
/// It exists so a test names its golden file once, by test name, and the
/// path never depends on the directory the test runs in. `name` is any
/// `Display` value; `actual` anything that is `AsRef<str>` (`String`, `&str`).
/// Run with `LAZYFUSE_BLESS=1` to write the files.
#[macro_export]
macro_rules! golden {
    ($name:expr, $actual:expr $(,)?) => {
        $crate::testutil::check_golden(
            ::std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests")
                .join("golden")
                .join(format!("{}.txt", $name)),
            ::std::convert::AsRef::<str>::as_ref(&$actual),
        )
    };
}
