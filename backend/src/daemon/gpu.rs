//! GPU samples through NVML, once a second, per device, with the run that
//! computes on each.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use jet_proto::{GpuSample, Push};
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::Nvml;

use super::shared::{Shared, Slot};

fn sample(nvml: &Nvml, sh: &Shared) -> Result<Vec<GpuSample>, nvml_wrapper::error::NvmlError> {
    let mut out = Vec::new();
    for i in 0..nvml.device_count()? {
        let d = nvml.device_by_index(i)?;
        let mem = d.memory_info()?;
        let pci = d.pci_info().ok().map(|p| (p.domain, p.bus, p.device));
        let ordinal = sh.devices.ordinal_of(i, pci);
        out.push(GpuSample {
            index: i,
            name: d.name().unwrap_or_default(),
            util_pct: d.utilization_rates().map(|u| u.gpu).unwrap_or(0),
            mem_used_mib: mem.used >> 20,
            mem_total_mib: mem.total >> 20,
            power_w: d.power_usage().map(|mw| mw as f64 / 1000.0).unwrap_or(0.0),
            temp_c: d.temperature(TemperatureSensor::Gpu).unwrap_or(0),
            ordinal,
            run: ordinal.and_then(|o| sh.run_on(Slot::Gpu(o))),
        });
    }
    Ok(out)
}

/// Sample every second until shutdown; on a machine without NVIDIA's driver,
/// say "no GPU" once and stop.
pub fn run_sampler(sh: Arc<Shared>) {
    // NVML's loader can panic inside dlopen wrappers on odd systems: contain it.
    let nvml = match std::panic::catch_unwind(Nvml::init) {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            eprintln!("jetd: no GPU ({e}); GPU panel disabled");
            return;
        }
        Err(_) => {
            eprintln!("jetd: no GPU (NVML could not be loaded); GPU panel disabled");
            return;
        }
    };
    while !sh.shutdown.load(Ordering::SeqCst) {
        match sample(&nvml, &sh) {
            Ok(g) => {
                *sh.gpus.lock().unwrap() = Some(g.clone());
                sh.push(Push::Gpu { gpus: g });
            }
            Err(e) => eprintln!("jetd: NVML sample failed: {e}"),
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
