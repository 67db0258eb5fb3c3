//! Replays the committed trace `data/tiny_engine.trace.jsonl` (recorded from the tiny
//! model by `scripts/record_replay_fixture.py`: chunked prefill, cache hits, a retraction,
//! evictions, stops, two samples of one prompt, a JSON grammar, an abort and a queue
//! timeout) through the library and through the `ferrolm-replay` binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ferrolm_core::trace::{replay, ConfigOverrides, ReplayOptions, Trace};

fn trace_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny_engine.trace.jsonl")
}

fn run_binary(args: &[&str], log: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrolm-replay"));
    cmd.args(args).env_remove("FERROLM_LOG");
    if let Some(filter) = log {
        cmd.env("FERROLM_LOG", filter);
    }
    cmd.output().expect("the binary runs")
}

#[test]
fn the_recorded_trace_replays_as_recorded() {
    let trace = Trace::open(&trace_path()).unwrap();
    let mut lines = Vec::new();
    let options = ReplayOptions { verbose: true, ..Default::default() };
    let s = replay(&trace, &options, &mut |l| lines.push(l.to_string())).unwrap();
    let finishes: BTreeMap<String, usize> =
        [("abort", 1), ("error:queue_timeout", 1), ("length", 9), ("stop", 2)]
            .map(|(k, v)| (k.to_string(), v))
            .into();
    assert_eq!(s.violation_count, 0, "{:?}", s.violations);
    assert_eq!((s.requests, s.steps, s.recorded_steps), (13, 50, 50));
    assert_eq!((s.compared_steps, s.diverged_steps), (50, 0), "{:?}", s.first_divergence);
    assert_eq!((s.prompt_tokens, s.cache_hit_tokens, s.recorded_cache_hit_tokens), (304, 177, 177));
    assert_eq!(s.generated_tokens, 211);
    assert_eq!((s.admissions, s.prefill_chunks, s.retractions), (13, 2, 1));
    assert_eq!(s.finishes, finishes);
    assert_eq!(
        (s.enforced_ends, s.cut_off, s.refused, s.finish_mismatches, s.missing_tokens),
        (1, 0, 0, 0, 0)
    );
    assert_eq!((s.kv_checks, s.peak_kv_used, s.kv_capacity), (51, 192, 192));
    assert_eq!(lines.len(), 50);
    assert!(lines[0].starts_with("step 0: "), "{}", lines[0]);
}

#[test]
fn the_binary_prints_each_step_and_the_summary() {
    let out = run_binary(&[trace_path().to_str().unwrap()], None);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(out.stderr.is_empty(), "silent without FERROLM_LOG: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().filter(|l| l.starts_with("step ")).count(), 50);
    assert!(stdout.lines().any(|l| l.contains("retract r")), "{stdout}");
    assert!(stdout.lines().any(|l| l.contains(" hit ")), "{stdout}");
    for wanted in [
        "replayed 13 requests in 50 steps (recorded: 50 steps)",
        "decisions: 50 of 50 steps scheduled as recorded",
        "cache hits 177 (58.2%; recorded 177)",
        "KV: 51 checks, peak 192 of 192 slots used, 0 violations; no leaked slot at the end",
    ] {
        assert!(stdout.contains(wanted), "{wanted:?} not in\n{stdout}");
    }
    let quiet = run_binary(&["-q", trace_path().to_str().unwrap()], None);
    assert_eq!(String::from_utf8(quiet.stdout).unwrap().lines().count(), 6, "the summary only");
}

#[test]
fn other_settings_diverge_and_expect_same_says_so() {
    let path = trace_path();
    let path = path.to_str().unwrap();
    let out = run_binary(&["-q", "--max-prefill-tokens", "8", path], None);
    assert_eq!(out.status.code(), Some(0), "divergence alone is no failure");
    let out = run_binary(&["-q", "--max-prefill-tokens", "8", "--expect-same", path], None);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8(out.stdout).unwrap().contains("first divergence: step"));
    // arrivals by time under a larger pool: nothing to compare, every request still ends
    let trace = Trace::open(&trace_path()).unwrap();
    let options = ReplayOptions {
        arrivals: ferrolm_core::trace::Arrivals::Time { step_s: None, token_s: 0.0 },
        overrides: ConfigOverrides { kv_capacity: Some(1024), ..Default::default() },
        ..Default::default()
    };
    let s = replay(&trace, &options, &mut |_| {}).unwrap();
    assert!(s.is_ok() && s.compared_steps == 0 && s.retractions == 0, "{}", s.report().join("\n"));
    assert_eq!(s.finishes.values().sum::<usize>(), 13);
}

#[test]
fn bad_arguments_and_bad_traces_exit_2() {
    let dir = std::env::temp_dir().join(format!("ferrolm-replay-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"kind\": \"header\", \"format\": \"something else\"}\n").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![], "missing the trace file"),
        (vec!["--bogus".into()], "unexpected argument"),
        (vec![dir.join("absent.jsonl").display().to_string()], "absent.jsonl"),
        (vec![bad.display().to_string()], "line 1: not a ferrolm trace"),
        (vec!["--step-ms".into(), "5".into(), trace_path().display().to_string()], "--by-time"),
        (vec!["--eviction-policy".into(), "random".into(), trace_path().display().to_string()], "random"),
    ];
    for (args, wanted) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_binary(&args, None);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(wanted), "{args:?}: {wanted:?} not in {stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ferrolm_log_shows_the_schedulers_events() {
    let out = run_binary(&["-q", trace_path().to_str().unwrap()], Some("ferrolm_core=debug"));
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8(out.stderr).unwrap();
    for event in [
        "admitted",
        "prefix cache hit",
        "prefill chunk",
        "evicted from the prefix cache",
        "retracted under KV pressure",
    ] {
        assert!(stderr.contains(event), "no {event:?} event in\n{stderr}");
    }
    assert!(stderr.contains("step{step="), "events carry their step's span");
    // a narrower filter leaves the debug events out
    let quiet = run_binary(&["-q", trace_path().to_str().unwrap()], Some("ferrolm_core=warn"));
    assert!(quiet.stderr.is_empty(), "{}", String::from_utf8_lossy(&quiet.stderr));
    let bad = run_binary(&["-q", trace_path().to_str().unwrap()], Some("ferrolm_core=loud"));
    assert_eq!(bad.status.code(), Some(0));
    assert!(String::from_utf8(bad.stderr).unwrap().contains("is not a log filter"));
}
