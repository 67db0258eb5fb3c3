//! The tree itself: match, insert (splitting a node where a sequence diverges inside
//! it), lock/unlock along a path, eviction of unlocked leaves.
//!
//! Bookkeeping that both backends (this one and the Python twin) follow exactly, so their
//! results can be compared operation by operation:
//! - a logical clock advances once per `match_prefix` and once per `insert`;
//! - every node walked by `match_prefix` gets `last_access = clock` and `hits += 1`;
//!   every node walked by `insert` gets `last_access = clock` and
//!   `priority = max(priority, inserted priority)`;
//! - a split creates the upper part as a new node that inherits the statistics (but not
//!   the sequence number) of the node it was cut from; sequence numbers count up from 1
//!   in creation order;
//! - `slru`: a node walked by `match_prefix` whose hits reach 2 enters the protected
//!   segment; at the end of every `match_prefix`, while the protected segment holds more than
//!   `slru_protected_share` of the cached tokens, its node with the smallest
//!   `(last_access, seq)` goes back to the probationary segment with `last_access = clock`;
//! - `tlru`: `match_prefix`, `insert` and `evict` read the time once each; a node walked
//!   or made gets `deadline = now + ttl`, where an insert raises the ttl of the nodes it
//!   walks to its own (`ttl = max(ttl, inserted ttl)`); `evict` takes the leaves with
//!   `deadline <= now` first, smallest `(deadline, seq)` first, then the others by LRU.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::arena::{Arena, ChildMap, Node, NodeHandle, NONE};
use super::clock::{MonotonicClock, TimeSource};
use super::events::{chain_hashes, namespace_seed, KvEvent};
use super::policy::{EvictionKey, EvictionPolicy, EvictionStats};

#[derive(Clone, Debug, PartialEq)]
pub struct TreeConfig {
    /// Tokens per KV page; match and insert work on whole pages only.
    pub page_size: usize,
    pub policy: EvictionPolicy,
    /// Queue KV events for `take_events`.
    pub kv_events: bool,
    /// Tokens per event block; 0 means one block per page.
    pub event_block_size: usize,
    /// `slru`: the most the protected segment may hold, as a share (0 to 1) of the cached
    /// tokens.
    pub slru_protected_share: f64,
    /// `tlru`: how long a node stays unexpired after its last use, when its insert gave
    /// no time-to-live of its own.
    pub ttl: Duration,
}

impl TreeConfig {
    /// Four fifths protected, one fifth probationary: the split of Caffeine's and
    /// W-TinyLFU's main SLRU space.
    pub const DEFAULT_SLRU_PROTECTED_SHARE: f64 = 0.8;
    /// Five minutes: the default lifetime of a cached prompt prefix at Anthropic's and
    /// OpenAI's APIs, which is what users of prompt caching expect.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(300);
}

impl Default for TreeConfig {
    fn default() -> Self {
        TreeConfig {
            page_size: 1,
            policy: EvictionPolicy::Lru,
            kv_events: false,
            event_block_size: 0,
            slru_protected_share: Self::DEFAULT_SLRU_PROTECTED_SHARE,
            ttl: Self::DEFAULT_TTL,
        }
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TreeError {
    /// The caller passed something the tree cannot take; the message names it.
    InvalidInput(String),
    /// The node behind this handle is gone (evicted or reset).
    StaleHandle(NodeHandle),
    /// `unlock` on a node that holds no lock taken on it.
    NotLocked(NodeHandle),
}

impl fmt::Display for TreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TreeError::InvalidInput(msg) => f.write_str(msg),
            TreeError::StaleHandle(h) => {
                write!(f, "node handle {:#x} is stale: its node was evicted or the tree was reset", h.0)
            }
            TreeError::NotLocked(h) => {
                write!(
                    f,
                    "unlock of node {:#x}, which holds no lock of its own \
                     (more unlocks than locks, or a handle other than the one locked)",
                    h.0
                )
            }
        }
    }
}

impl std::error::Error for TreeError {}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatchResult {
    /// Cached tokens at the start of the query (a whole number of pages).
    pub length: usize,
    /// The KV slot of each of those tokens.
    pub kv_slots: Vec<u32>,
    /// The node where the match ends (the root when nothing matched): lock it to keep the
    /// prefix cached while a request uses it.
    pub node: NodeHandle,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeSizes {
    /// Cached tokens on no locked path: what `evict` can free.
    pub evictable: usize,
    /// Cached tokens on a locked path.
    pub protected: usize,
    /// All cached tokens (`evictable + protected`).
    pub total: usize,
    /// Nodes, roots excluded.
    pub nodes: usize,
}

pub struct RadixTree {
    config: TreeConfig,
    block_size: usize,
    arena: Arena,
    root: u32,
    namespace_roots: HashMap<String, u32>,
    namespace_of_root: HashMap<u32, String>,
    evictable: BTreeSet<(EvictionKey, u32)>,
    evictable_tokens: usize,
    protected_tokens: usize,
    num_nodes: usize,
    clock: u64,
    next_seq: u64,
    events: Vec<KvEvent>,
    /// `slru`: the protected segment, `(last_access, seq, node)`, and its tokens.
    slru_hot: BTreeSet<(u64, u64, u32)>,
    slru_hot_tokens: usize,
    /// `tlru`: the evictable leaves again, `(deadline, seq, node)`.
    expiry: BTreeSet<(u64, u64, u32)>,
    ttl_ns: u64,
    time: Arc<dyn TimeSource>,
}

impl RadixTree {
    pub fn new(config: TreeConfig) -> Result<Self, TreeError> {
        Self::with_clock(config, Arc::new(MonotonicClock))
    }

    /// A tree whose `tlru` policy reads the time from `time` (tests move a
    /// [`ManualClock`](super::ManualClock) instead of sleeping).
    pub fn with_clock(config: TreeConfig, time: Arc<dyn TimeSource>) -> Result<Self, TreeError> {
        let share = config.slru_protected_share;
        if !(0.0..=1.0).contains(&share) {
            return Err(TreeError::InvalidInput(format!(
                "slru_protected_share must be between 0 and 1, got {share}"
            )));
        }
        if config.ttl.is_zero() {
            return Err(TreeError::InvalidInput("ttl must be positive".into()));
        }
        if config.page_size == 0 {
            return Err(TreeError::InvalidInput("page_size must be at least 1".into()));
        }
        let block_size =
            if config.event_block_size == 0 { config.page_size } else { config.event_block_size };
        // Siblings differ somewhere in their first page. A block that is a whole number of
        // pages therefore differs between them too; any other block could be the same
        // tokens in two branches, stored twice and removed while still cached.
        if block_size % config.page_size != 0 {
            return Err(TreeError::InvalidInput(format!(
                "kv_event_block_size ({block_size}) must be a multiple of page_size ({})",
                config.page_size
            )));
        }
        let mut arena = Arena::default();
        let root = arena.alloc(Node { is_root: true, ..Node::default() });
        Ok(RadixTree {
            ttl_ns: duration_ns(config.ttl),
            config,
            block_size,
            arena,
            root,
            namespace_roots: HashMap::new(),
            namespace_of_root: HashMap::new(),
            evictable: BTreeSet::new(),
            evictable_tokens: 0,
            protected_tokens: 0,
            num_nodes: 0,
            clock: 0,
            next_seq: 1,
            events: Vec::new(),
            slru_hot: BTreeSet::new(),
            slru_hot_tokens: 0,
            expiry: BTreeSet::new(),
            time,
        })
    }

    pub fn config(&self) -> &TreeConfig {
        &self.config
    }

    /// Tokens per KV event block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The handle `match_prefix` returns when nothing matched; locking it does nothing.
    pub fn root_handle(&self) -> NodeHandle {
        self.arena.handle(self.root)
    }

    /// The longest cached prefix of `tokens` in `namespace`, in whole pages. Marks the
    /// matched nodes used (for LRU/LFU), and splits the last one if the match ends inside
    /// it, so that the returned node covers exactly the matched prefix.
    pub fn match_prefix(&mut self, tokens: &[u32], namespace: Option<&str>) -> MatchResult {
        let mut path = MatchedPath::default();
        let (length, node) = self.match_prefix_path(tokens, namespace, &mut path);
        let mut kv_slots = vec![0; length];
        self.copy_matched_slots(&path, &mut kv_slots);
        MatchResult { length, kv_slots, node }
    }

    /// [`match_prefix`](Self::match_prefix) without gathering the slots: it records the
    /// matched nodes in `path` (a buffer the caller reuses) and returns the matched length
    /// and node. [`copy_matched_slots`](Self::copy_matched_slots) then writes the slots
    /// straight to where the caller wants them (the binding: a fresh numpy array), one
    /// copy fewer of the slots, which is what a walk on a cold cache pays for.
    pub fn match_prefix_path(
        &mut self,
        tokens: &[u32],
        namespace: Option<&str>,
        path: &mut MatchedPath,
    ) -> (usize, NodeHandle) {
        self.match_prefix_path_if(tokens, namespace, path, |_| true).expect("accepted")
    }

    /// [`match_prefix_path`](Self::match_prefix_path) that asks `accept`, with the matched
    /// length, once the matched path is found and before anything in the tree changes (no
    /// access marked, no split, the clock as it was): `None`, with an empty `path`, where
    /// it says no. The binding checks a prompt's values there, when the walk has brought
    /// them into cache, rather than reading a cold prompt once for the check and again for
    /// the walk; the first `matched` tokens are equal to keys of the tree.
    pub fn match_prefix_path_if(
        &mut self,
        tokens: &[u32],
        namespace: Option<&str>,
        path: &mut MatchedPath,
        accept: impl FnOnce(usize) -> bool,
    ) -> Option<(usize, NodeHandle)> {
        path.nodes.clear();
        let page = self.config.page_size;
        let aligned = tokens.len() / page * page;
        let root = self.root_of(namespace);
        // find the path, changing nothing: its last node may be matched only in part
        let mut pos = 0;
        let mut split_at = None;
        if let Some(mut node) = root {
            while pos < aligned {
                let Some(child) = self.find_child(node, &tokens[pos..pos + page]) else { break };
                let node_ref = &self.arena[child];
                // the statistics this match will write, in the node's second cache line
                prefetch_line(&node_ref.stats);
                let key = &node_ref.key;
                prefetch(&key[..key.len().min(aligned - pos)]);
                let common = self.common_pages(key, &tokens[pos..aligned]);
                path.nodes.push(child);
                pos += common;
                if common < self.arena[child].key.len() {
                    split_at = Some(common);
                    break;
                }
                node = child;
            }
        }
        if !accept(pos) {
            path.nodes.clear();
            return None;
        }
        self.clock += 1;
        let clock = self.clock;
        let now = self.now();
        let policy = self.config.policy;
        for &child in &path.nodes {
            self.touch(child, |s| {
                s.last_access = clock;
                s.hits += 1;
                if policy == EvictionPolicy::Tlru {
                    s.deadline_ns = now.saturating_add(s.ttl_ns);
                }
            });
            if policy == EvictionPolicy::Slru {
                self.promote_on_second_hit(child);
            }
        }
        if let (Some(common), Some(last)) = (split_at, path.nodes.last_mut()) {
            *last = self.split(*last, common);
        }
        if policy == EvictionPolicy::Slru {
            self.demote_overflow(clock);
        }
        // The slots are copied next: ask for them now, so that their cache lines arrive
        // while the caller gets ready (the binding takes the GIL back and makes an array).
        for &idx in &path.nodes {
            prefetch(&self.arena[idx].value);
        }
        let node = match path.nodes.last() {
            Some(&last) if pos > 0 => self.arena.handle(last),
            _ => self.root_handle(),
        };
        Some((pos, node))
    }

    /// Writes the slots of the prefix `path` matched (by the last call that filled it, on
    /// this tree, unchanged since) into `out`, whose length must be the matched length.
    pub fn copy_matched_slots(&self, path: &MatchedPath, out: &mut [u32]) {
        let mut at = 0;
        for &idx in &path.nodes {
            let value = &self.arena[idx].value;
            out[at..at + value.len()].copy_from_slice(value);
            at += value.len();
        }
        assert_eq!(at, out.len(), "out must be as long as the match");
    }

    /// How many leading tokens of `tokens` `match_prefix` would match, without its side
    /// effects: no node is split and no access statistics change (so eviction order and
    /// the clock stay as they were). For ordering work by expected cache hits.
    pub(crate) fn prefix_len(&self, tokens: &[u32], namespace: Option<&str>) -> usize {
        let page = self.config.page_size;
        let aligned = tokens.len() / page * page;
        let Some(mut node) = self.root_of(namespace) else { return 0 };
        let mut pos = 0;
        while pos < aligned {
            let Some(child) = self.find_child(node, &tokens[pos..pos + page]) else { break };
            let common = self.common_pages(&self.arena[child].key, &tokens[pos..aligned]);
            pos += common;
            if common < self.arena[child].key.len() {
                break;
            }
            node = child;
        }
        pos
    }

    /// Caches `tokens` (truncated to whole pages) with their KV slots. Returns how many
    /// leading tokens were already cached: the tree keeps its own slots for those, so the
    /// caller frees its copies among `kv_slots[..returned]` (and the slots of the
    /// truncated partial page) itself.
    pub fn insert(
        &mut self,
        tokens: &[u32],
        kv_slots: &[u32],
        namespace: Option<&str>,
        priority: i64,
    ) -> Result<usize, TreeError> {
        self.insert_with_ttl(tokens, kv_slots, namespace, priority, None)
    }

    /// [`insert`](Self::insert) with the nodes' time-to-live under `tlru` (`None`: the
    /// tree's [`TreeConfig::ttl`]). A `ttl` under any other policy is refused.
    pub fn insert_with_ttl(
        &mut self,
        tokens: &[u32],
        kv_slots: &[u32],
        namespace: Option<&str>,
        priority: i64,
        ttl: Option<Duration>,
    ) -> Result<usize, TreeError> {
        let policy = self.config.policy;
        if ttl.is_some() && policy != EvictionPolicy::Tlru {
            return Err(TreeError::InvalidInput(format!(
                "ttl: only the tlru eviction policy gives nodes a time-to-live (this tree's is {policy})"
            )));
        }
        if ttl.is_some_and(|t| t.is_zero()) {
            return Err(TreeError::InvalidInput("ttl must be positive".into()));
        }
        let ttl_ns = ttl.map_or(self.ttl_ns, duration_ns);
        if tokens.len() != kv_slots.len() {
            return Err(TreeError::InvalidInput(format!(
                "kv_slots has {} entries but tokens has {}; they must be the same length",
                kv_slots.len(),
                tokens.len()
            )));
        }
        self.clock += 1;
        let clock = self.clock;
        let now = self.now();
        let page = self.config.page_size;
        let aligned = tokens.len() / page * page;
        if aligned == 0 {
            return Ok(0);
        }
        let mut node = self.root_or_create(namespace);
        let mut pos = 0;
        // The hash of the last complete event block on the path so far.
        let mut parent_block: Option<u64> = None;
        while pos < aligned {
            let Some(child) = self.find_child(node, &tokens[pos..pos + page]) else {
                let leaf = NewLeaf { start: pos, end: aligned, priority, parent_block, ttl_ns, now };
                self.add_leaf(node, tokens, kv_slots, leaf, namespace);
                return Ok(pos);
            };
            let common = self.common_pages(&self.arena[child].key, &tokens[pos..aligned]);
            self.touch(child, |s| {
                s.last_access = clock;
                s.priority = s.priority.max(priority);
                if policy == EvictionPolicy::Tlru {
                    s.ttl_ns = s.ttl_ns.max(ttl_ns);
                    s.deadline_ns = now.saturating_add(s.ttl_ns);
                }
            });
            let reached =
                if common < self.arena[child].key.len() { self.split(child, common) } else { child };
            if let Some(&h) = self.arena[reached].block_hashes.last() {
                parent_block = Some(h);
            }
            node = reached;
            pos += common;
        }
        Ok(aligned)
    }

    /// Protects the path from `node` to the root from eviction (a request is using it).
    /// Returns how many tokens became protected.
    pub fn lock(&mut self, node: NodeHandle) -> Result<usize, TreeError> {
        let mut idx = self.resolve(node)?;
        let mut moved = 0;
        if !self.arena[idx].is_root {
            self.arena[idx].own_locks += 1;
        }
        while !self.arena[idx].is_root {
            if self.arena[idx].lock_ref == 0 {
                if self.arena[idx].in_evict_set {
                    self.leave_evict_set(idx);
                }
                moved += self.arena[idx].key.len();
            }
            self.arena[idx].lock_ref += 1;
            idx = self.arena[idx].parent;
        }
        self.evictable_tokens -= moved;
        self.protected_tokens += moved;
        Ok(moved)
    }

    /// Undoes one `lock` of this same node. Returns how many tokens became evictable.
    /// Fails, changing nothing, if the node holds no lock of its own (locks taken on a
    /// descendant protect it too, but only the descendant can give them back).
    pub fn unlock(&mut self, node: NodeHandle) -> Result<usize, TreeError> {
        let mut idx = self.resolve(node)?;
        if self.arena[idx].is_root {
            return Ok(0);
        }
        if self.arena[idx].own_locks == 0 {
            return Err(TreeError::NotLocked(node));
        }
        self.arena[idx].own_locks -= 1;
        let mut moved = 0;
        while !self.arena[idx].is_root {
            let n = &mut self.arena[idx];
            n.lock_ref -= 1;
            if n.lock_ref == 0 {
                moved += n.key.len();
                let leaf = n.is_leaf();
                if leaf {
                    self.enter_evict_set(idx);
                }
            }
            idx = self.arena[idx].parent;
        }
        self.protected_tokens -= moved;
        self.evictable_tokens += moved;
        Ok(moved)
    }

    /// Frees unlocked leaves in policy order (and parents that become unlocked leaves)
    /// until at least `num_tokens` tokens are freed or nothing evictable is left. Returns
    /// the freed KV slots; whole nodes go, so it may free more than asked.
    pub fn evict(&mut self, num_tokens: usize) -> Vec<u32> {
        let mut freed = Vec::new();
        let mut removed_blocks = Vec::new();
        let now = self.now();
        while freed.len() < num_tokens {
            let Some(idx) = self.next_victim(now) else { break };
            self.leave_evict_set(idx);
            if self.arena[idx].stats.slru_protected {
                self.leave_hot_set(idx);
                self.slru_hot_tokens -= self.arena[idx].key.len();
            }
            let parent = self.arena[idx].parent;
            self.unlink_child(parent, idx);
            let node = self.arena.release(idx);
            self.evictable_tokens -= node.key.len();
            self.num_nodes -= 1;
            freed.extend_from_slice(&node.value);
            removed_blocks.extend_from_slice(&node.block_hashes);
            let p = &self.arena[parent];
            let (leaf, root, unlocked) = (p.is_leaf(), p.is_root, p.lock_ref == 0);
            if leaf {
                if !root && unlocked {
                    self.enter_evict_set(parent);
                } else if root && parent != self.root {
                    self.drop_namespace_root(parent);
                }
            }
        }
        if !removed_blocks.is_empty() {
            self.events.push(KvEvent::BlockRemoved { block_hashes: removed_blocks });
        }
        tracing::debug!(asked = num_tokens, freed = freed.len(), "radix evict");
        freed
    }

    /// Drops everything cached. Every handle given out so far, but the root's, goes stale.
    pub fn reset(&mut self) {
        for idx in 0..self.arena.nodes.len() as u32 {
            if idx != self.root && self.arena[idx].alive {
                self.arena.release(idx);
            }
        }
        self.arena[self.root].children = ChildMap::default();
        self.namespace_roots.clear();
        self.namespace_of_root.clear();
        self.evictable.clear();
        self.slru_hot.clear();
        self.slru_hot_tokens = 0;
        self.expiry.clear();
        self.evictable_tokens = 0;
        self.protected_tokens = 0;
        self.num_nodes = 0;
        if self.config.kv_events {
            self.events.push(KvEvent::AllBlocksCleared);
        }
    }

    pub fn sizes(&self) -> TreeSizes {
        TreeSizes {
            evictable: self.evictable_tokens,
            protected: self.protected_tokens,
            total: self.evictable_tokens + self.protected_tokens,
            nodes: self.num_nodes,
        }
    }

    /// Up to `max` tokens the tree holds right after the whole of `tokens` (in
    /// `namespace`), into `out` (cleared first): what an earlier sequence with this
    /// prefix went on with, taking the most recently used branch where they part. Empty
    /// when `tokens` is not all in the tree, or nothing follows it. Reads only: no access
    /// is counted and nothing splits (a speculative draft's source, `engine::draft`).
    pub fn continuation(&self, tokens: &[u32], namespace: Option<&str>, max: usize, out: &mut Vec<u32>) {
        out.clear();
        let Some(root) = self.root_of(namespace) else { return };
        let page = self.config.page_size;
        let (mut node, mut pos) = (root, 0);
        // down the path of `tokens`: it must end inside an edge or at a node
        let mut rest: &[u32] = &[];
        while pos < tokens.len() {
            if pos + page > tokens.len() {
                return; // a partial page: not a key the tree can hold
            }
            let Some(child) = self.find_child(node, &tokens[pos..pos + page]) else { return };
            let key = &self.arena[child].key;
            let n = key.len().min(tokens.len() - pos);
            if key[..n] != tokens[pos..pos + n] {
                return;
            }
            pos += n;
            node = child;
            rest = &key[n..];
        }
        out.extend_from_slice(&rest[..rest.len().min(max)]);
        // then down the most recently used children
        while out.len() < max {
            let Some(child) =
                self.arena[node].children.values().max_by_key(|&c| self.arena[c].stats.last_access)
            else {
                return;
            };
            let key = &self.arena[child].key;
            out.extend_from_slice(&key[..key.len().min(max - out.len())]);
            node = child;
        }
    }

    /// The KV events queued since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// Every KV slot the tree holds, in no particular order (for integrity checks).
    pub fn all_kv_slots(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.evictable_tokens + self.protected_tokens);
        for n in &self.arena.nodes {
            if n.alive {
                out.extend_from_slice(&n.value);
            }
        }
        out
    }

    /// Heap and inline bytes the tree holds, counted from capacities.
    pub fn memory_bytes(&self) -> usize {
        let per_node: usize = self
            .arena
            .nodes
            .iter()
            .filter(|n| n.alive)
            .map(|n| {
                4 * (n.key.capacity() + n.value.capacity())
                    + 8 * n.block_hashes.capacity()
                    + n.children.allocation_size()
            })
            .sum();
        // A B-tree node holds up to 11 entries; count the entries at a conservative
        // two-thirds fill.
        let set = self.evictable.len() * std::mem::size_of::<(EvictionKey, u32)>() * 3 / 2
            + (self.slru_hot.len() + self.expiry.len()) * std::mem::size_of::<(u64, u64, u32)>() * 3 / 2;
        std::mem::size_of::<Self>() + self.arena.heap_bytes() + per_node + set
    }

    // ---- lookups ----

    /// The time for `tlru`; other policies never read the clock.
    fn now(&self) -> u64 {
        if self.config.policy == EvictionPolicy::Tlru {
            self.time.now_ns()
        } else {
            0
        }
    }

    fn resolve(&self, handle: NodeHandle) -> Result<u32, TreeError> {
        self.arena.resolve(handle).ok_or(TreeError::StaleHandle(handle))
    }

    fn root_of(&self, namespace: Option<&str>) -> Option<u32> {
        match namespace {
            None => Some(self.root),
            Some(ns) => self.namespace_roots.get(ns).copied(),
        }
    }

    fn root_or_create(&mut self, namespace: Option<&str>) -> u32 {
        if let Some(root) = self.root_of(namespace) {
            return root;
        }
        let ns = namespace.expect("the global root always exists").to_string();
        let root = self.arena.alloc(Node { is_root: true, parent: NONE, ..Node::default() });
        self.namespace_roots.insert(ns.clone(), root);
        self.namespace_of_root.insert(root, ns);
        root
    }

    fn drop_namespace_root(&mut self, root: u32) {
        if let Some(ns) = self.namespace_of_root.remove(&root) {
            self.namespace_roots.remove(&ns);
        }
        self.arena.release(root);
    }

    /// The child of `parent` whose key starts with `page`.
    fn find_child(&self, parent: u32, page: &[u32]) -> Option<u32> {
        let mut child = self.arena[parent].children.get(page[0])?;
        if page.len() == 1 {
            return Some(child);
        }
        loop {
            if self.arena[child].key[..page.len()] == *page {
                return Some(child);
            }
            child = self.arena[child].alias_next;
            if child == NONE {
                return None;
            }
        }
    }

    /// Length of the common prefix of `key` and `query`, rounded down to whole pages.
    fn common_pages(&self, key: &[u32], query: &[u32]) -> usize {
        let n = key.len().min(query.len());
        let (key, query) = (&key[..n], &query[..n]);
        let page = self.config.page_size;
        // The usual case: the whole edge matches (one memcmp).
        if key == query {
            return n / page * page;
        }
        // Compare in blocks first: whole-block equality compiles to a vectorized compare.
        const BLOCK: usize = 16;
        let mut i = 0;
        while i + BLOCK <= n && key[i..i + BLOCK] == query[i..i + BLOCK] {
            i += BLOCK;
        }
        while i < n && key[i] == query[i] {
            i += 1;
        }
        i / page * page
    }

    // ---- structure changes ----

    fn add_child(&mut self, parent: u32, child: u32) {
        let first = self.arena[child].key[0];
        if let Some(head) = self.arena[parent].children.insert(first, child) {
            self.arena[child].alias_next = head;
        }
    }

    fn unlink_child(&mut self, parent: u32, child: u32) {
        let first = self.arena[child].key[0];
        let next = self.arena[child].alias_next;
        let head = self.arena[parent].children.get(first).expect("child is a child of parent");
        if head == child {
            if next == NONE {
                self.arena[parent].children.remove(first);
            } else {
                self.arena[parent].children.insert(first, next);
            }
        } else {
            let mut prev = head;
            while self.arena[prev].alias_next != child {
                prev = self.arena[prev].alias_next;
            }
            self.arena[prev].alias_next = next;
        }
        self.arena[child].alias_next = NONE;
    }

    /// Puts `new` where `old` hangs under their common parent (`new` has the first page
    /// `old` had; `old` may already have been cut).
    fn replace_child(&mut self, parent: u32, old: u32, new: u32) {
        let first = self.arena[new].key[0];
        self.arena[new].alias_next = self.arena[old].alias_next;
        self.arena[old].alias_next = NONE;
        let head = self.arena[parent].children.get_mut(first).expect("old is a child of parent");
        if *head == old {
            *head = new;
        } else {
            let mut prev = *head;
            while self.arena[prev].alias_next != old {
                prev = self.arena[prev].alias_next;
            }
            self.arena[prev].alias_next = new;
        }
    }

    /// Cuts `idx` after `at` tokens; the upper part becomes a new node, which is returned.
    fn split(&mut self, idx: u32, at: usize) -> u32 {
        let block = self.block_size as u32;
        let node = &mut self.arena[idx];
        let upper_key = node.key.drain(..at).collect::<Vec<_>>();
        let upper_value = node.value.drain(..at).collect::<Vec<_>>();
        node.key.shrink_to_fit();
        node.value.shrink_to_fit();
        let upper_hashes = if self.config.kv_events {
            let upper_blocks = ((node.start + at as u32) / block - node.start / block) as usize;
            let upper = node.block_hashes.drain(..upper_blocks).collect::<Vec<_>>();
            node.block_hashes.shrink_to_fit();
            upper
        } else {
            Vec::new()
        };
        let upper = Node {
            key: upper_key,
            value: upper_value,
            parent: node.parent,
            start: node.start,
            lock_ref: node.lock_ref,
            stats: EvictionStats { seq: self.next_seq, ..node.stats },
            block_hashes: upper_hashes,
            ..Node::default()
        };
        node.start += at as u32;
        let parent = node.parent;
        self.next_seq += 1;
        let upper = self.arena.alloc(upper);
        self.replace_child(parent, idx, upper);
        self.arena[idx].parent = upper;
        self.add_child(upper, idx);
        self.num_nodes += 1;
        // both parts stay in the segment the node was in (no tokens move between segments)
        if self.arena[upper].stats.slru_protected {
            self.enter_hot_set(upper);
        }
        upper
    }

    fn add_leaf(
        &mut self,
        parent: u32,
        tokens: &[u32],
        kv_slots: &[u32],
        leaf: NewLeaf,
        namespace: Option<&str>,
    ) {
        let NewLeaf { start, end, priority, parent_block, ttl_ns, now } = leaf;
        let block_hashes = if self.config.kv_events {
            self.stored_blocks(tokens, start, end, parent_block, namespace)
        } else {
            Vec::new()
        };
        let leaf = Node {
            key: tokens[start..end].to_vec(),
            value: kv_slots[start..end].to_vec(),
            parent,
            start: start as u32,
            stats: EvictionStats {
                last_access: self.clock,
                created: self.clock,
                hits: 0,
                priority,
                seq: self.next_seq,
                slru_protected: false,
                ttl_ns,
                deadline_ns: now.saturating_add(ttl_ns),
            },
            block_hashes,
            ..Node::default()
        };
        self.next_seq += 1;
        if self.arena[parent].in_evict_set {
            self.leave_evict_set(parent);
        }
        let leaf = self.arena.alloc(leaf);
        self.add_child(parent, leaf);
        self.enter_evict_set(leaf);
        self.evictable_tokens += end - start;
        self.num_nodes += 1;
    }

    /// Hashes the event blocks that end inside `[start, end)` and queues their event.
    fn stored_blocks(
        &mut self,
        tokens: &[u32],
        start: usize,
        end: usize,
        parent_block: Option<u64>,
        namespace: Option<&str>,
    ) -> Vec<u64> {
        let b = self.block_size;
        let (first, last) = (start / b, end / b);
        if first == last {
            return Vec::new();
        }
        let parent = parent_block.unwrap_or_else(|| namespace_seed(namespace));
        let token_ids = &tokens[first * b..last * b];
        let hashes = chain_hashes(parent, token_ids, b);
        self.events.push(KvEvent::BlockStored {
            block_hashes: hashes.clone(),
            parent_block_hash: parent_block,
            token_ids: token_ids.to_vec(),
            block_size: b as u32,
            namespace: namespace.map(str::to_string),
        });
        hashes
    }

    // ---- the ordered sets ----
    //
    // Using a node only makes its keys grow (later access, more hits, higher priority,
    // promotion, later deadline), except under `mru`, whose key falls with use. So a walk
    // updates statistics only, and a node may sit in a set under an older, smaller key
    // than its own; whoever takes a set's front first re-files a front entry that lags
    // (`next_victim`, `demote_overflow`). What comes out is the same as with eager
    // updates, and a match or insert touches no set: on a cold cache each set update is
    // several misses.

    /// Whether a node's keys only grow with use, so that sets may lag (see above).
    fn lazy_keys(&self) -> bool {
        self.config.policy != EvictionPolicy::Mru
    }

    fn enter_evict_set(&mut self, idx: u32) {
        let key = self.config.policy.key(&self.arena[idx].stats);
        self.evictable.insert((key, idx));
        let n = &mut self.arena[idx];
        n.filed_key = key;
        n.in_evict_set = true;
        if self.config.policy == EvictionPolicy::Tlru {
            let (deadline, seq) = (n.stats.deadline_ns, n.stats.seq);
            n.filed_deadline = deadline;
            self.expiry.insert((deadline, seq, idx));
        }
    }

    fn leave_evict_set(&mut self, idx: u32) {
        let n = &mut self.arena[idx];
        n.in_evict_set = false;
        let (key, deadline, seq) = (n.filed_key, n.filed_deadline, n.stats.seq);
        self.evictable.remove(&(key, idx));
        if self.config.policy == EvictionPolicy::Tlru {
            self.expiry.remove(&(deadline, seq, idx));
        }
    }

    fn enter_hot_set(&mut self, idx: u32) {
        let n = &mut self.arena[idx];
        n.filed_access = n.stats.last_access;
        self.slru_hot.insert((n.filed_access, n.stats.seq, idx));
    }

    fn leave_hot_set(&mut self, idx: u32) {
        let n = &self.arena[idx];
        self.slru_hot.remove(&(n.filed_access, n.stats.seq, idx));
    }

    /// The leaf `evict` takes next: under `tlru` an expired one if any (the earliest),
    /// else the policy's first. Re-files front entries that lag their node's keys.
    fn next_victim(&mut self, now: u64) -> Option<u32> {
        while let Some(&(filed, seq, idx)) = self.expiry.first() {
            let deadline = self.arena[idx].stats.deadline_ns;
            if filed != deadline {
                self.expiry.pop_first();
                self.expiry.insert((deadline, seq, idx));
                self.arena[idx].filed_deadline = deadline;
                continue;
            }
            if deadline <= now {
                return Some(idx);
            }
            break;
        }
        while let Some(&(filed, idx)) = self.evictable.first() {
            let key = self.config.policy.key(&self.arena[idx].stats);
            if filed == key {
                return Some(idx);
            }
            self.evictable.pop_first();
            self.evictable.insert((key, idx));
            self.arena[idx].filed_key = key;
        }
        None
    }

    /// Updates a node's statistics through use (see the section's comment: the sets are
    /// left lagging, except under `mru`).
    fn touch(&mut self, idx: u32, update: impl FnOnce(&mut EvictionStats)) {
        if self.lazy_keys() {
            update(&mut self.arena[idx].stats);
        } else {
            self.restat(idx, update);
        }
    }

    /// Updates a node's statistics in any direction, re-filing it in every set it is in.
    fn restat(&mut self, idx: u32, update: impl FnOnce(&mut EvictionStats)) {
        let member = self.arena[idx].in_evict_set;
        if member {
            self.leave_evict_set(idx);
        }
        let hot = self.arena[idx].stats.slru_protected;
        if hot {
            self.leave_hot_set(idx);
        }
        update(&mut self.arena[idx].stats);
        if self.arena[idx].stats.slru_protected {
            self.enter_hot_set(idx);
        }
        if member {
            self.enter_evict_set(idx);
        }
    }

    // ---- slru segments ----

    /// A hit made this probationary node's second: it joins the protected segment (its
    /// eviction key grows, so the evictable set may lag).
    fn promote_on_second_hit(&mut self, idx: u32) {
        let s = &mut self.arena[idx].stats;
        if s.slru_protected || s.hits < 2 {
            return;
        }
        s.slru_protected = true;
        self.enter_hot_set(idx);
        self.slru_hot_tokens += self.arena[idx].key.len();
    }

    /// While the protected segment holds more than its share of the cached tokens, its
    /// least recently used node goes back to the probationary segment, as just used there.
    fn demote_overflow(&mut self, clock: u64) {
        let total = (self.evictable_tokens + self.protected_tokens) as f64;
        let limit = self.config.slru_protected_share * total;
        while self.slru_hot_tokens as f64 > limit {
            let &(filed, seq, idx) = self.slru_hot.first().expect("protected tokens are in protected nodes");
            let last_access = self.arena[idx].stats.last_access;
            if filed != last_access {
                self.slru_hot.pop_first();
                self.slru_hot.insert((last_access, seq, idx));
                self.arena[idx].filed_access = last_access;
                continue;
            }
            // the eviction key falls (protected to probationary): re-filed at once
            self.restat(idx, |s| {
                s.slru_protected = false;
                s.last_access = clock;
            });
            self.slru_hot_tokens -= self.arena[idx].key.len();
        }
    }

    // ---- integrity ----

    fn children_of(&self, idx: u32) -> impl Iterator<Item = u32> + '_ {
        self.arena[idx].children.values().flat_map(move |head| {
            std::iter::successors(Some(head), move |&c| {
                let next = self.arena[c].alias_next;
                (next != NONE).then_some(next)
            })
        })
    }

    /// Checks every structural invariant (DESIGN.md's tree accounting, the evictable
    /// set, the child maps, event hashes). O(cached tokens); for tests and idle checks.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut seen_slots = hashbrown::HashSet::new();
        let (mut evictable, mut protected, mut nodes, mut leaves) = (0usize, 0usize, 0usize, 0usize);
        let (mut hot_nodes, mut hot_tokens) = (0usize, 0usize);
        let policy = self.config.policy;
        let page = self.config.page_size;
        let mut roots: Vec<(u32, Option<&str>)> = vec![(self.root, None)];
        for (ns, &r) in &self.namespace_roots {
            roots.push((r, Some(ns.as_str())));
            if self.arena[r].is_leaf() {
                return Err(format!("namespace root {ns:?} has no children"));
            }
        }
        for (root, ns) in roots {
            // (node, tokens on the path above it, last block hash above it)
            let mut stack: Vec<(u32, Vec<u32>, u64)> = vec![(root, Vec::new(), namespace_seed(ns))];
            while let Some((idx, path, last_hash)) = stack.pop() {
                let n = &self.arena[idx];
                if !n.alive {
                    return Err(format!("node {idx} is reachable but freed"));
                }
                let mut path = path;
                let mut last_hash = last_hash;
                if !n.is_root {
                    nodes += 1;
                    let parent = &self.arena[n.parent];
                    if n.key.is_empty() || n.key.len() % page != 0 {
                        return Err(format!("node {idx} has {} tokens, not whole pages", n.key.len()));
                    }
                    if n.key.len() != n.value.len() {
                        return Err(format!("node {idx}: key and value lengths differ"));
                    }
                    if n.start as usize != path.len() {
                        return Err(format!("node {idx}: start {} but depth {}", n.start, path.len()));
                    }
                    if !parent.is_root && parent.lock_ref < n.lock_ref {
                        return Err(format!("node {idx}: lock_ref above its parent's"));
                    }
                    let below: u32 = self.children_of(idx).map(|c| self.arena[c].lock_ref).sum();
                    if n.lock_ref != n.own_locks + below {
                        return Err(format!("node {idx}: lock_ref is not own locks + children's"));
                    }
                    if n.lock_ref == 0 {
                        evictable += n.key.len();
                    } else {
                        protected += n.key.len();
                    }
                    for &slot in &n.value {
                        if !seen_slots.insert(slot) {
                            return Err(format!("kv slot {slot} is held twice"));
                        }
                    }
                    let should = n.is_leaf() && n.lock_ref == 0;
                    // filed keys may lag the node's own, never lead (or differ, under mru)
                    let key = policy.key(&n.stats);
                    let filed_ok = if self.lazy_keys() { n.filed_key <= key } else { n.filed_key == key };
                    if should != n.in_evict_set
                        || (should && (!filed_ok || !self.evictable.contains(&(n.filed_key, idx))))
                    {
                        return Err(format!("node {idx}: evictable-set membership is wrong"));
                    }
                    leaves += should as usize;
                    if n.stats.slru_protected {
                        let filed = (n.filed_access, n.stats.seq, idx);
                        if policy != EvictionPolicy::Slru
                            || n.filed_access > n.stats.last_access
                            || !self.slru_hot.contains(&filed)
                        {
                            return Err(format!("node {idx}: protected-segment membership is wrong"));
                        }
                        hot_nodes += 1;
                        hot_tokens += n.key.len();
                    }
                    let expires = policy == EvictionPolicy::Tlru && should;
                    let filed = (n.filed_deadline, n.stats.seq, idx);
                    if expires && (n.filed_deadline > n.stats.deadline_ns || !self.expiry.contains(&filed)) {
                        return Err(format!("node {idx}: expiry-set membership is wrong"));
                    }
                    path.extend_from_slice(&n.key);
                    if self.config.kv_events {
                        let b = self.block_size;
                        let first = n.start as usize / b;
                        let last = path.len() / b;
                        let want = chain_hashes(last_hash, &path[first * b..last * b], b);
                        if want != n.block_hashes {
                            return Err(format!("node {idx}: block hashes are wrong"));
                        }
                        if let Some(&h) = want.last() {
                            last_hash = h;
                        }
                    }
                }
                let mut firsts = hashbrown::HashSet::new();
                for (first, head) in n.children.iter() {
                    let mut c = head;
                    while c != NONE {
                        let child = &self.arena[c];
                        if child.parent != idx || child.key.first() != Some(&first) {
                            return Err(format!("node {c} hangs under the wrong parent or key"));
                        }
                        if !firsts.insert(child.key[..page].to_vec()) {
                            return Err(format!("two children of node {idx} share a first page"));
                        }
                        stack.push((c, path.clone(), last_hash));
                        c = child.alias_next;
                    }
                }
            }
        }
        if (evictable, protected, nodes) != (self.evictable_tokens, self.protected_tokens, self.num_nodes) {
            return Err(format!(
                "sizes drifted: counted evictable {evictable}, protected {protected}, nodes {nodes}; \
                 recorded {}, {}, {}",
                self.evictable_tokens, self.protected_tokens, self.num_nodes
            ));
        }
        if leaves != self.evictable.len() {
            return Err(format!("evictable set has {} entries, {leaves} expected", self.evictable.len()));
        }
        let expiring = if policy == EvictionPolicy::Tlru { leaves } else { 0 };
        if expiring != self.expiry.len() {
            return Err(format!("expiry set has {} entries, {expiring} expected", self.expiry.len()));
        }
        if (hot_nodes, hot_tokens) != (self.slru_hot.len(), self.slru_hot_tokens) {
            return Err(format!(
                "protected segment: counted {hot_nodes} nodes, {hot_tokens} tokens; recorded {}, {}",
                self.slru_hot.len(),
                self.slru_hot_tokens
            ));
        }
        Ok(())
    }
}

/// Asks the CPU to bring `data` into the cache: a match reads long runs of tokens and
/// slots that are cold more often than not, and asking for all their lines at once
/// overlaps the misses that a plain sequential read would wait out one by one.
#[inline]
fn prefetch(data: &[u32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        const LINE: usize = 64 / std::mem::size_of::<u32>();
        for i in (0..data.len()).step_by(LINE) {
            // SAFETY: a prefetch never faults, and the address is inside `data`
            unsafe { _mm_prefetch::<_MM_HINT_T0>(data.as_ptr().add(i).cast::<i8>()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Asks the CPU for the cache line that holds `value`.
#[inline]
fn prefetch_line<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch never faults, and the address is a live reference
        unsafe { _mm_prefetch::<_MM_HINT_T0>((value as *const T).cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// The nodes a match walked, for [`RadixTree::copy_matched_slots`]; reuse one between
/// calls to save its allocation.
#[derive(Debug, Default)]
pub struct MatchedPath {
    nodes: Vec<u32>,
}

/// What `insert` hands `add_leaf` about the leaf it makes.
struct NewLeaf {
    start: usize,
    end: usize,
    priority: i64,
    parent_block: Option<u64>,
    ttl_ns: u64,
    now: u64,
}

#[cfg(test)]
#[path = "tree_tests.rs"]
mod tests;
