//! The GPUs this jetd serves: chosen at start (`--gpus`), opened once with the
//! sled kernel cache attached, one compute thread each. A GPU run submitted to a
//! jetd that serves none is refused, naming what is missing.

use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::bail;
use jet_kernels::cuda::{cuda_device, cuda_device_count, Gpu, KernelStore};

use crate::store::Store;

/// What `--gpus` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuChoice {
    /// Every GPU the driver sees (the default); none is fine (CPU runs only).
    All,
    /// No GPU: CPU runs only, GPU runs refused at submit.
    None,
    /// These CUDA device numbers; each must exist and open.
    List(Vec<u32>),
}

impl std::str::FromStr for GpuChoice {
    type Err = String;
    /// `all`, `none`, or device numbers separated by commas (`0,1`).
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "all" => return Ok(GpuChoice::All),
            "none" => return Ok(GpuChoice::None),
            _ => {}
        }
        let mut seen = BTreeSet::new();
        let mut list = Vec::new();
        for part in s.split(',') {
            let n: u32 = part.trim().parse().map_err(|_| {
                format!("'{part}' is not a GPU number: give all, none or a list like 0,1")
            })?;
            if !seen.insert(n) {
                return Err(format!("GPU {n} is listed twice"));
            }
            list.push(n);
        }
        Ok(GpuChoice::List(list))
    }
}

/// One GPU this jetd computes on.
#[derive(Clone)]
pub struct ServedGpu {
    /// CUDA device number (after `CUDA_VISIBLE_DEVICES`).
    pub ordinal: u32,
    pub gpu: Arc<Gpu>,
    /// PCI (domain, bus, device): how NVML's samples are matched to it.
    pub pci: Option<(u32, u32, u32)>,
}

/// The GPUs served, or why there are none.
pub struct Devices {
    pub gpus: Vec<ServedGpu>,
    /// Why GPU runs cannot run here; set when `gpus` is empty.
    pub none_because: Option<String>,
}

impl Devices {
    /// No GPU, for `reason`.
    pub fn none(reason: impl Into<String>) -> Devices {
        Devices {
            gpus: vec![],
            none_because: Some(reason.into()),
        }
    }

    /// Open the GPUs of `choice` with `kernels` as their kernel cache. An explicit
    /// list that cannot be served is an error; `All` on a machine without CUDA
    /// serves none and says why.
    pub fn open(choice: &GpuChoice, kernels: Arc<dyn KernelStore>) -> anyhow::Result<Devices> {
        let wanted: Vec<u32> = match choice {
            GpuChoice::None => return Ok(Devices::none("this jetd was started with --gpus none")),
            GpuChoice::All => match cuda_device_count() {
                Ok(n) => (0..n as u32).collect(),
                Err(e) => return Ok(Devices::none(e.to_string())),
            },
            GpuChoice::List(l) => {
                let n = match cuda_device_count() {
                    Ok(n) => n,
                    Err(e) => bail!("--gpus {}: {e}", list_text(l)),
                };
                if let Some(bad) = l.iter().find(|&&g| g as usize >= n) {
                    bail!(
                        "--gpus {}: there is no GPU {bad}: the driver sees {n} (0..{})",
                        list_text(l),
                        n - 1
                    );
                }
                l.clone()
            }
        };
        let mut gpus = Vec::new();
        let mut failed = Vec::new();
        for ordinal in wanted {
            match cuda_device(ordinal as usize) {
                Ok(gpu) => {
                    gpu.set_kernel_store(kernels.clone());
                    gpus.push(ServedGpu {
                        ordinal,
                        pci: gpu.pci_location(),
                        gpu,
                    });
                }
                Err(e) if *choice == GpuChoice::All => {
                    eprintln!("jetd: GPU {ordinal} cannot be used ({e}); leaving it out");
                    failed.push(format!("GPU {ordinal}: {e}"));
                }
                Err(e) => bail!("--gpus: GPU {ordinal} cannot be used: {e}"),
            }
        }
        if gpus.is_empty() {
            return Ok(Devices::none(failed.join("; ")));
        }
        Ok(Devices {
            gpus,
            none_because: None,
        })
    }

    /// Whether a `cuda` run can be accepted; the error says why not.
    pub fn check_submit(&self, source: &str) -> Result<(), String> {
        match (&self.none_because, self.gpus.is_empty()) {
            (_, false) => Ok(()),
            (Some(why), true) => Err(format!(
                "{source}: run.device = \"cuda\", but this jetd has no GPU to run it on: {why}"
            )),
            (None, true) => Err(format!(
                "{source}: run.device = \"cuda\", but this jetd serves no GPU"
            )),
        }
    }

    /// The CUDA device number of the GPU NVML numbers `nvml_index` at `pci`.
    pub fn ordinal_of(&self, nvml_index: u32, pci: Option<(u32, u32, u32)>) -> Option<u32> {
        if let Some(p) = pci {
            if let Some(g) = self.gpus.iter().find(|g| g.pci == Some(p)) {
                return Some(g.ordinal);
            }
            if self.gpus.iter().any(|g| g.pci.is_some()) {
                return None;
            }
        }
        // Without PCI locations the numbers agree only when nothing renumbers them.
        if std::env::var_os("CUDA_VISIBLE_DEVICES").is_some() {
            return None;
        }
        self.gpus
            .iter()
            .find(|g| g.ordinal == nvml_index)
            .map(|g| g.ordinal)
    }

    /// One line for the log.
    pub fn describe(&self) -> String {
        match &self.none_because {
            Some(why) if self.gpus.is_empty() => {
                format!("CPU runs only; GPU runs are refused: {why}")
            }
            _ => format!(
                "CPU runs on the CPU, GPU runs on {}",
                self.gpus
                    .iter()
                    .map(|g| format!("GPU {} ({})", g.ordinal, g.gpu.name()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

fn list_text(l: &[u32]) -> String {
    l.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Open `store`'s kernel cache as the GPUs' kernel store.
pub fn sled_kernels(store: &Store) -> Arc<dyn KernelStore> {
    Arc::new(store.kernel_store())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_option_parses_and_names_bad_parts() {
        assert_eq!("all".parse::<GpuChoice>(), Ok(GpuChoice::All));
        assert_eq!("none".parse::<GpuChoice>(), Ok(GpuChoice::None));
        assert_eq!("0, 2".parse::<GpuChoice>(), Ok(GpuChoice::List(vec![0, 2])));
        let e = "0,x".parse::<GpuChoice>().unwrap_err();
        assert!(e.contains("'x'"), "{e}");
        let e = "1,1".parse::<GpuChoice>().unwrap_err();
        assert!(e.contains("twice"), "{e}");
        assert!("".parse::<GpuChoice>().is_err());
        assert!("-1".parse::<GpuChoice>().is_err());
    }

    #[test]
    fn no_gpu_refuses_cuda_runs_with_the_reason() {
        let d = Devices::none("libcuda.so not found: no NVIDIA driver on this machine");
        let e = d.check_submit("a.toml").unwrap_err();
        assert!(
            e.contains("a.toml") && e.contains("run.device") && e.contains("libcuda.so"),
            "{e}"
        );
        assert_eq!(d.ordinal_of(0, Some((0, 1, 0))), None);
    }
}
