//! Checks: a request's fields at submit, and the engine's KV and tree invariants.

use std::sync::Arc;

use super::constraint::Constraint;
use super::core::{invalid, Engine, EngineError};
use super::request::RequestParams;

impl Engine {
    pub(super) fn check_request(
        &self,
        rids: &[u64],
        prompt: &[u32],
        p: &RequestParams,
        constraint: Option<&Constraint>,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        if rids.is_empty() {
            return Err(invalid("rid", "no rid given: one per sample".into()));
        }
        for (i, &rid) in rids.iter().enumerate() {
            if self.requests.contains_key(&rid) || rids[..i].contains(&rid) {
                return Err(EngineError::DuplicateRid(rid));
            }
        }
        self.check_constraint(rids.len(), constraint)?;
        if prompt.is_empty() {
            return Err(invalid("input_ids", "the prompt is empty".into()));
        }
        if let Some((i, t)) = prompt.iter().enumerate().find(|(_, &t)| t as usize >= c.vocab_size) {
            return Err(invalid(
                "input_ids",
                format!("input_ids[{i}] = {t} is outside the vocabulary (size {})", c.vocab_size),
            ));
        }
        if prompt.len() >= c.max_context {
            return Err(invalid(
                "input_ids",
                format!("the prompt has {} tokens; the context length is {}", prompt.len(), c.max_context),
            ));
        }
        if p.max_new_tokens == 0 {
            return Err(invalid("max_new_tokens", "must be at least 1".into()));
        }
        if prompt.len() + p.max_new_tokens > c.max_context {
            return Err(invalid(
                "max_new_tokens",
                format!(
                    "the prompt ({} tokens) plus max_new_tokens ({}) exceeds the context length {}",
                    prompt.len(),
                    p.max_new_tokens,
                    c.max_context
                ),
            ));
        }
        if prompt.len() + 1 > c.kv_capacity {
            return Err(invalid(
                "input_ids",
                format!("the prompt has {} tokens; the KV pool holds {}", prompt.len(), c.kv_capacity),
            ));
        }
        if p.min_new_tokens > p.max_new_tokens {
            return Err(invalid(
                "min_new_tokens",
                format!("{} is above max_new_tokens ({})", p.min_new_tokens, p.max_new_tokens),
            ));
        }
        p.sampling.validate(c.vocab_size).map_err(|e| invalid(e.field, e.message))?;
        if let Some(&t) = p.stops.stop_token_ids.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(invalid(
                "stop_token_ids",
                format!("{t} is outside the vocabulary (size {})", c.vocab_size),
            ));
        }
        if p.stops.stop_strings.iter().any(String::is_empty) {
            return Err(invalid("stop", "stop strings must not be empty".into()));
        }
        if let Some(t) = &p.thinking {
            if t.end_ids.is_empty() {
                return Err(invalid(
                    "thinking_end_ids",
                    "a thinking budget needs the end marker's tokens".into(),
                ));
            }
            let outside = t.start_ids.iter().chain(&t.end_ids).find(|&&id| id as usize >= c.vocab_size);
            if let Some(id) = outside {
                return Err(invalid(
                    "thinking_token_budget",
                    format!("marker token {id} is outside the vocabulary (size {})", c.vocab_size),
                ));
            }
        }
        if let Some(t) = p.queue_timeout_s {
            if !(t.is_finite() && t > 0.0) {
                return Err(invalid(
                    "queue_timeout",
                    format!("must be a positive number of seconds, got {t}"),
                ));
            }
        }
        Ok(())
    }

    /// A constraint's token ids are in the vocabulary, a grammar was compiled from the
    /// engine's own vocabulary (so its mask rows have the engine's width), a custom one
    /// serves one sample.
    fn check_constraint(&self, samples: usize, constraint: Option<&Constraint>) -> Result<(), EngineError> {
        let vocab = self.config.vocab_size;
        match constraint {
            None => Ok(()),
            Some(Constraint::AllowedTokens(ids)) => {
                if ids.is_empty() {
                    return Err(invalid(
                        "allowed_token_ids",
                        "the list is empty, so no token could ever be sampled".into(),
                    ));
                }
                match ids.iter().find(|&&t| t as usize >= vocab) {
                    Some(t) => Err(invalid(
                        "allowed_token_ids",
                        format!("{t} is outside the vocabulary (size {vocab})"),
                    )),
                    None => Ok(()),
                }
            }
            Some(Constraint::Grammar(g)) => {
                // the engine detokenizes with the vocabulary grammars must be compiled from
                if !std::ptr::addr_eq(Arc::as_ptr(g.vocab()), Arc::as_ptr(&self.vocab)) {
                    return Err(invalid(
                        "grammar",
                        "compiled for another vocabulary; compile it with the engine's".into(),
                    ));
                }
                Ok(())
            }
            Some(Constraint::Custom(_)) if samples > 1 => Err(invalid(
                "n",
                "a custom constraint serves one sample; submit the samples one by one".into(),
            )),
            Some(Constraint::Custom(_)) => Ok(()),
        }
    }

    /// KV conservation (free + cached + held by running requests == capacity, no slot
    /// twice) and the tree's own invariants. O(capacity); for tests and idle checks.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.tree.check_invariants()?;
        let mut seen = vec![false; self.pool.capacity()];
        let mut mark = |s: u32, owner: &str| -> Result<(), String> {
            let cell = seen.get_mut(s as usize).ok_or(format!("slot {s} is outside the pool ({owner})"))?;
            if *cell {
                return Err(format!("slot {s} is held twice (second holder: {owner})"));
            }
            *cell = true;
            Ok(())
        };
        for s in self.tree.all_kv_slots() {
            mark(s, "the cache")?;
        }
        for rid in &self.running {
            let r = &self.requests[rid];
            for &s in &r.slots[r.cached_len..] {
                mark(s, &format!("request {rid}"))?;
            }
            // between steps a request holds exactly the slots of its written KV (a step's
            // reservations, drafts' included, are settled at its commit)
            if self.in_flight.is_empty() && (r.slots.len() != r.kv_len || r.kv_len > r.tokens.len()) {
                return Err(format!(
                    "request {rid} holds {} slots for {} written tokens of {}",
                    r.slots.len(),
                    r.kv_len,
                    r.tokens.len()
                ));
            }
        }
        for (s, held) in seen.iter().enumerate() {
            if *held == self.pool.is_free(s as u32) {
                return Err(format!(
                    "slot {s} is {} and {}",
                    if *held { "held" } else { "not held" },
                    if *held { "free" } else { "not free" }
                ));
            }
        }
        for rid in &self.waiting {
            let r = &self.requests[rid];
            if !r.slots.is_empty() || r.node.is_some() {
                return Err(format!("waiting request {rid} holds KV"));
            }
        }
        for (leader, followers) in &self.followers {
            if !self.requests.contains_key(leader) || followers.is_empty() {
                return Err(format!("followers of request {leader}, which is gone or has none"));
            }
            for rid in followers {
                let r = self.requests.get(rid).ok_or(format!("follower {rid} is not a request"))?;
                if !r.slots.is_empty() || r.node.is_some() {
                    return Err(format!("follower {rid} holds KV"));
                }
            }
        }
        let followers: usize = self.followers.values().map(Vec::len).sum();
        if self.waiting.len() + self.running.len() + followers != self.requests.len() {
            return Err("a request is neither waiting, running nor following".into());
        }
        Ok(())
    }
}
