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
        TokenTrie { nodes, duplicates, max_depth }
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

    /// Walk every token reachable from `start`: `step(state, byte)` advances a state or
    /// returns `None` when the prefix is dead (its whole subtree is skipped); `visit` is
    /// called with each token id on a live path and the state after its last byte.
    /// Duplicate ids are not visited; see [`TokenTrie::duplicates`].
    #[inline]
    pub fn walk<S: Copy>(
        &self,
        start: S,
        mut step: impl FnMut(S, u8) -> Option<S>,
        mut visit: impl FnMut(u32, S),
    ) {
        // states[d] = state after the first d bytes of the current path.
        let mut states = vec![start; self.max_depth + 1];
        let nodes = &self.nodes[..];
        let mut index = 1;
        while index < nodes.len() {
            let node = nodes[index];
            let depth = node.depth();
            match step(states[depth - 1], node.byte()) {
                None => index = node.subtree_end as usize,
                Some(next) => {
                    states[depth] = next;
                    if node.token != NO_TOKEN {
                        visit(node.token, next);
                    }
                    index += 1;
                }
            }
        }
    }

    /// [`TokenTrie::walk`] that sets the bit of every token on a live path in `mask`
    /// (which must have room for every id in the trie). The hot path of the crate.
    #[inline]
    pub fn walk_into_mask<S: Copy>(
        &self,
        start: S,
        mut step: impl FnMut(S, u8) -> Option<S>,
        mask: &mut [u32],
    ) {
        let mut states = vec![start; self.max_depth + 1];
        let nodes = &self.nodes[..];
        let mut index = 1;
        while index < nodes.len() {
            let node = nodes[index];
            let depth = node.depth();
            match step(states[depth - 1], node.byte()) {
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

    #[test]
    fn walk_without_pruning_visits_every_token_once() {
        let trie = trie_of(&["a", "ab", "abc", "b", "ba", "c"]);
        let mut seen = Vec::new();
        trie.walk((), |_, _| Some(()), |id, _| seen.push(id));
        seen.sort();
        assert_eq!(seen, vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(trie.num_nodes(), 7);
        assert_eq!(trie.max_depth(), 3);
    }

    #[test]
    fn dead_prefix_skips_its_subtree() {
        let trie = trie_of(&["a", "ab", "abc", "b", "ba", "c"]);
        let mut seen = Vec::new();
        // State 0 is the root; from it the byte `a` is dead.
        trie.walk(0u32, |s, b| if s == 0 && b == b'a' { None } else { Some(1) }, |id, _| seen.push(id));
        seen.sort();
        assert_eq!(seen, vec![3, 4, 5]);
    }

    #[test]
    fn identical_tokens_are_recorded_as_duplicates() {
        let trie = trie_of(&["x", "y", "x"]);
        assert_eq!(trie.duplicates(), &[(0, 2)]);
    }
}
