//! KV events: what a cache-aware router (NVIDIA Dynamo's KV indexer, llm-d's prefix
//! scorer) needs to know about this replica's cache, in the shape of vLLM's events.
//!
//! Events cover full blocks of `block_size` tokens aligned to position 0, never a partial
//! block. A block's hash chains: it covers its parent block's hash and its own tokens, and
//! the first block's parent is a seed made from the namespace. The hash is xxh3-64 with no
//! per-process seed, so every process and replica computes the same value:
//!
//! ```text
//! seed(namespace) = xxh3_64(b"ferrolm:kv:v1" ++ [0])                 no namespace
//!                 = xxh3_64(b"ferrolm:kv:v1" ++ [1] ++ utf8(namespace))
//! hash(block)     = xxh3_64(le_u64(parent_hash or seed) ++ le_u32(token) for each token)
//! ```

use xxhash_rust::xxh3::xxh3_64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Blocks that became fully cached, in path order: `block_hashes[i]` covers
    /// `token_ids[i * block_size..(i + 1) * block_size]` and chains from the one before it;
    /// the first chains from `parent_block_hash` (`None` at the start of a sequence).
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: u32,
        namespace: Option<String>,
    },
    /// Blocks no longer fully cached.
    BlockRemoved { block_hashes: Vec<u64> },
    /// The whole cache was dropped (reset).
    AllBlocksCleared,
}

const DOMAIN: &[u8] = b"ferrolm:kv:v1";

/// The chain's starting point for a namespace.
pub fn namespace_seed(namespace: Option<&str>) -> u64 {
    let mut bytes = DOMAIN.to_vec();
    match namespace {
        None => bytes.push(0),
        Some(ns) => {
            bytes.push(1);
            bytes.extend_from_slice(ns.as_bytes());
        }
    }
    xxh3_64(&bytes)
}

/// The hash of one block given its parent's hash (or the namespace seed).
pub fn block_hash(parent: u64, tokens: &[u32], scratch: &mut Vec<u8>) -> u64 {
    scratch.clear();
    scratch.extend_from_slice(&parent.to_le_bytes());
    for &t in tokens {
        scratch.extend_from_slice(&t.to_le_bytes());
    }
    xxh3_64(scratch)
}

/// Hashes of consecutive blocks of `tokens`, chained from `parent`.
pub fn chain_hashes(parent: u64, tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut scratch = Vec::with_capacity(8 + 4 * block_size);
    let mut prev = parent;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            prev = block_hash(prev, block, &mut scratch);
            prev
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_chain_and_depend_on_namespace() {
        let a = chain_hashes(namespace_seed(None), &[1, 2, 3, 4], 2);
        let b = chain_hashes(namespace_seed(Some("lora-1")), &[1, 2, 3, 4], 2);
        assert_eq!(a.len(), 2);
        assert_ne!(a, b);
        // the second block's hash depends on the first block's tokens
        let c = chain_hashes(namespace_seed(None), &[9, 2, 3, 4], 2);
        assert_ne!(a[1], c[1]);
        // and is reproducible from its parent alone
        assert_eq!(chain_hashes(a[0], &[3, 4], 2), vec![a[1]]);
        assert_ne!(namespace_seed(None), namespace_seed(Some("")));
    }

    #[test]
    fn hash_is_stable_across_builds() {
        // Pinned so that a change of hash function (which would break routers that
        // compare hashes across replicas and versions) fails loudly. The Python twin
        // pins the same values.
        assert_eq!(namespace_seed(None), xxh3_64(b"ferrolm:kv:v1\0"));
        let mut scratch = Vec::new();
        let mut expected = 7u64.to_le_bytes().to_vec();
        expected.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(block_hash(7, &[1, 2], &mut scratch), xxh3_64(&expected));
    }
}
