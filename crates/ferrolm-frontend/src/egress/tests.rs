use super::*;
use ferrolm_core::engine::FinishReason;

/// Step outputs with one entry per (rid, tokens, text, finished).
fn outputs(entries: &[(u64, &[u32], &str, bool)]) -> StepOutputs {
    let mut o = StepOutputs::new();
    for &(rid, tokens, text, finished) in entries {
        for &t in tokens {
            o.token_ids.push(t);
            o.logprobs.push(f32::NAN);
            o.top_offsets.push(o.top_ids.len() as u32);
        }
        o.rids.push(rid);
        o.texts.push(text.to_string());
        o.finished.push(finished.then_some(Finished {
            reason: FinishReason::Length,
            prompt_tokens: 3,
            cached_tokens: 0,
            completion_tokens: 1,
        }));
        o.token_offsets.push(o.token_ids.len() as u32);
    }
    o
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
}

#[test]
fn outputs_reach_their_sample_and_a_finish_removes_the_route() {
    let egress = Egress::new();
    let a = RequestStream::new(2);
    let b = RequestStream::new(1);
    egress.register(&[10, 11], &a, 0);
    egress.register(&[20], &b, 0);
    let finished =
        egress.publish(&outputs(&[(11, &[7], "x", false), (20, &[8], "y", true), (10, &[9], "z", false)]));
    assert_eq!(finished, vec![20]);
    assert_eq!(egress.len(), 2);
    let got = block_on(a.next());
    assert_eq!(
        got.iter().map(|(i, u)| (*i, u.text.as_str(), u.token_ids.clone())).collect::<Vec<_>>(),
        vec![(0, "z", vec![9]), (1, "x", vec![7])]
    );
    let got = block_on(b.next());
    assert_eq!(got.len(), 1);
    assert!(got[0].1.finished.is_some());
    assert!(b.finished());
    assert!(block_on(b.next()).is_empty(), "a finished stream ends");
    assert_eq!(a.unfinished(), vec![0, 1]);
}

#[test]
fn a_slow_reader_gets_every_step_merged_and_holds_up_no_other_stream() {
    let egress = Egress::new();
    let slow = RequestStream::new(1);
    let fast = RequestStream::new(1);
    egress.register(&[1], &slow, 0);
    egress.register(&[2], &fast, 0);
    let mut fast_text = String::new();
    for step in 0..500u32 {
        let t = format!("{step},");
        egress.publish(&outputs(&[(1, &[step], &t, false), (2, &[step], &t, false)]));
        // the fast reader reads every step; the slow one never does meanwhile
        for (_, u) in block_on(fast.next()) {
            fast_text.push_str(&u.text);
        }
    }
    egress.publish(&outputs(&[(1, &[], "end", true)]));
    let expected: String = (0..500).map(|s| format!("{s},")).collect();
    assert_eq!(fast_text, expected);
    let merged = block_on(slow.next());
    assert_eq!(merged.len(), 1, "500 steps come as one update");
    let (_, u) = &merged[0];
    assert_eq!(u.text, expected + "end", "nothing dropped, in order");
    assert_eq!(u.token_ids, (0..500).collect::<Vec<u32>>());
    assert!(u.finished.is_some());
}

#[test]
fn outputs_of_unrouted_rids_are_dropped_and_finishes_still_reported() {
    let egress = Egress::new();
    assert_eq!(egress.publish(&outputs(&[(5, &[1], "a", true)])), vec![5]);
    assert!(egress.is_empty());
}

#[test]
fn a_failure_ends_every_stream() {
    let egress = Egress::new();
    let s = RequestStream::new(1);
    egress.register(&[1], &s, 0);
    egress.fail_all("gone");
    assert!(block_on(s.next()).is_empty());
    assert_eq!(s.failure().as_deref(), Some("gone"));
    assert!(egress.is_empty());
}

#[test]
fn a_waiting_reader_wakes_on_publish_from_another_thread() {
    let egress = Arc::new(Egress::new());
    let s = RequestStream::new(1);
    egress.register(&[3], &s, 0);
    let e = egress.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(20));
        e.publish(&outputs(&[(3, &[4], "hi", true)]));
    });
    let got = block_on(s.next());
    t.join().unwrap();
    assert_eq!(got[0].1.text, "hi");
}

#[test]
fn the_pump_wakes_every_stream_of_a_step_and_a_stopped_one_leaves_it_to_publish() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_time().build().unwrap();
    let egress = Arc::new(Egress::new());
    rt.spawn(egress.clone().pump());
    let streams: Vec<_> = (0..3).map(|_| RequestStream::new(1)).collect();
    for (i, s) in streams.iter().enumerate() {
        egress.register(&[i as u64], s, 0);
    }
    let read = |egress: &Egress, step: &[(u64, &[u32], &str, bool)], want: [&str; 3]| {
        // the readers wait before the step is published: only a wake brings it
        let readers: Vec<_> = streams
            .iter()
            .map(|s| {
                let s = s.clone();
                rt.spawn(async move { s.next().await })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(50));
        egress.publish(&outputs(step));
        for (r, want) in readers.into_iter().zip(want) {
            let got = rt
                .block_on(async { tokio::time::timeout(std::time::Duration::from_secs(10), r).await })
                .expect("the reader was woken")
                .unwrap();
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].1.text, want);
        }
    };
    read(&egress, &[(0, &[1], "a", false), (1, &[2], "b", false), (2, &[3], "c", false)], ["a", "b", "c"]);
    egress.stop_pump();
    read(&egress, &[(0, &[4], "d", false), (1, &[5], "e", false), (2, &[6], "f", false)], ["d", "e", "f"]);
}
