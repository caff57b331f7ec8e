//! Test executables, as cargo reports them in `--message-format=json` (`compiler-artifact`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::workspace;

/// One test executable: a package's unit tests (lib, bin) or one integration test file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TestBinary {
    /// The package name (`flodl-tensor`).
    pub(crate) package: String,
    /// The target name (`flodl_tensor` for the lib, the file stem for an integration test).
    pub(crate) target: String,
    /// The target kind (`lib`, `bin`, `test`).
    pub(crate) kind: String,
    /// The executable.
    pub(crate) exe: PathBuf,
    /// The package folder (tests run there, as under `cargo test`).
    pub(crate) manifest_dir: PathBuf,
}

impl TestBinary {
    /// The id the matrix names it by: `package/lib`, `package/bin:name` or `package/test-file`.
    pub(crate) fn id(&self) -> String {
        match self.kind.as_str() {
            "lib" => format!("{}/lib", self.package),
            "test" => format!("{}/{}", self.package, self.target),
            kind => format!("{}/{kind}:{}", self.package, self.target),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Message {
    reason: String,
    #[serde(default)]
    package_id: String,
    manifest_path: Option<PathBuf>,
    target: Option<Target>,
    profile: Option<Profile>,
    executable: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
struct Target {
    kind: Vec<String>,
    name: String,
}

#[derive(Debug, Deserialize)]
struct Profile {
    test: bool,
}

/// The test executables among cargo's JSON messages (one per line; other lines are skipped).
///
/// # Errors
/// When a `compiler-artifact` line is not valid JSON of the documented shape.
pub(crate) fn parse_test_binaries(messages: &str) -> Result<Vec<TestBinary>> {
    let mut binaries = Vec::new();
    for line in messages.lines().filter(|l| l.contains("\"compiler-artifact\"")) {
        let message: Message =
            serde_json::from_str(line).with_context(|| format!("bad cargo message: {line}"))?;
        let (Some(target), Some(profile), Some(exe), Some(manifest_path)) =
            (message.target, message.profile, message.executable, message.manifest_path)
        else {
            continue;
        };
        if message.reason != "compiler-artifact" || !profile.test {
            continue;
        }
        let manifest_dir = manifest_path.parent().map(Path::to_path_buf).unwrap_or_default();
        let kind = target.kind.first().cloned().unwrap_or_default();
        binaries.push(TestBinary {
            package: package_name(&message.package_id, &manifest_dir),
            target: target.name,
            kind,
            exe,
            manifest_dir,
        });
    }
    binaries.sort_by_key(TestBinary::id);
    binaries.dedup_by(|a, b| a.id() == b.id());
    Ok(binaries)
}

/// The executable of the binary target `name` (not its unit-test build) among cargo's JSON
/// messages, when one was built (`cargo test --no-run` builds a package's binaries for its
/// integration tests).
pub(crate) fn parse_binary(messages: &str, name: &str) -> Option<PathBuf> {
    messages.lines().filter(|l| l.contains("\"compiler-artifact\"")).find_map(|line| {
        let message: Message = serde_json::from_str(line).ok()?;
        let (target, profile) = (message.target?, message.profile?);
        let is_bin = target.kind.iter().any(|k| k == "bin");
        (is_bin && target.name == name && !profile.test).then_some(message.executable).flatten()
    })
}

/// A package's name from its id: `path+file:///a/b#name@0.1.0` names it, `…/name#0.1.0` leaves
/// it to the folder; the old form `name 0.1.0 (path+file://…)` starts with it.
pub(crate) fn package_name(package_id: &str, manifest_dir: &Path) -> String {
    if let Some((_, fragment)) = package_id.rsplit_once('#') {
        if let Some((name, _)) = fragment.split_once('@') {
            return name.to_string();
        }
        let url_path = package_id.split_once('#').map_or(package_id, |(p, _)| p);
        if let Some(last) = url_path.rsplit('/').next().filter(|s| !s.is_empty()) {
            return last.to_string();
        }
    } else if let Some((name, _)) = package_id.split_once(' ') {
        return name.to_string();
    }
    manifest_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// How to react to a test that does not compile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BuildMode {
    /// `cargo test --no-run`: any compile error fails the build.
    Strict,
    /// `cargo build --tests --keep-going`: build what compiles and report what did.
    KeepGoing,
}

/// The test executables a build produced, and whether every test compiled.
#[derive(Debug, Clone)]
pub(crate) struct TestBuild {
    /// The executables.
    pub(crate) binaries: Vec<TestBinary>,
    /// Every test target compiled.
    pub(crate) complete: bool,
    /// The `fdl` binary, for the matrix's jobs.
    pub(crate) fdl: Option<PathBuf>,
}

/// Builds the workspace tests (release, `cuda` feature, xtask excluded) and returns their
/// executables.
///
/// # Errors
/// When cargo cannot start, or (in strict mode) the build fails.
pub(crate) fn build_tests(mode: BuildMode) -> Result<TestBuild> {
    let common = ["--workspace", "--exclude", "xtask", "--release", "--features", "cuda"];
    let mut args: Vec<&str> = match mode {
        BuildMode::Strict => vec!["test"],
        BuildMode::KeepGoing => vec!["build"],
    };
    args.extend(common);
    match mode {
        BuildMode::Strict => args.push("--no-run"),
        BuildMode::KeepGoing => args.extend(["--tests", "--keep-going"]),
    }
    args.push("--message-format=json-render-diagnostics");
    eprintln!("== cargo {}", args.join(" "));
    let output = Command::new(workspace::cargo())
        .args(&args)
        .current_dir(workspace::root())
        .stderr(Stdio::inherit())
        .output()
        .context("cannot start cargo")?;
    let messages = String::from_utf8_lossy(&output.stdout);
    let binaries = parse_test_binaries(&messages)?;
    let fdl = parse_binary(&messages, "fdl");
    let complete = output.status.success();
    if !complete {
        match mode {
            BuildMode::Strict => bail!("building the tests failed (cargo {})", args.join(" ")),
            BuildMode::KeepGoing => eprintln!(
                "warning: some tests did not compile; going on with the {} that did",
                binaries.len()
            ),
        }
    }
    Ok(TestBuild { binaries, complete, fdl })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact(
        package_id: &str,
        dir: &str,
        kind: &str,
        name: &str,
        test: bool,
        exe: &str,
    ) -> String {
        let exe = if exe.is_empty() { "null".to_string() } else { format!("\"{exe}\"") };
        format!(
            r#"{{"reason":"compiler-artifact","package_id":"{package_id}","manifest_path":"{dir}/Cargo.toml","target":{{"kind":["{kind}"],"crate_types":["{kind}"],"name":"{name}","src_path":"{dir}/src/lib.rs","edition":"2024","doc":true,"doctest":true,"test":true}},"profile":{{"opt_level":"3","debuginfo":1,"debug_assertions":false,"overflow_checks":false,"test":{test}}},"features":["cuda"],"filenames":["/t/x"],"executable":{exe},"fresh":false}}"#
        )
    }

    #[test]
    fn only_test_profile_executables_are_kept() -> Result<()> {
        let messages = [
            artifact(
                "path+file:///w/flodl-tensor#0.1.0",
                "/w/flodl-tensor",
                "lib",
                "flodl_tensor",
                false,
                "",
            ),
            artifact(
                "path+file:///w/flodl-tensor#0.1.0",
                "/w/flodl-tensor",
                "lib",
                "flodl_tensor",
                true,
                "/t/flodl_tensor-1",
            ),
            artifact(
                "path+file:///w/flodl-tensor#0.1.0",
                "/w/flodl-tensor",
                "test",
                "kernels",
                true,
                "/t/kernels-2",
            ),
            artifact(
                "path+file:///w/benches#flodl-benches@0.1.0",
                "/w/benches",
                "lib",
                "flodl_benches",
                true,
                "/t/flodl_benches-3",
            ),
            artifact(
                "path+file:///w/flodl-cli#0.1.0",
                "/w/flodl-cli",
                "bin",
                "fdl",
                true,
                "/t/fdl-4",
            ),
            artifact(
                "path+file:///w/flodl-cli#0.1.0",
                "/w/flodl-cli",
                "bin",
                "fdl",
                false,
                "/t/fdl",
            ),
            r#"{"reason":"build-finished","success":true}"#.to_string(),
            "not json at all".to_string(),
        ];
        let binaries = parse_test_binaries(&messages.join("\n"))?;
        let ids: Vec<String> = binaries.iter().map(TestBinary::id).collect();
        assert_eq!(
            ids,
            ["flodl-benches/lib", "flodl-cli/bin:fdl", "flodl-tensor/kernels", "flodl-tensor/lib"]
        );
        let kernels = &binaries[2];
        assert_eq!(kernels.exe, PathBuf::from("/t/kernels-2"));
        assert_eq!(kernels.manifest_dir, PathBuf::from("/w/flodl-tensor"));
        let messages = messages.join("\n");
        assert_eq!(parse_binary(&messages, "fdl"), Some(PathBuf::from("/t/fdl")));
        assert_eq!(parse_binary(&messages, "kernels"), None, "a test target is no binary");
        assert_eq!(parse_binary(&messages, "xtask"), None);
        Ok(())
    }

    #[test]
    fn a_broken_artifact_line_is_an_error() {
        let line = r#"{"reason":"compiler-artifact","target":{"kind":"lib"}}"#;
        assert!(parse_test_binaries(line).is_err());
    }

    #[test]
    fn package_names_come_from_every_id_form() {
        let dir = Path::new("/w/some-dir");
        let cases = [
            ("path+file:///w/flodl-nccl#0.1.0", "flodl-nccl"),
            ("path+file:///w/benches#flodl-benches@0.1.0", "flodl-benches"),
            ("registry+https://github.com/rust-lang/crates.io-index#serde@1.0.229", "serde"),
            ("flodl-data 0.1.0 (path+file:///w/flodl-data)", "flodl-data"),
            ("", "some-dir"),
        ];
        for (id, want) in cases {
            assert_eq!(package_name(id, dir), want, "{id}");
        }
    }
}
