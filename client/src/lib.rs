//! tandem-client: what a service needs to talk to tandem, without the server's weight.
//!
//! - [`api`]: the JSON contract of the HTTP API (requests and answers), shared with the
//!   server and the chaos harness and pinned by golden files (`client/golden/`).
//! - [`client`]: a small HTTP client of one DC's registry nodes (used by the CLI, the tests
//!   and the SDK).
//! - [`tls`]: HTTPS settings (the registry's CA, an optional client certificate).
//! - [`sdk`]: the provider/consumer SDK (heartbeats in batches, a cached and watched
//!   instance list, selection with outlier ejection).
//!
//! This crate depends on neither RocksDB, QUIC, rustls' server side nor axum: a service
//! that embeds the SDK builds in a minute or two, not a quarter of an hour.

pub mod api;
pub mod client;
pub mod sdk;
pub mod tls;

pub use client::{Client, ClientError, ClientOptions};
pub use tls::ClientTls;
