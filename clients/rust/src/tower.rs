//! A `tower::Layer` that limits HTTP requests (axum, tonic, hyper through
//! `hyper_util`'s `TowerToHyperService`), as docs/clients.md, "Middleware", says:
//!
//! - **Key**: a [`KeyExtractor`] of the request: the client's address
//!   ([`PeerIp`], the default: axum's `ConnectInfo<SocketAddr>` with the `axum`
//!   feature, or a `SocketAddr` extension; `X-Forwarded-For` / `Forwarded` only
//!   behind the proxies you trust), a header ([`HeaderKey`]), or any function
//!   of the request's parts. Windows live at `rl:<limit name>:<key>`. A request
//!   without a key is the layer's error (the framework answers, usually 500):
//!   whether a request carries the peer's address is decided by how the app is
//!   served, after the layer is built, so it can only be found per request.
//! - **Configuration** is checked when the layer is built:
//!   [`RateLimitLayer::new`] refuses a window, limit, cost, tier or names out
//!   of range with [`Error::Argument`](crate::Error::Argument), never at a request.
//! - **Limits**: one or more [`HttpLimit`]s, each with its tiers; several are
//!   checked all or nothing ([`Limiter::allow_all`]).
//! - **Rejected**: `429 Too Many Requests` with the headers and `Retry-After`,
//!   the same for a rejection the limiter's block cache answered without a
//!   call (`Retry-After` counting down; [`Builder::block_cache`](crate::Builder::block_cache)
//!   on the limiter the layer is given).
//! - **The request's result**: an admitted request carries its
//!   [`MultiDecision`] in its extensions (one decision per limit, in order),
//!   for the handler: `Extension<MultiDecision>` in axum.
//!   **Allowed**: the response carries the same headers.
//! - **Error policy** (the limiter's, with its timeout): `raise` returns the
//!   error to the framework (in axum, `HandleErrorLayer` answers, usually
//!   `500`); `allow` serves the request without headers; `deny` answers
//!   `503 Service Unavailable`.
//! - **`skip_successful` / `skip_failed`**: the request is admitted with
//!   `STAMP`, and once the inner service has answered (a status below 400 is a
//!   success; an error is a failure), its own admission is refunded by its
//!   stamp. Never peek-then-allow: under concurrency that lets a burst through.
//!   So a request still in flight holds its slot until its refund: under
//!   `skip_successful`, `limit` concurrent successful requests fill the window
//!   for as long as they run, and the next one gets 429.
//!
//! Per request the layer sends one `XCLOAK.ALLOW` per limit, and nothing else
//! (plus one `XCLOAK.REFUND` per refunded admission under `skip_*`), none
//! for a key the block cache holds a rejection of.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::request::Parts;
use http::{Extensions, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use crate::decision::{MultiDecision, Via};
use crate::engine::check_duration;
use crate::error::Error;
use crate::headers::Style;
use crate::limiter::Limiter;
use crate::request::{Refund, Request, Tier};
use crate::transport::Transport;

/// The error type of [`RateLimit`]: the limiter's [`Error`](crate::Error)
/// (downcast it), a [`KeyError`], or the inner service's error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The most tiers a call takes after the positional one (16 in all).
const MAX_TIERS: usize = 15;

/// One limit on every request that passes the layer. Its options are checked
/// by [`RateLimitLayer::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpLimit {
    name: String,
    window: Duration,
    limit: u64,
    tiers: Vec<Tier>,
    cost: u64,
    names: Vec<String>,
    skip_successful: bool,
    skip_failed: bool,
}

impl HttpLimit {
    /// At most `limit` (at least 1) requests per `window` (whole
    /// milliseconds, from 1 ms to 2^53 − 1 ms) per key, in the window at
    /// `rl:http:<key>` (see [`HttpLimit::name`]).
    pub fn new(window: Duration, limit: u64) -> HttpLimit {
        HttpLimit {
            name: "http".to_string(),
            window,
            limit,
            tiers: Vec::new(),
            cost: 1,
            names: Vec::new(),
            skip_successful: false,
            skip_failed: false,
        }
    }

    /// The limit's name: its windows live at `rl:<name>:<key>` (default `http`).
    /// Two limits on one request need two names.
    pub fn name(mut self, name: impl Into<String>) -> HttpLimit {
        self.name = name.into();
        self
    }

    /// Also at most `limit` per `window` (a tier on the same key; up to 15).
    pub fn tier(mut self, window: Duration, limit: u64) -> HttpLimit {
        self.tiers.push(Tier { window, limit });
        self
    }

    /// Each request takes `cost` units (default 1; at most the smallest limit).
    pub fn cost(mut self, cost: u64) -> HttpLimit {
        self.cost = cost;
        self
    }

    /// The policy names in the headers, one per tier, the positional one
    /// first (default `<limit>-in-<s>s`).
    pub fn names<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> HttpLimit {
        self.names = names.into_iter().map(Into::into).collect();
        self
    }

    /// Successful responses (status below 400) are refunded: only failures count.
    pub fn skip_successful(mut self) -> HttpLimit {
        self.skip_successful = true;
        self
    }

    /// Failed responses (400 and above, or an error) are refunded.
    pub fn skip_failed(mut self) -> HttpLimit {
        self.skip_failed = true;
        self
    }

    /// Every option in its range, or the first one out of it, by name.
    fn check(&self) -> Result<(), Error> {
        let refuse = |name: &str, message: String| {
            Err(Error::Argument {
                name: name.to_string(),
                message: format!("HttpLimit {:?}: {message}", self.name),
            })
        };
        if self.name.is_empty() {
            return refuse(
                "name",
                "name must not be empty (windows live at rl:<name>:<key>)".into(),
            );
        }
        let within = |name: &str, window: Duration| {
            check_duration(name, window, true).map_err(|error| Error::Argument {
                name: name.to_string(),
                message: format!("HttpLimit {:?}: {}", self.name, error),
            })
        };
        within("window", self.window)?;
        if self.limit == 0 {
            return refuse(
                "limit",
                "limit must be at least 1, not 0 (it would refuse every request)".into(),
            );
        }
        if self.tiers.len() > MAX_TIERS {
            return refuse(
                "tier",
                format!(
                    "at most {MAX_TIERS} tiers after the positional one (16 in all), not {}",
                    self.tiers.len()
                ),
            );
        }
        for (i, tier) in self.tiers.iter().enumerate() {
            within(&format!("window of TIER {}", i + 1), tier.window)?;
            if tier.limit == 0 {
                return refuse(
                    &format!("limit of TIER {}", i + 1),
                    format!("limit of TIER {} must be at least 1, not 0", i + 1),
                );
            }
        }
        let smallest = self.tiers.iter().map(|t| t.limit).fold(self.limit, u64::min);
        if !(1..=smallest).contains(&self.cost) {
            return refuse(
                "cost",
                format!(
                    "cost must be from 1 to {smallest} (the smallest limit: a larger request could never be admitted), not {}",
                    self.cost
                ),
            );
        }
        if !self.names.is_empty() && self.names.len() != self.tiers.len() + 1 {
            return refuse(
                "names",
                format!(
                    "names must give one name per tier ({}), not {}",
                    self.tiers.len() + 1,
                    self.names.len()
                ),
            );
        }
        Ok(())
    }

    fn request(&self, key: &str) -> Request {
        let mut request = Request::new(format!("rl:{}:{key}", self.name), self.window, self.limit)
            .tiers(self.tiers.iter().copied())
            .cost(self.cost);
        request.stamp = self.skip_successful || self.skip_failed;
        request
    }
}

/// A request had no key (no peer address, a missing header): the layer
/// returns it as its error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyError(pub String);

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rate limit key: {}", self.0)
    }
}

impl std::error::Error for KeyError {}

/// Who a request counts against.
pub trait KeyExtractor: Send + Sync + 'static {
    fn key(&self, request: &Parts) -> Result<String, KeyError>;

    /// This key, else `other`'s (`HeaderKey::new("x-api-key").or(PeerIp::new())`).
    fn or<B: KeyExtractor>(self, other: B) -> Or<Self, B>
    where
        Self: Sized,
    {
        Or(self, other)
    }
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Result<String, KeyError> + Send + Sync + 'static,
{
    fn key(&self, request: &Parts) -> Result<String, KeyError> {
        self(request)
    }
}

/// The first extractor's key, else the second's.
#[derive(Clone, Debug)]
pub struct Or<A, B>(A, B);

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn key(&self, request: &Parts) -> Result<String, KeyError> {
        self.0.key(request).or_else(|_| self.1.key(request))
    }
}

/// The value of a request header (an API key, a user id set by an auth layer).
#[derive(Clone, Debug)]
pub struct HeaderKey(http::HeaderName);

impl HeaderKey {
    /// Panics if `name` is not a valid header name (it is a constant of the program).
    pub fn new(name: &str) -> HeaderKey {
        HeaderKey(http::HeaderName::from_bytes(name.as_bytes()).expect("a valid header name"))
    }
}

impl KeyExtractor for HeaderKey {
    fn key(&self, request: &Parts) -> Result<String, KeyError> {
        let value = request
            .headers
            .get(&self.0)
            .ok_or_else(|| KeyError(format!("no {} header", self.0)))?;
        let value = value
            .to_str()
            .map_err(|_| KeyError(format!("the {} header is not visible ASCII", self.0)))?;
        Ok(value.to_string())
    }
}

/// An address range: `192.0.2.0/24`, `10.0.0.1`, `2001:db8::/32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    fn parse(text: &str) -> Option<IpNet> {
        let (addr, prefix) = match text.trim().split_once('/') {
            Some((addr, prefix)) => (addr.parse::<IpAddr>().ok()?, Some(prefix.parse::<u8>().ok()?)),
            None => (text.trim().parse::<IpAddr>().ok()?, None),
        };
        let addr = addr.to_canonical();
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(bits);
        (prefix <= bits).then_some(IpNet { addr, prefix })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                (u32::from(net) ^ u32::from(ip)) & mask == 0
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                (u128::from(net) ^ u128::from(ip)) & mask == 0
            }
            _ => false,
        }
    }
}

type AddrSource = Arc<dyn Fn(&Extensions) -> Option<SocketAddr> + Send + Sync>;

/// The client's IP address: the connection's peer, or behind trusted
/// proxies the rightmost `X-Forwarded-For` (else `Forwarded: for=`) address
/// that is not one of them.
///
/// The peer address comes from the request's extensions. [`PeerIp::new`] (the
/// layer's default) reads axum's `ConnectInfo<SocketAddr>` (with this crate's
/// `axum` feature; serve the app with
/// `into_make_service_with_connect_info::<SocketAddr>()`), else a
/// `std::net::SocketAddr` (what a hyper connection loop inserts). Another
/// framework's type: [`PeerIp::from_extension`] (tonic's `TcpConnectInfo`).
#[derive(Clone)]
pub struct PeerIp {
    source: AddrSource,
    trusted: Arc<[IpNet]>,
}

impl std::fmt::Debug for PeerIp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerIp")
            .field("trusted", &self.trusted)
            .finish_non_exhaustive()
    }
}

impl Default for PeerIp {
    fn default() -> Self {
        PeerIp::new()
    }
}

impl PeerIp {
    /// The peer from axum's `ConnectInfo<SocketAddr>` (feature `axum`), else
    /// from a `std::net::SocketAddr` in the request's extensions.
    pub fn new() -> PeerIp {
        PeerIp {
            source: Arc::new(peer_address),
            trusted: Arc::new([]),
        }
    }

    /// The peer from the framework's extension `E`:
    /// `PeerIp::from_extension(|c: &ConnectInfo<SocketAddr>| c.0)` in axum,
    /// `PeerIp::from_extension(|c: &TcpConnectInfo| c.remote_addr())` in tonic.
    pub fn from_extension<E, A>(addr: impl Fn(&E) -> A + Send + Sync + 'static) -> PeerIp
    where
        E: Send + Sync + 'static,
        A: Into<Option<SocketAddr>>,
    {
        PeerIp {
            source: Arc::new(move |extensions: &Extensions| extensions.get::<E>().and_then(|e| addr(e).into())),
            trusted: Arc::new([]),
        }
    }

    /// Trust these proxies (addresses or CIDR ranges): a request from one of
    /// them counts against the rightmost forwarded address not in the list.
    /// Without trusted proxies the forwarding headers are never read (a
    /// client could write any address there). An entry that is neither is
    /// refused here, with [`Error::Argument`] naming `trust_proxies`.
    pub fn trust_proxies<S: AsRef<str>>(mut self, proxies: impl IntoIterator<Item = S>) -> Result<PeerIp, Error> {
        let nets: Result<Vec<IpNet>, Error> = proxies
            .into_iter()
            .map(|p| {
                IpNet::parse(p.as_ref()).ok_or_else(|| Error::Argument {
                    name: "trust_proxies".into(),
                    message: format!(
                        "trust_proxies takes addresses and CIDR ranges (10.0.0.0/8, 2001:db8::/32), not {:?}",
                        p.as_ref()
                    ),
                })
            })
            .collect();
        self.trusted = nets?.into();
        Ok(self)
    }

    fn trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(ip))
    }

    /// The forwarded chain, nearest hop last: every `X-Forwarded-For` value
    /// in order, else every `Forwarded` element's `for=`. `None` for an entry
    /// that is not an address (`unknown`, an obfuscated name).
    fn forwarded(request: &Parts) -> Vec<Option<IpAddr>> {
        let values = |name: &str| {
            request
                .headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let xff = values("x-forwarded-for");
        if !xff.is_empty() {
            return xff.iter().map(|entry| parse_hop(entry)).collect();
        }
        values("forwarded")
            .iter()
            .filter_map(|element| {
                element.split(';').find_map(|pair| {
                    let (name, value) = pair.split_once('=')?;
                    name.trim()
                        .eq_ignore_ascii_case("for")
                        .then(|| parse_hop(value.trim().trim_matches('"')))
                })
            })
            .collect()
    }
}

/// The default peer address: axum's `ConnectInfo<SocketAddr>`, else a `SocketAddr`.
fn peer_address(extensions: &Extensions) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0);
    }
    extensions.get::<SocketAddr>().copied()
}

/// What to do when a request carries no peer address: the fix, by name.
#[cfg(feature = "axum")]
const NO_PEER: &str = "no client address in the request: axum: serve the app with \
    `app.into_make_service_with_connect_info::<SocketAddr>()`; hyper: insert the peer's `SocketAddr` \
    as a request extension; or key the layer otherwise with `RateLimitLayer::key(...)`";
#[cfg(not(feature = "axum"))]
const NO_PEER: &str = "no client address in the request: axum: enable xcloak-client's `axum` feature and \
    serve the app with `app.into_make_service_with_connect_info::<SocketAddr>()`; hyper: insert the peer's \
    `SocketAddr` as a request extension; or key the layer otherwise with `RateLimitLayer::key(...)`";

/// `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`, `[2001:db8::1]:80`.
fn parse_hop(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>()
        .ok()
        .or_else(|| text.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| text.strip_prefix('[')?.strip_suffix(']')?.parse().ok())
}

impl KeyExtractor for PeerIp {
    fn key(&self, request: &Parts) -> Result<String, KeyError> {
        let peer = (self.source)(&request.extensions)
            .ok_or_else(|| KeyError(NO_PEER.into()))?
            .ip()
            .to_canonical();
        if !self.trusted(peer) {
            return Ok(peer.to_string());
        }
        // From the nearest hop outwards: the first address that is not a trusted proxy.
        let mut client = peer;
        for hop in Self::forwarded(request).into_iter().rev() {
            match hop {
                Some(ip) if self.trusted(ip) => client = ip.to_canonical(),
                Some(ip) => return Ok(ip.to_canonical().to_string()),
                // Not an address: the nearest proxy's claim ends here.
                None => break,
            }
        }
        Ok(client.to_string())
    }
}

/// Limits the requests of the services it wraps. Build it once; it is cheap
/// to clone into every connection.
pub struct RateLimitLayer<T, K = PeerIp> {
    limiter: Limiter<T>,
    limits: Arc<[HttpLimit]>,
    key: Arc<K>,
    style: Style,
}

impl<T, K> Clone for RateLimitLayer<T, K> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: self.limiter.clone(),
            limits: self.limits.clone(),
            key: self.key.clone(),
            style: self.style,
        }
    }
}

impl<T: Transport> RateLimitLayer<T, PeerIp> {
    /// `limits` on every request, keyed by the peer's IP address ([`PeerIp`]:
    /// axum's `ConnectInfo<SocketAddr>` with the `axum` feature, else a
    /// `SocketAddr` extension; another key: [`RateLimitLayer::key`]).
    ///
    /// Refuses, with [`Error::Argument`] naming the option and its range, no
    /// limit at all, two limits with one name, and a limit whose window,
    /// limit, cost, tiers or names are out of range (see [`HttpLimit`]). The
    /// server's own bound on `limit` (`xcloak.max-limit`, default 1000000) is
    /// its configuration, checked at the request.
    pub fn new(
        limiter: Limiter<T>,
        limits: impl IntoIterator<Item = HttpLimit>,
    ) -> Result<RateLimitLayer<T, PeerIp>, Error> {
        let limits: Arc<[HttpLimit]> = limits.into_iter().collect();
        if limits.is_empty() {
            return Err(Error::Argument {
                name: "limits".into(),
                message: "limits must hold at least one HttpLimit".into(),
            });
        }
        for (i, limit) in limits.iter().enumerate() {
            limit.check()?;
            if limits[..i].iter().any(|other| other.name == limit.name) {
                return Err(Error::Argument {
                    name: "name".into(),
                    message: format!(
                        "two limits are named {:?}: they would share the window rl:{}:<key> (HttpLimit::name)",
                        limit.name, limit.name
                    ),
                });
            }
        }
        Ok(RateLimitLayer {
            limiter,
            limits,
            key: Arc::new(PeerIp::new()),
            style: Style::Ietf,
        })
    }
}

impl<T, K> RateLimitLayer<T, K> {
    /// Who a request counts against.
    pub fn key<K2: KeyExtractor>(self, key: K2) -> RateLimitLayer<T, K2> {
        RateLimitLayer {
            limiter: self.limiter,
            limits: self.limits,
            key: Arc::new(key),
            style: self.style,
        }
    }

    /// Which header fields to send (default [`Style::Ietf`]).
    pub fn style(mut self, style: Style) -> Self {
        self.style = style;
        self
    }
}

impl<S, T, K> Layer<S> for RateLimitLayer<T, K> {
    type Service = RateLimit<S, T, K>;

    fn layer(&self, inner: S) -> RateLimit<S, T, K> {
        RateLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] makes.
pub struct RateLimit<S, T, K> {
    inner: S,
    layer: RateLimitLayer<T, K>,
}

impl<S: Clone, T, K> Clone for RateLimit<S, T, K> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response body: the inner service's, or the layer's own message.
    #[project = BodyProjection]
    pub enum RateLimitBody<B> {
        Inner { #[pin] body: B },
        Message { text: Option<Bytes> },
    }
}

impl<B> RateLimitBody<B> {
    fn message(text: &'static str) -> RateLimitBody<B> {
        RateLimitBody::Message {
            text: Some(Bytes::from_static(text.as_bytes())),
        }
    }
}

impl<B: http_body::Body<Data = Bytes>> http_body::Body for RateLimitBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        match self.project() {
            BodyProjection::Inner { body } => body.poll_frame(cx),
            BodyProjection::Message { text } => Poll::Ready(text.take().map(|t| Ok(http_body::Frame::data(t)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RateLimitBody::Inner { body } => body.is_end_stream(),
            RateLimitBody::Message { text } => text.is_none(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            RateLimitBody::Inner { body } => body.size_hint(),
            RateLimitBody::Message { text } => {
                http_body::SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64))
            }
        }
    }
}

const TOO_MANY: &str = "Too Many Requests\n";
const UNAVAILABLE: &str = "Service Unavailable: the rate limiter could not decide\n";

fn plain<B>(status: StatusCode, text: &'static str, headers: http::HeaderMap) -> http::Response<RateLimitBody<B>> {
    let mut response = http::Response::new(RateLimitBody::message(text));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

impl<S, T, K, ReqBody, ResBody> Service<http::Request<ReqBody>> for RateLimit<S, T, K>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    T: Transport,
    K: KeyExtractor,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = http::Response<RateLimitBody<ResBody>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        // The clone that was not polled ready stays here; the ready one serves.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let key = layer.key.key(&parts)?;
            let requests: Vec<Request> = layer.limits.iter().map(|limit| limit.request(&key)).collect();
            // One XCLOAK.ALLOW per limit, nothing else (RateLimitLayer::new refuses no limits).
            let outcome = match requests.as_slice() {
                [one] => MultiDecision::from_decisions(vec![layer.limiter.allow(one).await?]),
                several => layer.limiter.allow_all(several).await?,
            };
            let mut request = http::Request::from_parts(parts, body);
            if outcome.allowed {
                // The request's own result, for the handler (axum: `Extension<MultiDecision>`).
                request.extensions_mut().insert(outcome.clone());
            }
            if outcome.decisions.iter().any(|d| d.via == Via::Error) {
                // The error policy answered: serve without headers, or 503.
                if !outcome.allowed {
                    return Ok(plain(
                        StatusCode::SERVICE_UNAVAILABLE,
                        UNAVAILABLE,
                        http::HeaderMap::new(),
                    ));
                }
                return inner
                    .call(request)
                    .await
                    .map(|r| r.map(|body| RateLimitBody::Inner { body }))
                    .map_err(Into::into);
            }
            let names: Vec<&[String]> = layer.limits.iter().map(|l| l.names.as_slice()).collect();
            let headers = outcome.headers_named(layer.style, &names);
            if !outcome.allowed {
                // Never a request larger than the limit: RateLimitLayer::new refuses that cost.
                return Ok(plain(StatusCode::TOO_MANY_REQUESTS, TOO_MANY, headers));
            }
            let result = inner.call(request).await;
            let success = matches!(&result, Ok(response) if response.status().as_u16() < 400);
            for ((limit, request), decision) in layer.limits.iter().zip(&requests).zip(&outcome.decisions) {
                let refund = if success {
                    limit.skip_successful
                } else {
                    limit.skip_failed
                };
                if let (true, Some(stamp)) = (refund, decision.stamp) {
                    let (limiter, refund) = (
                        layer.limiter.clone(),
                        Refund::new(&request.key, stamp).cost(request.cost),
                    );
                    // After the response: it does not wait for this round trip.
                    tokio::spawn(async move {
                        let _ = limiter.refund(&refund).await;
                    });
                }
            }
            let mut response = result.map_err(Into::into)?;
            response.headers_mut().extend(headers);
            Ok(response.map(|body| RateLimitBody::Inner { body }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(peer: &str, headers: &[(&str, &str)]) -> Parts {
        let mut builder = http::Request::builder();
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let (mut parts, ()) = builder.body(()).unwrap().into_parts();
        parts.extensions.insert(peer.parse::<SocketAddr>().unwrap());
        parts
    }

    #[test]
    fn forwarded_addresses_count_only_behind_trusted_proxies() {
        let plain = PeerIp::new();
        // Not behind a trusted proxy: the header is the client's to write, ignored.
        assert_eq!(
            plain
                .key(&parts("203.0.113.9:5000", &[("x-forwarded-for", "1.2.3.4")]))
                .unwrap(),
            "203.0.113.9"
        );
        let proxied = PeerIp::new().trust_proxies(["10.0.0.0/8", "192.0.2.1"]).unwrap();
        // The client wrote 1.2.3.4 itself; the proxies appended 198.51.100.7 then 10.1.1.1.
        let chain = [
            ("x-forwarded-for", "1.2.3.4, 198.51.100.7"),
            ("x-forwarded-for", "10.1.1.1"),
        ];
        assert_eq!(proxied.key(&parts("192.0.2.1:443", &chain)).unwrap(), "198.51.100.7");
        // From a peer that is not trusted, whatever it forwards.
        assert_eq!(proxied.key(&parts("198.51.100.99:1", &chain)).unwrap(), "198.51.100.99");
        // Every hop trusted: the leftmost.
        assert_eq!(
            proxied
                .key(&parts("10.0.0.1:1", &[("x-forwarded-for", "10.2.2.2")]))
                .unwrap(),
            "10.2.2.2"
        );
        let forwarded = [(
            "forwarded",
            r#"for=198.51.100.17;proto=https, for="[2001:db8::1]:4711""#,
        )];
        assert_eq!(proxied.key(&parts("10.0.0.1:1", &forwarded)).unwrap(), "2001:db8::1");
        // An IPv4 peer seen through an IPv6 socket is the IPv4 address.
        assert_eq!(
            plain.key(&parts("[::ffff:203.0.113.9]:80", &[])).unwrap(),
            "203.0.113.9"
        );
        assert!(matches!(
            PeerIp::new().trust_proxies(["10.0.0.0/8", "10.0.0.0/33"]),
            Err(Error::Argument { name, .. }) if name == "trust_proxies"
        ));
        assert!(IpNet::parse("2001:db8::/32")
            .unwrap()
            .contains("2001:db8:ffff::1".parse().unwrap()));
        assert!(!IpNet::parse("2001:db8::/32")
            .unwrap()
            .contains("2001:db9::1".parse().unwrap()));
        assert!(IpNet::parse("0.0.0.0/0").unwrap().contains("8.8.8.8".parse().unwrap()));
    }

    #[test]
    fn a_header_key_falls_back_to_the_peer() {
        let key = HeaderKey::new("x-api-key").or(PeerIp::new());
        assert_eq!(
            key.key(&parts("203.0.113.9:1", &[("x-api-key", "k-1")])).unwrap(),
            "k-1"
        );
        assert_eq!(key.key(&parts("203.0.113.9:1", &[])).unwrap(), "203.0.113.9");
        assert!(HeaderKey::new("x-api-key").key(&parts("203.0.113.9:1", &[])).is_err());
    }
}
