//! One client connection: hello, request lines, replies, subscription pushes.
//!
//! Lines are read with a hard size limit; replies and pushes go through a
//! bounded queue to a writer task, so a slow client only ever slows itself. A
//! subscriber that falls more than the push channel's capacity behind gets a
//! `resync` push and its subscription ends. Replies also hold a byte budget
//! until written: a client that sends requests without reading the answers
//! stops being read once REPLY_BUDGET bytes of answers wait for it, however
//! large each answer is (a run's metrics can be megabytes).

use std::sync::Arc;

use jet_proto::{parse_request, Hello, HelloBody, Op, Push, Reply, MAX_FRAME, PROTOCOL_VERSION};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{broadcast, mpsc, Semaphore};

use super::handlers::handle;
use super::shared::Shared;

/// Bytes of written-out-pending replies one connection may hold, in KiB.
const REPLY_BUDGET_KIB: u32 = 4 << 10;

/// A line for the writer, with the reply budget (KiB) it holds.
type Line = (String, u32);

/// Queue a reply once the connection's budget has room for it.
async fn send_reply(tx: &mpsc::Sender<Line>, budget: &Semaphore, line: String) -> bool {
    let kib = ((line.len() >> 10) as u32 + 1).min(REPLY_BUDGET_KIB);
    match budget.acquire_many(kib).await {
        Ok(p) => p.forget(),
        Err(_) => return false,
    }
    tx.send((line, kib)).await.is_ok()
}

/// Read one line of at most MAX_FRAME bytes. Ok(None) at end of stream;
/// Err(n) when the line was longer (it is consumed and discarded).
async fn read_line<R: AsyncRead + Unpin>(
    r: &mut BufReader<R>,
    buf: &mut Vec<u8>,
) -> std::io::Result<Result<bool, usize>> {
    buf.clear();
    let mut over = 0usize;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(if buf.is_empty() && over == 0 {
                Ok(false)
            } else if over > 0 {
                Err(over)
            } else {
                Ok(true)
            });
        }
        let (chunk, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (&avail[..i], Some(i + 1)),
            None => (avail, None),
        };
        if over > 0 || buf.len() + chunk.len() > MAX_FRAME {
            over += buf.len() + chunk.len();
            buf.clear();
        } else {
            buf.extend_from_slice(chunk);
        }
        let used = done.unwrap_or(avail.len());
        r.consume(used);
        if done.is_some() {
            return Ok(if over > 0 { Err(over) } else { Ok(true) });
        }
    }
}

/// Serve one connection until it closes. `token`: required first request on TCP.
pub async fn serve_conn<S>(sh: Arc<Shared>, stream: S, token: Option<String>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (rd, mut wr) = tokio::io::split(stream);
    let (tx, mut rx) = mpsc::channel::<Line>(256);
    let budget = Arc::new(Semaphore::new(REPLY_BUDGET_KIB as usize));
    let freed = budget.clone();
    let writer = tokio::spawn(async move {
        while let Some((line, kib)) = rx.recv().await {
            if wr.write_all(line.as_bytes()).await.is_err() || wr.write_all(b"\n").await.is_err() {
                break;
            }
            freed.add_permits(kib as usize);
            if rx.is_empty() && wr.flush().await.is_err() {
                break;
            }
        }
        // The client is gone: nothing waits on the budget any more.
        freed.close();
    });
    let hello = Hello {
        hello: HelloBody {
            protocol: PROTOCOL_VERSION,
            server: format!("jetd {}", env!("CARGO_PKG_VERSION")),
            auth_required: token.is_some(),
        },
    };
    let _ = tx.send((serde_json::to_string(&hello).unwrap(), 0)).await;
    let mut authed = token.is_none();
    let mut reader = BufReader::new(rd);
    let mut buf = Vec::new();
    let mut sub: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        let line = match read_line(&mut reader, &mut buf).await {
            Ok(Ok(true)) => String::from_utf8_lossy(&buf).into_owned(),
            Ok(Ok(false)) | Err(_) => break,
            Ok(Err(n)) => {
                let r = Reply::err(
                    0,
                    "too_large",
                    format!("frame of {n} bytes exceeds the limit of {MAX_FRAME}"),
                );
                send_reply(&tx, &budget, serde_json::to_string(&r).unwrap()).await;
                continue;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let req = match parse_request(&line) {
            Ok(r) => r,
            Err((id, code, msg)) => {
                let r = Reply::err(id.unwrap_or(0), code, msg);
                send_reply(&tx, &budget, serde_json::to_string(&r).unwrap()).await;
                continue;
            }
        };
        let id = req.id;
        if !authed {
            let reply = match &req.op {
                Op::Auth { token: t } if Some(t) == token.as_ref() => {
                    authed = true;
                    Reply::ok(id, serde_json::json!({"authenticated": true}))
                }
                _ => Reply::err(
                    id,
                    "unauthorized",
                    "send {\"op\":\"auth\",\"token\":...} first",
                ),
            };
            send_reply(&tx, &budget, serde_json::to_string(&reply).unwrap()).await;
            continue;
        }
        let sub_run = match &req.op {
            Op::Subscribe { run } => Some(run.clone()),
            _ => None,
        };
        // Subscribe to pushes before taking the snapshot, so nothing falls between.
        let pushes = sub_run.as_ref().map(|_| sh.pushes.subscribe());
        let sh2 = sh.clone();
        let res = tokio::task::spawn_blocking(move || handle(&sh2, req.op)).await;
        let reply = match res {
            Ok(Ok(v)) => Reply::ok(id, v),
            Ok(Err((code, msg))) => Reply::err(id, &code, msg),
            Err(e) => Reply::err(id, "internal", format!("request failed: {e}")),
        };
        let ok = reply.ok;
        if !send_reply(&tx, &budget, serde_json::to_string(&reply).unwrap()).await {
            break;
        }
        if let (Some(run), Some(rx), true) = (sub_run, pushes, ok) {
            if let Some(h) = sub.take() {
                h.abort();
            }
            sub = Some(tokio::spawn(forward(rx, tx.clone(), run)));
        }
    }
    if let Some(h) = sub {
        h.abort();
    }
    drop(tx);
    let _ = writer.await;
}

fn wants(p: &Push, run: &Option<String>) -> bool {
    let Some(run) = run else { return true };
    match p {
        Push::Metrics { run: r, .. }
        | Push::Event { run: r, .. }
        | Push::Checkpoint { run: r, .. } => r == run,
        Push::Run { .. } | Push::Gpu { .. } | Push::Resync { .. } => true,
    }
}

async fn forward(mut rx: broadcast::Receiver<Push>, tx: mpsc::Sender<Line>, run: Option<String>) {
    loop {
        match rx.recv().await {
            Ok(p) => {
                if !wants(&p, &run) {
                    continue;
                }
                // Never wait on a slow client: a full queue means resync.
                match tx.try_send((serde_json::to_string(&p).unwrap(), 0)) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        let r = Push::Resync {
                            reason: "client fell behind; subscribe again".into(),
                        };
                        let _ = tx.send((serde_json::to_string(&r).unwrap(), 0)).await;
                        return;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return,
                }
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                let r = Push::Resync {
                    reason: format!("{n} updates dropped; subscribe again"),
                };
                let _ = tx.send((serde_json::to_string(&r).unwrap(), 0)).await;
                return;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}
