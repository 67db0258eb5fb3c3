//! LoRA adapters (`ferrolm_core::lora`): the registry a server or `Engine` keeps of them
//! (`LoraRegistry`), one adapter a request runs with (`LoraAdapter`), and a step's
//! adapters per request as the plan carries them to a runner (`StepLoras`). Reading an
//! adapter's files releases the GIL. Behaviour and errors: `_core.pyi`.

use std::path::PathBuf;
use std::sync::Arc;

use ferrolm_core::engine::Lora;
use ferrolm_core::lora::registry::{LoraRegistry as Registry, RegistryError};
use ferrolm_core::lora::{LoraShape, Target};
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors;

/// A registry error as a Python exception: an unknown name is a `LookupError`-derived
/// `LoraNotFoundError`, a bad adapter an `InvalidInputError` naming the file.
pub fn registry_error(py: Python<'_>, e: RegistryError) -> PyErr {
    match &e {
        RegistryError::NotFound(_) => errors::lora_not_found(py, e.to_string()),
        RegistryError::BadName(_) => errors::invalid_field(py, "lora_name", e.to_string()),
        RegistryError::Load(l) => {
            errors::invalid_field(py, "lora_path", format!("{}: {}", l.file, l.message))
        }
    }
}

fn target_named(py: Python<'_>, name: &str) -> PyResult<Target> {
    Target::ALL.into_iter().find(|t| t.peft_name() == name).ok_or_else(|| {
        errors::invalid_field(
            py,
            "target",
            format!("target must be one of q_proj ... down_proj, got {name:?}"),
        )
    })
}

/// The adapters a model serves, by name; see the module docs of `ferrolm_core::lora::registry`.
#[pyclass(module = "ferrolm._core", name = "LoraRegistry", frozen)]
pub struct PyLoraRegistry {
    pub(crate) registry: Arc<Registry>,
}

#[pymethods]
impl PyLoraRegistry {
    #[new]
    #[pyo3(signature = (*, num_layers, hidden, q_dim, kv_dim, intermediate, max_resident))]
    fn new(
        num_layers: usize,
        hidden: usize,
        q_dim: usize,
        kv_dim: usize,
        intermediate: usize,
        max_resident: usize,
    ) -> Self {
        let shape = LoraShape { layers: num_layers, hidden, q_dim, kv_dim, intermediate };
        PyLoraRegistry { registry: Arc::new(Registry::new(shape, max_resident)) }
    }

    /// Reads and registers the PEFT adapter in folder `path` as `name`; its id.
    fn load(&self, py: Python<'_>, name: &str, path: PathBuf) -> PyResult<u32> {
        let registry = &self.registry;
        py.detach(|| registry.load(name, &path)).map_err(|e| registry_error(py, e))
    }

    fn unload(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        self.registry.unload(name).map_err(|e| registry_error(py, e))
    }

    /// The adapter `name` for a request (read again if it was evicted).
    fn acquire(&self, py: Python<'_>, name: &str) -> PyResult<PyLoraAdapter> {
        let registry = &self.registry;
        let lora = py.detach(|| registry.acquire(name)).map_err(|e| registry_error(py, e))?;
        Ok(PyLoraAdapter { lora })
    }

    /// Drops idle adapters' weights down to `max_resident`.
    fn trim(&self) {
        self.registry.trim()
    }

    /// `[{"id", "name", "path", "resident"}]`, in load order.
    fn list<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.registry
            .list()
            .into_iter()
            .map(|info| {
                let d = PyDict::new(py);
                d.set_item("id", info.id)?;
                d.set_item("name", info.name)?;
                d.set_item("path", info.path)?;
                d.set_item("resident", info.resident)?;
                Ok(d)
            })
            .collect()
    }

    fn __contains__(&self, name: &str) -> bool {
        self.registry.contains(name)
    }

    #[getter]
    fn max_resident(&self) -> usize {
        self.registry.max_resident()
    }

    #[getter]
    fn resident(&self) -> usize {
        self.registry.resident()
    }

    /// Reads of adapter files since start (first loads and reads after an eviction).
    #[getter]
    fn reads(&self) -> u64 {
        self.registry.reads()
    }
}

/// One adapter's weights, held while this object (or a request given it) lives.
#[pyclass(module = "ferrolm._core", name = "LoraAdapter", frozen)]
pub struct PyLoraAdapter {
    pub(crate) lora: Lora,
}

#[pymethods]
impl PyLoraAdapter {
    #[getter]
    fn id(&self) -> u32 {
        self.lora.id
    }

    #[getter]
    fn name(&self) -> &str {
        &self.lora.name
    }

    /// The projections it adapts in some layer, as PEFT names them (`q_proj`, ...).
    #[getter]
    fn targets(&self) -> Vec<&'static str> {
        self.lora.adapter.targets().into_iter().map(Target::peft_name).collect()
    }

    #[getter]
    fn max_rank(&self) -> usize {
        self.lora.adapter.max_rank()
    }

    /// `(a [rank, in], b_t [rank, out])` of layer `layer`'s projection `target` (the
    /// update is `x @ a.T @ b_t`, its scaling folded into `b_t`), or `None` where the
    /// adapter leaves it alone. Copies.
    #[allow(clippy::type_complexity)]
    fn matrices<'py>(
        &self,
        py: Python<'py>,
        layer: usize,
        target: &str,
    ) -> PyResult<Option<(Bound<'py, PyArray2<f32>>, Bound<'py, PyArray2<f32>>)>> {
        let target = target_named(py, target)?;
        let Some(m) = self.lora.adapter.get(layer, target) else { return Ok(None) };
        let a = m.a.clone().into_pyarray(py).reshape([m.rank, m.in_dim])?;
        let b_t = m.b_t.clone().into_pyarray(py).reshape([m.rank, m.out_dim])?;
        Ok(Some((a, b_t)))
    }

    fn __repr__(&self) -> String {
        format!("LoraAdapter(id={}, name={:?})", self.lora.id, &*self.lora.name)
    }
}

/// A step's adapter per request (`None`: the base model), as `BatchPlan.loras` gives it
/// (or built from a list of `LoraAdapter | None` for a hand-made batch).
#[pyclass(module = "ferrolm._core", name = "StepLoras", frozen)]
pub struct PyStepLoras {
    pub(crate) loras: Arc<Vec<Option<Lora>>>,
}

#[pymethods]
impl PyStepLoras {
    #[new]
    fn new(adapters: Vec<Option<PyRef<'_, PyLoraAdapter>>>) -> Self {
        PyStepLoras { loras: Arc::new(adapters.into_iter().map(|a| a.map(|a| a.lora.clone())).collect()) }
    }

    /// Request b's adapter id (0: the base model).
    #[getter]
    fn ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        self.loras.iter().map(|l| l.as_ref().map_or(0, |l| l.id)).collect::<Vec<_>>().into_pyarray(py)
    }

    /// Request b's adapter, or `None`.
    fn adapters(&self) -> Vec<Option<PyLoraAdapter>> {
        self.loras.iter().map(|l| l.clone().map(|lora| PyLoraAdapter { lora })).collect()
    }

    fn __len__(&self) -> usize {
        self.loras.len()
    }
}

/// `(adapter_id, adapter_name, salt)` of a cache namespace (`None`s where it is not an
/// adapter's / has no salt): KV events name the adapter as vLLM's do.
#[pyfunction]
fn lora_namespace_parts(namespace: &str) -> (Option<u32>, Option<String>, Option<String>) {
    let (lora, salt) = ferrolm_core::engine::namespace_parts(namespace);
    (lora.map(|l| l.0), lora.map(|l| l.1.to_string()), salt.map(str::to_string))
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLoraRegistry>()?;
    m.add_class::<PyLoraAdapter>()?;
    m.add_class::<PyStepLoras>()?;
    m.add_function(wrap_pyfunction!(lora_namespace_parts, m)?)
}
