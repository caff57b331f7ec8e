//! The control plane of a multi-process flodl job: who this process is ([`Identity`], from its
//! launcher's environment), the job's keys ([`JobKeys`], a per-job CA; [`Tls`], mutual TLS), and
//! [`Session`]s between the [`Controller`] and each rank ([`join`]): one ordered stream of opaque
//! frames on two lanes (control and bulk), size-capped, with heartbeats and a silence deadline.
//!
//! The network side runs on tokio, on runtimes these objects own; the caller's side is plain
//! threads and bounded channels. Nothing here knows about training: flodl-ddp builds its
//! cross-process link on these frames.

pub mod error;
pub mod handshake;
pub mod identity;
pub mod keys;
pub mod session;
pub mod wire;

pub use error::NetError;
pub use handshake::{Controller, join};
pub use identity::{ControllerAddr, Identity, IdentityError, Launcher};
pub use keys::{JobKeys, KeyError, Role, Tls, TlsError, TlsFiles};
pub use session::{
    Arrival, Caps, Lane, Liveness, Session, SessionConfig, SessionReceiver, SessionSender,
};
pub use wire::{Hello, PROTOCOL};
