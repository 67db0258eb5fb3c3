//! LoRA adapters in the scheduler: a step mixes at most `max_loras` of them (a request
//! with one more waits, and those behind it still join), each adapter's prefixes live in
//! its own namespace, and its requests are reported by name.

use super::*;
use crate::lora::{Adapter, LoraShape, Target};

fn lora(id: u32) -> Lora {
    let shape = LoraShape { layers: 1, hidden: 2, q_dim: 2, kv_dim: 2, intermediate: 2 };
    let part = (0, Target::Q, 1, vec![1.0; 2], vec![1.0; 2], 1.0);
    let adapter = Adapter::from_parts(&shape, vec![part]).unwrap();
    Lora { id, name: format!("adapter-{id}").into(), adapter: Arc::new(adapter) }
}

fn with_lora(id: u32, max_new: usize) -> RequestParams {
    RequestParams { lora: Some(lora(id)), ..greedy(max_new) }
}

#[test]
fn a_step_mixes_at_most_max_loras_adapters() {
    let mut engine = Engine::new(config(|c| c.max_loras = 2), vocab()).unwrap();
    let mut model = FakeModel::new(4096);
    // adapters 1, 2, 3, then the base model and adapter 1 again: 3 waits, the rest run
    for (rid, id) in [(1, Some(1)), (2, Some(2)), (3, Some(3)), (4, None), (5, Some(1))] {
        let params = id.map_or_else(|| greedy(3), |id| with_lora(id, 3));
        engine.submit(rid, &[1, 2, rid as u32], params, None).unwrap();
    }
    let plan = engine.schedule().unwrap();
    assert_eq!(plan.rids, [1, 2, 4, 5]);
    let ids: Vec<Option<u32>> = plan.loras.iter().map(|l| l.as_ref().map(|l| l.id)).collect();
    assert_eq!(ids, [Some(1), Some(2), None, Some(1)]);
    assert!(plan.has_lora());
    let load = engine.load();
    assert_eq!(load.running_loras, ["adapter-1", "adapter-2"]);
    assert_eq!(load.waiting_loras, ["adapter-3"]);
    engine.commit(&mut model.forward(&plan), VOCAB).unwrap();
    let mut steps = 1;
    while engine.has_work() {
        let plan = engine.schedule().unwrap();
        // each adapter's requests side by side (the runner reads its matrices once)
        let mut runs: Vec<u32> = plan.loras.iter().map(|l| l.as_ref().map_or(0, |l| l.id)).collect();
        runs.dedup();
        let mut mixed = runs.clone();
        mixed.sort_unstable();
        mixed.dedup();
        assert_eq!(runs.len(), mixed.len(), "{runs:?}");
        assert!(mixed.iter().filter(|&&id| id != 0).count() <= 2, "{mixed:?}");
        engine.commit(&mut model.forward(&plan), VOCAB).unwrap();
        engine.check_invariants().unwrap();
        steps += 1;
    }
    assert!(steps >= 4, "adapter 3 ran once the others were done");
    assert_eq!(engine.stats().finished, 5);
}

#[test]
fn each_adapter_caches_its_own_prefixes() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    let prompt: Vec<u32> = (1..40).collect();
    let out_base = clean_run(&config(|_| {}), &prompt, greedy(4));
    let mut model = FakeModel::new(4096); // holds the KV the cache's slots name
    for (rid, params) in [(1, with_lora(1, 4)), (2, greedy(4)), (3, with_lora(2, 4)), (4, with_lora(1, 4))] {
        engine.submit(rid, &prompt, params, None).unwrap();
        let mut out = Vec::new();
        while engine.has_work() {
            out.extend(step(&mut engine, &mut model).token_ids);
        }
        // the fake model knows no adapters: the same tokens, computed again or not
        assert_eq!(out, out_base);
    }
    // only the second run of adapter 1 found its prefix
    assert_eq!(engine.stats().cache_hit_tokens, prompt.len() as u64 - 1);
    engine.check_invariants().unwrap();
}
