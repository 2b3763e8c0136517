//! `jetd serve --metrics-addr ADDR`: a minimal HTTP/1.1 responder for
//! Prometheus (`GET /metrics`, text exposition 0.0.4). One request per
//! connection, then close: that is all a scraper needs, and it keeps the
//! responder small enough to read at a glance. Bounded: a request head over
//! 8 KiB or slower than 10 s is dropped, and at most 16 connections are served
//! at once, so a stuck client cannot pin the daemon.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::exposition::{render, RunView};
use super::shared::Shared;

const MAX_HEAD: usize = 8 << 10;
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_CONNECTIONS: usize = 16;
/// Newest metrics records read per run and scrape: enough to reach the newest
/// evaluation of any sensible `eval_every`, without reading a long run's
/// history on every scrape.
const NEWEST_RECORDS: usize = 256;
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Accept scrapes until the runtime stops.
pub async fn serve(sh: Arc<Shared>, listener: TcpListener) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    while let Ok((s, _)) = listener.accept().await {
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Over the limit: close at once rather than queue.
            drop(s);
            continue;
        };
        let sh = sh.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(HEAD_TIMEOUT, answer(sh, s)).await;
            drop(permit);
        });
    }
}

/// Read one request head and answer it.
async fn answer(sh: Arc<Shared>, mut s: TcpStream) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return respond(
                &mut s,
                "431 Request Header Fields Too Large",
                "text/plain",
                b"request head too large\n",
                true,
            )
            .await;
        }
    }
    let line = String::from_utf8_lossy(head.split(|&b| b == b'\n').next().unwrap_or(&[]));
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let with_body = method != "HEAD";
    if method != "GET" && method != "HEAD" {
        return respond(
            &mut s,
            "405 Method Not Allowed",
            "text/plain",
            b"only GET /metrics\n",
            true,
        )
        .await;
    }
    if path != "/metrics" {
        return respond(
            &mut s,
            "404 Not Found",
            "text/plain",
            b"jetd serves GET /metrics\n",
            with_body,
        )
        .await;
    }
    // sled reads are blocking: off the I/O threads.
    let body = tokio::task::spawn_blocking(move || exposition(&sh)).await;
    match body {
        Ok(Ok(text)) => respond(&mut s, "200 OK", CONTENT_TYPE, text.as_bytes(), with_body).await,
        Ok(Err(e)) => {
            let msg = format!("jetd: reading the store: {e}\n");
            respond(
                &mut s,
                "500 Internal Server Error",
                "text/plain",
                msg.as_bytes(),
                with_body,
            )
            .await
        }
        Err(_) => {
            respond(
                &mut s,
                "500 Internal Server Error",
                "text/plain",
                b"jetd: exposition failed\n",
                with_body,
            )
            .await
        }
    }
}

async fn respond(
    s: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
    with_body: bool,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    if with_body {
        s.write_all(body).await?;
    }
    s.shutdown().await
}

/// The exposition of every run in the store and the latest GPU samples.
fn exposition(sh: &Shared) -> Result<String, crate::store::StoreError> {
    let mut views = Vec::new();
    for r in sh.store.runs()? {
        let mut alarms = BTreeMap::new();
        for e in sh.store.events(&r.id, 0)? {
            if e.kind.starts_with("alarm.") || e.level == "alarm" {
                let kind = e.kind.strip_prefix("alarm.").unwrap_or(&e.kind).to_string();
                *alarms.entry(kind).or_insert(0) += 1;
            }
        }
        views.push(RunView {
            newest: sh.store.newest_live(&r.id, NEWEST_RECORDS)?,
            info: Some(r.info()),
            alarms,
        });
    }
    let gpus = sh.gpus.lock().unwrap().clone();
    Ok(render(&views, gpus.as_deref()))
}
