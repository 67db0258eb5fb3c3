//! A prefix tree over token bytes, stored flat in preorder so a mask is one linear
//! scan: a dead prefix skips its whole subtree with a single jump.

const NO_TOKEN: u32 = u32::MAX;

const HAS_TOKEN: u32 = 1 << 31;

/// Depths are stored in 23 bits; the vocabulary refuses longer tokens.
pub const MAX_TOKEN_BYTES: usize = (1 << 23) - 1;

/// One trie node. Preorder layout: a node's subtree is `index + 1 .. subtree_end`.
#[derive(Debug, Clone, Copy)]
struct TrieNode {
    /// The edge byte in bits 0..8, the depth (bytes from the root) in bits 8..31, and
    /// `HAS_TOKEN` in bit 31.
    bits: u32,
    subtree_end: u32,
    /// The token spelled by the path to this node, or `NO_TOKEN`.
    token: u32,
}

impl TrieNode {
    fn byte(self) -> u8 {
        self.bits as u8
    }
    fn depth(self) -> usize {
        ((self.bits & !HAS_TOKEN) >> 8) as usize
    }
    /// 1 if a token ends here, else 0; and the token id, or 0 when there is none.
    /// Lets the mask walk set bits without a hard-to-predict branch.
    fn token_bit(self) -> (u32, u32) {
        let has = self.bits >> 31;
        (has, self.token & has.wrapping_neg())
    }
}

/// Token trie. Tokens with identical bytes share a node: the first id sits on the node,
/// the others are listed in [`TokenTrie::duplicates`].
#[derive(Debug, Clone)]
pub struct TokenTrie {
    nodes: Vec<TrieNode>,
    /// Per node: the length of the longest token in its subtree, capped at 255 (a
    /// walk that only wants long tokens skips the subtrees without one).
    deepest_below: Vec<u8>,
    duplicates: Vec<(u32, u32)>,
    max_depth: usize,
}

impl TokenTrie {
    /// Build from `(id, bytes)` pairs; empty byte strings must be filtered out first.
    pub fn build<'a>(tokens: impl IntoIterator<Item = (u32, &'a [u8])>) -> Self {
        let mut sorted: Vec<(&[u8], u32)> = tokens.into_iter().map(|(id, b)| (b, id)).collect();
        // Sorted byte strings visit the trie in preorder, so nodes can be appended in order.
        sorted.sort_unstable();
        let root = TrieNode { bits: 0, subtree_end: 0, token: NO_TOKEN };
        let mut nodes = vec![root];
        let mut duplicates = Vec::new();
        // path[d] = index of the node at depth d on the current path.
        let mut path: Vec<usize> = vec![0];
        let mut previous: &[u8] = &[];
        let mut max_depth = 0;
        for (bytes, id) in sorted {
            debug_assert!(!bytes.is_empty());
            let common = previous.iter().zip(bytes).take_while(|(a, b)| a == b).count();
            while path.len() > common + 1 {
                let closed = path.pop().expect("path holds the root");
                nodes[closed].subtree_end = nodes.len() as u32;
            }
            for (depth, &byte) in bytes.iter().enumerate().skip(common) {
                path.push(nodes.len());
                nodes.push(TrieNode {
                    bits: byte as u32 | ((depth as u32 + 1) << 8),
                    subtree_end: 0,
                    token: NO_TOKEN,
                });
            }
            let last = *path.last().expect("path holds the root");
            if nodes[last].token == NO_TOKEN {
                nodes[last].token = id;
                nodes[last].bits |= HAS_TOKEN;
            } else {
                duplicates.push((nodes[last].token, id));
            }
            debug_assert!(bytes.len() <= MAX_TOKEN_BYTES);
            max_depth = max_depth.max(bytes.len());
            previous = bytes;
        }
        while let Some(closed) = path.pop() {
            nodes[closed].subtree_end = nodes.len() as u32;
        }
        // Backwards, every child is done before its parent; a node's children are found
        // by jumping from subtree end to subtree end.
        let mut deepest_below: Vec<u8> = nodes.iter().map(|n| n.depth().min(255) as u8).collect();
        for index in (0..nodes.len()).rev() {
            let mut child = index + 1;
            while child < nodes[index].subtree_end as usize {
                deepest_below[index] = deepest_below[index].max(deepest_below[child]);
                child = nodes[child].subtree_end as usize;
            }
        }
        TokenTrie { nodes, deepest_below, duplicates, max_depth }
    }

    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Length in bytes of the longest token.
    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// `(first_id, other_id)` pairs of tokens with identical bytes.
    pub fn duplicates(&self) -> &[(u32, u32)] {
        &self.duplicates
    }

    /// Set in `mask` the bit of every token reachable from `start`: `step(state, byte)`
    /// advances a state or returns `None` when the prefix is dead, which skips its whole
    /// subtree. `mask` must have room for every id in the trie. Duplicate ids are not
    /// set; see [`TokenTrie::duplicates`]. The hot path of the crate.
    #[inline]
    pub fn walk_into_mask<S: Copy>(
        &self,
        start: S,
        mut step: impl FnMut(S, u8) -> Option<S>,
        mask: &mut [u32],
    ) {
        let mut states = vec![start; self.max_depth + 1];
        self.walk_range(1..self.nodes.len(), &mut states, |_, s, b| step(s, b), mask);
    }

    /// [`TokenTrie::walk_into_mask`] whose `step` also receives the node index (to
    /// record where a walk stops, for [`TokenTrie::walk_subtree_into_mask`]).
    #[inline]
    pub(crate) fn walk_into_mask_indexed<S: Copy>(
        &self,
        start: S,
        step: impl FnMut(u32, S, u8) -> Option<S>,
        mask: &mut [u32],
    ) {
        let mut states = vec![start; self.max_depth + 1];
        self.walk_range(1..self.nodes.len(), &mut states, step, mask);
    }

    /// Walk the subtree rooted at `node` (node included), whose parent is in state
    /// `parent`. `states` is scratch space of at least `max_depth + 1` entries.
    #[inline]
    pub(crate) fn walk_subtree_into_mask<S: Copy>(
        &self,
        node: u32,
        parent: S,
        mut step: impl FnMut(S, u8) -> Option<S>,
        mask: &mut [u32],
        states: &mut [S],
    ) {
        let root = self.nodes[node as usize];
        states[root.depth() - 1] = parent;
        let range = node as usize..root.subtree_end as usize;
        self.walk_range(range, states, |_, s, b| step(s, b), mask);
    }

    /// [`TokenTrie::walk_subtree_into_mask`] whose `step` is also given the node entered.
    #[inline]
    pub(crate) fn walk_subtree_into_mask_indexed<S: Copy>(
        &self,
        node: u32,
        parent: S,
        step: impl FnMut(u32, S, u8) -> Option<S>,
        mask: &mut [u32],
        states: &mut [S],
    ) {
        let root = self.nodes[node as usize];
        states[root.depth() - 1] = parent;
        self.walk_range(node as usize..root.subtree_end as usize, states, step, mask);
    }

    /// Depth of `node` (bytes from the root).
    pub(crate) fn node_depth(&self, node: u32) -> usize {
        self.nodes[node as usize].depth()
    }

    /// Nodes in the subtree of `node`, itself included (what a walk of it may visit).
    pub(crate) fn subtree_size(&self, node: u32) -> usize {
        self.nodes[node as usize].subtree_end as usize - node as usize
    }

    /// A token in the subtree of `node` (its bytes begin with the node's path).
    pub(crate) fn token_under(&self, node: u32) -> u32 {
        let end = self.nodes[node as usize].subtree_end as usize;
        let first = (node as usize..end).find(|&i| self.nodes[i].bits & HAS_TOKEN != 0);
        self.nodes[first.expect("every subtree ends in a token")].token
    }

    /// [`TokenTrie::walk_into_mask`] for the tokens longer than `min_len` bytes only
    /// (shorter ones reached on the way are set too): subtrees whose tokens are all
    /// short are skipped whole.
    #[inline(never)]
    pub(crate) fn walk_long_tokens_into_mask<S: Copy>(
        &self,
        start: S,
        mut step: impl FnMut(S, u8) -> Option<S>,
        mask: &mut [u32],
        min_len: usize,
    ) {
        if min_len >= 255 {
            // Depths are capped at 255 in `deepest_below`: walk everything.
            return self.walk_into_mask(start, step, mask);
        }
        let mut states = vec![start; self.max_depth + 1];
        self.walk_range_skipping::<S, true>(
            1..self.nodes.len(),
            &mut states,
            |_, s, b| step(s, b),
            mask,
            min_len,
        );
    }

    /// The one walking loop. `states[d]` = state after the first `d` bytes of the
    /// current path; the parent of the first node of `range` must be set already.
    #[inline(always)]
    fn walk_range<S: Copy>(
        &self,
        range: std::ops::Range<usize>,
        states: &mut [S],
        step: impl FnMut(u32, S, u8) -> Option<S>,
        mask: &mut [u32],
    ) {
        self.walk_range_skipping::<S, false>(range, states, step, mask, 0);
    }

    /// [`TokenTrie::walk_range`] that, when `SKIP_SHORT`, also skips the subtrees
    /// whose tokens are all at most `min_len` bytes long (a constant, so the plain
    /// walk pays nothing for it).
    #[inline(always)]
    fn walk_range_skipping<S: Copy, const SKIP_SHORT: bool>(
        &self,
        range: std::ops::Range<usize>,
        states: &mut [S],
        mut step: impl FnMut(u32, S, u8) -> Option<S>,
        mask: &mut [u32],
        min_len: usize,
    ) {
        let nodes = &self.nodes[..range.end];
        let mut index = range.start;
        while index < nodes.len() {
            let node = nodes[index];
            if SKIP_SHORT && self.deepest_below[index] as usize <= min_len {
                index = node.subtree_end as usize;
                continue;
            }
            let depth = node.depth();
            match step(index as u32, states[depth - 1], node.byte()) {
                None => index = node.subtree_end as usize,
                Some(next) => {
                    states[depth] = next;
                    let (has, token) = node.token_bit();
                    mask[(token >> 5) as usize] |= has << (token & 31);
                    index += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trie_of(tokens: &[&str]) -> TokenTrie {
        TokenTrie::build(tokens.iter().enumerate().map(|(id, t)| (id as u32, t.as_bytes())))
    }

    fn set_ids(mask: &[u32]) -> Vec<u32> {
        (0..mask.len() as u32 * 32).filter(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1).collect()
    }

    #[test]
    fn walk_without_pruning_visits_every_token() {
        let trie = trie_of(&["a", "ab", "abc", "b", "ba", "c"]);
        let mut mask = [0u32; 1];
        trie.walk_into_mask((), |_, _| Some(()), &mut mask);
        assert_eq!(set_ids(&mask), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(trie.num_nodes(), 7);
        assert_eq!(trie.max_depth(), 3);
    }

    #[test]
    fn dead_prefix_skips_its_subtree() {
        let trie = trie_of(&["a", "ab", "abc", "b", "ba", "c"]);
        let mut mask = [0u32; 1];
        // State 0 is the root; from it the byte `a` is dead.
        trie.walk_into_mask(0u32, |s, b| if s == 0 && b == b'a' { None } else { Some(1) }, &mut mask);
        assert_eq!(set_ids(&mask), vec![3, 4, 5]);
    }

    #[test]
    fn subtree_walk_covers_one_subtree() {
        let trie = trie_of(&["a", "ab", "abc", "b", "ba", "c"]);
        // Node 1 is "a" (preorder); its subtree holds a, ab, abc.
        let mut mask = [0u32; 1];
        let mut states = vec![(); trie.max_depth() + 1];
        trie.walk_subtree_into_mask(1, (), |_, _| Some(()), &mut mask, &mut states);
        assert_eq!(set_ids(&mask), vec![0, 1, 2]);
    }

    #[test]
    fn long_token_walk_skips_short_subtrees_only() {
        let trie = trie_of(&["a", "ab", "abc", "b", "ba", "c", "cdef"]);
        assert_eq!(trie.deepest_below[0] as usize, 4);
        let mut mask = [0u32; 1];
        trie.walk_long_tokens_into_mask((), |_, _| Some(()), &mut mask, 2);
        // Every token longer than 2 is set; of the short ones, only those on the way.
        let ids = set_ids(&mask);
        assert!(ids.contains(&2) && ids.contains(&6), "{ids:?}");
        assert!(!ids.contains(&3) && !ids.contains(&4), "{ids:?}");
        let mut all = [0u32; 1];
        trie.walk_long_tokens_into_mask((), |_, _| Some(()), &mut all, 0);
        assert_eq!(set_ids(&all), vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(trie.node_depth(1), 1);
        assert_eq!(trie.token_under(1), 0);
    }

    #[test]
    fn identical_tokens_are_recorded_as_duplicates() {
        let trie = trie_of(&["x", "y", "x"]);
        assert_eq!(trie.duplicates(), &[(0, 2)]);
    }
}
