//! The one place where core errors become Python exceptions. The classes live in the
//! Python module `ferrolm.errors`, so users can import and catch them without `_core`.

use ferrolm_constraint::ConstraintError;
use ferrolm_core::engine::EngineError;
use ferrolm_core::radix::TreeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyModule, PyType};

static ERRORS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let module =
        ERRORS_MODULE.get_or_try_init(py, || PyModule::import(py, "ferrolm.errors").map(Bound::unbind))?;
    Ok(module.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

fn raise(py: Python<'_>, name: &str, msg: String) -> PyErr {
    match class(py, name) {
        Ok(cls) => PyErr::from_type(cls, msg),
        Err(import_failed) => import_failed,
    }
}

pub fn invalid_input(py: Python<'_>, msg: impl Into<String>) -> PyErr {
    raise(py, "InvalidInputError", msg.into())
}

/// An `InvalidInputError` whose `field` attribute names the argument at fault.
pub fn invalid_field(py: Python<'_>, field: &str, msg: String) -> PyErr {
    match class(py, "InvalidInputError") {
        Ok(cls) => PyErr::from_type(cls, (msg, field.to_string())),
        Err(import_failed) => import_failed,
    }
}

/// A LoRA adapter that is not loaded (HTTP 404 at the server).
pub fn lora_not_found(py: Python<'_>, msg: String) -> PyErr {
    raise(py, "LoraNotFoundError", msg)
}

pub fn protocol(py: Python<'_>, msg: String) -> PyErr {
    raise(py, "ProtocolError", msg)
}

pub fn invariant_violation(py: Python<'_>, msg: String) -> PyErr {
    raise(py, "InvariantViolation", msg)
}

pub fn core_panic(py: Python<'_>, msg: String) -> PyErr {
    raise(py, "CorePanicError", msg)
}

pub fn tree(py: Python<'_>, err: TreeError) -> PyErr {
    let name = match err {
        TreeError::InvalidInput(_) => "InvalidInputError",
        TreeError::StaleHandle(_) => "StaleHandleError",
        TreeError::NotLocked(_) => "NotLockedError",
    };
    raise(py, name, err.to_string())
}

pub fn engine(py: Python<'_>, err: EngineError) -> PyErr {
    match err {
        EngineError::InvalidRequest { field, .. } => invalid_field(py, field, err.to_string()),
        EngineError::DuplicateRid(_) => invalid_field(py, "rid", err.to_string()),
        EngineError::Protocol(m) => protocol(py, m),
    }
}

pub fn constraint(py: Python<'_>, err: ConstraintError) -> PyErr {
    let field = match &err {
        // A panic while compiling: a bug, not bad input.
        ConstraintError::Internal { .. } => return core_panic(py, err.to_string()),
        ConstraintError::InvalidVocabulary(_) | ConstraintError::TokenizerFile { .. } => "vocabulary",
        ConstraintError::InvalidRegex { .. } => "regex",
        ConstraintError::GrammarTooLarge { .. } => "grammar",
        ConstraintError::BitmaskSize { .. } => "bitmask",
        ConstraintError::RollbackTooFar { .. } => "steps",
        ConstraintError::UnsupportedSchema { .. } | ConstraintError::InvalidSchema { .. } => "json_schema",
        ConstraintError::InvalidGrammar { .. } | ConstraintError::UnsupportedGrammar { .. } => "ebnf",
    };
    invalid_field(py, field, err.to_string())
}
