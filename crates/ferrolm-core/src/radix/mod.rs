//! The radix prefix cache: token sequences in a compressed trie whose edges carry the
//! KV slot of every token, so a new request finds the longest cached prefix of its prompt
//! in one walk.
//!
//! Nodes live in an arena ([`arena`]); the evictable leaves sit in an ordered set keyed by
//! the eviction policy ([`policy`]; `tlru` reads the time from [`clock`]); inserts and evictions can queue KV events for
//! cache-aware routers ([`events`]).

mod arena;
mod children;
pub mod clock;
pub mod events;
pub mod policy;
mod tree;

pub use arena::NodeHandle;
pub use clock::{ManualClock, MonotonicClock, TimeSource};
pub use events::KvEvent;
pub use policy::EvictionPolicy;
pub use tree::{MatchResult, MatchedPath, RadixTree, TreeConfig, TreeError, TreeSizes};
