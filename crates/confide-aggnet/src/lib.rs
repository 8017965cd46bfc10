//! The aggregator's data path in Rust: `confide.v1.Aggregation/PushSlices` served by
//! tonic over mutual TLS (rustls), each received message handed to the data plane
//! ([`confide_agg::DataPlane`]) as the buffer it arrived in.
//!
//! # Why
//! Through Python's gRPC server every 1 MiB message costs a fresh receive buffer, a
//! Python `bytes` object, thread hand-offs between hundreds of stream threads and the
//! GIL: measured, the node spent more time there than in TLS and folding together
//! (docs/dataplane.md). Here the transport, the framing, the parsing and the checks of
//! a batch run on a small tokio runtime without the GIL; the control side (who may
//! join which round, what completes a round, deliveries) stays in Python behind the
//! narrow [`Control`] trait, called once per stream and once per batch that completes
//! slices, not once per message.
//!
//! # Shape
//! * Same proto, same method: a party's `PushSlices` stream (header first, then
//!   batches or single slices) gets the same `PushReply` and the same status codes
//!   as from the Python service. The server listens on its own port (the "data
//!   port"), which the aggregator reports in `HealthReply.data_port`.
//! * Mutual TLS: the client must present a certificate of the federation's CA; its
//!   DER goes to [`Control::open`], which checks it names the header's party.
//! * Messages are decoded as raw bytes (no protobuf decode, no copy): the tonic
//!   decoder's buffer is split off and shared with the data-plane workers.

use bytes::{Buf, BufMut, Bytes};
use confide_agg::{parse_push, DataPlane, PushBody};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Code, Request, Response, Status, Streaming};

/// What can go wrong starting the server.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A setting is out of range.
    #[error("invalid parameter {field}: {reason}")]
    InvalidParameter {
        /// Which setting.
        field: &'static str,
        /// Why, with the limit.
        reason: String,
    },
    /// Binding the address, starting threads or the TLS setup failed.
    #[error("data server: {0}")]
    Start(String),
}

/// A refused stream: the gRPC status code and message the party gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// gRPC status code.
    pub code: Code,
    /// Message naming the field and the limit.
    pub message: String,
}

impl Refusal {
    /// A refusal with `code`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Refusal { code, message: message.into() }
    }
}

impl From<Refusal> for Status {
    fn from(r: Refusal) -> Self {
        Status::new(r.code, r.message)
    }
}

/// One party's stream into one round (as the control side opened it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    /// The data plane's round id.
    pub round_id: u64,
    /// The party's position among the round's participants.
    pub participant: u32,
    /// The control side's handle for this stream.
    pub token: u64,
}

/// What [`Control::open`] decided for a stream's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Opened {
    /// Fold the stream's slices into this round.
    Fold(StreamInfo),
    /// The round attempt is already complete (its results were queued again for the party).
    Complete,
}

/// The control side of the aggregator (rounds, membership, deliveries). Every call may
/// block (the Python side takes the GIL); the server calls it off its async threads.
pub trait Control: Send + Sync + 'static {
    /// A stream's first message (a serialized `PushMessage` with a header) and the
    /// client certificate (DER) it came with.
    ///
    /// # Errors
    /// The status the party gets (not a participant, bad header, round closed).
    fn open(&self, peer_certificate: Option<&[u8]>, header_message: &[u8]) -> Result<Opened, Refusal>;
    /// Whether [`Control::observe`] wants every message (audits and tests).
    fn observing(&self) -> bool {
        false
    }
    /// A received slice message, before it is folded (only while observing).
    fn observe(&self, _stream: &StreamInfo, _message: &[u8]) {}
    /// Slices a batch completed: (index, combined payload).
    ///
    /// # Errors
    /// The status that ends the stream.
    fn folded(&self, stream: &StreamInfo, completed: Vec<(u32, Vec<u8>)>) -> Result<(), Refusal>;
    /// The data plane refused a batch of `slices` slices with `error` (earlier slices of
    /// it may have folded). `Ok(n)`: the round completed meanwhile; count `n` late copies.
    ///
    /// # Errors
    /// The status that ends the stream.
    fn refused(&self, stream: &StreamInfo, error: &confide_agg::Error, slices: u32) -> Result<u32, Refusal>;
    /// The stream ended (cleanly, broken, or refused); returns whether the round is complete.
    fn ended(&self, stream: &StreamInfo) -> bool;
}

/// Settings of the data server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to listen on ("host:port"; port 0 picks a free one).
    pub address: SocketAddr,
    /// The aggregator's certificate chain (PEM).
    pub cert_pem: Vec<u8>,
    /// Its private key (PEM).
    pub key_pem: Vec<u8>,
    /// The federation CA that client certificates must chain to (PEM).
    pub ca_pem: Vec<u8>,
    /// Async threads for TLS and HTTP/2 (0: one per core).
    pub threads: usize,
    /// Largest message accepted, in bytes.
    pub max_message_bytes: usize,
    /// HTTP/2 receive window per stream, in bytes.
    pub stream_window_bytes: u32,
}

/// PushReply { uint32 accepted = 1; uint32 duplicates = 2; bool round_complete = 3; }
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushReply {
    /// Slices folded in.
    pub accepted: u32,
    /// Slices already sent, or sent after their index completed.
    pub duplicates: u32,
    /// Whether the round attempt (this share of it) is complete.
    pub round_complete: bool,
}

fn put_varint(out: &mut impl BufMut, mut v: u64) {
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

impl PushReply {
    /// Appends the protobuf encoding (fields at their default are left out, as proto3 does).
    pub fn encode(&self, out: &mut impl BufMut) {
        for (field, value) in [(1u64, u64::from(self.accepted)), (2, u64::from(self.duplicates)), (3, u64::from(self.round_complete))] {
            if value != 0 {
                put_varint(out, field << 3);
                put_varint(out, value);
            }
        }
    }
}

/// Messages as their bytes in, `PushReply` out.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

struct RawDecoder;
struct ReplyEncoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        // The decoder's buffer holds exactly one message: split it off, no copy.
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

impl Encoder for ReplyEncoder {
    type Item = PushReply;
    type Error = Status;
    fn encode(&mut self, item: PushReply, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst);
        Ok(())
    }
}

impl Codec for RawCodec {
    type Encode = PushReply;
    type Decode = Bytes;
    type Encoder = ReplyEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> ReplyEncoder {
        ReplyEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Threads that run the blocking calls of the streams (folding a batch waits for the
/// data-plane workers; control calls wait for the GIL). A fixed set: a thread per call
/// (tokio's blocking pool under 200 streams) was measured creating ~400 threads per
/// round, each with fresh stack pages for the kernel to zero.
struct Pool {
    jobs: Option<crossbeam_channel::Sender<Job>>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Pool {
    fn new(threads: usize) -> Result<Self, NetError> {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let rx = rx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("confide-data-fold-{i}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                })
                .map_err(|e| NetError::Start(format!("fold thread: {e}")))?;
            handles.push(handle);
        }
        Ok(Pool { jobs: Some(tx), handles })
    }

    async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, Status> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        self.jobs
            .as_ref()
            .ok_or_else(|| Status::unavailable("data server is stopping"))?
            .send(job)
            .map_err(|_| Status::unavailable("data server is stopping"))?;
        rx.await.map_err(|_| Status::internal("data path task failed"))
    }

    fn stop(&mut self) {
        self.jobs = None;
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

struct Inner {
    plane: Arc<DataPlane>,
    control: Arc<dyn Control>,
    pool: Pool,
    max_message_bytes: usize,
}

/// The `confide.v1.Aggregation` service with its one data method.
#[derive(Clone)]
struct AggregationService {
    inner: Arc<Inner>,
}

impl NamedService for AggregationService {
    const NAME: &'static str = "confide.v1.Aggregation";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

struct PushSlices(Arc<Inner>);

impl tower_service::Service<Request<Streaming<Bytes>>> for PushSlices {
    type Response = Response<PushReply>;
    type Error = Status;
    type Future = BoxFuture<Result<Response<PushReply>, Status>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, request: Request<Streaming<Bytes>>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { push_slices(inner, request).await.map(Response::new) })
    }
}

impl tower_service::Service<http::Request<Body>> for AggregationService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        if request.uri().path() == "/confide.v1.Aggregation/PushSlices" {
            Box::pin(async move {
                let limit = inner.max_message_bytes;
                let mut grpc = tonic::server::Grpc::new(RawCodec).apply_max_message_size_config(Some(limit), Some(limit));
                Ok(grpc.client_streaming(PushSlices(inner), request).await)
            })
        } else {
            let path = request.uri().path().to_string();
            Box::pin(
                async move { Ok(Status::unimplemented(format!("{path}: this port serves only PushSlices (the data port)")).into_http()) },
            )
        }
    }
}

/// Calls [`Control::ended`] exactly once, also when the stream's future is dropped
/// (the connection went away mid-stream).
struct EndGuard {
    inner: Arc<Inner>,
    stream: Option<StreamInfo>,
}

impl EndGuard {
    async fn end(mut self) -> bool {
        let (control, stream) = (self.inner.control.clone(), self.stream.take());
        match stream {
            Some(s) => self.inner.pool.run(move || control.ended(&s)).await.unwrap_or(false),
            None => false,
        }
    }
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            let control = self.inner.control.clone();
            let job: Job = Box::new(move || {
                control.ended(&stream);
            });
            if let Some(Err(crossbeam_channel::SendError(job))) = self.inner.pool.jobs.as_ref().map(|jobs| jobs.send(job)) {
                job();
            }
        }
    }
}

async fn push_slices(inner: Arc<Inner>, request: Request<Streaming<Bytes>>) -> Result<PushReply, Status> {
    let peer: Option<Vec<u8>> = request.peer_certs().and_then(|certs| certs.first().map(|c| c.as_ref().to_vec()));
    let mut messages = request.into_inner();
    let first = messages.message().await?.ok_or_else(|| Status::invalid_argument("a PushSlices stream must start with a header"))?;
    if !matches!(parse_push(&first), Ok(PushBody::Header)) {
        return Err(Status::invalid_argument("a PushSlices stream must start with a header"));
    }
    let control = inner.control.clone();
    let opened = inner.pool.run(move || control.open(peer.as_deref(), &first)).await??;
    let stream = match opened {
        Opened::Complete => return Ok(PushReply { round_complete: true, ..PushReply::default() }),
        Opened::Fold(s) => s,
    };
    let guard = EndGuard { inner: inner.clone(), stream: Some(stream.clone()) };
    let observing = inner.control.observing();
    let mut reply = PushReply::default();
    loop {
        let message = match messages.message().await {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(status) => {
                guard.end().await;
                return Err(status);
            }
        };
        let view = match parse_push(&message) {
            Ok(PushBody::Slices(view)) => view,
            Ok(PushBody::Header) => {
                guard.end().await;
                return Err(Status::invalid_argument("only the first message of a PushSlices stream may be a header"));
            }
            Ok(PushBody::Empty) => continue,
            Err(e) => {
                guard.end().await;
                return Err(Status::invalid_argument(e.to_string()));
            }
        };
        let (plane, control, s) = (inner.plane.clone(), inner.control.clone(), stream.clone());
        let outcome = inner
            .pool
            .run(move || {
                if observing {
                    control.observe(&s, &message);
                }
                let slices = view.indices.len() as u32;
                let shared: confide_agg::node::SharedBytes = Arc::new(message);
                match plane.push_batch(s.round_id, s.participant, shared, &view) {
                    Ok(result) => {
                        let late = result.duplicates + result.late;
                        let accepted = result.accepted;
                        if !result.completed.is_empty() {
                            control.folded(&s, result.completed)?;
                        }
                        Ok((accepted, late))
                    }
                    Err(error) => control.refused(&s, &error, slices).map(|late| (0, late)),
                }
            })
            .await?;
        match outcome {
            Ok((accepted, late)) => {
                reply.accepted += accepted;
                reply.duplicates += late;
            }
            Err(refusal) => {
                guard.end().await;
                return Err(refusal.into());
            }
        }
    }
    reply.round_complete = guard.end().await;
    Ok(reply)
}

/// A running data server (stopped on drop).
pub struct DataServer {
    port: u16,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    runtime: Option<tokio::runtime::Runtime>,
    inner: Arc<Inner>,
}

impl DataServer {
    /// Binds `config.address` and starts serving `PushSlices` into `plane`.
    ///
    /// # Errors
    /// `InvalidParameter` (limits), `Start` (TLS material, bind, threads).
    pub fn start(config: ServerConfig, plane: Arc<DataPlane>, control: Arc<dyn Control>) -> Result<Self, NetError> {
        if config.threads > 256 {
            return Err(NetError::InvalidParameter { field: "threads", reason: format!("must be at most 256, got {}", config.threads) });
        }
        if !(1024..=1 << 30).contains(&config.max_message_bytes) {
            return Err(NetError::InvalidParameter {
                field: "max_message_bytes",
                reason: format!("must be in [1024, 2^30], got {}", config.max_message_bytes),
            });
        }
        if !(65_535..=1 << 30).contains(&config.stream_window_bytes) {
            return Err(NetError::InvalidParameter {
                field: "stream_window_bytes",
                reason: format!("must be in [65535, 2^30], got {}", config.stream_window_bytes),
            });
        }
        let threads = match config.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .max_blocking_threads(256)
            .thread_name("confide-data")
            .enable_all()
            .build()
            .map_err(|e| NetError::Start(format!("runtime: {e}")))?;
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(&config.cert_pem, &config.key_pem))
            .client_ca_root(Certificate::from_pem(&config.ca_pem));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(config.address))
            .map_err(|e| NetError::Start(format!("cannot listen on {}: {e}", config.address)))?;
        let port = listener.local_addr().map_err(|e| NetError::Start(e.to_string()))?.port();
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        // Enough threads to keep every data-plane worker fed while others wait for the GIL.
        let pool = Pool::new((2 * plane.workers()).max(4) + 2)?;
        let inner = Arc::new(Inner { plane, control, pool, max_message_bytes: config.max_message_bytes });
        let service = AggregationService { inner: inner.clone() };
        let window = config.stream_window_bytes;
        let router = Server::builder()
            .tls_config(tls)
            .map_err(|e| NetError::Start(format!("TLS: {e}")))?
            .initial_stream_window_size(window)
            .initial_connection_window_size(window.saturating_mul(2))
            .max_frame_size(1 << 20)
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .add_service(service);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        runtime.spawn(async move {
            let _ = router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(DataServer { port, shutdown: Some(tx), runtime: Some(runtime), inner })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops accepting, ends open streams and joins the threads (at most `grace`).
    pub fn stop(&mut self, grace: Duration) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(grace);
        }
        // Streams are gone (their end calls queued); let the pool finish them and exit.
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.pool.stop();
        }
    }
}

impl Drop for DataServer {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_reply_encodes_as_protobuf() {
        let mut out = Vec::new();
        PushReply { accepted: 300, duplicates: 0, round_complete: true }.encode(&mut out);
        // field 1 varint 300 (0xac 0x02), field 3 true
        assert_eq!(out, vec![0x08, 0xac, 0x02, 0x18, 0x01]);
        let mut empty = Vec::new();
        PushReply::default().encode(&mut empty);
        assert!(empty.is_empty());
    }

    struct Refuses;
    impl Control for Refuses {
        fn open(&self, _: Option<&[u8]>, _: &[u8]) -> Result<Opened, Refusal> {
            Err(Refusal::new(Code::PermissionDenied, "no"))
        }
        fn folded(&self, _: &StreamInfo, _: Vec<(u32, Vec<u8>)>) -> Result<(), Refusal> {
            Ok(())
        }
        fn refused(&self, _: &StreamInfo, _: &confide_agg::Error, _: u32) -> Result<u32, Refusal> {
            Ok(0)
        }
        fn ended(&self, _: &StreamInfo) -> bool {
            false
        }
    }

    #[test]
    fn settings_out_of_range_are_refused_by_name() {
        let plane = Arc::new(DataPlane::new(1, 1 << 20, None, None).unwrap_or_else(|e| unreachable!("{e}")));
        let config = ServerConfig {
            address: SocketAddr::from(([127, 0, 0, 1], 0)),
            cert_pem: Vec::new(),
            key_pem: Vec::new(),
            ca_pem: Vec::new(),
            threads: 1,
            max_message_bytes: 10,
            stream_window_bytes: 1 << 20,
        };
        let err = DataServer::start(config.clone(), plane.clone(), Arc::new(Refuses)).err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("invalid parameter max_message_bytes: must be in [1024, 2^30], got 10"));
        let config = ServerConfig { max_message_bytes: 1 << 20, stream_window_bytes: 10, ..config };
        let err = DataServer::start(config, plane, Arc::new(Refuses)).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("stream_window_bytes")));
    }
}
