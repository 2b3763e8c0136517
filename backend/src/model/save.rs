//! Saving a model folder in HF layout (`config.json`, `model.safetensors` in
//! f32), each file written under a temporary name, fsynced, then renamed.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use safetensors::{Dtype, View};

use super::config::ModelConfig;
use super::error::ModelError;
use super::load::{CONFIG_FILE, WEIGHTS_FILE};
use super::weights::{tensor_layout, ModelWeights};

/// Writes `dir/model.safetensors` (f32; `lm_head.weight` left out when tied,
/// as HF does) and then `dir/config.json`. Creates `dir` if needed.
pub fn save_model(dir: &Path, cfg: &ModelConfig, w: &ModelWeights) -> Result<(), ModelError> {
    let weights_path = dir.join(WEIGHTS_FILE);
    let config_path = dir.join(CONFIG_FILE);
    cfg.validate_at(&config_path)?;
    w.check_at(cfg, &weights_path)?;
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;

    let specs = tensor_layout(cfg);
    let views: Vec<(String, F32View)> = w
        .tensors()
        .into_iter()
        .zip(specs)
        .map(|((name, data), spec)| {
            (
                name,
                F32View {
                    data,
                    shape: spec.shape,
                },
            )
        })
        .collect();
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    write_atomic(&weights_path, |tmp| {
        safetensors::serialize_to_file(views, Some(metadata), tmp).map_err(|e| {
            ModelError::Safetensors {
                path: tmp.to_path_buf(),
                reason: e.to_string(),
            }
        })
    })?;

    let mut json =
        serde_json::to_vec_pretty(&cfg.to_hf_json()).map_err(|source| ModelError::Json {
            path: config_path.clone(),
            source,
        })?;
    json.push(b'\n');
    write_atomic(&config_path, |tmp| {
        let mut f = File::create(tmp).map_err(|e| ModelError::io(tmp, e))?;
        f.write_all(&json).map_err(|e| ModelError::io(tmp, e))
    })?;
    sync_dir(dir)
}

/// An f32 tensor borrowed for safetensors; bytes are produced one tensor at a
/// time while the file is written.
pub(crate) struct F32View<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) shape: Vec<usize>,
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let mut bytes = Vec::with_capacity(self.data.len() * 4);
        for x in self.data {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        Cow::Owned(bytes)
    }

    fn data_len(&self) -> usize {
        self.data.len() * 4
    }
}

/// Writes `path` via `write` to a temporary name in the same folder, fsyncs
/// it and renames it over `path`; the temporary file is removed on failure.
fn write_atomic(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    let tmp = temp_name(path);
    let result = write(&tmp)
        .and_then(|()| {
            File::open(&tmp)
                .and_then(|f| f.sync_all())
                .map_err(|e| ModelError::io(&tmp, e))
        })
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| ModelError::io(path, e)));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn temp_name(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()))
}

/// Makes the renames durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), ModelError> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| ModelError::io(dir, e))
}
