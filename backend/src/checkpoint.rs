//! Checkpoints: a folder with the model in HF layout (config.json,
//! model.safetensors), the optimizer state (optimizer.safetensors), the frozen
//! KL reference when the run has one (reference.safetensors: after an SFT
//! warm-up it is the warmed-up model, which nothing else could rebuild) and the
//! trainer state (state.json: progress, data position, RNG position).
//!
//! Written under a temporary name, every file fsynced, renamed into place, the
//! parent fsynced; only then does the caller enter it in the catalog with the
//! sha256 of each file. Loading checks every hash first.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::model::save::{sync_dir, F32View};
use crate::model::{load_model, save_model, tensor_layout, ModelConfig, ModelWeights};
use crate::rl::optim::AdamW;
use crate::trainer::{Progress, Trainer};

pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const REFERENCE_FILE: &str = "reference.safetensors";
pub const STATE_FILE: &str = "state.json";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("checkpoint {}: {file} does not match its recorded sha256 (expected {expected}, found {found})", .dir.display())]
    HashMismatch {
        dir: PathBuf,
        file: String,
        expected: String,
        found: String,
    },
    #[error("checkpoint {}: {message}", .dir.display())]
    Invalid { dir: PathBuf, message: String },
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// The checkpoint is fine; copying it to or from the GPU failed.
    #[error("checkpoint {}: {message}", .dir.display())]
    Device { dir: PathBuf, message: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One file of a checkpoint and its hash.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileHash {
    pub name: String,
    pub sha256: String,
    pub bytes: u64,
}

/// What state.json holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    pub format: u32,
    pub progress: Progress,
    pub optimizer_steps: u64,
    pub seed: u64,
    pub flow: String,
    pub last_heldout: Option<f64>,
}

pub fn sha256_file(path: &Path) -> Result<(String, u64), CheckpointError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let h = Sha256::digest(&bytes);
    Ok((
        h.iter().map(|b| format!("{b:02x}")).collect(),
        bytes.len() as u64,
    ))
}

fn f32_bytes(x: &[u8]) -> Vec<f32> {
    x.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let mut f = File::create(path).map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))?;
    f.sync_all().map_err(io(path))
}

/// Write the trainer's checkpoint to `dir` (which must not exist yet) and
/// return the hashes of its files.
pub fn save(dir: &Path, t: &mut Trainer) -> Result<Vec<FileHash>, CheckpointError> {
    t.sync_host().map_err(|e| CheckpointError::Device {
        dir: dir.into(),
        message: format!("copying the weights from the device: {e}"),
    })?;
    let parent = dir.parent().ok_or_else(|| CheckpointError::Invalid {
        dir: dir.into(),
        message: "no parent".into(),
    })?;
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let name = dir
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = parent.join(format!(".tmp-{name}-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    save_model(&tmp, &t.model_cfg, &t.weights)?;
    // Optimizer moments, named m.<tensor> and v.<tensor>.
    let layout = tensor_layout(&t.model_cfg);
    let mut views: Vec<(String, F32View)> = Vec::new();
    for (prefix, w) in [("m", &t.opt.m), ("v", &t.opt.v)] {
        for ((name, data), spec) in w.tensors().into_iter().zip(&layout) {
            views.push((
                format!("{prefix}.{name}"),
                F32View {
                    data,
                    shape: spec.shape.clone(),
                },
            ));
        }
    }
    let meta = HashMap::from([("t".to_string(), t.opt.t.to_string())]);
    let opt_path = tmp.join(OPTIMIZER_FILE);
    let bytes =
        safetensors::serialize(views, Some(meta)).map_err(|e| CheckpointError::Invalid {
            dir: tmp.clone(),
            message: e.to_string(),
        })?;
    write_file(&opt_path, &bytes)?;
    if let Some(r) = &t.reference {
        let views: Vec<(String, F32View)> = r
            .tensors()
            .into_iter()
            .zip(&layout)
            .map(|((name, data), spec)| {
                let shape = spec.shape.clone();
                (name, F32View { data, shape })
            })
            .collect();
        let bytes = safetensors::serialize(views, None).map_err(|e| CheckpointError::Invalid {
            dir: tmp.clone(),
            message: e.to_string(),
        })?;
        write_file(&tmp.join(REFERENCE_FILE), &bytes)?;
    }
    let state = TrainerState {
        format: 1,
        progress: t.progress,
        optimizer_steps: t.opt.t,
        seed: t.cfg.run.seed,
        flow: t.flow.name().into(),
        last_heldout: t.last_heldout,
    };
    let sp = tmp.join(STATE_FILE);
    write_file(
        &sp,
        &serde_json::to_vec_pretty(&state).expect("state serializes"),
    )?;
    sync_dir(&tmp)?;
    std::fs::rename(&tmp, dir).map_err(io(dir))?;
    sync_dir(parent)?;
    let mut files = Vec::new();
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    for name in names {
        let (sha256, bytes) = sha256_file(&dir.join(&name))?;
        files.push(FileHash {
            name,
            sha256,
            bytes,
        });
    }
    Ok(files)
}

/// Check every recorded hash of the checkpoint in `dir`.
pub fn verify(dir: &Path, files: &[FileHash]) -> Result<(), CheckpointError> {
    if files.is_empty() {
        return Err(CheckpointError::Invalid {
            dir: dir.into(),
            message: "no files recorded".into(),
        });
    }
    for f in files {
        let p = dir.join(&f.name);
        if !p.exists() {
            return Err(CheckpointError::Invalid {
                dir: dir.into(),
                message: format!("{} is missing", f.name),
            });
        }
        let (found, _) = sha256_file(&p)?;
        if found != f.sha256 {
            return Err(CheckpointError::HashMismatch {
                dir: dir.into(),
                file: f.name.clone(),
                expected: f.sha256.clone(),
                found,
            });
        }
    }
    Ok(())
}

/// The trainer state (progress, data and RNG position) of the checkpoint in `dir`.
pub fn read_state(dir: &Path) -> Result<TrainerState, CheckpointError> {
    let sp = dir.join(STATE_FILE);
    serde_json::from_slice(&std::fs::read(&sp).map_err(io(&sp))?).map_err(|e| {
        CheckpointError::Invalid {
            dir: dir.into(),
            message: format!("{STATE_FILE}: {e}"),
        }
    })
}

/// Restore weights, optimizer and progress from a verified checkpoint.
pub fn restore(dir: &Path, files: &[FileHash], t: &mut Trainer) -> Result<(), CheckpointError> {
    verify(dir, files)?;
    let (cfg, weights): (ModelConfig, ModelWeights) = load_model(dir)?;
    if cfg != t.model_cfg {
        return Err(CheckpointError::Invalid {
            dir: dir.into(),
            message: "model config differs from the run's".into(),
        });
    }
    let bad = |m: String| CheckpointError::Invalid {
        dir: dir.into(),
        message: m,
    };
    let op = dir.join(OPTIMIZER_FILE);
    let bytes = std::fs::read(&op).map_err(io(&op))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("{OPTIMIZER_FILE}: {e}")))?;
    let (_, meta) =
        SafeTensors::read_metadata(&bytes).map_err(|e| bad(format!("{OPTIMIZER_FILE}: {e}")))?;
    let steps: u64 = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("t"))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| bad(format!("{OPTIMIZER_FILE}: metadata 't' missing")))?;
    let mut opt = AdamW::new(&t.model_cfg);
    for (prefix, w) in [("m", &mut opt.m), ("v", &mut opt.v)] {
        for (name, data) in w.tensors_mut() {
            let key = format!("{prefix}.{name}");
            let tv = st
                .tensor(&key)
                .map_err(|e| bad(format!("{OPTIMIZER_FILE}: tensor {key}: {e}")))?;
            let vals = f32_bytes(tv.data());
            if vals.len() != data.len() {
                return Err(bad(format!(
                    "{OPTIMIZER_FILE}: tensor {key} has {} values, expected {}",
                    vals.len(),
                    data.len()
                )));
            }
            data.copy_from_slice(&vals);
        }
    }
    opt.t = steps;
    // Checkpoints from before the reference was kept lack the file: the run's
    // reference then stays as it is.
    let reference = match (&t.reference, files.iter().any(|f| f.name == REFERENCE_FILE)) {
        (Some(cur), true) => {
            let rp = dir.join(REFERENCE_FILE);
            let bytes = std::fs::read(&rp).map_err(io(&rp))?;
            let st = SafeTensors::deserialize(&bytes)
                .map_err(|e| bad(format!("{REFERENCE_FILE}: {e}")))?;
            let mut r = cur.clone();
            for (name, data) in r.tensors_mut() {
                let tv = st
                    .tensor(&name)
                    .map_err(|e| bad(format!("{REFERENCE_FILE}: tensor {name}: {e}")))?;
                let vals = f32_bytes(tv.data());
                if vals.len() != data.len() {
                    return Err(bad(format!(
                        "{REFERENCE_FILE}: tensor {name} has {} values, expected {}",
                        vals.len(),
                        data.len()
                    )));
                }
                data.copy_from_slice(&vals);
            }
            Some(r)
        }
        _ => None,
    };
    let state = read_state(dir)?;
    t.weights = weights;
    t.opt = opt;
    if reference.is_some() {
        t.reference = reference;
    }
    t.progress = state.progress;
    t.last_heldout = state.last_heldout;
    t.host_changed().map_err(|e| CheckpointError::Device {
        dir: dir.into(),
        message: format!("copying the weights to the device: {e}"),
    })?;
    Ok(())
}
