//! Output decisions in the open: what a flush left out (and where its plan
//! computed it, and why) and what it computed late, in the report's
//! `output:` lines and in the `LAZYFUSE_DUMP_DIR` flush log.

mod common;
use common::child::{figure, is_child, run_child, tmpdir};
use common::dev;
use lazyfuse::{metrics, Device, FusionGuard, Tensor};

/// Lines of the program [`child_output_notes`] runs: the tensor left out
/// but computed inside the region, and the one no region computes.
struct NoteLines {
    inside: u32,
    pending: u32,
    used: u32,
}

/// A loop that keeps three named locals it never reads (`h`, computed for
/// the read `y`, `unused` and `s`), then, in its last iteration, reads `h`
/// and uses `s` in a new op.
fn output_notes_program(d: &Device) -> NoteLines {
    let xs: Vec<f32> = (0..64).map(|i| i as f32 / 32.0 - 1.0).collect();
    let x = Tensor::from_vec(xs.clone(), &[64], d).unwrap();
    let mut lines = NoteLines {
        inside: 0,
        pending: 0,
        used: 0,
    };
    for i in 0..6 {
        let (h, inside) = (x.exp().unwrap(), line!());
        let (unused, pending) = (x.tanh().unwrap(), line!());
        let (s, used) = (x.sin().unwrap(), line!());
        let y = h.mul(2.0).unwrap().sum(.., false).unwrap();
        let want: f32 = xs.iter().map(|v| v.exp() * 2.0).sum();
        let got = y.item::<f32>().unwrap();
        assert!((got - want).abs() <= want.abs() * 1e-5, "{got} vs {want}");
        if i == 5 {
            let hv = h.to_vec::<f32>().unwrap();
            for (a, v) in hv.iter().zip(&xs) {
                assert!((a - v.exp()).abs() <= v.exp() * 1e-6, "{a} vs {}", v.exp());
            }
            let m = s.add(1.0).unwrap().max(.., false).unwrap();
            let want = xs.iter().map(|v| v.sin() + 1.0).fold(f32::MIN, f32::max);
            assert!((m.item::<f32>().unwrap() - want).abs() <= 1e-6);
        }
        drop(unused);
        lines = NoteLines {
            inside,
            pending,
            used,
        };
    }
    lines
}

#[test]
fn child_output_notes() {
    if !is_child("child_output_notes") {
        return;
    }
    let _f = FusionGuard::new(true);
    let l = output_notes_program(&dev());
    lazyfuse::sync();
    let decisions = metrics::recent_output_decisions();
    let here = |line: u32| format!("@ {}:{line}", file!());
    let has = |start: &str, line: u32, rest: &str| {
        decisions
            .iter()
            .any(|d| d.starts_with(start) && d.contains(&here(line)) && d.contains(rest))
    };
    assert!(
        has(
            "left out: exp f32[64]",
            l.inside,
            ", computed inside region 0 (key "
        ) && has(
            "left out: exp",
            l.inside,
            "(the last 2 tensors recorded here were dropped unread)"
        ),
        "{decisions:#?}"
    );
    assert!(
        has(
            "left out: tanh f32[64]",
            l.pending,
            ", not computed (the last 2 tensors"
        ),
        "{decisions:#?}"
    );
    assert!(
        has(
            "recompute (read or used after being left out): exp",
            l.inside,
            ", written by region 0"
        ),
        "{decisions:#?}"
    );
    assert!(
        has(
            "recompute (read or used after being left out): sin",
            l.used,
            ", written by region 0"
        ),
        "{decisions:#?}"
    );
    println!(
        "CHILD inside={} pending={} used={}",
        l.inside, l.pending, l.used
    );
    println!("CHILD done=1");
}

/// What a flush left out, and what it computed late, is in the report's
/// `output:` lines and in the flush log, under the region that computed
/// it (or the flush, when no region did), with the reason.
#[test]
fn the_flush_log_and_explain_say_what_was_left_out_where_and_why() {
    let dir = tmpdir("notes");
    let figures = run_child(
        "child_output_notes",
        &[
            ("LAZYFUSE_DUMP_DIR", dir.to_str().unwrap()),
            ("LAZYFUSE_METRICS", "1"),
        ],
    );
    let log = std::fs::read_to_string(dir.join("flush-log.txt")).unwrap();
    // `<indent><what>: <op> f32[64] @ <this file>:<line of figure k>`.
    let line = |indent: &str, what: &str, op: &str, k: &str| {
        format!(
            "{indent}{what}: {op} f32[64] @ {}:{}",
            file!(),
            figure(&figures, k)
        )
    };
    // Under a region (four spaces), with why; under the flush (two).
    let why = " (the last 2 tensors recorded here were dropped unread)";
    let inside = line("    ", "left out, not written", "exp", "inside") + why;
    let pending = line("\n  ", "left out, not computed", "tanh", "pending") + why;
    let late = "recomputed (left out before, now read or used)";
    let recomputed = line("    ", late, "exp", "inside");
    let used = line("    ", late, "sin", "used");
    for needle in [&inside, &pending, &recomputed, &used] {
        assert!(log.contains(needle.as_str()), "{needle:?} not in\n{log}");
    }
    // Left out from the third iteration on, in both ways.
    assert!(log.matches(inside.as_str()).count() >= 3, "{log}");
    assert!(log.matches(pending.as_str()).count() >= 3, "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
