use std::sync::Arc;
use std::time::Duration;

use super::super::ManualClock;
use super::*;

fn tree(page_size: usize, policy: EvictionPolicy) -> RadixTree {
    RadixTree::new(TreeConfig { page_size, policy, kv_events: true, ..TreeConfig::default() }).unwrap()
}

fn slots(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

fn ok(t: &RadixTree) {
    t.check_invariants().unwrap();
}

#[test]
fn insert_then_match_whole_and_partial() {
    let mut t = tree(1, EvictionPolicy::Lru);
    assert_eq!(t.insert(&[1, 2, 3, 4], &slots(10..14), None, 0).unwrap(), 0);
    let m = t.match_prefix(&[1, 2, 3, 4, 5], None);
    assert_eq!((m.length, m.kv_slots.clone()), (4, vec![10, 11, 12, 13]));
    let m = t.match_prefix(&[1, 2, 9], None);
    assert_eq!((m.length, m.kv_slots), (2, vec![10, 11]));
    // the partial match split the node so its handle covers exactly [1, 2]
    assert_eq!(t.sizes().nodes, 2);
    assert_eq!(t.lock(m.node).unwrap(), 2);
    assert_eq!(t.sizes(), TreeSizes { evictable: 2, protected: 2, total: 4, nodes: 2 });
    ok(&t);
}

#[test]
fn insert_splits_where_sequences_diverge() {
    let mut t = tree(1, EvictionPolicy::Lru);
    t.insert(&[1, 2, 3, 4], &slots(0..4), None, 0).unwrap();
    assert_eq!(t.insert(&[1, 2, 7, 8, 9], &slots(20..25), None, 0).unwrap(), 2);
    assert_eq!(t.sizes().nodes, 3);
    assert_eq!(t.sizes().total, 7);
    assert_eq!(t.match_prefix(&[1, 2, 7, 8, 9], None).kv_slots, vec![0, 1, 22, 23, 24]);
    assert_eq!(t.match_prefix(&[1, 2, 3, 4], None).kv_slots, vec![0, 1, 2, 3]);
    // a full re-insert reports everything as cached and changes nothing
    assert_eq!(t.insert(&[1, 2, 3, 4], &slots(50..54), None, 0).unwrap(), 4);
    assert_eq!(t.sizes().total, 7);
    ok(&t);
}

#[test]
fn mismatched_lengths_are_rejected_without_change() {
    let mut t = tree(1, EvictionPolicy::Lru);
    let err = t.insert(&[1, 2], &[1], None, 0).unwrap_err();
    assert!(matches!(err, TreeError::InvalidInput(ref m) if m.contains("same length")), "{err}");
    assert_eq!(t.sizes().total, 0);
    assert!(RadixTree::new(TreeConfig { page_size: 0, ..TreeConfig::default() }).is_err());
}

#[test]
fn pages_match_and_insert_whole_pages_only() {
    let mut t = tree(4, EvictionPolicy::Lru);
    // 10 tokens: only 8 are inserted
    assert_eq!(t.insert(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], &slots(0..10), None, 0).unwrap(), 0);
    assert_eq!(t.sizes().total, 8);
    // diverges inside the second page: only the first page matches
    let m = t.match_prefix(&[1, 2, 3, 4, 5, 6, 0, 0], None);
    assert_eq!(m.length, 4);
    // two children sharing a first token but differing later in the page
    t.insert(&[1, 2, 3, 4, 5, 9, 9, 9], &slots(100..108), None, 0).unwrap();
    t.insert(&[1, 2, 3, 4, 5, 6, 7, 0], &slots(200..208), None, 0).unwrap();
    ok(&t);
    assert_eq!(t.match_prefix(&[1, 2, 3, 4, 5, 9, 9, 9], None).kv_slots, [0, 1, 2, 3, 104, 105, 106, 107]);
    assert_eq!(t.match_prefix(&[1, 2, 3, 4, 5, 6, 7, 8], None).kv_slots, slots(0..8));
    assert_eq!(t.match_prefix(&[1, 2, 3, 4, 5, 6, 7, 0], None).kv_slots, [0, 1, 2, 3, 204, 205, 206, 207]);
    // shorter than a page: nothing
    assert_eq!(t.match_prefix(&[1, 2, 3], None).length, 0);
    // evicting the aliased children keeps the chain intact
    assert_eq!(t.evict(100).len(), 16);
    ok(&t);
}

#[test]
fn namespaces_never_share_prefixes() {
    let mut t = tree(1, EvictionPolicy::Lru);
    t.insert(&[1, 2, 3], &slots(0..3), Some("lora-a"), 0).unwrap();
    assert_eq!(t.match_prefix(&[1, 2, 3], None).length, 0);
    assert_eq!(t.match_prefix(&[1, 2, 3], Some("lora-b")).length, 0);
    assert_eq!(t.match_prefix(&[1, 2, 3], Some("lora-a")).length, 3);
    assert_eq!(t.insert(&[1, 2, 3], &slots(10..13), Some("lora-b"), 0).unwrap(), 0);
    assert_eq!(t.sizes().total, 6);
    ok(&t);
    // an emptied namespace disappears
    assert_eq!(t.evict(6).len(), 6);
    ok(&t);
    assert_eq!(t.match_prefix(&[1], Some("lora-a")).length, 0);
}

fn evict_order(policy: EvictionPolicy, setup: impl FnOnce(&mut RadixTree)) -> Vec<u32> {
    let mut t = tree(1, policy);
    setup(&mut t);
    let mut order = Vec::new();
    loop {
        let freed = t.evict(1);
        if freed.is_empty() {
            return order;
        }
        order.extend(freed);
        ok(&t);
    }
}

#[test]
fn lru_evicts_least_recently_used() {
    let order = evict_order(EvictionPolicy::Lru, |t| {
        t.insert(&[1], &[1], None, 0).unwrap();
        t.insert(&[2], &[2], None, 0).unwrap();
        t.insert(&[3], &[3], None, 0).unwrap();
        t.match_prefix(&[1], None);
    });
    assert_eq!(order, [2, 3, 1]);
}

#[test]
fn mru_evicts_most_recently_used() {
    let order = evict_order(EvictionPolicy::Mru, |t| {
        t.insert(&[1], &[1], None, 0).unwrap();
        t.insert(&[2], &[2], None, 0).unwrap();
        t.insert(&[3], &[3], None, 0).unwrap();
        t.match_prefix(&[1], None);
    });
    assert_eq!(order, [1, 3, 2]);
}

#[test]
fn lfu_evicts_least_matched() {
    let order = evict_order(EvictionPolicy::Lfu, |t| {
        t.insert(&[1], &[1], None, 0).unwrap();
        t.insert(&[2], &[2], None, 0).unwrap();
        t.insert(&[3], &[3], None, 0).unwrap();
        for _ in 0..3 {
            t.match_prefix(&[1], None);
        }
        t.match_prefix(&[3], None);
    });
    assert_eq!(order, [2, 3, 1]);
}

#[test]
fn fifo_and_filo_ignore_use() {
    let setup = |t: &mut RadixTree| {
        t.insert(&[1], &[1], None, 0).unwrap();
        t.insert(&[2], &[2], None, 0).unwrap();
        t.insert(&[3], &[3], None, 0).unwrap();
        t.match_prefix(&[1], None);
    };
    assert_eq!(evict_order(EvictionPolicy::Fifo, setup), [1, 2, 3]);
    assert_eq!(evict_order(EvictionPolicy::Filo, setup), [3, 2, 1]);
}

#[test]
fn priority_evicts_lowest_priority_then_lru() {
    let order = evict_order(EvictionPolicy::Priority, |t| {
        t.insert(&[1], &[1], None, 5).unwrap();
        t.insert(&[2], &[2], None, -1).unwrap();
        t.insert(&[3], &[3], None, 5).unwrap();
        t.insert(&[4], &[4], None, 0).unwrap();
        // re-inserting with a higher priority raises it
        t.insert(&[4], &[40], None, 9).unwrap();
        t.match_prefix(&[1], None);
    });
    assert_eq!(order, [2, 3, 1, 4]);
}

#[test]
fn eviction_cascades_to_parents_and_spares_locked_paths() {
    let mut t = tree(1, EvictionPolicy::Lru);
    t.insert(&[1, 2, 3], &slots(0..3), None, 0).unwrap();
    t.insert(&[1, 2, 4], &slots(10..13), None, 0).unwrap();
    let m = t.match_prefix(&[1, 2, 4], None);
    t.lock(m.node).unwrap();
    // only [3] is evictable: [1, 2] and [4] are on the locked path
    let mut freed = t.evict(100);
    freed.sort();
    assert_eq!(freed, [2]);
    assert_eq!(t.sizes(), TreeSizes { evictable: 0, protected: 3, total: 3, nodes: 2 });
    t.unlock(m.node).unwrap();
    let mut freed = t.evict(100);
    freed.sort();
    assert_eq!(freed, [0, 1, 12]);
    assert_eq!(t.sizes(), TreeSizes::default());
    ok(&t);
}

#[test]
fn locks_nest_and_unlock_below_zero_fails() {
    let mut t = tree(1, EvictionPolicy::Lru);
    t.insert(&[1, 2], &[0, 1], None, 0).unwrap();
    let m = t.match_prefix(&[1, 2], None);
    assert_eq!(t.lock(m.node).unwrap(), 2);
    assert_eq!(t.lock(m.node).unwrap(), 0);
    assert_eq!(t.unlock(m.node).unwrap(), 0);
    assert_eq!(t.unlock(m.node).unwrap(), 2);
    assert_eq!(t.unlock(m.node), Err(TreeError::NotLocked(m.node)));
    ok(&t);
    // the root is always there and locking it does nothing
    let root = t.root_handle();
    assert_eq!(t.lock(root).unwrap(), 0);
    assert_eq!(t.unlock(root).unwrap(), 0);
}

#[test]
fn stale_handles_fail_and_never_alias() {
    let mut t = tree(1, EvictionPolicy::Lru);
    t.insert(&[1, 2], &[0, 1], None, 0).unwrap();
    let old = t.match_prefix(&[1, 2], None).node;
    t.evict(2);
    // a new node may reuse the slot, but not the handle
    t.insert(&[5, 6], &[5, 6], None, 0).unwrap();
    let new = t.match_prefix(&[5, 6], None).node;
    assert_ne!(old, new);
    assert_eq!(t.lock(old), Err(TreeError::StaleHandle(old)));
    assert_eq!(t.unlock(old), Err(TreeError::StaleHandle(old)));
    t.reset();
    assert_eq!(t.lock(new), Err(TreeError::StaleHandle(new)));
    assert_eq!(t.lock(NodeHandle(u64::MAX)), Err(TreeError::StaleHandle(NodeHandle(u64::MAX))));
    ok(&t);
}

#[test]
fn handles_survive_a_split_below_them() {
    let mut t = tree(1, EvictionPolicy::Lru);
    t.insert(&[1, 2, 3, 4], &slots(0..4), None, 0).unwrap();
    let whole = t.match_prefix(&[1, 2, 3, 4], None).node;
    t.lock(whole).unwrap();
    t.insert(&[1, 2, 9], &slots(10..13), None, 0).unwrap(); // splits the locked node
    ok(&t);
    assert_eq!(t.sizes().protected, 4);
    t.unlock(whole).unwrap();
    assert_eq!(t.sizes().protected, 0);
    ok(&t);
}

#[test]
fn events_cover_full_blocks_and_chain() {
    let mut t = RadixTree::new(TreeConfig {
        page_size: 1,
        policy: EvictionPolicy::Lru,
        kv_events: true,
        event_block_size: 2,
        ..TreeConfig::default()
    })
    .unwrap();
    t.insert(&[1, 2, 3, 4, 5], &slots(0..5), None, 0).unwrap();
    let seed = namespace_seed(None);
    let h = chain_hashes(seed, &[1, 2, 3, 4], 2);
    assert_eq!(
        t.take_events(),
        [KvEvent::BlockStored {
            block_hashes: h.clone(),
            parent_block_hash: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: 2,
            namespace: None,
        }]
    );
    // diverging at position 3 (inside block 1) stores a new block 1 and 2, chained from block 0
    t.insert(&[1, 2, 3, 9, 9, 9], &slots(10..16), None, 0).unwrap();
    let h2 = chain_hashes(h[0], &[3, 9, 9, 9], 2);
    assert_eq!(
        t.take_events(),
        [KvEvent::BlockStored {
            block_hashes: h2.clone(),
            parent_block_hash: Some(h[0]),
            token_ids: vec![3, 9, 9, 9],
            block_size: 2,
            namespace: None,
        }]
    );
    ok(&t);
    // evicting the first branch's leaf [4, 5] removes block 1 = [3, 4]
    let m = t.match_prefix(&[1, 2, 3, 9], None);
    t.lock(m.node).unwrap();
    t.evict(1);
    assert_eq!(t.take_events(), [KvEvent::BlockRemoved { block_hashes: vec![h[1]] }]);
    t.reset();
    assert_eq!(t.take_events(), [KvEvent::AllBlocksCleared]);
    assert!(t.take_events().is_empty());
}

#[test]
fn events_off_queue_nothing() {
    let mut t = RadixTree::new(TreeConfig::default()).unwrap();
    t.insert(&[1, 2, 3], &slots(0..3), None, 0).unwrap();
    t.evict(3);
    t.reset();
    assert!(t.take_events().is_empty());
}

#[test]
fn memory_is_counted() {
    let mut t = tree(1, EvictionPolicy::Lru);
    let before = t.memory_bytes();
    t.insert(&(0..1000).collect::<Vec<_>>(), &slots(0..1000), None, 0).unwrap();
    assert!(t.memory_bytes() >= before + 8000);
    assert_eq!(t.all_kv_slots().len(), 1000);
}

#[test]
fn unlock_only_gives_back_locks_taken_on_that_node() {
    let mut t = tree(1, EvictionPolicy::Lru);
    t.insert(&[1, 2, 3], &slots(0..3), None, 0).unwrap();
    let whole = t.match_prefix(&[1, 2, 3], None).node;
    t.lock(whole).unwrap();
    // matching [1] splits the locked node; the upper part is protected, but not locked itself
    let upper = t.match_prefix(&[1], None).node;
    assert_eq!(t.unlock(upper), Err(TreeError::NotLocked(upper)));
    ok(&t);
    t.unlock(whole).unwrap();
    assert_eq!(t.sizes().protected, 0);
    ok(&t);
}

#[test]
fn splits_work_with_events_off() {
    let mut t = RadixTree::new(TreeConfig::default()).unwrap();
    t.insert(&[1, 2, 3, 4], &slots(0..4), None, 0).unwrap();
    assert_eq!(t.match_prefix(&[1, 2, 9], None).length, 2);
    assert_eq!(t.insert(&[1, 9], &slots(10..12), None, 0).unwrap(), 1);
    assert_eq!(t.sizes().nodes, 4);
    ok(&t);
}

#[test]
fn event_blocks_must_be_whole_pages() {
    let bad = TreeConfig { page_size: 2, kv_events: true, event_block_size: 3, ..TreeConfig::default() };
    assert!(
        matches!(RadixTree::new(bad), Err(TreeError::InvalidInput(m)) if m.contains("multiple of page_size"))
    );
    let ok = TreeConfig { page_size: 2, kv_events: true, event_block_size: 4, ..TreeConfig::default() };
    assert!(RadixTree::new(ok).is_ok());
}

#[test]
fn prefix_len_agrees_with_match_prefix_and_changes_nothing() {
    let queries: [&[u32]; 7] =
        [&[1, 2, 3, 4, 5], &[1, 2, 9], &[1], &[7, 7], &[], &[1, 2, 3, 4, 5, 6, 7, 8], &[5, 6, 7, 8]];
    for page in [1, 2] {
        let mut t = tree(page, EvictionPolicy::Lru);
        t.insert(&[1, 2, 3, 4, 5, 6], &slots(10..16), None, 0).unwrap();
        t.insert(&[5, 6, 7, 8], &slots(20..24), None, 0).unwrap();
        t.insert(&[1, 2, 3, 4], &slots(30..34), Some("ns"), 0).unwrap();
        t.take_events();
        let (sizes, clock) = (t.sizes(), t.clock);
        let lens: Vec<usize> = queries.iter().map(|q| t.prefix_len(q, None)).collect();
        assert_eq!(t.prefix_len(&[1, 2, 3, 9], Some("ns")), 3 / page * page);
        assert_eq!(t.prefix_len(&[1, 2], Some("other")), 0);
        // nothing moved: no split, no tick of the clock, no event, same eviction order
        assert_eq!((t.sizes(), t.clock), (sizes, clock));
        assert!(t.take_events().is_empty());
        for (q, len) in queries.iter().zip(&lens) {
            assert_eq!(t.match_prefix(q, None).length, *len, "query {q:?}, page {page}");
        }
        ok(&t);
    }
    // the LRU order is the insertion order still: the look did not count as a use
    let order = evict_order(EvictionPolicy::Lru, |t| {
        t.insert(&[1], &[1], None, 0).unwrap();
        t.insert(&[2], &[2], None, 0).unwrap();
        assert_eq!(t.prefix_len(&[1], None), 1);
    });
    assert_eq!(order, [1, 2]);
}

// ---- slru ----

fn slru(share: f64) -> RadixTree {
    let config =
        TreeConfig { policy: EvictionPolicy::Slru, slru_protected_share: share, ..TreeConfig::default() };
    RadixTree::new(config).unwrap()
}

fn drain_order(t: &mut RadixTree) -> Vec<u32> {
    let mut order = Vec::new();
    loop {
        let freed = t.evict(1);
        if freed.is_empty() {
            return order;
        }
        order.extend(freed);
        ok(t);
    }
}

#[test]
fn slru_promotes_on_the_second_hit_and_evicts_probationary_first() {
    let mut t = slru(1.0);
    for i in 1..=4 {
        t.insert(&[i], &[i], None, 0).unwrap();
    }
    // 1: two hits (protected); 2: one hit (still probationary, but used last); 3, 4: none
    t.match_prefix(&[1], None);
    t.match_prefix(&[1], None);
    t.match_prefix(&[2], None);
    ok(&t);
    // probationary in LRU order (3, 4, then 2, the most recently used), then protected
    assert_eq!(drain_order(&mut t), [3, 4, 2, 1]);
}

#[test]
fn slru_differs_from_lru_where_a_scan_would_flush_hot_entries() {
    // The classic case for SLRU: a hot entry used twice long ago survives a burst of
    // one-off entries used since, which LRU would keep instead. (The share is of the
    // cached tokens: on a cold tree a first promotion would overflow it, so the entries
    // are all cached first.)
    let run = |policy| {
        let config = TreeConfig { policy, ..TreeConfig::default() };
        let mut t = RadixTree::new(config).unwrap();
        for i in 1..=5 {
            t.insert(&[i], &[i], None, 0).unwrap();
        }
        t.match_prefix(&[1], None);
        t.match_prefix(&[1], None);
        for i in 2..=5 {
            t.match_prefix(&[i], None);
        }
        t.evict(1)
    };
    assert_eq!(run(EvictionPolicy::Lru), [1]);
    assert_eq!(run(EvictionPolicy::Slru), [2]);
}

#[test]
fn slru_demotes_least_recently_used_protected_nodes_when_over_share() {
    // four one-token leaves; a share of 0.5 lets two of them be protected
    let mut t = slru(0.5);
    for i in 1..=4 {
        t.insert(&[i], &[i], None, 0).unwrap();
    }
    for i in 1..=3 {
        t.match_prefix(&[i], None);
        t.match_prefix(&[i], None);
        ok(&t);
    }
    // promoting 3 overflowed the segment: 1, its least recently used node, went back to
    // the probationary segment as just used there (so after 4, never hit)
    assert_eq!(drain_order(&mut t), [4, 1, 2, 3]);
}

#[test]
fn slru_share_zero_is_plain_lru_and_one_never_demotes() {
    let mut t = slru(0.0);
    t.insert(&[1], &[1], None, 0).unwrap();
    t.insert(&[2], &[2], None, 0).unwrap();
    t.match_prefix(&[1], None);
    t.match_prefix(&[1], None);
    t.match_prefix(&[2], None);
    ok(&t);
    assert_eq!(drain_order(&mut t), [1, 2], "nothing stays protected at share 0");
    assert!(RadixTree::new(TreeConfig { slru_protected_share: 1.5, ..TreeConfig::default() }).is_err());
    assert!(RadixTree::new(TreeConfig { slru_protected_share: f64::NAN, ..TreeConfig::default() }).is_err());
}

#[test]
fn slru_split_keeps_both_parts_in_the_segment() {
    let mut t = slru(1.0);
    t.insert(&[1, 2, 3, 4], &slots(0..4), None, 0).unwrap();
    t.match_prefix(&[1, 2, 3, 4], None);
    t.match_prefix(&[1, 2, 3, 4], None);
    // a match ending inside the protected node splits it; both halves stay protected
    t.match_prefix(&[1, 2], None);
    ok(&t);
    t.insert(&[7], &[7], None, 0).unwrap();
    assert_eq!(t.evict(1), [7]);
    assert_eq!(t.evict(usize::MAX).len(), 4);
    ok(&t);
}

// ---- tlru ----

fn tlru(ttl_s: u64) -> (RadixTree, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_000));
    let config =
        TreeConfig { policy: EvictionPolicy::Tlru, ttl: Duration::from_secs(ttl_s), ..TreeConfig::default() };
    (RadixTree::with_clock(config, clock.clone()).unwrap(), clock)
}

const SECOND: u64 = 1_000_000_000;

#[test]
fn tlru_is_lru_until_something_expires() {
    let (mut t, clock) = tlru(10);
    t.insert(&[1], &[1], None, 0).unwrap();
    t.insert(&[2], &[2], None, 0).unwrap();
    t.match_prefix(&[1], None);
    clock.advance(9 * SECOND);
    ok(&t);
    assert_eq!(drain_order(&mut t), [2, 1]);
}

#[test]
fn tlru_evicts_expired_nodes_first_earliest_first() {
    let (mut t, clock) = tlru(10);
    // 1 lives an hour, 2 and 3 the default ten seconds; 1 is the least recently used
    t.insert_with_ttl(&[1], &[1], None, 0, Some(Duration::from_secs(3600))).unwrap();
    t.insert(&[2], &[2], None, 0).unwrap();
    clock.advance(SECOND);
    t.insert(&[3], &[3], None, 0).unwrap();
    clock.advance(20 * SECOND);
    // 2 and 3 expired (2 first); then 1 by LRU
    assert_eq!(drain_order(&mut t), [2, 3, 1]);
}

#[test]
fn tlru_use_renews_the_deadline_and_insert_raises_ttl() {
    let (mut t, clock) = tlru(10);
    t.insert(&[1], &[1], None, 0).unwrap();
    t.insert(&[2], &[2], None, 0).unwrap();
    clock.advance(8 * SECOND);
    t.match_prefix(&[1], None); // 1 now lives until 18 s
                                // re-inserting 2 with a longer TTL raises its own: lives until 8 + 100 s
    t.insert_with_ttl(&[2], &[20], None, 0, Some(Duration::from_secs(100))).unwrap();
    clock.advance(12 * SECOND);
    // at 20 s 1 has expired and 2 has not, though 2 is the least recently used
    t.match_prefix(&[1], None);
    t.match_prefix(&[2], None);
    clock.advance(11 * SECOND);
    assert_eq!(t.evict(1), [1], "expired first");
    assert_eq!(t.evict(1), [2]);
    ok(&t);
}

#[test]
fn ttl_is_refused_under_other_policies_and_must_be_positive() {
    let mut t = tree(1, EvictionPolicy::Lru);
    let err = t.insert_with_ttl(&[1], &[1], None, 0, Some(Duration::from_secs(1))).unwrap_err();
    assert!(matches!(err, TreeError::InvalidInput(ref m) if m.contains("tlru")), "{err}");
    assert_eq!(t.sizes().total, 0);
    let (mut t, _) = tlru(10);
    assert!(t.insert_with_ttl(&[1], &[1], None, 0, Some(Duration::ZERO)).is_err());
    assert!(RadixTree::new(TreeConfig { ttl: Duration::ZERO, ..TreeConfig::default() }).is_err());
}

#[test]
fn a_refused_match_changes_nothing() {
    for policy in [EvictionPolicy::Lru, EvictionPolicy::Slru, EvictionPolicy::Lfu] {
        let mut t = tree(1, policy);
        t.insert(&[1, 2, 3, 4], &slots(0..4), None, 0).unwrap();
        t.insert(&[7, 8], &slots(4..6), None, 0).unwrap();
        let mut path = MatchedPath::default();
        // [1, 2, 9] would split [1, 2, 3, 4] and mark it used
        let mut asked = false;
        let refused = t.match_prefix_path_if(&[1, 2, 9], None, &mut path, |matched| {
            asked = true;
            assert_eq!(matched, 2, "told the matched length");
            false
        });
        assert!(asked && refused.is_none() && path.nodes.is_empty());
        assert_eq!(t.sizes().nodes, 2, "{policy:?}: no split");
        // no access was marked: [1, 2, 3, 4], inserted first, is still evicted first
        assert_eq!(t.evict(1), vec![0, 1, 2, 3], "{policy:?}");
        ok(&t);
        // accepted, the same call splits and marks
        let mut t = tree(1, policy);
        t.insert(&[1, 2, 3, 4], &slots(0..4), None, 0).unwrap();
        let (length, node) = t.match_prefix_path_if(&[1, 2, 9], None, &mut path, |_| true).unwrap();
        assert_eq!(length, 2);
        assert_eq!(t.sizes().nodes, 2);
        assert_eq!(t.lock(node).unwrap(), 2);
        ok(&t);
    }
}

#[test]
fn continuation_is_what_follows_a_whole_prefix_on_the_latest_branch() {
    let mut t = tree(1, EvictionPolicy::Lru);
    t.insert(&[1, 2, 3, 4, 5], &slots(0..5), None, 0).unwrap();
    t.insert(&[1, 2, 3, 9, 9, 9], &slots(10..16), None, 0).unwrap(); // splits at 3
    let mut out = Vec::new();
    t.continuation(&[1, 2], None, 10, &mut out);
    assert_eq!(out[0], 3, "mid-edge: the rest of the edge first");
    assert_eq!(out.len(), 4, "then one branch to its end");
    t.match_prefix(&[1, 2, 3, 4], None); // the first branch is now the latest used
    t.continuation(&[1, 2, 3], None, 10, &mut out);
    assert_eq!(out, [4, 5]);
    t.continuation(&[1, 2, 3], None, 1, &mut out);
    assert_eq!(out, [4], "at most max");
    for absent in [&[1, 2, 7][..], &[8], &[1, 2, 3, 4, 5, 6]] {
        t.continuation(absent, None, 10, &mut out);
        assert!(out.is_empty(), "{absent:?} is not all in the tree");
    }
    t.continuation(&[1, 2, 3, 4, 5], None, 10, &mut out);
    assert!(out.is_empty(), "nothing follows a leaf");
    t.continuation(&[1], Some("other"), 10, &mut out);
    assert!(out.is_empty(), "no continuation across namespaces");
    let sizes = t.sizes();
    t.continuation(&[1, 2, 3, 9], None, 10, &mut out);
    assert_eq!(out, [9, 9]);
    assert_eq!(t.sizes(), sizes, "a read changes nothing");
    ok(&t);
}
