//! A loopback HTTP proxy in front of the Kubernetes API under test that can delay one request
//! while the others flow, add latency to every request, or hang everything. A client is pointed
//! at it with [`ApiProxy::kubeconfig`] (plain HTTP on loopback); the proxy reaches the API server
//! with the credentials of the test kubeconfig, through kube's own client.
//!
//! Why not a TCP relay: a relay hangs whole connections, and so every request queued on them.
//! To make a single status write time out at its client and land late, after newer writes (as a
//! slow API server or a stuck load balancer can do to one request), the proxy must see requests.
//! A held request is sent on by a task of its own, so it lands even after its client gave up.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch, Notify};
use tokio::task::JoinSet;

type ProxyBody = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

/// Which requests a [`Hold`] catches: the method, a piece of the path (with its query), and
/// whether it is a status write (`…/status`): `None` catches either.
#[derive(Clone, Debug)]
pub struct Matcher {
    pub method: &'static str,
    pub path_contains: String,
    pub status: Option<bool>,
}

impl Matcher {
    fn matches<B>(&self, request: &Request<B>) -> bool {
        let path = request.uri().path_and_query().map_or("", |p| p.as_str());
        let status = request.uri().path().ends_with("/status");
        request.method().as_str() == self.method
            && path.contains(&self.path_contains)
            && self.status.is_none_or(|wanted| wanted == status)
    }
}

/// One request held back: see [`ApiProxy::hold_next`].
pub struct Hold {
    caught: Arc<Notify>,
    caught_flag: Arc<Mutex<bool>>,
    delivered: Option<oneshot::Receiver<u16>>,
    release: watch::Sender<bool>,
}

impl Hold {
    /// Waits until a request matched (at most `within`); false if none did.
    pub async fn caught(&self, within: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.caught.notified();
                if *self.caught_flag.lock() {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }

    /// Sends the held request on now; answers the API server's status code for it.
    pub async fn deliver(mut self, within: Duration) -> Option<u16> {
        self.release.send_replace(true);
        let delivered = self.delivered.take()?;
        tokio::time::timeout(within, delivered).await.ok()?.ok()
    }
}

struct Pending {
    matcher: Matcher,
    caught: Arc<Notify>,
    caught_flag: Arc<Mutex<bool>>,
    release: watch::Receiver<bool>,
    delivered: oneshot::Sender<u16>,
}

#[derive(Default)]
struct Faults {
    holds: Vec<Pending>,
    latency: Duration,
}

/// The proxy; it stops when dropped.
pub struct ApiProxy {
    addr: SocketAddr,
    faults: Arc<Mutex<Faults>>,
    hung: watch::Sender<bool>,
    _tasks: JoinSet<()>,
}

impl ApiProxy {
    /// Listens on a free loopback port; forwards to the API server of `kubeconfig`.
    pub async fn start(kubeconfig: &Path) -> ApiProxy {
        let upstream = crate::kube::client_for(kubeconfig).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("API proxy cannot bind: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("API proxy has no address: {e}"));
        let faults = Arc::new(Mutex::new(Faults::default()));
        let (hung, _) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let (shared_faults, shared_hung) = (faults.clone(), hung.clone());
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                // As the API server's own sockets: no Nagle (a held write waits for a delayed ACK).
                // A socket that refuses the option still serves, only slower.
                let _ = stream.set_nodelay(true);
                let (upstream, faults, hung) = (upstream.clone(), shared_faults.clone(), shared_hung.subscribe());
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        forward(upstream.clone(), faults.clone(), hung.clone(), request)
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    // A client that goes away ends its connection; nothing to report.
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        ApiProxy { addr, faults, hung, _tasks: tasks }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig (written into `dir`) whose server is this proxy.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join(format!("api-proxy-{}.kubeconfig", self.addr.port()));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: http://{}\nusers:\n- name: \
             proxy\n  user: {{}}\ncontexts:\n- name: proxy\n  context: {{cluster: proxy, user: proxy, namespace: \
             default}}\ncurrent-context: proxy\n",
            self.addr
        );
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        path
    }

    /// Holds the next request `matcher` catches until [`Hold::deliver`]; others flow meanwhile.
    pub fn hold_next(&self, matcher: Matcher) -> Hold {
        let (release, release_rx) = watch::channel(false);
        let (delivered_tx, delivered) = oneshot::channel();
        let caught = Arc::new(Notify::new());
        let caught_flag = Arc::new(Mutex::new(false));
        self.faults.lock().holds.push(Pending {
            matcher,
            caught: caught.clone(),
            caught_flag: caught_flag.clone(),
            release: release_rx,
            delivered: delivered_tx,
        });
        Hold { caught, caught_flag, delivered: Some(delivered), release }
    }

    /// Every request from now on is sent this much later.
    pub fn set_latency(&self, latency: Duration) {
        self.faults.lock().latency = latency;
    }

    /// While on, no request is sent on and no answer comes back (also of watches under way).
    pub fn set_hung(&self, on: bool) {
        self.hung.send_replace(on);
    }
}

async fn forward(
    upstream: kube::Client,
    faults: Arc<Mutex<Faults>>,
    hung: watch::Receiver<bool>,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, std::convert::Infallible> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Ok(status(502, &format!("reading the request: {e}"))),
    };
    let mut request = Request::from_parts(parts, ());
    for hop in ["host", "connection", "keep-alive", "transfer-encoding", "upgrade"] {
        request.headers_mut().remove(hop);
    }
    let (hold, latency) = {
        let mut faults = faults.lock();
        let held = faults.holds.iter().position(|h| h.matcher.matches(&request)).map(|i| faults.holds.remove(i));
        (held, faults.latency)
    };
    let (parts, ()) = request.into_parts();
    let request = Request::from_parts(parts, kube::client::Body::from(body.to_vec()));
    let (answer_tx, answer) = oneshot::channel();
    let gate = hung.clone();
    // Its own task: a held request is sent on even after its client gave up on it.
    tokio::spawn(async move {
        if let Some(mut hold) = hold {
            *hold.caught_flag.lock() = true;
            hold.caught.notify_waiters();
            let _ = hold.release.wait_for(|released| *released).await;
            let answer = upstream.send(request).await;
            let code = answer.as_ref().map_or(502, |r| r.status().as_u16());
            let _ = hold.delivered.send(code);
            let _ = answer_tx.send(answer);
            return;
        }
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut gate = gate;
        let _ = gate.wait_for(|on| !*on).await;
        let _ = answer_tx.send(upstream.send(request).await);
    });
    let response = match answer.await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => return Ok(status(502, &format!("the API server: {e}"))),
        Err(_) => return Ok(status(502, "the proxy's request task ended")),
    };
    let (mut parts, body) = response.into_parts();
    for hop in ["connection", "keep-alive", "transfer-encoding"] {
        parts.headers.remove(hop);
    }
    // The answer's frames pass the same gate: a hang stops watches under way too.
    let frames = body.into_data_stream().then(move |chunk| {
        let mut gate = hung.clone();
        async move {
            let _ = gate.wait_for(|on| !*on).await;
            chunk.map(Frame::data).map_err(|e| std::io::Error::other(e.to_string()))
        }
    });
    Ok(Response::from_parts(parts, BodyExt::boxed_unsync(StreamBody::new(frames))))
}

fn status(code: u16, message: &str) -> Response<ProxyBody> {
    let body =
        http_body_util::Full::new(Bytes::from(message.to_string())).map_err(|never| match never {}).boxed_unsync();
    let mut response = Response::new(body);
    *response.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    response
}
