//! The Kubernetes client stack every part of zklock builds its clients on (the operator, the
//! CLI, the benchmarks, the tests' own requests): kube's, with `TCP_NODELAY` on its connections.
//! A crate of its own so that the operator and the test kit, which the operator's tests use,
//! share one copy.
#![forbid(unsafe_code)]

/// The client stack of [`kube::client::ClientBuilder::try_from`] (TLS and credentials from
/// `config`, its timeouts, base URI, auth and extra headers, kube's retry of 429/503 answers)
/// with `TCP_NODELAY` on its connections. kube-client 5 leaves Nagle's algorithm on (kube-rs
/// issue #2056): a request written in two segments (a new connection's TLS handshake with a
/// client certificate, a body after its headers) then waits for the API server's delayed ACK,
/// 40 ms on Linux. Measured with `operator_bench`: a holder pod's deletion took 50 ms from the
/// request to its first watch event with Nagle on, 8 ms of which in the API server. A
/// configured proxy keeps kube's own stack (its proxy connectors are not public). Left out of
/// kube's stack: its tracing layer (a debug span per request, an error line on a 5xx; the
/// operator counts and times every request itself) and the expiry of exec-plugin credentials
/// that `Client::valid_until` reports (kube does not say it publicly; nothing here reads it).
pub fn builder(config: kube::Config) -> Result<kube::client::ClientBuilder<Stack>, kube::Error> {
    use http_body_util::BodyExt;
    use kube::client::ConfigExt;
    use tower::ServiceBuilder;
    if config.proxy_url.is_some() {
        return kube::client::ClientBuilder::try_from(config);
    }
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.enforce_http(false);
    connector.set_nodelay(true);
    let connector = config.rustls_https_connector_with_connector(connector)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(connector);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
    let retry = kube::client::retry::RetryPolicy::server_retry();
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| tower::retry::RetryLayer::new(retry)))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .map_response(|answer: http::Response<hyper::body::Incoming>| {
            answer.map(|body| Box::new(body.map_err(tower::BoxError::from)) as Box<kube::client::DynBody>)
        })
        .service(client);
    Ok(kube::client::ClientBuilder::new(tower::util::BoxService::new(service), config.default_namespace))
}

/// The client stack, whichever of [`builder`]'s two it is (the type kube's own builder makes).
pub type Stack = tower::util::BoxService<
    http::Request<kube::client::Body>,
    http::Response<Box<kube::client::DynBody>>,
    tower::BoxError,
>;
