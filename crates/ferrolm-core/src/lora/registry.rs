//! The LoRA adapters a server knows, by name, and which of them it holds in memory.
//!
//! An adapter is registered under a name with the folder it was read from
//! (`--lora-modules`, `/v1/load_lora_adapter`); registering reads and checks it, so a bad
//! adapter is refused at once. At most `max_resident` adapters keep their weights in
//! memory: when another is needed, the one used least recently whose weights no request
//! holds is dropped, and read again from its folder when next asked for. A request holds
//! its adapter's weights (an `Arc`) from submission to its end, so an adapter in use is
//! never dropped; while every resident adapter is in use, one more is read beside them
//! and the count comes back down as they go idle.
//!
//! Files are read without the lock held: a slow disk delays only the request (or the
//! load) that needs them, never the step loop or other requests.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Adapter, LoraError, LoraShape};
use crate::engine::Lora;

/// Why the registry refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryError {
    /// No adapter is registered under this name (an HTTP 404).
    NotFound(String),
    /// The name is taken, or not a name an adapter can have; the message says which.
    BadName(String),
    /// The adapter's files are missing or wrong (`LoraError::file` names the file).
    Load(LoraError),
}

impl std::fmt::Display for RegistryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryError::NotFound(name) => write!(f, "the LoRA adapter {name:?} is not loaded"),
            RegistryError::BadName(message) => f.write_str(message),
            RegistryError::Load(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RegistryError {}

/// One registered adapter as listed (`/v1/models`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoraInfo {
    pub id: u32,
    pub name: String,
    pub path: String,
    /// Whether its weights are in memory now.
    pub resident: bool,
}

struct Entry {
    id: u32,
    name: Arc<str>,
    path: PathBuf,
    weights: Option<Arc<Adapter>>,
    last_used: u64,
}

impl Entry {
    /// Resident, and held by nothing but the registry.
    fn idle(&self) -> bool {
        self.weights.as_ref().is_some_and(|w| Arc::strong_count(w) == 1)
    }
}

#[derive(Default)]
struct Inner {
    entries: Vec<Entry>,
    next_id: u32,
    clock: u64,
    /// Reads from disk since start (first loads and reads after eviction).
    reads: u64,
}

/// Shows the registered names (what a settings dump needs).
impl std::fmt::Debug for LoraRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.list().into_iter().map(|l| l.name).collect();
        f.debug_struct("LoraRegistry")
            .field("adapters", &names)
            .field("max_resident", &self.max_resident)
            .finish()
    }
}

pub struct LoraRegistry {
    shape: LoraShape,
    max_resident: usize,
    inner: Mutex<Inner>,
}

/// The longest adapter name taken (names go into metrics labels and cache namespaces).
pub const MAX_NAME_LEN: usize = 256;

impl LoraRegistry {
    /// A registry for adapters of a model of `shape`, keeping at most `max_resident`
    /// (at least 1) in memory.
    pub fn new(shape: LoraShape, max_resident: usize) -> LoraRegistry {
        LoraRegistry {
            shape,
            max_resident: max_resident.max(1),
            inner: Mutex::new(Inner { next_id: 1, ..Inner::default() }),
        }
    }

    pub fn shape(&self) -> &LoraShape {
        &self.shape
    }

    pub fn max_resident(&self) -> usize {
        self.max_resident
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // an entry is only ever changed whole: what a panicking thread left is usable
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the adapter in `path`, checks it against the model and registers it as
    /// `name`, resident. Returns its id (never reused).
    pub fn load(&self, name: &str, path: &Path) -> Result<u32, RegistryError> {
        check_name(name)?;
        if self.lock().entries.iter().any(|e| &*e.name == name) {
            return Err(taken(name));
        }
        let adapter = Arc::new(Adapter::load_peft(path, &self.shape).map_err(RegistryError::Load)?);
        let mut inner = self.lock();
        if inner.entries.iter().any(|e| &*e.name == name) {
            return Err(taken(name)); // loaded by another caller meanwhile
        }
        let (id, now) = (inner.next_id, inner.tick());
        inner.next_id += 1;
        inner.reads += 1;
        inner.entries.push(Entry {
            id,
            name: name.into(),
            path: path.to_path_buf(),
            weights: Some(adapter),
            last_used: now,
        });
        inner.trim(self.max_resident, Some(id));
        tracing::info!(name, id, path = %path.display(), "LoRA adapter loaded");
        Ok(id)
    }

    /// Forgets `name`. Requests that run with it finish with its weights; new ones are
    /// refused.
    pub fn unload(&self, name: &str) -> Result<(), RegistryError> {
        let mut inner = self.lock();
        let at = inner.position(name).ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        let entry = inner.entries.remove(at);
        tracing::info!(name, id = entry.id, "LoRA adapter unloaded");
        Ok(())
    }

    /// The adapter `name` (or, failing a name, the one registered from the folder
    /// `name`: SGLang's `lora_path`) for a request, read again from its folder if its
    /// weights were dropped. The caller holds the weights for the request's life.
    pub fn acquire(&self, name: &str) -> Result<Lora, RegistryError> {
        let (id, path) = {
            let mut inner = self.lock();
            let at = inner
                .position(name)
                .or_else(|| inner.entries.iter().position(|e| e.path.as_os_str() == name))
                .ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
            let now = inner.tick();
            let e = &mut inner.entries[at];
            e.last_used = now;
            if let Some(w) = &e.weights {
                return Ok(Lora { id: e.id, name: Arc::clone(&e.name), adapter: Arc::clone(w) });
            }
            (e.id, e.path.clone())
        };
        // evicted: read it again, without the lock (two callers may both read; one copy stays)
        let adapter = Arc::new(Adapter::load_peft(&path, &self.shape).map_err(RegistryError::Load)?);
        let mut inner = self.lock();
        inner.reads += 1;
        let Some(at) = inner.entries.iter().position(|e| e.id == id) else {
            return Err(RegistryError::NotFound(name.to_string())); // unloaded meanwhile
        };
        let e = &mut inner.entries[at];
        let weights = Arc::clone(e.weights.get_or_insert(adapter));
        let lora = Lora { id, name: Arc::clone(&e.name), adapter: weights };
        inner.trim(self.max_resident, Some(id));
        tracing::debug!(name = %lora.name, id, "LoRA adapter read again");
        Ok(lora)
    }

    /// Drops idle adapters' weights down to `max_resident` (after busy ones went idle).
    pub fn trim(&self) {
        self.lock().trim(self.max_resident, None);
    }

    pub fn list(&self) -> Vec<LoraInfo> {
        self.lock()
            .entries
            .iter()
            .map(|e| LoraInfo {
                id: e.id,
                name: e.name.to_string(),
                path: e.path.display().to_string(),
                resident: e.weights.is_some(),
            })
            .collect()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.lock().position(name).is_some()
    }

    /// How many adapters have their weights in memory.
    pub fn resident(&self) -> usize {
        self.lock().entries.iter().filter(|e| e.weights.is_some()).count()
    }

    /// Reads of adapter files since start.
    pub fn reads(&self) -> u64 {
        self.lock().reads
    }
}

impl Inner {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.entries.iter().position(|e| &*e.name == name)
    }

    /// Drops the least recently used idle weights (never `keep`'s) while more than
    /// `max` are resident.
    fn trim(&mut self, max: usize, keep: Option<u32>) {
        loop {
            let resident = self.entries.iter().filter(|e| e.weights.is_some()).count();
            if resident <= max {
                return;
            }
            let victim = self
                .entries
                .iter_mut()
                .filter(|e| e.idle() && Some(e.id) != keep)
                .min_by_key(|e| e.last_used);
            let Some(victim) = victim else { return }; // every one is in use
            tracing::debug!(name = %victim.name, id = victim.id, "LoRA adapter evicted");
            victim.weights = None;
        }
    }
}

fn taken(name: &str) -> RegistryError {
    RegistryError::BadName(format!("a LoRA adapter named {name:?} is already loaded"))
}

fn check_name(name: &str) -> Result<(), RegistryError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
        return Err(RegistryError::BadName(format!(
            "a LoRA adapter's name has 1 to {MAX_NAME_LEN} bytes and no control characters, got {name:?}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use safetensors::tensor::TensorView;
    use safetensors::Dtype;

    use super::*;

    const SHAPE: LoraShape = LoraShape { layers: 1, hidden: 4, q_dim: 4, kv_dim: 4, intermediate: 4 };

    /// A PEFT folder adapting layer 0's q_proj at rank 1, removed when dropped.
    struct Folder(PathBuf);

    impl Folder {
        fn new(scale: f32) -> Folder {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("ferrolm-registry-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let config = r#"{"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": ["q_proj"]}"#;
            std::fs::write(dir.join("adapter_config.json"), config).unwrap();
            let bytes: Vec<u8> = [scale; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
            let prefix = "base_model.model.model.layers.0.self_attn.q_proj";
            let views = [
                (format!("{prefix}.lora_A.weight"), TensorView::new(Dtype::F32, vec![1, 4], &bytes).unwrap()),
                (format!("{prefix}.lora_B.weight"), TensorView::new(Dtype::F32, vec![4, 1], &bytes).unwrap()),
            ];
            let file = safetensors::serialize(views, None).unwrap();
            std::fs::write(dir.join("adapter_model.safetensors"), file).unwrap();
            Folder(dir)
        }
    }

    impl Drop for Folder {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn a_of(lora: &Lora) -> f32 {
        lora.adapter.get(0, super::super::Target::Q).unwrap().a[0]
    }

    #[test]
    fn adapters_are_read_once_and_held_while_requests_run() {
        let (one, two, three) = (Folder::new(1.0), Folder::new(2.0), Folder::new(3.0));
        let r = LoraRegistry::new(SHAPE, 2);
        assert_eq!(r.load("one", &one.0), Ok(1));
        assert_eq!(r.load("two", &two.0), Ok(2));
        assert_eq!(r.reads(), 2);
        let held = r.acquire("one").unwrap();
        assert_eq!((held.id, &*held.name, a_of(&held)), (1, "one", 1.0));
        assert_eq!(r.reads(), 2, "resident: no read");
        // a third: "two" is the least recently used idle one, and goes
        assert_eq!(r.load("three", &three.0), Ok(3));
        let resident: Vec<_> = r.list().into_iter().filter(|l| l.resident).map(|l| l.name).collect();
        assert_eq!(resident, ["one", "three"]);
        // asked for again: read back from its folder, and the idle "three" goes
        let two_again = r.acquire("two").unwrap();
        assert_eq!((two_again.id, a_of(&two_again), r.reads()), (2, 2.0, 4));
        assert_eq!(r.resident(), 2);
        // everything in use: a fourth read stays beside them until one is idle
        let three_again = r.acquire("three").unwrap();
        assert_eq!(r.resident(), 3, "held weights are never dropped");
        drop((held, two_again));
        r.trim();
        assert_eq!(r.resident(), 2);
        assert!(r.list().iter().any(|l| l.name == "three" && l.resident));
        drop(three_again);
    }

    #[test]
    fn unloading_keeps_running_requests_weights_and_ids_are_never_reused() {
        let (one, other) = (Folder::new(1.0), Folder::new(5.0));
        let r = LoraRegistry::new(SHAPE, 4);
        r.load("one", &one.0).unwrap();
        let held = r.acquire("one").unwrap();
        r.unload("one").unwrap();
        assert_eq!(r.acquire("one").unwrap_err(), RegistryError::NotFound("one".into()));
        assert_eq!(r.unload("one").unwrap_err(), RegistryError::NotFound("one".into()));
        assert_eq!(a_of(&held), 1.0, "the running request keeps its weights");
        // the name again, other weights: a new id, so a new cache namespace
        assert_eq!(r.load("one", &other.0), Ok(2));
        let fresh = r.acquire("one").unwrap();
        assert_eq!((fresh.id, a_of(&fresh)), (2, 5.0));
        assert_ne!(fresh.namespace(None), held.namespace(None));
    }

    #[test]
    fn names_and_folders_are_checked() {
        let one = Folder::new(1.0);
        let r = LoraRegistry::new(SHAPE, 4);
        r.load("one", &one.0).unwrap();
        assert!(matches!(r.load("one", &one.0), Err(RegistryError::BadName(m)) if m.contains("already")));
        for bad in ["", "a\u{0}b", "tab\tname", &"x".repeat(MAX_NAME_LEN + 1)] {
            assert!(matches!(r.load(bad, &one.0), Err(RegistryError::BadName(_))), "{bad:?}");
        }
        let missing = one.0.join("nowhere");
        match r.load("two", &missing) {
            Err(RegistryError::Load(e)) => assert!(e.file.ends_with("adapter_config.json"), "{e}"),
            other => panic!("{other:?}"),
        }
        // SGLang's lora_path may name the folder it was loaded from
        let by_path = r.acquire(one.0.to_str().unwrap()).unwrap();
        assert_eq!(&*by_path.name, "one");
        assert_eq!(r.list().len(), 1);
    }
}
