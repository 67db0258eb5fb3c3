//! `RadixTree` and `MatchResult`: the radix prefix cache. Behaviour and errors are
//! documented in `python/ferrolm/_core.pyi`.

use std::sync::Arc;
use std::time::Duration;

use ferrolm_core::radix::{
    EvictionPolicy, ManualClock, MatchedPath, NodeHandle, RadixTree, TimeSource, TreeConfig,
};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::convert::{
    count_or_all, non_negative, sign_error, tree_ids, type_name, BlockSize, Namespace, PageSize, PolicyName,
    Priority, SignCheck,
};
use crate::errors;
use crate::guard::Poison;

/// KV slot indices cross as int32 (what torch and numpy index with cheaply).
const MAX_SLOT: u32 = i32::MAX as u32;

#[pyclass(module = "ferrolm._core", name = "RadixTree", subclass)]
pub struct PyRadixTree {
    tree: RadixTree,
    poison: Poison,
    /// The nodes of the last match, reused between calls.
    path: MatchedPath,
    /// No key holds a token of 2^31 or more (none came from a `uint32` array or a list
    /// with one): the tokens a match finds equal to keys then need no sign check.
    keys_below_half: bool,
}

/// A clock for the `tlru` policy that moves only when told to, so that tests of
/// time-to-live never sleep. One clock can drive several trees, and the Python twin.
#[pyclass(module = "ferrolm._core", name = "ManualClock", frozen)]
pub struct PyManualClock {
    clock: Arc<ManualClock>,
}

#[pymethods]
impl PyManualClock {
    #[new]
    #[pyo3(signature = (start_ns = 0))]
    fn new(start_ns: u64) -> Self {
        PyManualClock { clock: Arc::new(ManualClock::new(start_ns)) }
    }

    /// Moves the time forward.
    fn advance(&self, py: Python<'_>, seconds: &Bound<'_, PyAny>) -> PyResult<()> {
        let ns = seconds_to_ns(py, seconds, "seconds", true)?;
        self.clock.advance(ns);
        Ok(())
    }

    /// The time in nanoseconds.
    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }
}

/// The most seconds a time-to-live may be (about 31 years): nanoseconds stay far from
/// overflow, and conversion is exact enough in both backends.
const MAX_SECONDS: f64 = 1e9;

/// Seconds (an int or a float, not a bool) as whole nanoseconds, truncated as the Python
/// twin does (`int(seconds * 1e9)`). `zero_ok`: whether 0 is allowed.
fn seconds_to_ns(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str, zero_ok: bool) -> PyResult<u64> {
    let numeric = !obj.is_instance_of::<pyo3::types::PyBool>()
        && (obj.is_instance_of::<pyo3::types::PyInt>() || obj.is_instance_of::<pyo3::types::PyFloat>());
    let value = if numeric { obj.extract::<f64>().ok() } else { None };
    let Some(v) = value else {
        return Err(errors::invalid_field(
            py,
            what,
            format!("{what} must be a number of seconds, got {}", type_name(obj)),
        ));
    };
    let low_ok = if zero_ok { v >= 0.0 } else { v > 0.0 };
    if !(low_ok && v <= MAX_SECONDS) {
        let low = if zero_ok { ">= 0" } else { "> 0" };
        return Err(errors::invalid_field(
            py,
            what,
            format!("{what} must be {low} and at most {MAX_SECONDS:e}, got {v}"),
        ));
    }
    let ns = (v * 1e9) as u64;
    if ns == 0 && !zero_ok {
        return Err(errors::invalid_field(py, what, format!("{what} is under a nanosecond: {v}")));
    }
    Ok(ns)
}

/// A share between 0 and 1 (an int or a float, not a bool).
fn share(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<f64> {
    let numeric = !obj.is_instance_of::<pyo3::types::PyBool>()
        && (obj.is_instance_of::<pyo3::types::PyInt>() || obj.is_instance_of::<pyo3::types::PyFloat>());
    match if numeric { obj.extract::<f64>().ok() } else { None } {
        Some(v) if (0.0..=1.0).contains(&v) => Ok(v),
        Some(v) => Err(errors::invalid_field(py, what, format!("{what} must be between 0 and 1, got {v}"))),
        None => Err(errors::invalid_field(
            py,
            what,
            format!("{what} must be a number between 0 and 1, got {}", type_name(obj)),
        )),
    }
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

fn slots_array<'py>(py: Python<'py>, slots: &[u32]) -> Bound<'py, PyArray1<i32>> {
    // Slots are always <= MAX_SLOT (checked on insert), so their bits read as the same
    // i32 values. A copy into an array numpy allocates is cheaper than handing numpy a
    // Rust vector (which takes a capsule object to own it).
    // SAFETY: u32 and i32 have the same size and alignment.
    let as_i32 = unsafe { std::slice::from_raw_parts(slots.as_ptr().cast::<i32>(), slots.len()) };
    PyArray1::from_slice(py, as_i32)
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
        signature = (
            page_size = PageSize(1), eviction_policy = PolicyName("lru".into()), enable_kv_events = false,
            kv_event_block_size = None, *, slru_protected_share = None, ttl_seconds = None, clock = None,
        ),
        text_signature = "(page_size=1, eviction_policy='lru', enable_kv_events=False, kv_event_block_size=None, \
                          *, slru_protected_share=0.8, ttl_seconds=300.0, clock=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        page_size: PageSize,
        eviction_policy: PolicyName,
        enable_kv_events: bool,
        kv_event_block_size: Option<BlockSize>,
        slru_protected_share: Option<&Bound<'_, PyAny>>,
        ttl_seconds: Option<&Bound<'_, PyAny>>,
        clock: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let policy: EvictionPolicy =
            eviction_policy.0.parse().map_err(|e: ferrolm_core::radix::policy::UnknownPolicy| {
                errors::invalid_field(py, "eviction_policy", format!("eviction_policy: {e}"))
            })?;
        let slru_protected_share = match slru_protected_share {
            Some(obj) => share(py, obj, "slru_protected_share")?,
            None => TreeConfig::DEFAULT_SLRU_PROTECTED_SHARE,
        };
        let ttl = match ttl_seconds {
            Some(obj) => Duration::from_nanos(seconds_to_ns(py, obj, "ttl_seconds", false)?),
            None => TreeConfig::DEFAULT_TTL,
        };
        let time: Arc<dyn TimeSource> = match clock {
            None => Arc::new(ferrolm_core::radix::MonotonicClock),
            Some(obj) => match obj.cast::<PyManualClock>() {
                Ok(c) => c.get().clock.clone(),
                // the core reads the time with the GIL released: no Python callable
                Err(_) => {
                    return Err(errors::invalid_field(
                        py,
                        "clock",
                        format!("clock must be a ferrolm._core.ManualClock or None, got {}", type_name(obj)),
                    ))
                }
            },
        };
        let config = TreeConfig {
            page_size: page_size.0,
            policy,
            kv_events: enable_kv_events,
            event_block_size: kv_event_block_size.map_or(0, |b| b.0),
            slru_protected_share,
            ttl,
        };
        let tree = RadixTree::with_clock(config, time).map_err(|e| errors::tree(py, e))?;
        Ok(PyRadixTree {
            tree,
            poison: Poison::default(),
            path: MatchedPath::default(),
            keys_below_half: true,
        })
    }

    #[pyo3(signature = (tokens, namespace = None))]
    fn match_prefix(
        &mut self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        namespace: Option<Namespace>,
    ) -> PyResult<MatchResult> {
        // An int32 prompt's sign is checked once the walk has found the matched path and
        // before it changes anything in the tree: the walk is then the first read of a
        // prompt that is usually cold (tokenized a while ago), overlapping the reads of
        // the node keys it compares with, and the check runs on values in cache. A check
        // before the walk waited for the whole prompt on its own, a sixth of the call.
        // The matched tokens equal keys, so while every key is below 2^31 only the rest
        // of the prompt is checked (for a cache hit, little or nothing).
        let (tokens, sign) = tree_ids(tokens, "tokens", u32::MAX, true)?;
        let tokens = tokens.as_slice();
        let namespace = namespace.as_ref().map(|n| n.0.as_str());
        let keys_below_half = self.keys_below_half;
        let matched = self.poison.run(py, (&mut self.tree, &mut self.path), |(t, path)| {
            t.match_prefix_path_if(tokens, namespace, path, |matched| {
                let unchecked = if keys_below_half { &tokens[matched..] } else { tokens };
                sign != SignCheck::Deferred || non_negative(unchecked)
            })
        })?;
        let Some((length, node)) = matched else { return Err(sign_error(py, tokens, "tokens")) };
        // The slots go straight from the tree into the result array (no buffer between):
        // copying them is the result's conversion, done as the array is made.
        // SAFETY: uninitialized, but every element is written below before Python sees it
        let kv_slots = unsafe { PyArray1::<i32>::new(py, [length], false) };
        // SAFETY: the array was made just now and nothing else refers to it yet
        let out = unsafe { kv_slots.as_slice_mut() }.expect("a new array is contiguous");
        // SAFETY: i32 and u32 have the same size and alignment (slots are below 2^31)
        let out = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u32>(), out.len()) };
        self.poison
            .run_attached(py, (&self.tree, &self.path), |(t, path)| t.copy_matched_slots(path, out))?;
        let kv_slots = kv_slots.unbind();
        Ok(MatchResult { length, kv_slots, node: node.0 })
    }

    #[pyo3(
        signature = (tokens, kv_slots, namespace = None, priority = Priority(0), *, ttl_seconds = None),
        text_signature = "($self, tokens, kv_slots, namespace=None, priority=0, *, ttl_seconds=None)"
    )]
    fn insert(
        &mut self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        kv_slots: &Bound<'_, PyAny>,
        namespace: Option<Namespace>,
        priority: Priority,
        ttl_seconds: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let (namespace, priority) = (namespace.as_ref().map(|n| n.0.as_str()), priority.0);
        let (tokens, sign) = tree_ids(tokens, "tokens", u32::MAX, false)?;
        if sign != SignCheck::BelowHalf && self.keys_below_half {
            // before the insert, so that no key can hold such a token while the flag is set
            self.keys_below_half = non_negative(tokens.as_slice());
        }
        let (kv_slots, _) = tree_ids(kv_slots, "kv_slots", MAX_SLOT, false)?;
        let ttl = match ttl_seconds {
            Some(obj) => Some(Duration::from_nanos(seconds_to_ns(py, obj, "ttl_seconds", false)?)),
            None => None,
        };
        let (tokens, kv_slots) = (tokens.as_slice(), kv_slots.as_slice());
        self.poison
            .run(py, &mut self.tree, |t| t.insert_with_ttl(tokens, kv_slots, namespace, priority, ttl))?
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
        Ok(slots_array(py, &freed))
    }

    fn reset(&mut self, py: Python<'_>) -> PyResult<()> {
        self.poison.run(py, &mut self.tree, |t| t.reset())?;
        self.keys_below_half = true; // no keys left
        Ok(())
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
        Ok(slots_array(py, &slots))
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
    fn slru_protected_share(&self) -> f64 {
        self.tree.config().slru_protected_share
    }

    #[getter]
    fn ttl_seconds(&self) -> f64 {
        self.tree.config().ttl.as_nanos() as f64 / 1e9
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

    /// Bench hook: reads `tokens` as `match_prefix` does (in place, its sign checked with
    /// the GIL released) and touches no tree; returns how many there are. `ferrolm bench tree` times it on each
    /// prompt just before that prompt's match: what a cold prompt costs to read on this
    /// machine, which no tree can match under.
    fn _read_tokens(&mut self, py: Python<'_>, tokens: &Bound<'_, PyAny>) -> PyResult<usize> {
        let (ids, sign) = tree_ids(tokens, "tokens", u32::MAX, true)?;
        let ids = ids.as_slice();
        // the values read with the GIL released, as a match reads them
        let ok = self.poison.run(py, (), |()| sign != SignCheck::Deferred || non_negative(ids))?;
        if !ok {
            return Err(sign_error(py, ids, "tokens"));
        }
        Ok(ids.len())
    }

    /// Test hook: panics inside the core, to check that a panic poisons this object.
    fn _inject_panic(&mut self, py: Python<'_>) -> PyResult<()> {
        self.poison.run(py, (), |()| panic!("injected by _inject_panic"))
    }
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRadixTree>()?;
    m.add_class::<MatchResult>()?;
    m.add_class::<PyManualClock>()?;
    Ok(())
}
