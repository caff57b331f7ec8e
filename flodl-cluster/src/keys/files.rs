//! Where a job's certificate files are.

use std::path::PathBuf;

/// The paths of a job's PEM files: the CA certificate, this process's certificate and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The job CA's certificate: the only trust anchor.
    pub ca: PathBuf,
    /// The certificate this process presents: the controller's (server use) or its rank's
    /// (client use).
    pub cert: PathBuf,
    /// The private key of `cert`.
    pub key: PathBuf,
}

impl TlsFiles {
    /// The variable naming the CA certificate file.
    pub const CA_VAR: &'static str = "FLODL_TLS_CA";
    /// The variable naming this process's certificate file.
    pub const CERT_VAR: &'static str = "FLODL_TLS_CERT";
    /// The variable naming this process's key file.
    pub const KEY_VAR: &'static str = "FLODL_TLS_KEY";

    /// The files named by `FLODL_TLS_CA`, `FLODL_TLS_CERT` and `FLODL_TLS_KEY`; `None` unless all
    /// three are set.
    pub fn from_env() -> Option<TlsFiles> {
        TlsFiles::from_vars(|name| std::env::var_os(name).map(PathBuf::from))
    }

    /// The files named by the three variables as `get` returns them; `None` unless all are set.
    pub fn from_vars(get: impl Fn(&str) -> Option<PathBuf>) -> Option<TlsFiles> {
        let get = |name: &str| get(name).filter(|p| !p.as_os_str().is_empty());
        Some(TlsFiles {
            ca: get(Self::CA_VAR)?,
            cert: get(Self::CERT_VAR)?,
            key: get(Self::KEY_VAR)?,
        })
    }

    /// The placeholder a launcher that hands every process the same variables (`mpirun -x`)
    /// writes in the certificate and key paths; each rank puts its own rank there.
    pub const RANK_PLACEHOLDER: &'static str = "{rank}";
    /// The placeholder for a file's stem by seat: `controller` in rank 0's process when the
    /// controller's files are there (it hosts the controller), else `rank-<r>`. For launchers
    /// that hand every process of a host the same variables (torchrun, srun): give rank 0's
    /// host the controller's files, every host its ranks'.
    pub const SEAT_PLACEHOLDER: &'static str = "{seat}";

    /// These files for rank `rank`'s process: [`TlsFiles::RANK_PLACEHOLDER`] and
    /// [`TlsFiles::SEAT_PLACEHOLDER`] in the certificate and key paths filled in.
    pub fn for_rank(&self, rank: usize) -> TlsFiles {
        let fill = |path: &PathBuf, seat: &str| match path.to_str() {
            Some(text)
                if text.contains(Self::RANK_PLACEHOLDER)
                    || text.contains(Self::SEAT_PLACEHOLDER) =>
            {
                PathBuf::from(
                    text.replace(Self::RANK_PLACEHOLDER, &rank.to_string())
                        .replace(Self::SEAT_PLACEHOLDER, seat),
                )
            }
            _ => path.clone(),
        };
        let own = format!("rank-{rank}");
        if rank == 0 {
            let hosting = TlsFiles {
                ca: self.ca.clone(),
                cert: fill(&self.cert, "controller"),
                key: fill(&self.key, "controller"),
            };
            if hosting != *self && hosting.cert.is_file() && hosting.key.is_file() {
                return hosting;
            }
        }
        TlsFiles { ca: self.ca.clone(), cert: fill(&self.cert, &own), key: fill(&self.key, &own) }
    }

    /// The variables that name these files, as `(name, path)` pairs for a child's environment.
    pub fn vars(&self) -> [(&'static str, &std::path::Path); 3] {
        [(Self::CA_VAR, &self.ca), (Self::CERT_VAR, &self.cert), (Self::KEY_VAR, &self.key)]
    }
}
