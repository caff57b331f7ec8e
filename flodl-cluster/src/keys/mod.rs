//! A job's keys: a per-job certificate authority, the certificate every process of the job
//! presents, and the mutual-TLS configurations built from them.
//!
//! **Naming rule.** Every leaf certificate of a job carries the fixed DNS name
//! [`JOB_SERVER_NAME`] (plus the hosts it was made for), and a joining process verifies the
//! controller's certificate against that name, whatever address it dialled. This is sound because
//! trust comes from the CA, not the name: each job has its own CA, whose key signs the job's leaf
//! and is then discarded, and both sides trust that CA alone. A certificate that chains to it was
//! therefore made for this job, and the name check adds nothing an attacker could satisfy
//! without it. A fixed name keeps the check independent of how the controller's address was
//! spelled (an IP, a short host name, `MASTER_ADDR`).

mod files;
mod job_keys;
mod tls;

pub use files::TlsFiles;
pub use job_keys::{JobKeys, KeyError};
pub use tls::{JOB_SERVER_NAME, Tls, TlsError};
