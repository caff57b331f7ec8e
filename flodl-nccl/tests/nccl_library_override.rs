//! The `FLODL_NCCL_LIB` override: a path that does not exist is a typed error, never a panic.
#![cfg(feature = "cuda")]

use flodl_nccl::{Error, NCCL_LIB_ENV, UniqueId, nccl_version};

#[test]
fn a_bad_override_path_is_reported_as_a_missing_library() -> Result<(), String> {
    let path = std::env::temp_dir().join("flodl-no-such-dir/libnccl-missing.so.2");
    // SAFETY: this test binary has exactly one test, so no other thread reads the environment.
    unsafe { std::env::set_var(NCCL_LIB_ENV, &path) };
    for _ in 0..2 {
        match nccl_version() {
            Err(Error::LibraryMissing(why)) => {
                assert!(why.contains("libnccl-missing.so.2"), "{why}");
                assert!(why.contains(NCCL_LIB_ENV), "{why}");
            }
            other => return Err(format!("expected LibraryMissing, got {other:?}")),
        }
    }
    assert!(matches!(UniqueId::new(), Err(Error::LibraryMissing(_))));
    Ok(())
}
