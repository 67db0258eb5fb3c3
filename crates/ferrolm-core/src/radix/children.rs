//! A node's children by the first token of their keys: most nodes have one or two, held
//! inline in the node (a match reads them from the node's own cache line, no hash and no
//! second allocation to visit); a node with more spills them all into a hash map.

use hashbrown::HashMap;
use rustc_hash::FxBuildHasher;

/// Children held in the node itself (with the key, one cache line: see `Node`); a fourth
/// moves them all to a map.
const INLINE: usize = 3;

type Spill = HashMap<u32, u32, FxBuildHasher>;

/// First token -> the head of the children that start with it (`Node::alias_next` chains
/// the others, with pages of more than one token).
#[derive(Debug, Default)]
pub(crate) struct ChildMap {
    /// Entries in `firsts`/`heads` while `spill` is `None`.
    len: u32,
    firsts: [u32; INLINE],
    heads: [u32; INLINE],
    spill: Option<Box<Spill>>,
}

impl ChildMap {
    #[inline]
    pub fn get(&self, first: u32) -> Option<u32> {
        match &self.spill {
            None => {
                let n = self.len as usize;
                // a compare of every slot (unused ones masked off): no data-dependent branch
                let mut found = None;
                for i in 0..INLINE {
                    if i < n && self.firsts[i] == first {
                        found = Some(self.heads[i]);
                    }
                }
                found
            }
            Some(map) => map.get(&first).copied(),
        }
    }

    pub fn get_mut(&mut self, first: u32) -> Option<&mut u32> {
        match &mut self.spill {
            None => {
                let n = self.len as usize;
                let i = self.firsts[..n].iter().position(|&f| f == first)?;
                Some(&mut self.heads[i])
            }
            Some(map) => map.get_mut(&first),
        }
    }

    /// Sets `first`'s head; returns the head it replaces, if any.
    pub fn insert(&mut self, first: u32, head: u32) -> Option<u32> {
        if let Some(slot) = self.get_mut(first) {
            return Some(std::mem::replace(slot, head));
        }
        match &mut self.spill {
            Some(map) => {
                map.insert(first, head);
            }
            None if (self.len as usize) < INLINE => {
                let n = self.len as usize;
                self.firsts[n] = first;
                self.heads[n] = head;
                self.len += 1;
            }
            None => {
                let mut map = Spill::with_capacity_and_hasher(INLINE * 2, FxBuildHasher);
                map.extend(self.firsts.iter().copied().zip(self.heads.iter().copied()));
                map.insert(first, head);
                self.spill = Some(Box::new(map));
                self.len = 0;
            }
        }
        None
    }

    pub fn remove(&mut self, first: u32) -> Option<u32> {
        match &mut self.spill {
            None => {
                let n = self.len as usize;
                let i = self.firsts[..n].iter().position(|&f| f == first)?;
                let head = self.heads[i];
                // the last entry fills the hole
                self.firsts[i] = self.firsts[n - 1];
                self.heads[i] = self.heads[n - 1];
                self.len -= 1;
                Some(head)
            }
            Some(map) => map.remove(&first),
        }
    }

    pub fn is_empty(&self) -> bool {
        match &self.spill {
            None => self.len == 0,
            Some(map) => map.is_empty(),
        }
    }

    /// `(first, head)` pairs, in no particular order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (u32, u32)> + '_> {
        match &self.spill {
            None => {
                let n = self.len as usize;
                Box::new(self.firsts[..n].iter().copied().zip(self.heads[..n].iter().copied()))
            }
            Some(map) => Box::new(map.iter().map(|(&f, &h)| (f, h))),
        }
    }

    pub fn values(&self) -> impl Iterator<Item = u32> + '_ {
        self.iter().map(|(_, h)| h)
    }

    /// Heap bytes beyond the node (the spilled map and its box).
    pub fn allocation_size(&self) -> usize {
        self.spill.as_ref().map_or(0, |m| m.allocation_size() + std::mem::size_of::<Spill>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_then_spilled_then_emptied() {
        let mut m = ChildMap::default();
        assert!(m.is_empty());
        for i in 0..10u32 {
            assert_eq!(m.insert(i * 7, i), None);
            assert_eq!(m.insert(i * 7, i + 100), Some(i), "a second insert replaces");
            for j in 0..=i {
                assert_eq!(m.get(j * 7), Some(j + 100));
            }
            assert_eq!(m.get(i * 7 + 1), None);
            assert_eq!(m.spill.is_some(), i as usize >= INLINE);
        }
        let mut all: Vec<_> = m.iter().collect();
        all.sort();
        assert_eq!(all, (0..10u32).map(|i| (i * 7, i + 100)).collect::<Vec<_>>());
        *m.get_mut(21).unwrap() = 5;
        assert_eq!(m.get(21), Some(5));
        for i in 0..10u32 {
            assert!(m.remove(i * 7).is_some());
            assert_eq!(m.remove(i * 7), None);
            assert_eq!(m.get(i * 7), None);
        }
        assert!(m.is_empty());
    }

    #[test]
    fn inline_removal_keeps_the_others() {
        let mut m = ChildMap::default();
        for i in 0..INLINE as u32 {
            m.insert(i, i + 10);
        }
        assert_eq!(m.remove(1), Some(11));
        assert_eq!(m.get(1), None);
        for i in (0..INLINE as u32).filter(|&i| i != 1) {
            assert_eq!(m.get(i), Some(i + 10));
        }
        assert_eq!(m.allocation_size(), 0);
    }
}
