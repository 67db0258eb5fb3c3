//! ferrolm's Rust core: the parts of an LLM serving runtime that run per token or per
//! request on the CPU, with no Python in them (the PyO3 crate `ferrolm-py` is a thin
//! layer on top).
//!
//! So far it holds the radix prefix cache ([`radix::RadixTree`]): the structure that lets
//! requests with a shared prefix reuse the KV of that prefix instead of recomputing it.
//!
//! A request's life in the tree, as the engine drives it:
//!
//! ```
//! use ferrolm_core::radix::{RadixTree, TreeConfig};
//!
//! let mut tree = RadixTree::new(TreeConfig::default()).unwrap();
//! let prompt = [1, 2, 3, 4];
//! // 1. find what is cached, and protect it from eviction while the request runs
//! let hit = tree.match_prefix(&prompt, None);
//! assert_eq!(hit.length, 0);
//! tree.lock(hit.node).unwrap();
//! // 2. the model computes KV for the rest into slots the engine allocated ...
//! let slots = [10, 11, 12, 13];
//! // 3. on finish, hand the sequence to the cache and drop the protection
//! let already_cached = tree.insert(&prompt, &slots, None, 0).unwrap();
//! assert_eq!(already_cached, 0);
//! tree.unlock(hit.node).unwrap();
//! // 4. under memory pressure, the engine takes slots back from unlocked leaves
//! let freed = tree.evict(4);
//! assert_eq!(freed.len(), 4);
//! ```

pub mod attention;
pub mod cpu_model;
pub mod detok;
pub mod engine;
pub mod logging;
pub mod lora;
pub mod norm;
pub mod quant;
pub mod radix;
pub mod sampling;
#[cfg(test)]
mod test_values;
pub mod trace;
