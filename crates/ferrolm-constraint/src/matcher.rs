//! Per-request matching state: where the output stands in the grammar, how it got
//! there (for rollback), and the queries a decode step needs.

use std::sync::Arc;

use crate::dfa::DEAD;
use crate::error::{ConstraintError, Result};
use crate::grammar::{set_bit, Grammar};
use crate::vocab::TokenKind;

/// Jump-forward never returns more than this many bytes at once.
const MAX_FORCED_BYTES: usize = 4096;

#[derive(Debug, Clone)]
pub struct Matcher {
    grammar: Arc<Grammar>,
    state: u32,
    /// The state before each accepted step, most recent last.
    history: Vec<u32>,
    /// An EOS token was accepted: only EOS is allowed from now on.
    ended: bool,
}

impl Matcher {
    pub fn new(grammar: Arc<Grammar>) -> Self {
        let state = grammar.dfa().start();
        Matcher { grammar, state, history: Vec::new(), ended: false }
    }

    pub fn grammar(&self) -> &Arc<Grammar> {
        &self.grammar
    }

    /// The current DFA state (for diagnostics and benchmarks).
    pub fn state(&self) -> u32 {
        self.state
    }

    /// Fill `bitmask` (`(vocab_size + 31) / 32` words; bit `i` of word `i / 32` set =
    /// token `i` allowed). EOS is allowed only where the document may end.
    pub fn fill_next_token_bitmask(&self, bitmask: &mut [u32]) -> Result<()> {
        let expected = self.grammar.vocab().bitmask_words();
        if bitmask.len() != expected {
            return Err(ConstraintError::BitmaskSize { expected, got: bitmask.len() });
        }
        if self.ended {
            bitmask.fill(0);
            for &eos in self.grammar.vocab().eos_ids() {
                set_bit(bitmask, eos);
            }
        } else {
            self.grammar.fill_mask(self.state, bitmask);
        }
        Ok(())
    }

    /// The same for a signed buffer (numpy `int32` rows, torch masks).
    pub fn fill_next_token_bitmask_i32(&self, bitmask: &mut [i32]) -> Result<()> {
        self.fill_next_token_bitmask(bytemuck::cast_slice_mut(bitmask))
    }

    /// Whether `token` may come next; no state change.
    pub fn is_token_allowed(&self, token: u32) -> bool {
        self.state_after_token(token).is_some()
    }

    /// Advance by `token` if allowed; `false` and no change otherwise.
    pub fn accept_token(&mut self, token: u32) -> bool {
        let Some(next) = self.state_after_token(token) else {
            return false;
        };
        self.history.push(self.state);
        if self.grammar.vocab().is_eos(token) {
            self.ended = true;
        }
        self.state = next;
        true
    }

    /// Advance by raw bytes (e.g. a jump-forward string) as one step; all or nothing.
    pub fn accept_bytes(&mut self, bytes: &[u8]) -> bool {
        if self.ended {
            return false;
        }
        let next = self.grammar.dfa().run(self.state, bytes);
        if next == DEAD {
            return false;
        }
        self.history.push(self.state);
        self.state = next;
        true
    }

    pub fn accept_str(&mut self, text: &str) -> bool {
        self.accept_bytes(text.as_bytes())
    }

    /// Undo the last `steps` successful `accept_*` calls.
    pub fn rollback(&mut self, steps: usize) -> Result<()> {
        if steps > self.history.len() {
            return Err(ConstraintError::RollbackTooFar { requested: steps, available: self.history.len() });
        }
        if steps == 0 {
            return Ok(());
        }
        // EOS is always the last step, so undoing anything undoes the end.
        self.ended = false;
        let keep = self.history.len() - steps;
        self.state = self.history[keep];
        self.history.truncate(keep);
        Ok(())
    }

    /// Back to the start of the grammar.
    pub fn reset(&mut self) {
        self.state = self.grammar.dfa().start();
        self.history.clear();
        self.ended = false;
    }

    /// Number of steps that `rollback` can undo.
    pub fn num_steps(&self) -> usize {
        self.history.len()
    }

    /// The output so far is a complete document (EOS is allowed).
    pub fn is_accepting(&self) -> bool {
        self.ended || self.grammar.dfa().is_accepting(self.state)
    }

    /// Alias of [`Matcher::is_accepting`], read as "may the generation stop here".
    pub fn can_end(&self) -> bool {
        self.is_accepting()
    }

    /// Nothing but EOS can follow (or EOS was already accepted).
    pub fn must_end(&self) -> bool {
        self.ended || !self.grammar.dfa().can_continue(self.state)
    }

    /// EOS has been accepted.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// The bytes that must come next whatever the model does (jump-forward): follow the
    /// automaton while exactly one byte keeps it alive and it may not end. May stop in
    /// the middle of a UTF-8 character; the caller tokenizes what it takes.
    pub fn forced_bytes(&self) -> Vec<u8> {
        let dfa = self.grammar.dfa();
        let mut forced = Vec::new();
        if self.ended {
            return forced;
        }
        let mut state = self.state;
        while forced.len() < MAX_FORCED_BYTES && !dfa.is_accepting(state) {
            let Some(byte) = dfa.single_byte(state) else {
                break;
            };
            forced.push(byte);
            state = dfa.next(state, byte);
        }
        forced
    }

    fn state_after_token(&self, token: u32) -> Option<u32> {
        if self.ended {
            return None;
        }
        let vocab = self.grammar.vocab();
        match vocab.kind(token)? {
            TokenKind::Eos => self.grammar.dfa().is_accepting(self.state).then_some(self.state),
            TokenKind::Special | TokenKind::Absent => None,
            TokenKind::Normal => {
                let bytes = vocab.token_bytes(token)?;
                if bytes.is_empty() {
                    return None;
                }
                let next = self.grammar.dfa().run(self.state, bytes);
                (next != DEAD).then_some(next)
            }
        }
    }
}

/// Fill one row per matcher of a row-major 2-D bitmask (`matchers.len()` rows of
/// `(vocab_size + 31) / 32` words). Every matcher must share one vocabulary size.
pub fn fill_next_token_bitmask_batch(matchers: &[&Matcher], bitmask: &mut [u32]) -> Result<()> {
    let Some(first) = matchers.first() else {
        return Ok(());
    };
    let words = first.grammar().vocab().bitmask_words();
    if bitmask.len() != words * matchers.len() {
        return Err(ConstraintError::BitmaskSize { expected: words * matchers.len(), got: bitmask.len() });
    }
    for (matcher, row) in matchers.iter().zip(bitmask.chunks_exact_mut(words)) {
        matcher.fill_next_token_bitmask(row)?;
    }
    Ok(())
}

/// [`fill_next_token_bitmask_batch`] for a signed buffer.
pub fn fill_next_token_bitmask_batch_i32(matchers: &[&Matcher], bitmask: &mut [i32]) -> Result<()> {
    fill_next_token_bitmask_batch(matchers, bytemuck::cast_slice_mut(bitmask))
}
