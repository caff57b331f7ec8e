//! The mutual-TLS configurations of one job: a server that requires a client certificate from the
//! job's CA and a client that trusts only that CA.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use thiserror::Error;

use super::files::TlsFiles;
use super::role::{Role, RoleError};

/// The DNS name the controller's certificate carries and every rank verifies (see the
/// [module](crate::keys) documentation for why that is sound). `.invalid` never resolves.
pub const JOB_SERVER_NAME: &str = "flodl-job.invalid";

/// A failure to load a job's certificate files or build a TLS configuration from them.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A PEM file is missing, unreadable or holds nothing of the kind expected.
    #[error("cannot read {what} from {path}: {reason}")]
    Pem { what: &'static str, path: PathBuf, reason: String },
    /// rustls refused the material (e.g. a key that does not match the certificate).
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The CA certificate cannot anchor client verification.
    #[error("client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// The certificate is not one a job's CA issues to a controller or a rank.
    #[error("{path}: {source}")]
    Role { path: PathBuf, source: RoleError },
}

/// The server and client TLS configurations of one job member; cheap to clone.
#[derive(Clone)]
pub struct Tls {
    pub(crate) role: Role,
    pub(crate) server: Arc<ServerConfig>,
    pub(crate) client: Arc<ClientConfig>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// Loads the job's CA, this process's certificate and key, and builds both configurations
    /// (ring provider). The certificate must be a controller's or a rank's: an older fdl's
    /// shared certificate is refused with a line saying how to make new keys.
    pub fn load(files: &TlsFiles) -> Result<Tls, TlsError> {
        let ca = certs(&files.ca, "the CA certificate")?;
        let chain = certs(&files.cert, "the certificate")?;
        let role = Role::of(&chain[0])
            .map_err(|source| TlsError::Role { path: files.cert.clone(), source })?;
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|e| pem_error("the private key", &files.key, e))?;
        let provider = Arc::new(provider());
        let mut roots = RootCertStore::empty();
        for cert in ca {
            roots.add(cert)?;
        }
        let roots = Arc::new(roots);

        let verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone()).build()?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        Ok(Tls { role, server: Arc::new(server), client: Arc::new(client) })
    }

    /// What this process's certificate lets it be: the controller, or one rank.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The server configuration: it requires a client certificate from the job's CA.
    pub fn server(&self) -> Arc<ServerConfig> {
        self.server.clone()
    }

    /// The client configuration: it presents this member's certificate and trusts the job's CA
    /// alone, verifying the name of the controller it joins ([`JOB_SERVER_NAME`], or a standby's
    /// that took over: a rank's certificate, issued for client use only and without either name,
    /// cannot serve).
    pub fn client(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }

    /// The name a client verifies on the certificate of the controller `serving` (the first
    /// controller's [`JOB_SERVER_NAME`], or a standby's [`Role::standby_name`]); `None` for a
    /// rank, which serves nothing.
    pub(crate) fn server_name(serving: Role) -> Option<ServerName<'static>> {
        ServerName::try_from(serving.server_name()?).ok()
    }
}

/// ring's provider with AES-128-GCM preferred: both ends are the job's own, 128-bit keys are
/// ample, and it encrypts the bulk lane about a third faster than AES-256.
fn provider() -> CryptoProvider {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    provider
}

/// Every certificate in a PEM file (at least one).
fn certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(what, path, e))?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what,
            path: path.to_owned(),
            reason: "no certificate in the file".into(),
        });
    }
    Ok(certs)
}

fn pem_error(what: &'static str, path: &Path, e: rustls_pki_types::pem::Error) -> TlsError {
    TlsError::Pem { what, path: path.to_owned(), reason: e.to_string() }
}
