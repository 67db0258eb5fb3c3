//! The hook through which a structured-output grammar steers a request: the engine asks
//! for a mask before sampling and reports the sampled token after.

use std::sync::Arc;

/// What constrains a request's tokens, as submitted. The engine checks it against its own
/// vocabulary and makes one live constraint per sample.
pub enum Constraint {
    /// Only these tokens, at every step.
    AllowedTokens(Vec<u32>),
    /// A structured-output grammar, compiled from the engine's own vocabulary.
    Grammar(Arc<ferrolm_constraint::Grammar>),
    /// Any other constraint; it serves one sample (it cannot be copied for more).
    Custom(Box<dyn TokenConstraint>),
}

impl Constraint {
    /// A fresh live constraint for one sample (not for `Custom`, which is taken as is).
    pub(crate) fn instance(&self, vocab_size: usize) -> Box<dyn TokenConstraint> {
        match self {
            Constraint::AllowedTokens(ids) => Box::new(AllowList::new(vocab_size, ids)),
            Constraint::Grammar(g) => Box::new(ferrolm_constraint::Matcher::new(g.clone())),
            Constraint::Custom(_) => unreachable!("a custom constraint is used as given"),
        }
    }
}

pub trait TokenConstraint: Send + Sync {
    /// Fills the packed mask (bit t of word t / 32 set = token t allowed) for the next
    /// token. EOS bits are set only where the document may end.
    fn fill_mask(&mut self, mask: &mut [u32]);
    /// Advances by one sampled token; false if the grammar does not allow it.
    fn accept_token(&mut self, token: u32) -> bool;
    /// True when the document is complete and nothing but EOS may follow.
    fn must_end(&self) -> bool;
}

/// A constraint that allows a fixed set of tokens at every step (for tests and simple
/// vocab restrictions).
pub struct AllowList {
    mask: Vec<u32>,
}

impl AllowList {
    pub fn new(vocab_size: usize, allowed: &[u32]) -> Self {
        let mut mask = vec![0u32; vocab_size.div_ceil(32)];
        for &t in allowed {
            if (t as usize) < vocab_size {
                mask[t as usize / 32] |= 1 << (t % 32);
            }
        }
        AllowList { mask }
    }
}

impl TokenConstraint for AllowList {
    fn fill_mask(&mut self, mask: &mut [u32]) {
        mask.copy_from_slice(&self.mask[..mask.len()]);
    }
    fn accept_token(&mut self, token: u32) -> bool {
        crate::sampling::mask_allows(&self.mask, token as usize)
    }
    fn must_end(&self) -> bool {
        false
    }
}

/// A structured-output grammar's matcher steers a request directly. The engine checks at
/// submit that the grammar's vocabulary has its own size, so the mask rows agree.
impl TokenConstraint for ferrolm_constraint::Matcher {
    fn fill_mask(&mut self, mask: &mut [u32]) {
        // The only failure is a row of the wrong length, which submit rules out.
        self.fill_next_token_bitmask(mask).expect("mask row sized to the grammar's vocabulary");
    }
    fn accept_token(&mut self, token: u32) -> bool {
        ferrolm_constraint::Matcher::accept_token(self, token)
    }
    fn must_end(&self) -> bool {
        ferrolm_constraint::Matcher::must_end(self)
    }
}
