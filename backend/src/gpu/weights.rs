//! A model's tensors on the device, in the order of `ModelWeights::tensors`
//! (weights, gradients and AdamW moments all use this one layout).

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::{CudaError, Gpu, Result};

use crate::model::ModelWeights;

/// Copy `bufs` (one a tensor, in `w`'s order) into `w`'s tensors; a length that
/// differs is an error naming the tensor (after `what`: "", "gradient of ").
pub(super) fn download_tensors(
    gpu: &Gpu,
    bufs: &[&CudaSlice<f32>],
    w: &mut ModelWeights,
    what: &str,
) -> Result<()> {
    for ((name, t), b) in w.tensors_mut().into_iter().zip(bufs) {
        let host = gpu.download(b)?;
        if host.len() != t.len() {
            return Err(CudaError::Invalid(format!(
                "{what}{name}: device copy holds {} values, host {}",
                host.len(),
                t.len()
            )));
        }
        *t = host;
    }
    Ok(())
}

/// Where one layer's tensors sit in [`GpuWeights::bufs`].
#[derive(Clone, Debug)]
pub struct LayerIx {
    pub input_layernorm: usize,
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub o: usize,
    pub q_bias: Option<usize>,
    pub k_bias: Option<usize>,
    pub v_bias: Option<usize>,
    pub q_norm: Option<usize>,
    pub k_norm: Option<usize>,
    pub post_attention_layernorm: usize,
    pub gate: usize,
    pub up: usize,
    pub down: usize,
}

/// Indices of every tensor by role.
#[derive(Clone, Debug)]
pub struct Index {
    pub embed: usize,
    pub layers: Vec<LayerIx>,
    pub norm: usize,
    /// `None` when the LM head is tied to the embedding.
    pub lm_head: Option<usize>,
}

impl Index {
    fn new(names: &[String]) -> Result<Index> {
        let find = |n: &str| names.iter().position(|x| x == n);
        let need = |n: &str| {
            find(n).ok_or_else(|| CudaError::Invalid(format!("device weights lack tensor {n}")))
        };
        let mut layers = Vec::new();
        for i in 0.. {
            let p = |f: &str| format!("model.layers.{i}.{f}");
            if find(&p("input_layernorm.weight")).is_none() {
                break;
            }
            layers.push(LayerIx {
                input_layernorm: need(&p("input_layernorm.weight"))?,
                q: need(&p("self_attn.q_proj.weight"))?,
                k: need(&p("self_attn.k_proj.weight"))?,
                v: need(&p("self_attn.v_proj.weight"))?,
                o: need(&p("self_attn.o_proj.weight"))?,
                q_bias: find(&p("self_attn.q_proj.bias")),
                k_bias: find(&p("self_attn.k_proj.bias")),
                v_bias: find(&p("self_attn.v_proj.bias")),
                q_norm: find(&p("self_attn.q_norm.weight")),
                k_norm: find(&p("self_attn.k_norm.weight")),
                post_attention_layernorm: need(&p("post_attention_layernorm.weight"))?,
                gate: need(&p("mlp.gate_proj.weight"))?,
                up: need(&p("mlp.up_proj.weight"))?,
                down: need(&p("mlp.down_proj.weight"))?,
            });
        }
        Ok(Index {
            embed: need(crate::model::weights::EMBED_TOKENS)?,
            layers,
            norm: need(crate::model::weights::FINAL_NORM)?,
            lm_head: find(crate::model::weights::LM_HEAD),
        })
    }
}

/// Device copies of every tensor (f32), named as in the HF files.
pub struct GpuWeights {
    pub names: Vec<String>,
    pub bufs: Vec<CudaSlice<f32>>,
    pub ix: Index,
}

impl GpuWeights {
    /// Upload host weights.
    pub fn upload(gpu: &Gpu, w: &ModelWeights) -> Result<GpuWeights> {
        let mut names = Vec::new();
        let mut bufs = Vec::new();
        for (n, t) in w.tensors() {
            names.push(n);
            bufs.push(gpu.upload(t)?);
        }
        let ix = Index::new(&names)?;
        Ok(GpuWeights { names, bufs, ix })
    }

    /// Zeros with the layout of `like` (gradients, moments).
    pub fn zeros_like(gpu: &Gpu, like: &GpuWeights) -> Result<GpuWeights> {
        let bufs = like
            .bufs
            .iter()
            .map(|b| gpu.zeros(b.len()))
            .collect::<Result<Vec<_>>>()?;
        Ok(GpuWeights {
            names: like.names.clone(),
            bufs,
            ix: like.ix.clone(),
        })
    }

    /// Overwrite every tensor with the host's `w` (same layout), in place: a
    /// restore must not need a second copy of the model on the device.
    pub fn copy_from_host(&mut self, gpu: &Gpu, w: &ModelWeights) -> Result<()> {
        let host = w.tensors();
        if host.len() != self.bufs.len() {
            return Err(CudaError::Invalid(format!(
                "host weights have {} tensors, the device copy {}",
                host.len(),
                self.bufs.len()
            )));
        }
        for ((name, t), b) in host.into_iter().zip(&mut self.bufs) {
            if t.len() != b.len() {
                return Err(CudaError::Invalid(format!(
                    "{name}: host holds {} values, the device copy {}",
                    t.len(),
                    b.len()
                )));
            }
            gpu.stream()
                .memcpy_htod(t, b)
                .map_err(|e| CudaError::Driver {
                    what: format!("copying {name} to the device"),
                    err: e.to_string(),
                })?;
        }
        Ok(())
    }

    /// Copy every tensor back into `w` (same layout).
    pub fn download_into(&self, gpu: &Gpu, w: &mut ModelWeights) -> Result<()> {
        let bufs: Vec<&CudaSlice<f32>> = self.bufs.iter().collect();
        download_tensors(gpu, &bufs, w, "")
    }

    /// The output projection `[vocab, hidden]`: lm_head, or the embedding when tied.
    pub fn lm_head(&self) -> &CudaSlice<f32> {
        &self.bufs[self.ix.lm_head.unwrap_or(self.ix.embed)]
    }

    pub fn t(&self, i: usize) -> &CudaSlice<f32> {
        &self.bufs[i]
    }

    pub fn opt(&self, i: Option<usize>) -> Option<&CudaSlice<f32>> {
        i.map(|i| &self.bufs[i])
    }
}

impl GpuWeights {
    /// Random weights for `cfg` made on the device (benchmarks of large shapes,
    /// where a host init would dominate): matrices uniform with the std of
    /// `init_random`, norms 1, biases 0.
    pub fn random(gpu: &Gpu, cfg: &crate::model::ModelConfig, seed: u32) -> Result<GpuWeights> {
        use crate::model::weights::{tensor_layout, TensorKind};
        let amp = (crate::model::init::INIT_STD * 3f64.sqrt()) as f32;
        let mut names = Vec::new();
        let mut bufs = Vec::new();
        for (i, spec) in tensor_layout(cfg).into_iter().enumerate() {
            let n = spec.numel();
            let mut b = gpu.zeros::<f32>(n)?;
            match spec.kind {
                TensorKind::Norm => jet_kernels::cuda::tensor::fill(gpu, &mut b, n, 1.0)?,
                TensorKind::Bias => {}
                TensorKind::Embedding | TensorKind::Matrix => {
                    jet_kernels::cuda::quantize::fill_random(
                        gpu,
                        &mut b,
                        seed ^ (i as u32) << 8,
                        amp,
                    )?
                }
            }
            names.push(spec.name);
            bufs.push(b);
        }
        let ix = Index::new(&names)?;
        Ok(GpuWeights { names, bufs, ix })
    }
}
