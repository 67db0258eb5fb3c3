//! Per-request matching state: where the output stands in the grammar, how it got
//! there (for rollback), and the queries a decode step needs.

use std::sync::Arc;

use crate::error::{ConstraintError, Result};
use crate::grammar::{set_bit, Grammar};
use crate::recursive::{Config, Frame, Frames, ScratchFrames, NO_FRAME};
use crate::vocab::TokenKind;

/// Jump-forward never returns more than this many bytes at once.
const MAX_FORCED_BYTES: usize = 4096;

#[derive(Debug, Clone)]
pub struct Matcher {
    grammar: Arc<Grammar>,
    config: Config,
    /// Stack frames of a recursive grammar (an arena: configurations link into it;
    /// frames are only appended, so older configurations stay valid for rollback).
    frames: Vec<Frame>,
    /// The configuration before each accepted step, most recent last.
    history: Vec<Config>,
    /// An EOS token was accepted: only EOS is allowed from now on.
    ended: bool,
}

impl Matcher {
    pub fn new(grammar: Arc<Grammar>) -> Self {
        let config = grammar.start_config();
        Matcher { grammar, config, frames: Vec::new(), history: Vec::new(), ended: false }
    }

    pub fn grammar(&self) -> &Arc<Grammar> {
        &self.grammar
    }

    /// The current DFA state (of the current rule, for a recursive grammar); for
    /// diagnostics and benchmarks.
    pub fn state(&self) -> u32 {
        self.config.state
    }

    /// Depth of the rule stack (0 unless the grammar is recursive).
    pub fn stack_depth(&self) -> usize {
        let mut depth = 0;
        let mut index = self.config.stack;
        while index != NO_FRAME {
            let frame = self.frames[index as usize];
            // (not the member names noted in open objects)
            depth += usize::from(frame.rule != crate::recursive::SEEN);
            index = frame.below;
        }
        depth
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
            self.grammar.fill_mask_at(self.config, &self.frames, bitmask);
            self.grammar.add_token_edges(self.config, bitmask);
        }
        Ok(())
    }

    /// The same for a signed buffer (numpy `int32` rows, torch masks).
    pub fn fill_next_token_bitmask_i32(&self, bitmask: &mut [i32]) -> Result<()> {
        self.fill_next_token_bitmask(bytemuck::cast_slice_mut(bitmask))
    }

    /// Whether `token` may come next; no state change.
    pub fn is_token_allowed(&self, token: u32) -> bool {
        if self.grammar.vocab().is_eos(token) {
            return self.ended || self.eos_allowed();
        }
        let mut scratch = ScratchFrames::new(&self.frames);
        self.config_after_token(token, &mut scratch).is_some()
    }

    fn eos_allowed(&self) -> bool {
        !self.ended && self.grammar.can_end_at(self.config, &self.frames)
    }

    /// Advance by `token` if allowed; `false` and no change otherwise. After the end,
    /// EOS is still allowed (as the mask says) and changes nothing.
    pub fn accept_token(&mut self, token: u32) -> bool {
        if self.grammar.vocab().is_eos(token) {
            if self.ended {
                return true;
            }
            if !self.eos_allowed() {
                return false;
            }
            self.history.push(self.config);
            self.ended = true;
            return true;
        }
        let pushed_from = self.frames.len();
        let mut frames = std::mem::take(&mut self.frames);
        let next = self.config_after_token(token, &mut frames);
        self.frames = frames;
        self.commit_step(pushed_from, next)
    }

    /// Advance by raw bytes (e.g. a jump-forward string) as one step; all or nothing.
    pub fn accept_bytes(&mut self, bytes: &[u8]) -> bool {
        if self.ended {
            return false;
        }
        let pushed_from = self.frames.len();
        let next = self.grammar.advance(self.config, bytes, &mut self.frames);
        self.commit_step(pushed_from, next)
    }

    /// Takes a step to `next` (remembering the old configuration for rollback), or, if
    /// there is none, drops the frames the attempt pushed and changes nothing.
    fn commit_step(&mut self, pushed_from: usize, next: Option<Config>) -> bool {
        let Some(next) = next else {
            self.frames.truncate(pushed_from);
            return false;
        };
        self.history.push(self.config);
        self.config = next;
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
        self.config = self.history[keep];
        self.history.truncate(keep);
        Ok(())
    }

    /// Back to the start of the grammar.
    pub fn reset(&mut self) {
        self.config = self.grammar.start_config();
        self.frames.clear();
        self.history.clear();
        self.ended = false;
    }

    /// Number of steps that `rollback` can undo.
    pub fn num_steps(&self) -> usize {
        self.history.len()
    }

    /// The output so far is a complete document (EOS is allowed).
    pub fn is_accepting(&self) -> bool {
        self.ended || self.grammar.can_end_at(self.config, &self.frames)
    }

    /// Alias of [`Matcher::is_accepting`], read as "may the generation stop here".
    pub fn can_end(&self) -> bool {
        self.is_accepting()
    }

    /// Nothing but EOS can follow (or EOS was already accepted).
    pub fn must_end(&self) -> bool {
        if self.ended {
            return true;
        }
        if self.grammar.is_recursive() {
            return self.grammar.next_bytes(self.config, &self.frames).is_empty();
        }
        !self.grammar.dfa().can_continue(self.config.state)
    }

    /// EOS has been accepted.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// The bytes that must come next whatever the model does (jump-forward): follow the
    /// automaton while exactly one byte keeps it alive and it may not end. May stop in
    /// the middle of a UTF-8 character; the caller tokenizes what it takes.
    pub fn forced_bytes(&self) -> Vec<u8> {
        let mut forced = Vec::new();
        if self.ended {
            return forced;
        }
        if self.grammar.is_recursive() {
            let mut frames = self.frames.clone();
            let mut config = self.config;
            while forced.len() < MAX_FORCED_BYTES && !self.grammar.can_end_at(config, &frames) {
                let [byte] = self.grammar.next_bytes(config, &frames)[..] else {
                    break;
                };
                forced.push(byte);
                match self.grammar.advance(config, &[byte], &mut frames) {
                    Some(next) => config = next,
                    None => break,
                }
            }
            return forced;
        }
        let dfa = self.grammar.dfa();
        let mut state = self.config.state;
        while forced.len() < MAX_FORCED_BYTES && !dfa.is_accepting(state) {
            let Some(byte) = dfa.single_byte(state) else {
                break;
            };
            forced.push(byte);
            state = dfa.next(state, byte);
        }
        forced
    }

    /// The configuration after a text token (EOS is handled by the callers).
    fn config_after_token(&self, token: u32, frames: &mut impl Frames) -> Option<Config> {
        if self.ended {
            return None;
        }
        let vocab = self.grammar.vocab();
        match vocab.kind(token)? {
            TokenKind::Special => self.grammar.token_edge(self.config, token),
            TokenKind::Eos | TokenKind::Absent => None,
            TokenKind::Normal => {
                let bytes = vocab.token_bytes(token)?;
                if bytes.is_empty() {
                    return None;
                }
                self.grammar.advance(self.config, bytes, frames)
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
