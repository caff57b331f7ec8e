//! Making a job's CA and its leaf certificate.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use thiserror::Error;

use super::files::TlsFiles;
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
    /// The directory or a file could not be written.
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// The maker of a job's keys.
#[derive(Debug, Clone, Copy)]
pub struct JobKeys;

impl JobKeys {
    /// The file names written in the key directory.
    pub const CA_FILE: &'static str = "ca.pem";
    /// The leaf certificate's file name.
    pub const CERT_FILE: &'static str = "cert.pem";
    /// The leaf key's file name.
    pub const KEY_FILE: &'static str = "key.pem";

    /// Makes a fresh CA and one leaf certificate signed by it for both server and client auth,
    /// naming [`JOB_SERVER_NAME`] and `hosts` (names or IP addresses), and writes `ca.pem`,
    /// `cert.pem` and `key.pem` in `dir` with mode 0600 (`dir` is made 0700 when missing). The CA's
    /// key is dropped once the leaf is signed: nobody can add a certificate to the job later.
    pub fn generate(dir: &Path, hosts: &[String]) -> Result<TlsFiles, KeyError> {
        let now = time_now();
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

        let mut names = vec![JOB_SERVER_NAME.to_owned()];
        names.extend(hosts.iter().filter(|h| h.as_str() != JOB_SERVER_NAME).cloned());
        let mut leaf = CertificateParams::new(names)?;
        leaf.distinguished_name.push(DnType::CommonName, "flodl job member");
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        leaf.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        leaf.use_authority_key_identifier_extension = true;
        leaf.not_before = now - CLOCK_SKEW;
        leaf.not_after = now + VALIDITY;
        let leaf_key = KeyPair::generate()?;
        let issuer = Issuer::new(ca, ca_key);
        let leaf_cert = leaf.signed_by(&leaf_key, &issuer)?;

        make_private_dir(dir)?;
        let files = TlsFiles {
            ca: dir.join(Self::CA_FILE),
            cert: dir.join(Self::CERT_FILE),
            key: dir.join(Self::KEY_FILE),
        };
        write_private(&files.ca, ca_cert.pem().as_bytes())?;
        write_private(&files.cert, leaf_cert.pem().as_bytes())?;
        write_private(&files.key, leaf_key.serialize_pem().as_bytes())?;
        Ok(files)
    }
}

/// The current time as rcgen wants it.
fn time_now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

/// Creates `dir` (mode 0700 on Unix) unless it exists.
fn make_private_dir(dir: &Path) -> Result<(), KeyError> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|source| KeyError::Write { path: dir.to_owned(), source })
}

/// Writes `bytes` to a fresh or truncated file readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), KeyError> {
    let wrap = |source| KeyError::Write { path: path.to_owned(), source };
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(wrap)?;
    // An existing file keeps its old mode on open: narrow it explicitly.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(0o600)).map_err(wrap)?;
    }
    file.write_all(bytes).map_err(wrap)?;
    file.sync_all().map_err(wrap)
}
