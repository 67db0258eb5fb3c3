//! What the front end shows of the KV event stream (`--kv-events-config`): the stream's
//! description on `/server_info` and the publisher's counters there and on `/metrics`.
//! The events themselves are taken from the core and published by the step loop's side
//! (`ferrolm.kv_publisher`), which keeps these counters current.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Map, Value};

/// The publisher's counters, set by the step loop's side as they change.
#[derive(Debug, Default)]
pub struct KvEventCounters {
    queued: AtomicU64,
    sent: AtomicU64,
    dropped: AtomicU64,
    replays: AtomicU64,
    late: AtomicU64,
}

/// A snapshot of [`KvEventCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvEventCounts {
    /// Batches accepted by the publisher's queue.
    pub queued: u64,
    /// Batches sent on the PUB socket.
    pub sent: u64,
    /// Batches dropped because the queue was full.
    pub dropped: u64,
    /// Replay requests answered.
    pub replays: u64,
    /// Steps whose outputs went before the earlier steps' events were sent.
    pub late: u64,
}

impl KvEventCounters {
    pub fn set(&self, c: KvEventCounts) {
        self.queued.store(c.queued, Ordering::Relaxed);
        self.sent.store(c.sent, Ordering::Relaxed);
        self.dropped.store(c.dropped, Ordering::Relaxed);
        self.replays.store(c.replays, Ordering::Relaxed);
        self.late.store(c.late, Ordering::Relaxed);
    }

    pub fn get(&self) -> KvEventCounts {
        KvEventCounts {
            queued: self.queued.load(Ordering::Relaxed),
            sent: self.sent.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            replays: self.replays.load(Ordering::Relaxed),
            late: self.late.load(Ordering::Relaxed),
        }
    }
}

/// Whether `info` (the stream's description, `/server_info`'s `kv_events`) says events
/// are published.
pub fn enabled(info: &Value) -> bool {
    info.get("enabled").and_then(Value::as_bool).unwrap_or(false)
}

/// The counters as the load on `/server_info` has them (`bench kv-events` reads these names).
pub fn load_fields(c: KvEventCounts) -> Map<String, Value> {
    let v = json!({"kv_events_queued": c.queued, "kv_events_sent": c.sent, "kv_events_dropped": c.dropped,
                   "kv_events_replays": c.replays, "kv_events_late": c.late});
    match v {
        Value::Object(m) => m,
        _ => unreachable!("an object"),
    }
}

/// `/server_info`'s `kv_events`: the description, with the counters when the load was
/// read.
pub fn server_info(info: &Value, counts: Option<KvEventCounts>) -> Value {
    let mut out = info.clone();
    if let (Some(c), Value::Object(m)) = (counts.filter(|_| enabled(info)), &mut out) {
        m.insert("queued_batches".into(), c.queued.into());
        m.insert("published_batches".into(), c.sent.into());
        m.insert("dropped_batches".into(), c.dropped.into());
        m.insert("late_steps".into(), c.late.into());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_show_only_when_enabled() {
        let counters = KvEventCounters::default();
        counters.set(KvEventCounts { queued: 3, sent: 2, dropped: 0, replays: 1, late: 0 });
        let off = json!({"enabled": false, "block_size": 16});
        assert_eq!(server_info(&off, Some(counters.get())), off);
        let on = json!({"enabled": true, "block_size": 4});
        let shown = server_info(&on, Some(counters.get()));
        assert_eq!(shown["queued_batches"], 3);
        assert_eq!(shown["published_batches"], 2);
        assert_eq!(server_info(&on, None), on);
        assert_eq!(load_fields(counters.get())["kv_events_replays"], 1);
    }
}
