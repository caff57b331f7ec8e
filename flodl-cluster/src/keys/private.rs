//! A directory of secrets: owner-only, and written without following links.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::job_keys::KeyError;

/// A directory that holds a job's private keys: made 0700 when missing; an existing one must be a
/// real directory (not a link) that neither its group nor others can read.
#[derive(Debug)]
pub(crate) struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    /// Makes `dir`, or checks the existing one.
    pub(crate) fn open(dir: &Path) -> Result<PrivateDir, KeyError> {
        let io = |source| KeyError::Write { path: dir.to_owned(), source };
        match fs::symlink_metadata(dir) {
            Ok(meta) => {
                if !meta.file_type().is_dir() {
                    return Err(KeyError::Unsafe {
                        path: dir.to_owned(),
                        reason: "not a directory (a link is not followed)".into(),
                    });
                }
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt;
                    let mode = meta.permissions().mode() & 0o777;
                    if mode & 0o077 != 0 {
                        return Err(KeyError::Unsafe {
                            path: dir.to_owned(),
                            reason: format!(
                                "mode {mode:04o} lets others reach the keys (chmod 700 it, or \
                                 name a new directory)"
                            ),
                        });
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut builder = fs::DirBuilder::new();
                builder.recursive(true);
                #[cfg(unix)]
                std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
                builder.create(dir).map_err(io)?;
            }
            Err(e) => return Err(io(e)),
        }
        Ok(PrivateDir { path: dir.to_owned() })
    }

    /// The path of `name` in it.
    pub(crate) fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Writes `bytes` to a fresh file `name` readable by its owner only. Whatever was at that path
    /// is unlinked first (a link itself, never its target) and the file is created exclusively, so
    /// a link planted in between makes the write fail rather than land elsewhere.
    pub(crate) fn write(&self, name: &str, bytes: &[u8]) -> Result<PathBuf, KeyError> {
        let path = self.join(name);
        let wrap = |source| KeyError::Write { path: path.clone(), source };
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(wrap(e)),
        }
        let mut options = fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&path).map_err(wrap)?;
        file.write_all(bytes).map_err(wrap)?;
        file.sync_all().map_err(wrap)?;
        Ok(path)
    }
}
