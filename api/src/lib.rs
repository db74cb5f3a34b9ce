//! plegd's subscriber API: the plegd.v1 gRPC service on a unix socket,
//! and the client helpers the CLI and node agents use.
//!
//! - `socket`: making the socket safely (mode, group, stale or live socket).
//! - `server`: tonic on its own thread (`incoming`: its connections, with a handshake
//!   deadline, caps and an idle timeout; `streams`: the streams open on each);
//!   `service`: the RPCs; `watch`: one Watch stream (a subscriber with its own queue);
//!   `sync`: one Sync stream (a sync hold); `clients`: the open watchers and holds,
//!   for ListClients.
//! - `filter` and `selector`: Watch's filters; `convert`: domain ↔ wire types;
//!   `request_errors`: malformed or oversized requests → INVALID_ARGUMENT.
//! - `standard`: grpc.health.v1 and server reflection next to plegd.v1.
//! - `client`: connecting to a plegd.

mod client;
mod clients;
pub mod convert;
mod filter;
mod incoming;
mod request_errors;
mod selector;
mod server;
mod service;
mod socket;
mod standard;
mod streams;
mod sync;
mod watch;

pub use client::{connect, Unreachable, DEFAULT_CONTROL_SOCKET, DEFAULT_SOCKET};
pub use incoming::Limits as ConnectionLimits;
pub use plegd_protocol::{v1, MAX_REQUEST_BYTES};
pub use selector::{LabelSelector, SelectorError};
pub use server::{
    control_socket_beside, ApiConfig, ApiServer, DEFAULT_MAX_CONNECTIONS, DEFAULT_WATCH_QUEUE,
    MAX_RESPONSE_BYTES,
};
pub use service::{DEFAULT_WAIT, MAX_WAIT};
pub use socket::{
    bind, bind_with_mode, check_path, lock_path, resolve_group, BoundSocket, SocketError, MAX_GID,
    MAX_SOCKET_PATH, SOCKET_MODE,
};
