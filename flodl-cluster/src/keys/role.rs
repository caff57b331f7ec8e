//! What a job certificate lets its holder be: the controller, or one rank.

use rustls_pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::tls::JOB_SERVER_NAME;

/// The part of a job a certificate was issued for, read from its names and key usages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The first controller (term 0): a server-only certificate naming [`JOB_SERVER_NAME`].
    Controller,
    /// Rank `n`'s process as a standby: a server-only certificate naming
    /// [`Role::standby_name`]`(n)` (never [`JOB_SERVER_NAME`]), with which that process serves
    /// the terms it takes over and no other controller's.
    Standby(usize),
    /// Rank `n`: a client-only certificate naming [`Role::rank_name`]`(n)`.
    Rank(usize),
}

/// Why a certificate has no role in a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoleError {
    /// The certificate is valid for both server and client use: the one certificate an older fdl
    /// shared between every process of a job.
    #[error(
        "a shared job certificate from an older fdl (any holder could pose as the controller or \
         any rank): make new keys with `fdl cluster keys DIR --world N`"
    )]
    Shared,
    /// The certificate does not parse, or names neither the controller nor a rank.
    #[error("not a flodl job certificate: {0}")]
    Foreign(String),
}

impl Role {
    /// The DNS name a rank's certificate carries: `rank-<n>.` followed by [`JOB_SERVER_NAME`].
    pub fn rank_name(rank: usize) -> String {
        format!("rank-{rank}.{JOB_SERVER_NAME}")
    }

    /// The DNS name a standby's certificate carries: `standby-<n>.` followed by
    /// [`JOB_SERVER_NAME`].
    pub fn standby_name(rank: usize) -> String {
        format!("standby-{rank}.{JOB_SERVER_NAME}")
    }

    /// Whether the role serves a controller (the first one, or a standby that took over).
    pub fn serves(self) -> bool {
        matches!(self, Role::Controller | Role::Standby(_))
    }

    /// The name a rank verifies on the certificate of the controller this role serves as
    /// (`None` for a rank: it serves nothing).
    pub fn server_name(self) -> Option<String> {
        match self {
            Role::Controller => Some(JOB_SERVER_NAME.to_owned()),
            Role::Standby(rank) => Some(Role::standby_name(rank)),
            Role::Rank(_) => None,
        }
    }

    /// The role `cert` was issued for. A job's CA issues the controller a server-only
    /// certificate and each rank a client-only one, so the key usages decide which side a
    /// certificate may play and the names decide which seat.
    pub fn of(cert: &CertificateDer<'_>) -> Result<Role, RoleError> {
        let foreign = |why: &str| RoleError::Foreign(why.to_owned());
        let (_, parsed) = X509Certificate::from_der(cert.as_ref())
            .map_err(|e| RoleError::Foreign(format!("unreadable certificate: {e}")))?;
        let usage = parsed
            .extended_key_usage()
            .map_err(|e| RoleError::Foreign(format!("unreadable key usages: {e}")))?
            .ok_or_else(|| foreign("no extended key usage"))?;
        let (server, client) = (usage.value.server_auth, usage.value.client_auth);
        if usage.value.any || (server && client) {
            return Err(RoleError::Shared);
        }
        let names: Vec<&str> = parsed
            .subject_alternative_name()
            .map_err(|e| RoleError::Foreign(format!("unreadable names: {e}")))?
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        GeneralName::DNSName(name) => Some(*name),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        if server {
            let mut standbys = names.iter().filter_map(|name| seat_of("standby-", name));
            return match (names.contains(&JOB_SERVER_NAME), standbys.next(), standbys.next()) {
                (true, None, _) => Ok(Role::Controller),
                (false, Some(rank), None) => Ok(Role::Standby(rank)),
                (true, Some(_), _) => {
                    Err(foreign("a server certificate naming the controller and a standby"))
                }
                (false, Some(_), Some(_)) => {
                    Err(foreign("a server certificate naming two standbys"))
                }
                (false, None, _) => {
                    Err(foreign("a server certificate without the job's controller name"))
                }
            };
        }
        if !client {
            return Err(foreign("neither a server nor a client certificate"));
        }
        let mut ranks = names.iter().filter_map(|name| seat_of("rank-", name));
        match (ranks.next(), ranks.next()) {
            (Some(rank), None) => Ok(Role::Rank(rank)),
            (None, _) => Err(foreign("a client certificate naming no rank")),
            (Some(_), Some(_)) => Err(foreign("a client certificate naming two ranks")),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Role::Controller => f.write_str("the controller"),
            Role::Standby(rank) => write!(f, "rank {rank}'s standby"),
            Role::Rank(rank) => write!(f, "rank {rank}"),
        }
    }
}

/// The rank a name such as `rank-3.flodl-job.invalid` (`prefix` `rank-`) or
/// `standby-3.flodl-job.invalid` gives (digits only, no sign or padding).
fn seat_of(prefix: &str, name: &str) -> Option<usize> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(JOB_SERVER_NAME)?.strip_suffix('.')?;
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    canonical.then(|| digits.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_names_read_back() {
        for rank in [0, 1, 7, 4096, usize::MAX] {
            assert_eq!(seat_of("rank-", &Role::rank_name(rank)), Some(rank));
            assert_eq!(seat_of("standby-", &Role::standby_name(rank)), Some(rank));
            assert_eq!(seat_of("rank-", &Role::standby_name(rank)), None);
        }
        for name in [
            "rank-.flodl-job.invalid",
            "rank-01.flodl-job.invalid",
            "rank-+1.flodl-job.invalid",
            "rank-1.other.invalid",
            "rank-1flodl-job.invalid",
            "flodl-job.invalid",
            "rank-99999999999999999999999.flodl-job.invalid",
        ] {
            assert_eq!(seat_of("rank-", name), None, "{name}");
        }
    }
}
