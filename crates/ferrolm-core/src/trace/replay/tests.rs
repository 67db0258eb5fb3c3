//! Record a run of the engine on a fake model, then replay the trace: the replay must make
//! the same decisions step by step, end every request as recorded and keep the KV checks.

use std::io::Write;
use std::sync::{Arc, Mutex};

use super::*;
use crate::detok::{StopConditions, TokenTable};
use crate::engine::{Engine, EngineConfig, RequestParams, StepOutputs};
use crate::sampling::SamplingParams;
use crate::trace::{ConfigOverrides, Record};

const VOCAB: usize = 300;
const EOS: u32 = 299;

fn vocab() -> Arc<TokenTable> {
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    while tokens.len() < VOCAB - 1 {
        tokens.push(format!("<{}>", tokens.len()).into_bytes());
    }
    tokens.push(b"</s>".to_vec());
    Arc::new(TokenTable { tokens, special: vec![EOS] })
}

/// A model whose logits are a hash of the tokens in the KV slots a request attends to.
struct FakeModel {
    kv: Vec<u32>,
}

impl FakeModel {
    fn forward(&mut self, plan: &BatchPlan) -> Vec<f32> {
        for i in 0..plan.num_tokens() {
            self.kv[plan.out_slots[i] as usize] = plan.input_ids[i];
        }
        // a row per logit row: the request's slots up to that token's position
        let mut logits = Vec::with_capacity(plan.logit_rows.len() * VOCAB);
        let mut b = 0;
        for &t in &plan.logit_rows {
            while plan.qo_offsets[b + 1] <= t {
                b += 1;
            }
            let start = plan.kv_offsets[b] as usize;
            let ctx = &plan.kv_slots[start..start + plan.positions[t as usize] as usize + 1];
            let h = ctx.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &s| {
                (h ^ self.kv[s as usize] as u64).wrapping_mul(0x100_0000_01b3)
            });
            for v in 0..VOCAB as u64 {
                let x = (h ^ v.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xff51_afd7_ed55_8ccd);
                logits.push(((x >> 40) % 1000) as f32 / 100.0);
            }
        }
        logits
    }
}

/// A `Write` whose bytes the test reads back.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn config() -> EngineConfig {
    EngineConfig {
        kv_capacity: 200,
        max_prefill_tokens: 24,
        max_running_requests: 6,
        // admit on what the prompts need alone: decodes then run out of room and retract
        new_token_ratio: 0.0,
        vocab_size: VOCAB,
        eos_token_ids: vec![EOS],
        max_context: 512,
        ..EngineConfig::default()
    }
}

fn params(max_new: usize, temperature: f32) -> RequestParams {
    RequestParams {
        sampling: SamplingParams { temperature, seed: Some(7), ..Default::default() },
        max_new_tokens: max_new,
        ignore_eos: true,
        ..Default::default()
    }
}

fn prompt(shared: usize, own: usize, salt: u32) -> Vec<u32> {
    let mut p: Vec<u32> = (0..shared as u32).map(|i| (i * 7 + 3) % 250).collect();
    p.extend((0..own as u32).map(|j| (salt * 31 + j * 13) % 250));
    p
}

/// What a recorded run did, to compare the replay with.
struct Live {
    trace: Vec<u8>,
    stats: crate::engine::EngineStats,
    finishes: std::collections::BTreeMap<String, usize>,
}

/// Runs a workload that retracts, chunks, hits the cache, stops on a string and on a
/// token, samples twice from one prompt, aborts one request and times out another.
fn record_run() -> Live {
    let out = Shared::default();
    let mut engine = Engine::new(config(), vocab()).unwrap();
    engine.record_trace(Box::new(out.clone())).unwrap();
    let mut model = FakeModel { kv: vec![0; 200] };
    let mut finishes = std::collections::BTreeMap::new();
    let mut tally = |out: &StepOutputs| {
        for f in out.finished.iter().flatten() {
            *finishes.entry(reason_key(&f.reason)).or_insert(0usize) += 1;
        }
    };
    let mut rid = 0u64;
    let mut next_rid = || {
        rid += 1;
        rid
    };
    for step in 0..400 {
        if step < 12 && step % 2 == 0 {
            let r = next_rid();
            let p = prompt(if r % 3 == 0 { 0 } else { 40 }, 5 + (r as usize * 7) % 30, r as u32);
            engine
                .submit(r, &p, params(20 + (r as usize % 4) * 8, if r % 2 == 0 { 0.0 } else { 0.8 }), None)
                .unwrap();
        }
        if step == 5 {
            // a thinking budget: its forced end marker replays as recorded
            let mut p = params(20, 0.8);
            let end_ids = vec![250, 251];
            p.thinking =
                Some(crate::engine::ThinkingBudget { budget: 3, start_ids: vec![249], end_ids, open: true });
            engine.submit(next_rid(), &prompt(40, 6, 77), p, None).unwrap();
        }
        if step == 3 {
            let mut p = params(20, 0.0);
            // the text of two tokens this request draws ("<" then "T"): a stop across tokens
            p.stops = StopConditions {
                stop_strings: vec!["<T".into()],
                skip_special_tokens: true,
                ..Default::default()
            };
            engine.submit(next_rid(), &prompt(40, 9, 99), p, None).unwrap();
            let r = next_rid();
            let mut p = params(30, 1.0);
            p.stops.stop_token_ids = (100..140).collect();
            engine.submit_samples(&[r, r + 100], &prompt(40, 3, 77), p, None).unwrap();
        }
        if step == 4 {
            let mut p = params(8, 0.0);
            p.queue_timeout_s = Some(1e-9); // waits past it at the next step's start
            engine.submit(next_rid(), &prompt(0, 60, 5), p, None).unwrap();
        }
        if step == 9 {
            assert!(engine.abort(2));
        }
        let plan = engine.schedule().unwrap();
        let out = if plan.is_empty() {
            engine.take_outputs()
        } else {
            let mut logits = model.forward(&plan);
            engine.commit(&mut logits, VOCAB).unwrap()
        };
        tally(&out);
        engine.check_invariants().unwrap();
        if step >= 12 && !engine.has_work() {
            break;
        }
    }
    assert!(!engine.has_work(), "the workload ends");
    let trace = out.0.lock().unwrap().clone();
    Live { trace, stats: engine.stats(), finishes }
}

fn read(bytes: &[u8]) -> Trace {
    Trace::read(bytes).unwrap()
}

#[test]
fn a_replay_by_steps_makes_the_recorded_decisions() {
    let live = record_run();
    assert!(live.stats.retractions > 0, "the workload retracts: {:?}", live.stats);
    assert!(live.stats.cache_hit_tokens > 0, "the workload hits the cache");
    for reason in ["stop", "length", "abort", "error:queue_timeout"] {
        assert!(live.finishes.contains_key(reason), "no {reason} in {:?}", live.finishes);
    }
    let text = String::from_utf8(live.trace.clone()).unwrap();
    assert!(text.contains(r#""reason":"stop","string":"<T""#), "a stop string ends a request");
    assert!(text.contains(r#""reason":"stop","token":1"#), "a stop token ends a request");
    let trace = read(&live.trace);
    let mut lines = Vec::new();
    let options = ReplayOptions { verbose: true, ..Default::default() };
    let s = replay(&trace, &options, &mut |l| lines.push(l.to_string())).unwrap();
    assert!(s.is_ok(), "{:?}", s.violations);
    assert!(s.is_same(), "{}", s.report().join("\n"));
    assert_eq!(s.compared_steps, live.stats.steps);
    assert_eq!(s.steps, live.stats.steps);
    assert_eq!(s.retractions, live.stats.retractions);
    assert_eq!(s.cache_hit_tokens, live.stats.cache_hit_tokens);
    assert_eq!(s.recorded_cache_hit_tokens, live.stats.cache_hit_tokens);
    assert_eq!(s.prompt_tokens, live.stats.prompt_tokens);
    assert_eq!(s.generated_tokens, live.stats.generation_tokens);
    assert_eq!(s.finishes, live.finishes);
    assert_eq!(s.enforced_ends, 1, "the queue timeout is applied from the recording");
    assert_eq!(s.kv_checks, s.steps + 1);
    assert!(s.prefill_chunks > 0);
    assert_eq!(lines.len() as u64, s.steps);
    assert!(lines.iter().any(|l| l.contains("retract r")), "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains(" hit ")), "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains(" chunk")), "{lines:#?}");
}

#[test]
fn a_replay_under_other_settings_diverges_but_keeps_the_checks() {
    let trace = read(&record_run().trace);
    let options = ReplayOptions {
        overrides: ConfigOverrides {
            max_prefill_tokens: Some(7),
            kv_capacity: Some(400),
            ..Default::default()
        },
        ..Default::default()
    };
    let s = replay(&trace, &options, &mut |_| {}).unwrap();
    assert!(s.is_ok(), "{:?}", s.violations);
    assert!(s.diverged_steps > 0 && s.first_divergence.is_some());
    assert_eq!(s.exit_code(true), 3);
    assert_eq!(s.exit_code(false), 0);
    assert_eq!(s.finishes.values().sum::<usize>(), s.requests, "every request ends");
}

#[test]
fn a_replay_by_time_ends_every_request() {
    let trace = read(&record_run().trace);
    for step_s in [None, Some(0.5)] {
        let options =
            ReplayOptions { arrivals: Arrivals::Time { step_s, token_s: 1e-4 }, ..Default::default() };
        let s = replay(&trace, &options, &mut |_| {}).unwrap();
        assert!(s.is_ok(), "{:?}", s.violations);
        assert_eq!(s.compared_steps, 0);
        assert_eq!(s.finishes.values().sum::<usize>(), s.requests);
        assert_eq!(s.missing_tokens, 0, "{}", s.report().join("\n"));
    }
}

#[test]
fn a_recording_cut_off_mid_run_ends_its_requests_when_their_tokens_run_out() {
    let live = record_run();
    let text = String::from_utf8(live.trace).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let half = lines[..lines.len() / 2].join("\n");
    let s = replay(&read(half.as_bytes()), &ReplayOptions::default(), &mut |_| {}).unwrap();
    assert!(s.is_ok(), "{:?}", s.violations);
    assert!(s.cut_off > 0, "{}", s.report().join("\n"));
    assert_eq!(s.finishes.values().sum::<usize>(), s.requests);
}

#[test]
fn a_leaked_slot_is_a_violation() {
    let trace = read(&record_run().trace);
    let options = ReplayOptions::default();
    let mut log = |_: &str| {};
    let mut r = Replayer::start(&trace, &options, &mut log).unwrap();
    r.run(&trace, Arrivals::Steps);
    r.engine.leak_slot_for_test();
    let s = r.finish();
    assert!(!s.is_ok());
    assert_eq!(s.exit_code(false), 1);
    assert!(s.violations.iter().any(|v| v.contains("leaked")), "{:?}", s.violations);
    assert!(s.violations.iter().any(|v| v.contains("not held and not free")), "{:?}", s.violations);
    assert!(s.report().iter().any(|l| l.starts_with("VIOLATION")));
}

#[test]
fn a_bad_trace_is_refused_with_its_line() {
    let good = String::from_utf8(record_run().trace).unwrap();
    let header = good.lines().next().unwrap();
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "empty"),
        ("{\"kind\": \"header\"}\n".into(), "not a ferrolm trace"),
        (header.replace("\"version\":1", "\"version\":99"), "version 99"),
        (format!("{header}\nnot json\n"), "line 2: not JSON"),
        (format!("{header}\n{{\"kind\":\"teleport\",\"step\":0}}\n"), "line 2: unknown record kind"),
        (format!("{header}\n{{\"kind\":\"abort\",\"step\":0}}\n"), "line 2: missing field \"rid\""),
        (format!("{header}\n\n{{\"kind\":\"submit\",\"step\":0,\"rids\":[1],\"prompt\":[-1],\"params\":{{}}}}\n"), "line 3: prompt"),
        (header.replace("\"kv_capacity\":200", "\"kv_capacity\":0"), "kv_capacity must be at least 1"),
    ];
    for (text, wanted) in cases {
        let err = Trace::read(text.as_bytes()).unwrap_err();
        assert!(err.contains(wanted), "{err:?} does not say {wanted:?}");
    }
}

#[test]
fn recording_starts_on_a_fresh_engine_and_a_failed_write_stops_only_the_recording() {
    let mut engine = Engine::new(config(), vocab()).unwrap();
    engine.submit(1, &[1, 2, 3], params(2, 0.0), None).unwrap();
    let err = engine.record_trace(Box::new(Shared::default())).unwrap_err();
    assert!(err.contains("fresh engine"), "{err}");

    /// Takes this many lines, then fails.
    struct Failing(usize);
    impl Write for Failing {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.0 == 0 {
                return Err(std::io::Error::other("disk full"));
            }
            self.0 -= buf.iter().filter(|&&b| b == b'\n').count().min(self.0);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut engine = Engine::new(config(), vocab()).unwrap();
    engine.record_trace(Box::new(Failing(2))).unwrap(); // the header, then one more line
    let mut model = FakeModel { kv: vec![0; 200] };
    engine.submit(1, &prompt(0, 10, 1), params(4, 0.0), None).unwrap();
    while engine.has_work() {
        let plan = engine.schedule().unwrap();
        let mut logits = model.forward(&plan);
        engine.commit(&mut logits, VOCAB).unwrap();
    }
    assert_eq!(engine.stats().finished, 1);
    assert!(Engine::new(config(), vocab()).unwrap().record_trace(Box::new(Failing(0))).is_err());
}

#[test]
fn records_round_trip_through_json() {
    let trace = read(&record_run().trace);
    for r in &trace.records {
        let again = Record::from_json(&r.to_json()).unwrap();
        assert_eq!(format!("{again:?}"), format!("{r:?}"));
    }
}

/// A trace of one request whose prompt fits the pool but whose `max_new_tokens` does not.
fn outgrowing_trace() -> Trace {
    let lines = [
        r#"{"kind":"header","format":"ferrolm-trace","version":1,"config":{"kv_capacity":100,"vocab_size":300,"eos_token_ids":[299],"max_context":4096}}"#.to_string(),
        format!(
            r#"{{"kind":"submit","step":0,"t":0,"rids":[1],"prompt":{:?},"params":{{"max_new_tokens":100,"temperature":0}}}}"#,
            (0..90).collect::<Vec<u32>>()
        ),
        format!(
            r#"{{"kind":"outputs","step":0,"t":0,"out":[[1,{:?},{{"reason":"length"}}]]}}"#,
            (0..100).collect::<Vec<u32>>()
        ),
    ];
    read(lines.join("\n").as_bytes())
}

#[test]
fn a_request_alone_that_outgrows_the_pool_runs_instead_of_waiting_forever() {
    // admission used to keep room for 30% of its max_new_tokens, which the pool never
    // had: the request waited forever (a replay of this trace stalled)
    let s = replay(&outgrowing_trace(), &ReplayOptions::default(), &mut |_| {}).unwrap();
    assert!(s.is_ok(), "{:?}", s.violations);
    assert_eq!(s.finishes.get("error:kv_capacity"), Some(&1), "{}", s.report().join("\n"));
    assert_eq!(s.generated_tokens, 11, "it ran until the pool was full");
    assert_eq!(s.finish_mismatches, 1, "the recording said length");
}

#[test]
fn an_engine_that_schedules_nothing_is_a_stall() {
    let trace = outgrowing_trace();
    // checked at the end only: the leak itself is a violation at every check
    let options = ReplayOptions { check_every: 0, ..Default::default() };
    let mut log = |_: &str| {};
    let mut r = Replayer::start(&trace, &options, &mut log).unwrap();
    for _ in 0..100 {
        r.engine.leak_slot_for_test(); // the whole pool: nothing can be admitted
    }
    r.run(&trace, Arrivals::Steps);
    let s = r.finish();
    assert!(!s.is_ok());
    assert!(
        s.violations.iter().any(|v| v.contains("the engine stalls: 1001 steps in a row scheduled nothing")),
        "{:?}",
        s.violations
    );
    assert!(
        s.violations.iter().any(|v| v.contains("not held and not free")),
        "the end's check: {:?}",
        s.violations
    );
}

#[test]
fn a_replay_shows_the_drafts_and_what_was_kept() {
    // the same greedy prompt twice: the second drafts the first's output from the cache
    let out = Shared::default();
    let config = EngineConfig { kv_capacity: 2048, speculative: true, ..config() };
    let mut engine = Engine::new(config, vocab()).unwrap();
    engine.record_trace(Box::new(out.clone())).unwrap();
    let mut model = FakeModel { kv: vec![0; 2048] };
    for rid in [1, 2] {
        engine.submit(rid, &prompt(30, 10, 3), params(40, 0.0), None).unwrap();
        while engine.has_work() {
            let plan = engine.schedule().unwrap();
            let mut logits = model.forward(&plan);
            engine.commit(&mut logits, VOCAB).unwrap();
        }
    }
    let live = engine.stats();
    assert!(live.spec_accepted_tokens >= 30, "{live:?}");
    let trace = read(&out.0.lock().unwrap());
    let mut lines = Vec::new();
    let options = ReplayOptions { verbose: true, ..Default::default() };
    let s = replay(&trace, &options, &mut |l| lines.push(l.to_string())).unwrap();
    assert!(s.is_ok() && s.is_same(), "{}", s.report().join("\n"));
    assert_eq!(
        (s.drafts, s.draft_tokens, s.accepted_tokens),
        (live.spec_drafts, live.spec_draft_tokens, live.spec_accepted_tokens)
    );
    assert!(lines.iter().any(|l| l.contains("drafts r2")), "{lines:#?}");
    assert!(s.report().iter().any(|l| l.starts_with("speculation: ")), "{:?}", s.report());
}
