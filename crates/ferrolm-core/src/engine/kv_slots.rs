//! The KV slot pool's free list. The pool's tensors live with the model runner; the core
//! only hands out indices. A bitmap of free slots catches a double free at once instead of
//! letting two requests write the same slot later.

#[derive(Clone, Debug)]
pub struct SlotPool {
    free: Vec<u32>,
    is_free: Vec<u64>,
    capacity: usize,
}

/// A slot was freed twice or is outside the pool (a bug in the caller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadFree(pub u32);

impl SlotPool {
    pub fn new(capacity: usize) -> Self {
        assert!(capacity <= u32::MAX as usize, "KV capacity must fit in u32");
        // hand out low slots first: the most recently freed slot is reused first
        let free: Vec<u32> = (0..capacity as u32).rev().collect();
        let mut is_free = vec![u64::MAX; capacity.div_ceil(64)];
        if capacity % 64 != 0 {
            *is_free.last_mut().unwrap() = (1u64 << (capacity % 64)) - 1;
        }
        SlotPool { free, is_free, capacity }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// `n` slots, or `None` (taking nothing) when fewer are free.
    pub fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        let slots = self.free.split_off(self.free.len() - n);
        for &s in &slots {
            self.is_free[s as usize / 64] &= !(1 << (s % 64));
        }
        Some(slots)
    }

    /// Appends `n` slots to `out`; false (taking nothing) when fewer are free.
    pub fn alloc_into(&mut self, n: usize, out: &mut Vec<u32>) -> bool {
        match self.alloc(n) {
            Some(s) => {
                out.extend_from_slice(&s);
                true
            }
            None => false,
        }
    }

    pub fn free(&mut self, slots: &[u32]) -> Result<(), BadFree> {
        for (i, &s) in slots.iter().enumerate() {
            let (word, bit) = (s as usize / 64, s % 64);
            if s as usize >= self.capacity || self.is_free[word] >> bit & 1 == 1 {
                // undo this call's frees so the pool stays as it was
                for &t in &slots[..i] {
                    self.is_free[t as usize / 64] &= !(1 << (t % 64));
                }
                self.free.truncate(self.free.len() - i);
                return Err(BadFree(s));
            }
            self.is_free[word] |= 1 << bit;
            self.free.push(s);
        }
        Ok(())
    }

    pub fn is_free(&self, slot: u32) -> bool {
        (slot as usize) < self.capacity && self.is_free[slot as usize / 64] >> (slot % 64) & 1 == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_round_trip_and_double_free() {
        let mut p = SlotPool::new(70);
        let a = p.alloc(65).unwrap();
        assert_eq!(p.num_free(), 5);
        assert!(p.alloc(6).is_none());
        assert_eq!(p.num_free(), 5);
        p.free(&a[..10]).unwrap();
        assert_eq!(p.free(&[a[10], a[0]]), Err(BadFree(a[0])));
        assert_eq!(p.num_free(), 15, "a failed free changes nothing");
        assert!(!p.is_free(a[10]));
        assert_eq!(p.free(&[70]), Err(BadFree(70)));
        p.free(&a[10..]).unwrap();
        assert_eq!(p.num_free(), 70);
        let mut all = p.alloc(70).unwrap();
        all.sort();
        assert_eq!(all, (0..70).collect::<Vec<_>>());
    }
}
