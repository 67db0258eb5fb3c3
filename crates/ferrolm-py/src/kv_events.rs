//! KV events cross as plain tuples (`ferrolm.kv_events.event_from_raw` makes them
//! objects), for the tree's and the engine's queues alike.

use ferrolm_core::radix::KvEvent;
use pyo3::prelude::*;
use pyo3::types::PyList;

pub fn raw_events(py: Python<'_>, events: Vec<KvEvent>) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    for event in events {
        let item = match event {
            KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size, namespace } => {
                ("stored", block_hashes, parent_block_hash, token_ids, block_size, namespace)
                    .into_pyobject(py)?
                    .into_any()
            }
            KvEvent::BlockRemoved { block_hashes } => ("removed", block_hashes).into_pyobject(py)?.into_any(),
            KvEvent::AllBlocksCleared => ("cleared",).into_pyobject(py)?.into_any(),
        };
        list.append(item)?;
    }
    Ok(list)
}
