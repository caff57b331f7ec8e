//! A job's keys: a per-job certificate authority, a certificate for the controller, two per rank
//! (the rank's, and its process's as a standby), and the mutual-TLS configurations built from
//! them.
//!
//! **Naming rule.** The controller's certificate is issued for server use only and carries the
//! fixed DNS name [`JOB_SERVER_NAME`] (plus the hosts it was made for); a joining rank verifies
//! the controller against that name, whatever address it dialled. Each rank's certificate is
//! issued for client use only and names its rank ([`Role::rank_name`]); the controller admits a
//! hello only for the rank its certificate names. Trust comes from the CA: each job has its own,
//! and both sides trust it alone, so a certificate that chains to it was made for this job, and
//! its key usages and name say which seat it holds. A holder of one rank's key can therefore be
//! that rank and nothing else: not the controller (ranks refuse a client-only certificate as a
//! server) and not another rank. A fixed controller name keeps the check independent of how the
//! controller's address was spelled (an IP, a short host name, `MASTER_ADDR`). A standby's
//! certificate is for server use only too, naming its rank's standby ([`Role::standby_name`])
//! and not [`JOB_SERVER_NAME`]: a rank joining the controller a standby started after a takeover
//! verifies that standby's name ([`crate::SessionConfig::serving`]), so a standby's key can serve
//! only where its rank is the one the ranks expect, never as the first controller or another
//! rank's standby.

mod files;
mod job_keys;
mod private;
mod role;
mod tls;

pub use files::TlsFiles;
pub use job_keys::{JobKeys, KeyError};
pub use role::{Role, RoleError};
pub use tls::{JOB_SERVER_NAME, Tls, TlsError};
