//! The node arena: nodes in one `Vec`, addressed by `u32` index, with a free list of
//! slots. Each slot carries a generation that moves on whenever its node is freed, so a
//! handle (index + generation) to a freed node can never alias the node that reuses the
//! slot. A slot whose generation would wrap is retired instead of reused.

pub(crate) use super::children::ChildMap;
use super::policy::{EvictionKey, EvictionStats};

pub(crate) const NONE: u32 = u32::MAX;

/// An opaque reference to a tree node, as given to callers. Never recycled: once its node
/// is gone (evicted, reset) the handle is stale and every call with it fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeHandle(pub u64);

impl NodeHandle {
    pub(crate) fn new(index: u32, generation: u32) -> Self {
        NodeHandle(((generation as u64) << 32) | index as u64)
    }
    pub(crate) fn index(self) -> u32 {
        self.0 as u32
    }
    pub(crate) fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// A node, laid out for the match walk: what it reads of each node it passes (the key,
/// to compare, and the children, to find the next node) is the node's first cache line;
/// the statistics a match writes are the second; the slots it copies and the structure's
/// bookkeeping follow.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub(crate) struct Node {
    /// The tokens on the edge into this node (a whole number of pages; empty for roots).
    pub key: Vec<u32>,
    /// Children by the first token of their key. With pages of more than one token two
    /// children may share a first token; the later ones hang off `alias_next`.
    pub children: ChildMap,
    pub stats: EvictionStats,
    /// The KV slot of each token in `key`.
    pub value: Vec<u32>,
    pub alias_next: u32,
    pub parent: u32,
    /// Position of `key[0]` in the sequence, i.e. tokens on the path above this node.
    pub start: u32,
    /// Locks on the path through this node: `own_locks` plus the children's `lock_ref`.
    pub lock_ref: u32,
    /// Locks taken on this node itself; `unlock` may only give back one of these.
    pub own_locks: u32,
    pub generation: u32,
    pub alive: bool,
    /// Member of the evictable set (unlocked leaf, not a root).
    pub in_evict_set: bool,
    pub is_root: bool,
    /// The keys the node is filed under in the tree's ordered sets: the evictable set
    /// (while `in_evict_set`), `tlru`'s expiry set (deadline, likewise) and `slru`'s
    /// protected segment (last access, while protected). They may lag `stats`: use only
    /// makes keys grow, so the sets are corrected when their front is taken
    /// (`RadixTree::touch`).
    pub filed_deadline: u64,
    pub filed_key: EvictionKey,
    pub filed_access: u64,
    /// Chained hashes of the event blocks that end inside this node (events on only).
    pub block_hashes: Vec<u64>,
}

impl Node {
    pub fn is_leaf(&self) -> bool {
        self.children.is_empty()
    }
}

#[derive(Debug, Default)]
pub(crate) struct Arena {
    pub nodes: Vec<Node>,
    free: Vec<u32>,
}

impl Arena {
    pub fn alloc(&mut self, mut node: Node) -> u32 {
        node.alive = true;
        node.alias_next = NONE;
        if let Some(index) = self.free.pop() {
            let slot = &mut self.nodes[index as usize];
            node.generation = slot.generation;
            *slot = node;
            index
        } else {
            let index = self.nodes.len() as u32;
            assert!(index != NONE, "radix tree arena is full (2^32 - 1 nodes)");
            node.generation = 0;
            self.nodes.push(node);
            index
        }
    }

    /// Frees a slot and returns the node that was there.
    pub fn release(&mut self, index: u32) -> Node {
        let slot = &mut self.nodes[index as usize];
        let generation = slot.generation;
        let node = std::mem::take(slot);
        slot.generation = generation.wrapping_add(1);
        if slot.generation != 0 {
            self.free.push(index);
        } // else retired: reusing it could make an old handle valid again
        node
    }

    pub fn handle(&self, index: u32) -> NodeHandle {
        NodeHandle::new(index, self.nodes[index as usize].generation)
    }

    /// The index behind a handle, if its node still lives.
    pub fn resolve(&self, handle: NodeHandle) -> Option<u32> {
        let node = self.nodes.get(handle.index() as usize)?;
        (node.alive && node.generation == handle.generation()).then_some(handle.index())
    }

    #[cfg(test)]
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>() + self.free.capacity() * 4
    }
}

impl std::ops::Index<u32> for Arena {
    type Output = Node;
    fn index(&self, index: u32) -> &Node {
        &self.nodes[index as usize]
    }
}

impl std::ops::IndexMut<u32> for Arena {
    fn index_mut(&mut self, index: u32) -> &mut Node {
        &mut self.nodes[index as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_slot_reuse_never_revives_old_handle() {
        let mut arena = Arena::default();
        let a = arena.alloc(Node::default());
        let old = arena.handle(a);
        arena.release(a);
        assert_eq!(arena.resolve(old), None);
        let b = arena.alloc(Node::default());
        assert_eq!(a, b, "slot is reused");
        assert_eq!(arena.resolve(old), None);
        assert_eq!(arena.resolve(arena.handle(b)), Some(b));
    }

    #[test]
    fn the_walks_fields_share_the_first_cache_line() {
        assert_eq!(std::mem::align_of::<Node>(), 64);
        assert!(std::mem::offset_of!(Node, children) + std::mem::size_of::<ChildMap>() <= 64);
        assert_eq!(std::mem::offset_of!(Node, stats), 64);
    }

    #[test]
    fn wrapped_generation_retires_slot() {
        let mut arena = Arena::default();
        let a = arena.alloc(Node::default());
        arena.nodes[a as usize].generation = u32::MAX;
        arena.release(a);
        assert_eq!(arena.num_free(), 0);
        assert_ne!(arena.alloc(Node::default()), a);
    }
}
