//! The jetd client: connect to the Unix socket, check the hello, send requests
//! and match replies by id, and iterate over the pushes of a subscription.
//!
//! One reader thread per connection turns lines into [`Incoming`] messages on an
//! mpsc channel; the console plugs its own channel in (see [`Conn::open`]), the
//! scriptable commands use the blocking [`Client`].

use std::collections::VecDeque;
use std::fmt;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use jet_proto::{Hello, HelloBody, Op, Push, Reply, Request, Snapshot, PROTOCOL_VERSION};
use serde_json::Value;

/// Where the socket is when neither `--socket` nor `--data-dir` says otherwise.
pub fn socket_path(socket: Option<&Path>, data_dir: Option<&Path>) -> PathBuf {
    match (socket, data_dir) {
        (Some(s), _) => s.to_path_buf(),
        (None, Some(d)) => d.join(jet_proto::SOCKET_NAME),
        (None, None) => Path::new("runs").join(jet_proto::SOCKET_NAME),
    }
}

/// What can go wrong talking to jetd; the Display text is what the user sees.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientError {
    /// No socket file at the path.
    NotRunning(PathBuf),
    /// A socket file, but nobody listens (jetd died without cleaning up).
    Refused(PathBuf),
    /// Any other failure to connect (permissions, not a socket, ...).
    Connect(PathBuf, String),
    /// The first line was not a hello.
    NoHello(String),
    /// The server speaks another protocol version.
    Version {
        server: u32,
        server_name: String,
    },
    /// The server wants a token first (TCP only; jetctl speaks Unix sockets).
    AuthRequired,
    /// No reply in time.
    Timeout {
        op: String,
        after: Duration,
    },
    /// The connection closed (jetd stopped or restarted).
    Closed,
    /// A line that is not part of the protocol.
    Protocol(String),
    /// The server answered with `ok: false`.
    Server {
        code: String,
        message: String,
    },
    Io(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::NotRunning(p) => write!(f, "jetd is not running (no socket at {})", p.display()),
            ClientError::Refused(p) => {
                write!(f, "jetd is not running (stale socket at {}: connection refused)", p.display())
            }
            ClientError::Connect(p, e) => write!(f, "cannot connect to jetd at {}: {e}", p.display()),
            ClientError::NoHello(got) => write!(f, "the server sent no jetd hello (got: {got})"),
            ClientError::Version { server, server_name } => write!(
                f,
                "{server_name} speaks protocol {server}, this jetctl speaks protocol {PROTOCOL_VERSION}: \
                 use a jetctl built with the same version as jetd"
            ),
            ClientError::AuthRequired => write!(f, "jetd requires a token on this connection (jetctl speaks the Unix socket only)"),
            ClientError::Timeout { op, after } => {
                write!(f, "jetd did not answer '{op}' within {:.1} s", after.as_secs_f64())
            }
            ClientError::Closed => write!(f, "jetd closed the connection (it stopped or restarted)"),
            ClientError::Protocol(m) => write!(f, "protocol error: {m}"),
            ClientError::Server { message, .. } => write!(f, "{message}"),
            ClientError::Io(m) => write!(f, "I/O error talking to jetd: {m}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// One line received from the server after the hello.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    Reply(Reply),
    Push(Push),
    /// A line that could not be understood (kept going: a newer server may add pushes).
    Bad(String),
    /// The connection ended (reason when it was an error).
    Closed(Option<String>),
}

/// Parse one line the server sent (not the hello).
pub fn parse_incoming(line: &str) -> Incoming {
    let v: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return Incoming::Bad(format!("not JSON: {e}")),
    };
    if v.get("push").is_some() {
        match serde_json::from_value::<Push>(v) {
            Ok(p) => Incoming::Push(p),
            Err(e) => Incoming::Bad(format!("bad push: {e}")),
        }
    } else if v.get("id").is_some() {
        match serde_json::from_value::<Reply>(v) {
            Ok(r) => Incoming::Reply(r),
            Err(e) => Incoming::Bad(format!("bad reply: {e}")),
        }
    } else {
        Incoming::Bad(format!("neither a reply nor a push: {}", clip(line, 80)))
    }
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(n).collect::<String>())
    }
}

/// Name of an op as it travels (`"pause"`, `"subscribe"`, ...).
pub fn op_name(op: &Op) -> String {
    serde_json::to_value(op)
        .ok()
        .and_then(|v| v.get("op").and_then(|o| o.as_str()).map(str::to_string))
        .unwrap_or_else(|| "request".into())
}

/// The write half of a connection plus what the hello said.
pub struct Conn {
    stream: UnixStream,
    pub hello: HelloBody,
    pub path: PathBuf,
}

impl Conn {
    /// Connect, read and check the hello (within `timeout`), then start a reader
    /// thread that sends every further line through `wrap` into `tx`.
    pub fn open<M: Send + 'static>(
        path: &Path,
        timeout: Duration,
        tx: Sender<M>,
        wrap: impl Fn(Incoming) -> M + Send + 'static,
    ) -> Result<Conn, ClientError> {
        let stream = UnixStream::connect(path).map_err(|e| match e.kind() {
            ErrorKind::NotFound => ClientError::NotRunning(path.to_path_buf()),
            ErrorKind::ConnectionRefused => ClientError::Refused(path.to_path_buf()),
            _ => ClientError::Connect(path.to_path_buf(), e.to_string()),
        })?;
        let io = |e: std::io::Error| ClientError::Io(e.to_string());
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        let mut reader = BufReader::new(stream.try_clone().map_err(io)?);
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => return Err(ClientError::Closed),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(ClientError::NoHello(format!(
                    "nothing within {:.1} s",
                    timeout.as_secs_f64()
                )))
            }
            Err(e) => return Err(io(e)),
        }
        let hello: Hello = serde_json::from_str(line.trim_end())
            .map_err(|_| ClientError::NoHello(clip(line.trim_end(), 80)))?;
        if hello.hello.protocol != PROTOCOL_VERSION {
            return Err(ClientError::Version {
                server: hello.hello.protocol,
                server_name: hello.hello.server,
            });
        }
        if hello.hello.auth_required {
            return Err(ClientError::AuthRequired);
        }
        stream.set_read_timeout(None).map_err(io)?;
        std::thread::Builder::new()
            .name("jetd-reader".into())
            .spawn(move || read_loop(reader, tx, wrap))
            .map_err(io)?;
        Ok(Conn {
            stream,
            hello: hello.hello,
            path: path.to_path_buf(),
        })
    }

    /// Send one request line.
    pub fn send(&mut self, req: &Request) -> Result<(), ClientError> {
        let mut line =
            serde_json::to_string(req).map_err(|e| ClientError::Protocol(e.to_string()))?;
        line.push('\n');
        self.stream
            .write_all(line.as_bytes())
            .map_err(|e| match e.kind() {
                ErrorKind::BrokenPipe | ErrorKind::ConnectionReset => ClientError::Closed,
                _ => ClientError::Io(e.to_string()),
            })
    }

    /// Close both directions; the reader thread then ends.
    pub fn close(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.close();
    }
}

fn read_loop<M>(mut reader: BufReader<UnixStream>, tx: Sender<M>, wrap: impl Fn(Incoming) -> M) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let msg = match reader.read_until(b'\n', &mut buf) {
            Ok(0) => Incoming::Closed(None),
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end();
                if line.is_empty() {
                    continue;
                }
                parse_incoming(line)
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => Incoming::Closed(Some(e.to_string())),
        };
        let last = matches!(msg, Incoming::Closed(_));
        if tx.send(wrap(msg)).is_err() || last {
            return;
        }
    }
}

/// A blocking client for one-shot commands.
pub struct Client {
    conn: Conn,
    rx: Receiver<Incoming>,
    next_id: u64,
    pushes: VecDeque<Push>,
    timeout: Duration,
    closed: bool,
}

impl Client {
    pub fn connect(path: &Path, timeout: Duration) -> Result<Client, ClientError> {
        let (tx, rx) = mpsc::channel();
        let conn = Conn::open(path, timeout, tx, |m| m)?;
        Ok(Client {
            conn,
            rx,
            next_id: 1,
            pushes: VecDeque::new(),
            timeout,
            closed: false,
        })
    }

    /// The server's name from its hello (`jetd 0.1.0`).
    pub fn server(&self) -> &str {
        &self.conn.hello.server
    }

    /// Send `op` and wait for the reply with the same id; pushes arriving meanwhile
    /// are kept for [`Subscription`].
    pub fn request(&mut self, op: Op) -> Result<Value, ClientError> {
        let name = op_name(&op);
        let id = self.next_id;
        self.next_id += 1;
        if self.closed {
            return Err(ClientError::Closed);
        }
        self.conn.send(&Request { id, op })?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Incoming::Reply(r)) if r.id == id => return reply_result(r),
                Ok(Incoming::Reply(_)) | Ok(Incoming::Bad(_)) => {}
                Ok(Incoming::Push(p)) => self.pushes.push_back(p),
                Ok(Incoming::Closed(_)) | Err(RecvTimeoutError::Disconnected) => {
                    self.closed = true;
                    return Err(ClientError::Closed);
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(ClientError::Timeout {
                        op: name,
                        after: self.timeout,
                    })
                }
            }
        }
    }

    /// Send `op` and decode the result as `T`.
    pub fn call<T: serde::de::DeserializeOwned>(&mut self, op: Op) -> Result<T, ClientError> {
        let name = op_name(&op);
        let v = self.request(op)?;
        serde_json::from_value(v)
            .map_err(|e| ClientError::Protocol(format!("result of '{name}': {e}")))
    }

    /// Subscribe (to one run, or to all runs with `None`): the snapshot and an
    /// iterator over the pushes that follow.
    pub fn subscribe(
        &mut self,
        run: Option<String>,
    ) -> Result<(Snapshot, Subscription<'_>), ClientError> {
        let snap: Snapshot = self.call(Op::Subscribe { run })?;
        Ok((snap, Subscription { client: self }))
    }
}

fn reply_result(r: Reply) -> Result<Value, ClientError> {
    if r.ok {
        Ok(r.result.unwrap_or(Value::Null))
    } else {
        let e = r.error.unwrap_or(jet_proto::ErrorBody {
            code: "internal".into(),
            message: "request failed".into(),
        });
        Err(ClientError::Server {
            code: e.code,
            message: e.message,
        })
    }
}

/// The pushes after a subscribe, in order; ends when the connection closes.
pub struct Subscription<'a> {
    client: &'a mut Client,
}

impl Iterator for Subscription<'_> {
    type Item = Push;
    fn next(&mut self) -> Option<Push> {
        if let Some(p) = self.client.pushes.pop_front() {
            return Some(p);
        }
        if self.client.closed {
            return None;
        }
        loop {
            match self.client.rx.recv() {
                Ok(Incoming::Push(p)) => return Some(p),
                Ok(Incoming::Reply(_)) | Ok(Incoming::Bad(_)) => {}
                Ok(Incoming::Closed(_)) | Err(_) => {
                    self.client.closed = true;
                    return None;
                }
            }
        }
    }
}
