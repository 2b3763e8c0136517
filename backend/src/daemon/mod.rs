//! `jetd serve`: the daemon. Compute runs on its own threads (one for CPU runs,
//! one per GPU); tokio only does I/O.

mod conn;
mod devices;
mod exposition;
mod gpu;
mod handlers;
mod lineage;
mod metrics_http;
mod shared;
mod worker;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{bail, Context};
use jet_proto::{RunState, SOCKET_NAME};
use tokio::net::{TcpListener, UnixListener};

use crate::store::Store;
pub use devices::GpuChoice;
pub use shared::Shared;

/// Options of `jetd serve`.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub data_dir: PathBuf,
    pub socket: Option<PathBuf>,
    pub tcp: Option<String>,
    pub token_file: Option<PathBuf>,
    /// The GPUs to compute on.
    pub gpus: GpuChoice,
    /// Serve Prometheus' `GET /metrics` here (off when None).
    pub metrics_addr: Option<String>,
}

/// Refuse a data dir that others could tamper with.
fn check_data_dir(dir: &Path) -> anyhow::Result<()> {
    if !dir.exists() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create data dir {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let md = std::fs::metadata(dir).with_context(|| format!("data dir {}", dir.display()))?;
    if !md.is_dir() {
        bail!("data dir {} is not a directory", dir.display());
    }
    if md.mode() & 0o002 != 0 {
        bail!(
            "data dir {} is world-writable (mode {:o}): refusing it; chmod o-w it",
            dir.display(),
            md.mode() & 0o777
        );
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if md.uid() != me {
        bail!(
            "data dir {} is owned by uid {}, not by this user (uid {me}): refusing it",
            dir.display(),
            md.uid()
        );
    }
    Ok(())
}

/// Tidy the run folders a crash may have left untidy, in one pass:
/// - a run folder whose run is not in the registry goes (a crash between a
///   delete's durable removal and removing its folder leaves it; run ids are
///   never reused, so no later run can own it);
/// - in a registered run, checkpoint folders not in the catalog go: temporaries a
///   crash left mid-write, folders renamed into place before their catalog entry
///   was durable, and pruned ones whose durable removal a crash cut off from their
///   deletion. None is trusted or reachable; a later checkpoint at the same
///   position is written afresh.
fn clean_run_folders(dir: &Path, store: &Store) {
    let Ok(runs) = std::fs::read_dir(dir.join("runs")) else {
        return;
    };
    for r in runs.flatten() {
        let id = r.file_name().to_string_lossy().into_owned();
        if matches!(store.run(&id), Ok(None)) {
            let _ = std::fs::remove_dir_all(r.path());
            continue;
        }
        let Ok(cat) = store.checkpoints(&id) else {
            continue;
        };
        let kept: std::collections::HashSet<String> = cat
            .iter()
            .filter_map(|c| {
                Path::new(&c.info.path)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .collect();
        let Ok(cks) = std::fs::read_dir(r.path().join("checkpoints")) else {
            continue;
        };
        for c in cks.flatten() {
            if !kept.contains(c.file_name().to_string_lossy().as_ref()) {
                let _ = std::fs::remove_dir_all(c.path());
            }
        }
    }
}

pub fn serve(opts: ServeOptions) -> anyhow::Result<()> {
    check_data_dir(&opts.data_dir)?;
    let store = Store::open(&opts.data_dir)?;
    clean_run_folders(&opts.data_dir, &store);
    let devices = devices::Devices::open(&opts.gpus, devices::sled_kernels(&store))?;
    eprintln!("jetd: {}", devices.describe());
    if devices.gpus.is_empty() {
        for r in store.runs()?.iter().filter(|r| r.device == "cuda") {
            if matches!(r.state, RunState::Queued | RunState::Running) {
                eprintln!(
                    "jetd: run {} needs a GPU and this jetd serves none: it waits in the queue",
                    r.id
                );
            }
        }
    }
    let sh = Arc::new(Shared::new(opts.data_dir.clone(), store, devices));
    let token = match &opts.token_file {
        Some(p) => {
            let t = std::fs::read_to_string(p)
                .with_context(|| format!("token file {}", p.display()))?;
            let t = t.trim().to_string();
            if t.len() < 16 {
                bail!(
                    "token file {}: the token must be at least 16 characters",
                    p.display()
                );
            }
            Some(t)
        }
        None => None,
    };
    if opts.tcp.is_some() && token.is_none() {
        bail!("--tcp needs --token-file: every TCP connection must present the token");
    }
    // One compute thread for CPU runs and one per GPU: up to one run per GPU at once.
    let mut workers = vec![{
        let sh = sh.clone();
        std::thread::Builder::new()
            .name("jetd-compute".into())
            .spawn(move || worker::run_worker(sh, shared::Slot::Cpu, None))?
    }];
    for g in sh.devices.gpus.clone() {
        let sh = sh.clone();
        workers.push(
            std::thread::Builder::new()
                .name(format!("jetd-gpu{}", g.ordinal))
                .spawn(move || worker::run_worker(sh, shared::Slot::Gpu(g.ordinal), Some(g)))?,
        );
    }
    {
        let sh = sh.clone();
        std::thread::Builder::new()
            .name("jetd-nvml".into())
            .spawn(move || gpu::run_sampler(sh))?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let socket = opts
        .socket
        .clone()
        .unwrap_or_else(|| opts.data_dir.join(SOCKET_NAME));
    let res = rt.block_on(async {
        if socket.exists() {
            // A live daemon answers on it; a stale socket from a crash does not.
            if tokio::net::UnixStream::connect(&socket).await.is_ok() {
                bail!("another jetd is already serving on {}", socket.display());
            }
            std::fs::remove_file(&socket)
                .with_context(|| format!("removing stale socket {}", socket.display()))?;
        }
        let unix =
            UnixListener::bind(&socket).with_context(|| format!("binding {}", socket.display()))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
        eprintln!(
            "jetd: serving on {} (data dir {})",
            socket.display(),
            opts.data_dir.display()
        );
        if let Some(addr) = &opts.tcp {
            let tcp = TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding TCP {addr}"))?;
            eprintln!(
                "jetd: also serving on tcp://{} (token required)",
                tcp.local_addr()?
            );
            let (sh, token) = (sh.clone(), token.clone());
            tokio::spawn(async move {
                while let Ok((s, _)) = tcp.accept().await {
                    tokio::spawn(conn::serve_conn(sh.clone(), s, token.clone()));
                }
            });
        }
        if let Some(addr) = &opts.metrics_addr {
            let l = TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding --metrics-addr {addr}"))?;
            let at = l.local_addr()?;
            eprintln!("jetd: Prometheus metrics on http://{at}/metrics");
            if !at.ip().is_loopback() {
                // The exposition names runs and needs no token.
                eprintln!("jetd: note: {at} is not a loopback address: anyone who reaches it can read the metrics");
            }
            tokio::spawn(metrics_http::serve(sh.clone(), l));
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        loop {
            tokio::select! {
                a = unix.accept() => {
                    if let Ok((s, _)) = a {
                        tokio::spawn(conn::serve_conn(sh.clone(), s, None));
                    }
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        Ok(())
    });
    // Finish the current step, checkpoint, flush, exit 0.
    eprintln!("jetd: shutting down: finishing the current step");
    sh.shutdown.store(true, Ordering::SeqCst);
    sh.notify();
    for w in workers {
        let _ = w.join();
    }
    sh.store.flush()?;
    let _ = std::fs::remove_file(&socket);
    rt.shutdown_background();
    res?;
    eprintln!("jetd: stopped cleanly");
    Ok(())
}
