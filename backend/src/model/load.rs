//! Loading an HF model folder: `config.json` plus `model.safetensors` or a
//! sharded `model.safetensors.index.json`, memory-mapped, converted to f32.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use super::config::ModelConfig;
use super::error::ModelError;
use super::json::{describe, read_json_file};
use super::weights::{tensor_layout, ModelWeights, TensorSpec, LM_HEAD};

pub const CONFIG_FILE: &str = "config.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Reads `dir/config.json` and the weights next to it.
pub fn load_model(dir: &Path) -> Result<(ModelConfig, ModelWeights), ModelError> {
    let cfg = ModelConfig::from_json_file(dir.join(CONFIG_FILE))?;
    let weights = load_weights(dir, &cfg)?;
    Ok((cfg, weights))
}

/// Reads the weights in `dir` for an already-known config: `model.safetensors`
/// if present, else the shards listed in `model.safetensors.index.json`.
pub fn load_weights(dir: &Path, cfg: &ModelConfig) -> Result<ModelWeights, ModelError> {
    let single = dir.join(WEIGHTS_FILE);
    let index = dir.join(INDEX_FILE);
    let mut c = Collector::new(cfg);
    if single.exists() {
        let map = map_file(&single)?;
        let st = parse_safetensors(&single, &map)?;
        let names = sorted_names(&st);
        c.take_file(&single, &st, &names)?;
        c.finish(&single)
    } else if index.exists() {
        load_sharded(dir, &index, c)
    } else {
        Err(ModelError::MissingWeights {
            dir: dir.to_path_buf(),
        })
    }
}

fn load_sharded(dir: &Path, index: &Path, mut c: Collector) -> Result<ModelWeights, ModelError> {
    let weight_map = read_weight_map(index)?;
    let bad_index = |reason: String| ModelError::InvalidIndex {
        path: index.to_path_buf(),
        reason,
    };
    let shard_names: BTreeSet<&str> = weight_map.values().map(String::as_str).collect();
    // Map every shard first (only headers are read here), so that the index
    // can be checked against what the shards hold before anything is converted.
    let mut maps = Vec::with_capacity(shard_names.len());
    for shard in shard_names {
        let path = dir.join(shard);
        if !path.exists() {
            return Err(ModelError::MissingShard {
                index: index.to_path_buf(),
                shard: path,
            });
        }
        let map = map_file(&path)?;
        maps.push((shard, path, map));
    }
    let mut shards = Vec::with_capacity(maps.len());
    let mut stored: HashMap<String, usize> = HashMap::new();
    for (k, (shard, path, map)) in maps.iter().enumerate() {
        let st = parse_safetensors(path, map)?;
        let names = sorted_names(&st);
        for name in &names {
            if let Some(&other) = stored.get(name.as_str()) {
                return Err(ModelError::DuplicateTensor {
                    path: path.clone(),
                    tensor: name.to_string(),
                    other: maps[other].1.clone(),
                });
            }
            stored.insert(name.clone(), k);
            match weight_map.get(name) {
                Some(s) if s == shard => {}
                Some(other) => {
                    return Err(bad_index(format!(
                        "weight_map puts tensor `{name}` in {other}, but it is stored in {shard}"
                    )))
                }
                None => {
                    return Err(bad_index(format!(
                        "tensor `{name}` is stored in {shard}, but weight_map does not list it"
                    )))
                }
            }
        }
        shards.push((path, st, names));
    }
    let mut listed: Vec<(&String, &String)> = weight_map.iter().collect();
    listed.sort_unstable();
    for (name, shard) in listed {
        if !stored.contains_key(name.as_str()) {
            return Err(bad_index(format!(
                "weight_map lists tensor `{name}` in {shard}, which does not contain it"
            )));
        }
    }
    for (path, st, names) in &shards {
        c.take_file(path, st, names)?;
    }
    c.finish(index)
}

/// The index's `weight_map`: tensor name -> shard file name (a plain name in
/// the same folder).
fn read_weight_map(index: &Path) -> Result<HashMap<String, String>, ModelError> {
    let v = read_json_file(index)?;
    let bad = |reason: String| ModelError::InvalidIndex {
        path: index.to_path_buf(),
        reason,
    };
    let Some(map) = v.get("weight_map") else {
        return Err(bad("missing field `weight_map`".into()));
    };
    let Value::Object(map) = map else {
        return Err(bad(format!(
            "field `weight_map` should be an object, found {}",
            describe(map)
        )));
    };
    let mut out = HashMap::with_capacity(map.len());
    for (tensor, shard) in map {
        let Value::String(shard) = shard else {
            return Err(bad(format!(
                "weight_map[`{tensor}`] should be a file name, found {}",
                describe(shard)
            )));
        };
        let plain = !shard.is_empty()
            && shard != "."
            && shard != ".."
            && !shard.contains('/')
            && !shard.contains('\\');
        if !plain {
            return Err(bad(format!(
                "weight_map[`{tensor}`] = {shard:?} is not a file name in the model folder"
            )));
        }
        out.insert(tensor.clone(), shard.clone());
    }
    if out.is_empty() {
        return Err(bad("`weight_map` is empty".into()));
    }
    Ok(out)
}

fn map_file(path: &Path) -> Result<Mmap, ModelError> {
    let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    // SAFETY: the map is only read. As with every memory-mapped safetensors
    // loader, a file truncated by another process while mapped would fault.
    unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))
}

fn parse_safetensors<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>, ModelError> {
    SafeTensors::deserialize(bytes).map_err(|e| ModelError::Safetensors {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn sorted_names(st: &SafeTensors<'_>) -> Vec<String> {
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort_unstable();
    names
}

/// Checks and converts tensors as files are read, then assembles the model.
struct Collector<'c> {
    cfg: &'c ModelConfig,
    specs: Vec<TensorSpec>,
    by_name: HashMap<String, usize>,
    data: Vec<Option<Vec<f32>>>,
    source: Vec<Option<PathBuf>>,
}

enum Role {
    Param(usize),
    Ignored,
}

impl<'c> Collector<'c> {
    fn new(cfg: &'c ModelConfig) -> Self {
        let specs = tensor_layout(cfg);
        let by_name = specs
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), i))
            .collect();
        let n = specs.len();
        Collector {
            cfg,
            specs,
            by_name,
            data: vec![None; n],
            source: vec![None; n],
        }
    }

    /// What a stored tensor is for; errors on tensors that do not belong.
    fn role(&self, path: &Path, name: &str, view: &TensorView) -> Result<Role, ModelError> {
        let vocab = [self.cfg.vocab_size, self.cfg.hidden_size];
        if self.cfg.tie_word_embeddings && name == LM_HEAD {
            // Some exporters store the tied lm_head too; HF re-ties it to the
            // embeddings, so it is ignored here (its shape must still fit).
            check_shape(path, name, &vocab, view.shape())?;
            check_dtype(path, name, view.dtype())?;
            return Ok(Role::Ignored);
        }
        if name.ends_with(".self_attn.rotary_emb.inv_freq") {
            // A RoPE buffer older Llama exports saved; HF ignores it too.
            return Ok(Role::Ignored);
        }
        let Some(&i) = self.by_name.get(name) else {
            return Err(ModelError::UnexpectedTensor {
                path: path.to_path_buf(),
                tensor: name.to_string(),
                arch: self.cfg.arch.hf_class().into(),
            });
        };
        if let Some(other) = &self.source[i] {
            return Err(ModelError::DuplicateTensor {
                path: path.to_path_buf(),
                tensor: name.to_string(),
                other: other.clone(),
            });
        }
        check_shape(path, name, &self.specs[i].shape, view.shape())?;
        check_dtype(path, name, view.dtype())?;
        Ok(Role::Param(i))
    }

    /// Checks every tensor of one file first, then converts them.
    fn take_file(
        &mut self,
        path: &Path,
        st: &SafeTensors,
        names: &[String],
    ) -> Result<(), ModelError> {
        let mut todo = Vec::with_capacity(names.len());
        for name in names {
            let view = st.tensor(name).map_err(|e| ModelError::Safetensors {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
            if let Role::Param(i) = self.role(path, name, &view)? {
                self.source[i] = Some(path.to_path_buf());
                todo.push((i, view));
            }
        }
        for (i, view) in todo {
            self.data[i] = Some(to_f32(&view));
        }
        Ok(())
    }

    /// Assembles the model; `path` names where a missing tensor was expected.
    fn finish(self, path: &Path) -> Result<ModelWeights, ModelError> {
        if let Some(i) = self.data.iter().position(Option::is_none) {
            return Err(ModelError::MissingTensor {
                path: path.to_path_buf(),
                tensor: self.specs[i].name.clone(),
            });
        }
        let mut w = ModelWeights::empty(self.cfg);
        for ((_, slot), data) in w.tensors_mut().into_iter().zip(self.data) {
            *slot = data.unwrap_or_default();
        }
        Ok(w)
    }
}

fn check_shape(
    path: &Path,
    name: &str,
    expected: &[usize],
    found: &[usize],
) -> Result<(), ModelError> {
    if expected == found {
        Ok(())
    } else {
        Err(ModelError::WrongShape {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            expected: expected.to_vec(),
            found: found.to_vec(),
        })
    }
}

fn check_dtype(path: &Path, name: &str, dtype: Dtype) -> Result<(), ModelError> {
    match dtype {
        Dtype::F32 | Dtype::F16 | Dtype::BF16 => Ok(()),
        other => Err(ModelError::UnsupportedDtype {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            dtype: other.to_string(),
        }),
    }
}

/// Converts a checked F32/F16/BF16 tensor (little-endian, as safetensors stores it).
fn to_f32(view: &TensorView) -> Vec<f32> {
    let bytes = view.data();
    match view.dtype() {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        // `check_dtype` ran first; nothing else reaches here.
        _ => Vec::new(),
    }
}
