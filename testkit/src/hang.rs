//! A loopback TCP relay that can hang: while hung it neither reads nor forwards a byte in
//! either direction and keeps every connection open, the way a stuck load balancer or a
//! half-dead network path behaves. Used between the operator and the Kubernetes API to test
//! that a leader whose API connection hangs steps down in time.
//!
//! What was sent before or during the hang stays in the sockets' buffers and is delivered when
//! the hang ends, as a delayed network would deliver it. A client's close can be made to arrive
//! later than its last request ([`HangingRelay::delay_close`]), as when the closing segment is
//! lost and sent again: the server then serves that request instead of dropping it with the
//! connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The relay; it stops, closing every connection, when dropped.
pub struct HangingRelay {
    addr: SocketAddr,
    hung: watch::Sender<bool>,
    /// Milliseconds between a client's close and its delivery to the server.
    close_delay: Arc<AtomicU64>,
    _tasks: JoinSet<()>,
}

impl HangingRelay {
    /// Listens on a free loopback port and relays to `upstream`.
    pub async fn start(upstream: SocketAddr) -> HangingRelay {
        let listener =
            TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("relay cannot bind to loopback: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("relay has no address: {e}"));
        let (hung, _) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let states = hung.clone();
        let close_delay = Arc::new(AtomicU64::new(0));
        let delays = close_delay.clone();
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let hung = states.subscribe();
                let delay = delays.clone();
                connections.spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        relay(client, server, hung, delay).await;
                    }
                });
                // Forget the connections that ended.
                while connections.try_join_next().is_some() {}
            }
        });
        HangingRelay { addr, hung, close_delay, _tasks: tasks }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// While on, no byte moves through any connection, old or new.
    pub fn set_hung(&self, on: bool) {
        self.hung.send_replace(on);
    }

    /// From now on a client's close reaches the server `delay` after the client's last bytes.
    pub fn delay_close(&self, delay: Duration) {
        self.close_delay.store(delay.as_millis().try_into().unwrap_or(u64::MAX), Ordering::SeqCst);
    }
}

async fn relay(client: TcpStream, server: TcpStream, hung: watch::Receiver<bool>, close_delay: Arc<AtomicU64>) {
    let (client_rx, client_tx) = client.into_split();
    let (server_rx, server_tx) = server.into_split();
    tokio::join!(pump(client_rx, server_tx, hung.clone(), Some(close_delay)), pump(server_rx, client_tx, hung, None));
}

async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut hung: watch::Receiver<bool>,
    close_delay: Option<Arc<AtomicU64>>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Not even reading while hung: the bytes wait in the kernel's buffers.
        if hung.wait_for(|h| !*h).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if hung.wait_for(|h| !*h).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    if let Some(delay) = close_delay {
        tokio::time::sleep(Duration::from_millis(delay.load(Ordering::SeqCst))).await;
    }
    let _ = to.shutdown().await;
}
