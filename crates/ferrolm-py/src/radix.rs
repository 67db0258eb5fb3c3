//! `RadixTree` and `MatchResult`: the radix prefix cache. Behaviour and errors are
//! documented in `python/ferrolm/_core.pyi`.

use ferrolm_core::radix::{EvictionPolicy, NodeHandle, RadixTree, TreeConfig};
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::convert::{count_or_all, ids, type_name, BlockSize, Namespace, PageSize, PolicyName, Priority};
use crate::errors;
use crate::guard::Poison;

/// KV slot indices cross as int32 (what torch and numpy index with cheaply).
const MAX_SLOT: u32 = i32::MAX as u32;

#[pyclass(module = "ferrolm._core", name = "RadixTree", subclass)]
pub struct PyRadixTree {
    tree: RadixTree,
    poison: Poison,
}

#[pyclass(module = "ferrolm._core", frozen, get_all)]
pub struct MatchResult {
    length: usize,
    kv_slots: Py<PyArray1<i32>>,
    node: u64,
}

#[pymethods]
impl MatchResult {
    fn __iter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let me = slf.get();
        let py = slf.py();
        let items = PyTuple::new(
            py,
            [
                me.length.into_pyobject(py)?.into_any(),
                me.kv_slots.bind(py).clone().into_any(),
                me.node.into_pyobject(py)?.into_any(),
            ],
        )?;
        Ok(items.try_iter()?.into_any())
    }

    fn __repr__(&self) -> String {
        format!(
            "MatchResult(length={}, kv_slots=<{} slots>, node={:#x})",
            self.length, self.length, self.node
        )
    }
}

fn slots_array(py: Python<'_>, slots: Vec<u32>) -> Bound<'_, PyArray1<i32>> {
    // Slots are always <= MAX_SLOT (checked on insert), so the cast is exact; the
    // collect reuses the allocation.
    slots.into_iter().map(|s| s as i32).collect::<Vec<i32>>().into_pyarray(py)
}

fn handle(obj: &Bound<'_, PyAny>) -> PyResult<NodeHandle> {
    obj.extract::<u64>().map(NodeHandle).map_err(|_| {
        errors::invalid_field(
            obj.py(),
            "node",
            format!("node must be a handle from match_prefix (a non-negative int), got {}", type_name(obj)),
        )
    })
}

#[pymethods]
impl PyRadixTree {
    #[new]
    #[pyo3(
        signature = (page_size = PageSize(1), eviction_policy = PolicyName("lru".into()), enable_kv_events = false, kv_event_block_size = None),
        text_signature = "(page_size=1, eviction_policy='lru', enable_kv_events=False, kv_event_block_size=None)"
    )]
    fn new(
        py: Python<'_>,
        page_size: PageSize,
        eviction_policy: PolicyName,
        enable_kv_events: bool,
        kv_event_block_size: Option<BlockSize>,
    ) -> PyResult<Self> {
        let policy: EvictionPolicy =
            eviction_policy.0.parse().map_err(|e: ferrolm_core::radix::policy::UnknownPolicy| {
                errors::invalid_field(py, "eviction_policy", format!("eviction_policy: {e}"))
            })?;
        let config = TreeConfig {
            page_size: page_size.0,
            policy,
            kv_events: enable_kv_events,
            event_block_size: kv_event_block_size.map_or(0, |b| b.0),
        };
        let tree = RadixTree::new(config).map_err(|e| errors::tree(py, e))?;
        Ok(PyRadixTree { tree, poison: Poison::default() })
    }

    #[pyo3(signature = (tokens, namespace = None))]
    fn match_prefix(
        &mut self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        namespace: Option<Namespace>,
    ) -> PyResult<MatchResult> {
        let tokens = ids(tokens, "tokens", u32::MAX)?;
        let tokens = tokens.as_slice();
        let namespace = namespace.as_ref().map(|n| n.0.as_str());
        let m = self.poison.run(py, &mut self.tree, |t| t.match_prefix(tokens, namespace))?;
        Ok(MatchResult { length: m.length, kv_slots: slots_array(py, m.kv_slots).unbind(), node: m.node.0 })
    }

    #[pyo3(
        signature = (tokens, kv_slots, namespace = None, priority = Priority(0)),
        text_signature = "($self, tokens, kv_slots, namespace=None, priority=0)"
    )]
    fn insert(
        &mut self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        kv_slots: &Bound<'_, PyAny>,
        namespace: Option<Namespace>,
        priority: Priority,
    ) -> PyResult<usize> {
        let (namespace, priority) = (namespace.as_ref().map(|n| n.0.as_str()), priority.0);
        let tokens = ids(tokens, "tokens", u32::MAX)?;
        let kv_slots = ids(kv_slots, "kv_slots", MAX_SLOT)?;
        let (tokens, kv_slots) = (tokens.as_slice(), kv_slots.as_slice());
        self.poison
            .run(py, &mut self.tree, |t| t.insert(tokens, kv_slots, namespace, priority))?
            .map_err(|e| errors::tree(py, e))
    }

    fn lock(&mut self, py: Python<'_>, node: &Bound<'_, PyAny>) -> PyResult<usize> {
        let node = handle(node)?;
        self.poison.run(py, &mut self.tree, |t| t.lock(node))?.map_err(|e| errors::tree(py, e))
    }

    fn unlock(&mut self, py: Python<'_>, node: &Bound<'_, PyAny>) -> PyResult<usize> {
        let node = handle(node)?;
        self.poison.run(py, &mut self.tree, |t| t.unlock(node))?.map_err(|e| errors::tree(py, e))
    }

    fn evict<'py>(
        &mut self,
        py: Python<'py>,
        num_tokens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let n = count_or_all(num_tokens, "num_tokens")?;
        let freed = self.poison.run(py, &mut self.tree, |t| t.evict(n))?;
        Ok(slots_array(py, freed))
    }

    fn reset(&mut self, py: Python<'_>) -> PyResult<()> {
        self.poison.run(py, &mut self.tree, |t| t.reset())
    }

    fn evictable_size(&mut self, py: Python<'_>) -> PyResult<usize> {
        self.poison.run(py, &self.tree, |t| t.sizes().evictable)
    }

    fn protected_size(&mut self, py: Python<'_>) -> PyResult<usize> {
        self.poison.run(py, &self.tree, |t| t.sizes().protected)
    }

    fn total_size(&mut self, py: Python<'_>) -> PyResult<usize> {
        self.poison.run(py, &self.tree, |t| t.sizes().total)
    }

    fn num_nodes(&mut self, py: Python<'_>) -> PyResult<usize> {
        self.poison.run(py, &self.tree, |t| t.sizes().nodes)
    }

    fn memory_bytes(&mut self, py: Python<'_>) -> PyResult<usize> {
        self.poison.run(py, &self.tree, |t| t.memory_bytes())
    }

    fn all_kv_slots<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let slots = self.poison.run(py, &self.tree, |t| t.all_kv_slots())?;
        Ok(slots_array(py, slots))
    }

    fn check_invariants(&mut self, py: Python<'_>) -> PyResult<()> {
        self.poison
            .run(py, &self.tree, |t| t.check_invariants())?
            .map_err(|msg| errors::invariant_violation(py, msg))
    }

    /// Events as plain tuples; `ferrolm.radix_cache` turns them into event objects.
    fn take_raw_events<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.poison.run(py, &mut self.tree, |t| t.take_events())?;
        crate::kv_events::raw_events(py, events)
    }

    #[getter]
    fn page_size(&self) -> usize {
        self.tree.config().page_size
    }

    #[getter]
    fn eviction_policy(&self) -> &'static str {
        self.tree.config().policy.name()
    }

    #[getter]
    fn kv_events_enabled(&self) -> bool {
        self.tree.config().kv_events
    }

    #[getter]
    fn kv_event_block_size(&self) -> usize {
        self.tree.block_size()
    }

    #[getter]
    fn root_node(&self) -> u64 {
        self.tree.root_handle().0
    }

    /// Test hook: panics inside the core, to check that a panic poisons this object.
    fn _inject_panic(&mut self, py: Python<'_>) -> PyResult<()> {
        self.poison.run(py, (), |()| panic!("injected by _inject_panic"))
    }
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRadixTree>()?;
    m.add_class::<MatchResult>()?;
    Ok(())
}
