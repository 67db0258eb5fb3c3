//! The front end's ingress and egress around a real engine core, stepped here as the
//! Python loop steps it (schedule → forward → commit), with forced tokens standing in
//! for the model.

use std::sync::Arc;
use std::time::Duration;

use ferrolm_constraint::Vocabulary;
use ferrolm_core::detok::{StopConditions, StopReason};
use ferrolm_core::engine::{Engine, EngineConfig, EngineError, FinishReason, RequestParams};
use ferrolm_core::sampling::SamplingParams;
use ferrolm_frontend::{Egress, Ingress, RequestStream, SampleUpdate};
use tokio::sync::oneshot;

const EOS: u32 = 256;

fn ids(text: &[u8]) -> Vec<u32> {
    text.iter().map(|&b| u32::from(b)).collect()
}

fn engine() -> Engine {
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    tokens.push(b"<eos>".to_vec());
    let vocab = Vocabulary::new(tokens, &[EOS], &[EOS]).unwrap();
    let config = EngineConfig {
        kv_capacity: 512,
        max_context: 256,
        vocab_size: 257,
        eos_token_ids: vec![EOS],
        ..EngineConfig::default()
    };
    Engine::new(config, Arc::new(vocab)).unwrap()
}

fn greedy(stop: &[&str], max_new_tokens: usize) -> RequestParams {
    RequestParams {
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        stops: StopConditions {
            stop_strings: stop.iter().map(|s| s.to_string()).collect(),
            skip_special_tokens: true,
            ..Default::default()
        },
        max_new_tokens,
        ..Default::default()
    }
}

struct Loop {
    engine: Engine,
    ingress: Ingress,
    egress: Egress,
}

impl Loop {
    fn new() -> Self {
        Loop { engine: engine(), ingress: Ingress::new(), egress: Egress::new() }
    }

    /// Submits one request of `n` samples through the ingress; its stream and the answer.
    fn submit(
        &self,
        rids: Vec<u64>,
        prompt: &[u32],
        params: RequestParams,
    ) -> (Arc<RequestStream>, oneshot::Receiver<Result<(), EngineError>>) {
        let stream = RequestStream::new(rids.len());
        self.egress.register(&rids, &stream, 0);
        let (tx, rx) = oneshot::channel();
        self.ingress.submit(rids, prompt, params, None, tx);
        (stream, rx)
    }

    /// One step: drain the ingress, then every planned entry gets `token`.
    fn step(&mut self, token: u32) {
        self.ingress.drain(&mut self.engine);
        let plan = self.engine.schedule().unwrap();
        let out = if plan.num_requests() == 0 {
            self.engine.take_outputs()
        } else {
            self.engine.commit_tokens(&vec![token; plan.num_requests()]).unwrap()
        };
        self.egress.publish(&out);
    }
}

fn take(stream: &RequestStream) -> Vec<(usize, SampleUpdate)> {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(stream.next())
}

#[test]
fn a_stop_of_one_four_byte_character_over_four_tokens_never_leaks() {
    let mut l = Loop::new();
    let (stream, mut answer) = l.submit(vec![1], &ids(b"hi"), greedy(&["\u{1F600}"], 32));
    let mut text = String::new();
    let mut finished = None;
    // "a", then U+1F600 one byte (one token) at a time
    for &t in &[b'a' as u32, 0xF0, 0x9F, 0x98, 0x80] {
        l.step(t);
        for (_, u) in take(&stream) {
            assert!(!u.text.contains('\u{FFFD}'), "a partial character leaked: {:?}", u.text);
            text.push_str(&u.text);
            finished = u.finished.or(finished);
        }
    }
    assert_eq!(answer.try_recv().unwrap(), Ok(()));
    assert_eq!(text, "a");
    let f = finished.expect("the stop string ended the request");
    assert_eq!(f.reason, FinishReason::Stop(StopReason::String("\u{1F600}".into())));
    assert_eq!(f.completion_tokens, 5);
    assert_eq!(l.engine.num_requests(), 0);
}

#[test]
fn a_near_miss_of_the_stop_character_is_released_whole() {
    let mut l = Loop::new();
    let (stream, _answer) = l.submit(vec![1], &ids(b"hi"), greedy(&["\u{1F600}"], 4));
    let mut text = String::new();
    let mut finished = None;
    // U+1F601: the stop's first three bytes, then another
    for &t in &[0xF0, 0x9F, 0x98, 0x81] {
        l.step(t);
        for (_, u) in take(&stream) {
            text.push_str(&u.text);
            finished = u.finished.or(finished);
        }
    }
    assert_eq!(text, "\u{1F601}");
    assert_eq!(finished.unwrap().reason, FinishReason::Length);
}

#[test]
fn an_abort_through_the_ingress_frees_the_kv() {
    let mut l = Loop::new();
    let (stream, _answer) = l.submit(vec![7, 8], &ids(b"a prompt"), greedy(&[], 100));
    for _ in 0..3 {
        l.step(b'x' as u32);
    }
    assert!(l.engine.load().running > 0);
    let unfinished: Vec<u64> = stream.unfinished().into_iter().map(|i| [7, 8][i]).collect();
    assert_eq!(unfinished, vec![7, 8]);
    l.ingress.abort(&unfinished);
    l.step(b'x' as u32);
    let mut reasons = Vec::new();
    while !stream.finished() {
        for (_, u) in take(&stream) {
            if let Some(f) = u.finished {
                reasons.push(f.reason);
            }
        }
    }
    assert_eq!(reasons, vec![FinishReason::Abort, FinishReason::Abort]);
    let load = l.engine.load();
    assert_eq!((load.running, load.waiting, l.engine.num_requests()), (0, 0, 0));
    assert_eq!(load.kv_used, load.cached_tokens, "only the prefix cache holds KV");
    assert!(l.egress.is_empty());
}

#[test]
fn a_refused_submission_is_answered_with_the_field() {
    let mut l = Loop::new();
    let (_stream, mut answer) = l.submit(vec![1], &[1, 2, 999], greedy(&[], 4));
    l.step(0);
    match answer.try_recv().unwrap() {
        Err(EngineError::InvalidRequest { field, .. }) => assert_eq!(field, "input_ids"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(l.engine.num_requests(), 0);
}

#[test]
fn an_abort_queued_with_its_submission_finds_it() {
    let mut l = Loop::new();
    let (stream, _answer) = l.submit(vec![3], &ids(b"p"), greedy(&[], 10));
    l.ingress.abort(&[3]);
    l.step(b'x' as u32);
    let got = take(&stream);
    assert_eq!(got[0].1.finished.as_ref().unwrap().reason, FinishReason::Abort);
    assert_eq!(l.engine.num_requests(), 0);
}

#[test]
fn the_plan_carries_the_greedy_rule_of_what_the_http_threads_submitted() {
    let l = Loop::new();
    let mut engine = engine();
    let (tx, _rx) = oneshot::channel();
    l.ingress.submit(vec![4, 5], &ids(b"p"), RequestParams { ignore_eos: true, ..greedy(&[], 3) }, None, tx);
    let (tx, _rx) = oneshot::channel();
    let mut sampled = greedy(&[], 3);
    sampled.sampling.temperature = 0.8;
    l.ingress.submit(vec![6], &ids(b"p"), sampled, None, tx);
    let d = l.ingress.drain(&mut engine);
    assert_eq!((d.submitted, d.rejected), (2, 0));
    // the leader of 4 and 5 runs first; 5 follows once it has cached the prompt
    let plan = engine.schedule().unwrap();
    assert_eq!(plan.rids, vec![4, 6]);
    assert_eq!((plan.plain_greedy, plan.ignore_eos), (vec![true, false], vec![true, false]));
}

#[test]
fn the_idle_loop_blocks_until_a_request_comes() {
    let ingress = Arc::new(Ingress::new());
    assert!(!ingress.wait(Duration::from_millis(1)), "nothing queued: the wait times out");
    let i = ingress.clone();
    let pusher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        i.abort(&[1]);
    });
    assert!(ingress.wait(Duration::from_secs(60)));
    pusher.join().unwrap();
    ingress.stop();
    ingress.wait(Duration::from_secs(60)); // returns at once once stopped
    assert!(ingress.is_stopped());
}
