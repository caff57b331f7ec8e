//! Lets this crate's tests, examples and doctests find libtorch at run time: an rpath to the
//! library directory of `LIBTORCH_INCLUDE` (the torch package that `libtorch/install` installs;
//! the repository's `.cargo/config.toml` sets it). Without it, libtorch must be on the loader's
//! path (`LD_LIBRARY_PATH`), as with `LIBTORCH_USE_PYTORCH=1`.

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH_INCLUDE");
    if let Ok(dir) = std::env::var("LIBTORCH_INCLUDE") {
        let lib = std::path::Path::new(&dir).join("lib");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    }
}
