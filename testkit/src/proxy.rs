//! A loopback TCP proxy between a ZooKeeper client and server that injects the two faults the
//! lock engine must survive:
//!
//! - [`Proxy::cut_after_next_create`]: forward the next contender create (EPHEMERAL_SEQUENTIAL)
//!   to the server, drop its answer and cut the connection. The server applies the create; the
//!   client sees a connection loss and cannot know whether it did.
//! - [`Proxy::set_blackhole`]: close every connection and refuse new ones until turned off, long
//!   enough for the session to expire.
//!
//! And a condition to measure under: [`Proxy::set_latency`] delays every request (a client in
//! another region).
//!
//! It reads the client's side of the ZooKeeper wire protocol just enough to spot creates:
//! length-prefixed frames, the first one the session handshake, every later one a request
//! header `(xid, opcode)` followed by the request body.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;

const OP_CREATE: i32 = 1;
const OP_CREATE2: i32 = 15;
const OP_CREATE_CONTAINER: i32 = 19;
const OP_CREATE_TTL: i32 = 21;
const OP_DELETE: i32 = 2;
const OP_SET_DATA: i32 = 5;
const OP_CHECK: i32 = 13;
const OP_MULTI: i32 = 14;
const CREATES: [i32; 4] = [OP_CREATE, OP_CREATE2, OP_CREATE_CONTAINER, OP_CREATE_TTL];
const EPHEMERAL_SEQUENTIAL: i32 = 3;

#[derive(Default)]
struct Control {
    cut_armed: AtomicBool,
    blackhole: AtomicBool,
    cuts: AtomicUsize,
    /// Added to every request on its way to the server, in microseconds.
    latency_micros: AtomicU64,
    connections: Mutex<Vec<JoinHandle<()>>>,
    before_multi: Mutex<Option<Hook>>,
}

/// Something to do, once, before the next multi-op reaches the server.
type Hook = Box<dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send>;

/// The proxy; it stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    control: Arc<Control>,
    acceptor: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener =
            TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("proxy cannot bind to loopback: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("proxy has no address: {e}"));
        let control = Arc::new(Control::default());
        let ctl = control.clone();
        let acceptor = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if ctl.blackhole.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let ctl2 = ctl.clone();
                let task = tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        // No Nagle on either side: a small write held until the peer's delayed
                        // ACK (40 ms on Linux) would add that to a request or an answer; the
                        // client and the server each send at once, and so must the proxy.
                        // (A socket that refuses the option still relays, only slower.)
                        let _ = (client.set_nodelay(true), server.set_nodelay(true));
                        relay(client, server, ctl2).await;
                    }
                });
                let mut connections = ctl.connections.lock();
                connections.retain(|t| !t.is_finished());
                connections.push(task);
            }
        });
        Proxy { addr, control, acceptor }
    }

    /// The connect string for a client to use, with an optional chroot (`/name` or "").
    pub fn connect_string(&self, chroot: &str) -> String {
        format!("{}{chroot}", self.addr)
    }

    /// Cut the connection right after forwarding the next ephemeral sequential create.
    pub fn cut_after_next_create(&self) {
        self.control.cut_armed.store(true, Ordering::SeqCst);
    }

    /// Runs `hook` (say, another client's write) before forwarding the next multi-op, so that
    /// it lands between the client's reads and its multi.
    pub fn before_next_multi<F, Fut>(&self, hook: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let hook: Hook = Box::new(move || Box::pin(hook()));
        *self.control.before_multi.lock() = Some(hook);
    }

    /// How many connections were cut after a create.
    pub fn cuts(&self) -> usize {
        self.control.cuts.load(Ordering::SeqCst)
    }

    /// While on, every connection is closed and new ones are refused.
    pub fn set_blackhole(&self, on: bool) {
        self.control.blackhole.store(on, Ordering::SeqCst);
        if on {
            for task in self.control.connections.lock().drain(..) {
                task.abort();
            }
        }
    }
}

impl Proxy {
    /// Delays every request on its way to the server by `latency` (0: none), so that each
    /// request's round trip takes that much longer; answers and watch events are not delayed.
    pub fn set_latency(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.control.latency_micros.store(micros, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        self.set_blackhole(true);
    }
}

async fn relay(client: TcpStream, server: TcpStream, control: Arc<Control>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let muted = Arc::new(AtomicBool::new(false));
    let muted2 = muted.clone();
    // Server to client: plain bytes, unless the answer to a cut create must be dropped.
    let downstream = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Muted, answers are dropped until the connection is cut (returning here would drop
            // the client's half and end the connection at once, before the cut).
            if muted2.load(Ordering::SeqCst) {
                continue;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    // Client to server: frame by frame, each read as it arrives (so that a latency delays each
    // request by itself, not behind the delays of those before it).
    let (frames_tx, mut frames) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        loop {
            let mut len = [0u8; 4];
            if client_rx.read_exact(&mut len).await.is_err() {
                return;
            }
            let n = i32::from_be_bytes(len).max(0) as usize;
            let mut frame = vec![0u8; n];
            if client_rx.read_exact(&mut frame).await.is_err() || frames_tx.send((Instant::now(), len, frame)).is_err()
            {
                return;
            }
        }
    });
    let mut first = true;
    while let Some((arrived, len, frame)) = frames.recv().await {
        let latency = Duration::from_micros(control.latency_micros.load(Ordering::SeqCst));
        tokio::time::sleep_until(arrived + latency).await;
        if !first && is_multi(&frame) {
            let hook = control.before_multi.lock().take();
            if let Some(hook) = hook {
                hook().await;
            }
        }
        let cut = !first && is_contender_create(&frame) && control.cut_armed.swap(false, Ordering::SeqCst);
        first = false;
        if cut {
            muted.store(true, Ordering::SeqCst);
            // Counted now: the client may see the cut, and ask, as soon as it comes.
            control.cuts.fetch_add(1, Ordering::SeqCst);
        }
        // The frame in one write, as the client sent it: its length alone in a segment of its
        // own would be a request the server waits on for the rest.
        let whole = [&len[..], &frame[..]].concat();
        if server_tx.write_all(&whole).await.is_err() {
            break;
        }
        if cut {
            // Give the server time to read and apply the request before the connection goes.
            tokio::time::sleep(Duration::from_millis(100)).await;
            break;
        }
    }
    downstream.abort();
    reader.abort();
}

/// Whether a request frame creates an EPHEMERAL_SEQUENTIAL node, alone or in a multi-op (the
/// engine guards its creates with a check of the leader epoch).
fn is_contender_create(frame: &[u8]) -> bool {
    let mut r = Reader(frame);
    let (Some(_xid), Some(op)) = (r.int(), r.int()) else { return false };
    if op == OP_MULTI {
        return multi_creates_contender(&mut r).unwrap_or(false);
    }
    CREATES.contains(&op) && create_flags(&mut r) == Some(EPHEMERAL_SEQUENTIAL)
}

fn is_multi(frame: &[u8]) -> bool {
    let mut r = Reader(frame);
    matches!((r.int(), r.int()), (Some(_), Some(OP_MULTI)))
}

/// CreateRequest: path, data, acl vector, flags.
fn create_flags(r: &mut Reader) -> Option<i32> {
    r.buffer()?;
    r.buffer()?;
    let acls = r.int()?;
    for _ in 0..acls.max(0) {
        r.int()?;
        r.buffer()?;
        r.buffer()?;
    }
    r.int()
}

/// A multi-op: (MultiHeader type, done, err; then the operation) until a header marked done.
fn multi_creates_contender(r: &mut Reader) -> Option<bool> {
    loop {
        let op = r.int()?;
        let done = r.byte()? != 0;
        r.int()?;
        if done {
            return Some(false);
        }
        match op {
            // A TTL create carries one more field; the engine never makes one.
            _ if CREATES.contains(&op) && op != OP_CREATE_TTL => {
                if create_flags(r)? == EPHEMERAL_SEQUENTIAL {
                    return Some(true);
                }
            }
            OP_DELETE | OP_CHECK => {
                r.buffer()?;
                r.int()?;
            }
            OP_SET_DATA => {
                r.buffer()?;
                r.buffer()?;
                r.int()?;
            }
            _ => return None,
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn int(&mut self) -> Option<i32> {
        let (head, rest) = self.0.split_first_chunk::<4>()?;
        self.0 = rest;
        Some(i32::from_be_bytes(*head))
    }

    fn byte(&mut self) -> Option<u8> {
        let (head, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*head)
    }

    fn buffer(&mut self) -> Option<()> {
        let n = self.int()?;
        let n = usize::try_from(n).unwrap_or(0);
        self.0 = self.0.get(n..)?;
        Some(())
    }
}
