//! Making a job's CA and its certificates: one for the controller, and per rank one for the
//! rank and one for its process as a standby.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use thiserror::Error;

use super::files::TlsFiles;
use super::private::PrivateDir;
use super::role::Role;
use super::tls::JOB_SERVER_NAME;

/// How long a job's certificates are valid from the moment they are made.
const VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// How far back a certificate's validity starts, so clocks a little behind still accept it.
const CLOCK_SKEW: Duration = Duration::from_secs(3600);

/// A failure to make or write a job's keys.
#[derive(Debug, Error)]
pub enum KeyError {
    /// rcgen refused the parameters or failed to sign (e.g. a host that is not a valid DNS name).
    #[error("cannot make the job's certificates: {0}")]
    Generate(#[from] rcgen::Error),
    /// The directory or a file could not be written or read.
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    /// The key directory is not private, or a path in it is not a plain file or directory.
    #[error("{path}: refusing to keep keys there: {reason}")]
    Unsafe { path: PathBuf, reason: String },
    /// A rank's certificate was asked of a directory without the CA's key.
    #[error(
        "{path}: no CA key to issue a certificate with (only the directory `fdl cluster keys DIR \
         --world N` made keeps it)"
    )]
    NoCaKey { path: PathBuf },
    /// A world of no ranks.
    #[error("a job of zero ranks has no keys to make")]
    EmptyWorld,
}

/// A job's key directory: the CA's certificate, the controller's certificate and key, and per
/// rank a certificate and key (`rank-<r>.pem`, `rank-<r>.key`) and its process's as a standby
/// (`standby-<r>.pem`, `standby-<r>.key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobKeys {
    dir: PathBuf,
}

impl JobKeys {
    /// The CA's certificate: every process trusts it alone.
    pub const CA_FILE: &'static str = "ca.pem";
    /// The CA's private key, kept only where later ranks may be issued: never copy it to a host.
    pub const CA_KEY_FILE: &'static str = "ca.key";

    /// The key directory `dir` as made before (nothing is read until a file is loaded).
    pub fn at(dir: &Path) -> JobKeys {
        JobKeys { dir: dir.to_owned() }
    }

    /// Makes a fresh CA in `dir` and signs with it the controller's certificate (server use only,
    /// naming [`JOB_SERVER_NAME`] and `hosts`) and per rank of `world` two: the rank's (client
    /// use only, naming its rank) and its process's as a standby (server use only, naming
    /// [`Role::standby_name`]), all written with mode 0600 in a private `dir` (made 0700
    /// when missing; an existing one must not be readable by others). With `keep_ca`, the CA's
    /// key is written too ([`JobKeys::CA_KEY_FILE`]) so [`JobKeys::issue`] can add a rank later;
    /// without it the key is dropped and nobody can add a certificate to the job.
    pub fn generate(
        dir: &Path,
        world: usize,
        hosts: &[String],
        keep_ca: bool,
    ) -> Result<JobKeys, KeyError> {
        if world == 0 {
            return Err(KeyError::EmptyWorld);
        }
        let private = PrivateDir::open(dir)?;
        let now = time::OffsetDateTime::now_utc();
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name.push(DnType::CommonName, "flodl job CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        ca.not_before = now - CLOCK_SKEW;
        ca.not_after = now + VALIDITY;
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca.self_signed(&ca_key)?;
        private.write(Self::CA_FILE, ca_cert.pem().as_bytes())?;
        if keep_ca {
            private.write(Self::CA_KEY_FILE, ca_key.serialize_pem().as_bytes())?;
        }
        let issuer = Issuer::new(ca, ca_key);
        let keys = JobKeys { dir: dir.to_owned() };
        keys.sign(&private, &issuer, Role::Controller, hosts, &keys.controller())?;
        for rank in 0..world {
            keys.issue_seat(&private, &issuer, rank, hosts)?;
        }
        Ok(keys)
    }

    /// Issues rank `rank`'s certificates (the rank's and its standby's) with the CA key kept in
    /// `dir` (a host that joins a job later, or a seat beyond the world the keys were first made
    /// for); returns the rank's.
    pub fn issue(dir: &Path, rank: usize) -> Result<TlsFiles, KeyError> {
        let private = PrivateDir::open(dir)?;
        let read = |name: &str| {
            let path = private.join(name);
            std::fs::read_to_string(&path).map_err(|source| {
                if source.kind() == std::io::ErrorKind::NotFound && name == Self::CA_KEY_FILE {
                    KeyError::NoCaKey { path: dir.to_owned() }
                } else {
                    KeyError::Write { path, source }
                }
            })
        };
        let ca_key = KeyPair::from_pem(&read(Self::CA_KEY_FILE)?)?;
        let issuer = Issuer::from_ca_cert_pem(&read(Self::CA_FILE)?, ca_key)?;
        let keys = JobKeys { dir: dir.to_owned() };
        keys.issue_seat(&private, &issuer, rank, &[])?;
        Ok(keys.rank(rank))
    }

    /// Signs seat `rank`'s two certificates: the rank's (client use) and its process's as a
    /// standby (server use, naming [`Role::standby_name`]: the controller's key never leaves
    /// the controller's process, and a standby's serves only the terms its rank takes over).
    fn issue_seat(
        &self,
        private: &PrivateDir,
        issuer: &Issuer<'_, KeyPair>,
        rank: usize,
        hosts: &[String],
    ) -> Result<(), KeyError> {
        self.sign(private, issuer, Role::Rank(rank), &[], &self.rank(rank))?;
        self.sign(private, issuer, Role::Standby(rank), hosts, &self.standby(rank))
    }

    /// The files of the controller: the CA, its certificate and its key.
    pub fn controller(&self) -> TlsFiles {
        self.files("controller")
    }

    /// The files of rank `rank`'s process as a standby (it takes over when the controller's
    /// process dies and its rank is next in the chain): a server certificate of its own.
    pub fn standby(&self, rank: usize) -> TlsFiles {
        self.files(&format!("standby-{rank}"))
    }

    /// Every rank's standby files at once, as [`JobKeys::ranks`] (the paths hold
    /// [`TlsFiles::RANK_PLACEHOLDER`]).
    pub fn standbys(&self) -> TlsFiles {
        self.files(&format!("standby-{}", TlsFiles::RANK_PLACEHOLDER))
    }

    /// The files of rank `rank`: the CA, its certificate and its key.
    pub fn rank(&self, rank: usize) -> TlsFiles {
        self.files(&format!("rank-{rank}"))
    }

    /// Every rank's files at once, for a launcher that hands all its processes the same
    /// variables: the certificate and key paths hold [`TlsFiles::RANK_PLACEHOLDER`], which each
    /// rank fills in ([`TlsFiles::for_rank`]).
    pub fn ranks(&self) -> TlsFiles {
        self.files(&format!("rank-{}", TlsFiles::RANK_PLACEHOLDER))
    }

    /// Every process's files at once, by seat ([`TlsFiles::SEAT_PLACEHOLDER`]): rank 0's process
    /// takes the controller's when they are there, every other its rank's.
    pub fn seats(&self) -> TlsFiles {
        self.files(TlsFiles::SEAT_PLACEHOLDER)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn files(&self, stem: &str) -> TlsFiles {
        TlsFiles {
            ca: self.dir.join(Self::CA_FILE),
            cert: self.dir.join(format!("{stem}.pem")),
            key: self.dir.join(format!("{stem}.key")),
        }
    }

    /// Signs `role`'s certificate (extra DNS names or addresses `hosts`) and writes it and its
    /// key as `files` name them.
    fn sign(
        &self,
        private: &PrivateDir,
        issuer: &Issuer<'_, KeyPair>,
        role: Role,
        hosts: &[String],
        files: &TlsFiles,
    ) -> Result<(), KeyError> {
        let now = time::OffsetDateTime::now_utc();
        let (names, usage, common) = match role {
            Role::Controller | Role::Standby(_) => {
                let name = role.server_name().unwrap_or_else(|| JOB_SERVER_NAME.to_owned());
                let mut names = vec![name];
                names.extend(hosts.iter().filter(|h| !h.ends_with(JOB_SERVER_NAME)).cloned());
                let common = match role {
                    Role::Standby(rank) => format!("flodl job standby of rank {rank}"),
                    _ => "flodl job controller".to_owned(),
                };
                (names, ExtendedKeyUsagePurpose::ServerAuth, common)
            }
            Role::Rank(rank) => (
                vec![Role::rank_name(rank)],
                ExtendedKeyUsagePurpose::ClientAuth,
                format!("flodl job rank {rank}"),
            ),
        };
        let mut leaf = CertificateParams::new(names)?;
        leaf.distinguished_name.push(DnType::CommonName, common);
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        leaf.extended_key_usages = vec![usage];
        leaf.use_authority_key_identifier_extension = true;
        leaf.not_before = now - CLOCK_SKEW;
        leaf.not_after = now + VALIDITY;
        let key = KeyPair::generate()?;
        let cert = leaf.signed_by(&key, issuer)?;
        for (path, bytes) in [(&files.cert, cert.pem()), (&files.key, key.serialize_pem())] {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            private.write(name, bytes.as_bytes())?;
        }
        Ok(())
    }
}
