//! Incremental detokenization with stop conditions: one [`Detokenizer`] per request turns
//! each new token into a text delta that never splits a UTF-8 character and never leaks
//! any part of a stop string, in work bounded by the token's length and the longest stop
//! string (not by how much text came before).
//!
//! Per token: stop token ids are checked first; otherwise the token's bytes join the
//! undecoded tail, the longest complete UTF-8 prefix becomes text, and that text joins
//! the held-back text. A stop string found there ends the request (the text before it is
//! the last delta; with `include_stop_str` the stop string too). Otherwise everything is
//! released except the longest suffix that could still grow into a stop string.

#[cfg(test)]
mod tests;

/// Where the detokenizer reads a token's bytes.
pub trait TokenBytes {
    /// The token's bytes; `None` for an id outside the vocabulary.
    fn token_bytes(&self, id: u32) -> Option<&[u8]>;
    /// Special tokens (EOS, chat markers) are left out of the text when asked.
    fn is_special(&self, id: u32) -> bool;
}

/// The constraint engine's vocabulary is the one table of token bytes: the engine
/// detokenizes with the same object its grammars are compiled for.
impl TokenBytes for ferrolm_constraint::Vocabulary {
    fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        ferrolm_constraint::Vocabulary::token_bytes(self, id)
    }
    fn is_special(&self, id: u32) -> bool {
        use ferrolm_constraint::TokenKind;
        matches!(self.kind(id), Some(TokenKind::Special | TokenKind::Eos))
    }
}

/// A plain token table for tests.
#[cfg(test)]
pub struct TokenTable {
    pub tokens: Vec<Vec<u8>>,
    pub special: Vec<u32>,
}

#[cfg(test)]
impl TokenBytes for TokenTable {
    fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.tokens.get(id as usize).map(Vec::as_slice)
    }
    fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopConditions {
    pub stop_strings: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    /// Keep the matched stop string at the end of the text (off by default, as in OpenAI).
    pub include_stop_str: bool,
    pub skip_special_tokens: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// One of `stop_token_ids` (or an EOS id the engine passed in).
    Token(u32),
    /// The stop string that matched.
    String(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Text to send now (possibly empty while a partial stop match is held back).
    pub delta: String,
    /// Set when this token ended the request.
    pub stop: Option<StopReason>,
}

#[derive(Clone, Debug)]
pub struct Detokenizer {
    stops: StopConditions,
    longest_stop: usize,
    /// Bytes of an incomplete UTF-8 character at the end of the output so far.
    undecoded: Vec<u8>,
    /// Decoded text not yet released: the suffix that may still become a stop string.
    held: String,
    stopped: bool,
}

/// The token id was outside the vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownToken(pub u32);

impl Detokenizer {
    pub fn new(stops: StopConditions) -> Self {
        let longest_stop = stops.stop_strings.iter().map(String::len).max().unwrap_or(0);
        Detokenizer { stops, longest_stop, undecoded: Vec::new(), held: String::new(), stopped: false }
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Feeds one generated token. `check_stops` is false while `min_new_tokens` is not
    /// reached; `is_eos` marks a token that ends generation as EOS does.
    pub fn step<V: TokenBytes + ?Sized>(
        &mut self,
        vocab: &V,
        token: u32,
        check_stops: bool,
        is_eos: bool,
    ) -> Result<Step, UnknownToken> {
        let bytes = vocab.token_bytes(token).ok_or(UnknownToken(token))?;
        if check_stops && (is_eos || self.stops.stop_token_ids.contains(&token)) {
            self.stopped = true;
            return Ok(Step { delta: self.flush(), stop: Some(StopReason::Token(token)) });
        }
        if !(self.stops.skip_special_tokens && vocab.is_special(token)) {
            self.undecoded.extend_from_slice(bytes);
        }
        let before = self.held.len();
        self.decode_complete_chars();
        if check_stops && self.longest_stop > 0 {
            // A match must end in the new text: earlier text held no complete match.
            let from = floor_char_boundary(&self.held, before.saturating_sub(self.longest_stop - 1));
            if let Some((start, stop)) = self.find_stop(from) {
                let end = if self.stops.include_stop_str { start + stop.len() } else { start };
                let delta = self.held[..end].to_string();
                self.held.clear();
                self.undecoded.clear();
                self.stopped = true;
                return Ok(Step { delta, stop: Some(StopReason::String(stop)) });
            }
        }
        let keep = if check_stops { self.partial_stop_suffix() } else { 0 };
        let delta = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        Ok(Step { delta, stop: None })
    }

    /// Everything still held (on a finish for length, abort or EOS): the held-back text
    /// and any incomplete character, the latter as U+FFFD.
    pub fn flush(&mut self) -> String {
        let mut out = std::mem::take(&mut self.held);
        out.push_str(&String::from_utf8_lossy(&self.undecoded));
        self.undecoded.clear();
        out
    }

    fn decode_complete_chars(&mut self) {
        loop {
            match std::str::from_utf8(&self.undecoded) {
                Ok(s) => {
                    self.held.push_str(s);
                    self.undecoded.clear();
                    return;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    self.held.push_str(std::str::from_utf8(&self.undecoded[..valid]).expect("checked valid"));
                    match e.error_len() {
                        // an incomplete character at the end: wait for the next token
                        None => {
                            self.undecoded.drain(..valid);
                            return;
                        }
                        // bytes that can never become a character: show them as U+FFFD
                        Some(bad) => {
                            self.held.push(char::REPLACEMENT_CHARACTER);
                            self.undecoded.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// The earliest-ending stop string match that ends at or after `from`.
    fn find_stop(&self, from: usize) -> Option<(usize, String)> {
        let hay = &self.held[from..];
        self.stops
            .stop_strings
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| hay.find(s.as_str()).map(|i| (from + i, s)))
            .min_by_key(|(start, s)| (start + s.len(), *start))
            .map(|(start, s)| (start, s.clone()))
    }

    /// Bytes at the end of `held` that are a proper prefix of some stop string.
    fn partial_stop_suffix(&self) -> usize {
        let held = self.held.as_bytes();
        let mut best = 0;
        for stop in &self.stops.stop_strings {
            let stop = stop.as_bytes();
            for len in (best + 1..stop.len().min(held.len() + 1)).rev() {
                if held.ends_with(&stop[..len]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}
