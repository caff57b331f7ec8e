//! `cargo xtask gpu-test` and the bundle's `run-bundle`: build, detect GPUs, run the matrix.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::bundle;
use crate::cargo_artifact::{self, BuildMode, TestBinary, TestBuild};
use crate::flags::{GpuTestArgs, MatrixArgs, RunBundleArgs};
use crate::gpu_inventory::GpuInventory;
use crate::matrix::{self, CASES, JOBS};
use crate::matrix_report::MatrixReport;
use crate::row_runner::{RowResult, RunContext, file_in};
use crate::workspace;

/// Runs `cargo xtask gpu-test`.
///
/// # Errors
/// When no GPU is visible (unless allowed), the build fails, or a matrix row fails.
pub(crate) fn run(args: &GpuTestArgs) -> Result<()> {
    let mode = if args.keep_going || args.list { BuildMode::KeepGoing } else { BuildMode::Strict };
    if let Some(dir) = &args.bundle {
        let build = cargo_artifact::build_tests(mode)?;
        bundle::make(dir, &build, JOBS)?;
        eprintln!(
            "bundle: on a GPU machine run `{}/run.sh` (results go to $OUT or ./out)",
            dir.display()
        );
        return Ok(());
    }
    if args.list {
        return list(&cargo_artifact::build_tests(mode)?.binaries);
    }
    let inventory = GpuInventory::detect(args.matrix.gpus);
    check_gpus(&inventory, &args.matrix)?;
    let build = cargo_artifact::build_tests(mode)?;
    let out = args.matrix.out.clone().unwrap_or_else(|| workspace::target_dir().join("gpu-test"));
    let mnist =
        env::var_os("FLODL_MNIST_DIR").map(PathBuf::from).unwrap_or_else(workspace::mnist_dir);
    let report = run_matrix(inventory, &build, &args.matrix, &mnist, &out)?;
    println!("{}", report.render());
    fail_unless_ok(&report, &out)?;
    if !build.complete {
        bail!(
            "some tests did not compile (see the cargo errors above); the matrix ran without them"
        );
    }
    Ok(())
}

/// The exit status of `run-bundle` when no GPU is visible: the matrix is written with every row
/// not run, and nothing was tested (77: "skipped", as automake's test drivers read it).
pub(crate) const NO_GPU_EXIT: u8 = 77;

/// Runs the matrix from a bundle (what the bundle's run.sh calls; run.sh prints the table that
/// this writes to `matrix.txt`). With no GPU visible (and no `--allow-no-gpu`) every row is
/// reported as not run, and the result is [`NO_GPU_EXIT`].
///
/// # Errors
/// When the bundle is unreadable or a matrix row fails.
pub(crate) fn run_bundle(args: &RunBundleArgs) -> Result<ExitCode> {
    let build = bundle::load(&args.bundle)?;
    let inventory = GpuInventory::detect(args.matrix.gpus);
    let out = args.matrix.out.clone().unwrap_or_else(|| args.bundle.join("out"));
    if inventory.count == 0 && !args.matrix.allow_no_gpu {
        let evidence = inventory.evidence.join("; ");
        let rows = matrix::plan(CASES, JOBS, &build.binaries, args.matrix.cases_only, 0);
        let results = rows.into_iter().map(|row| RowResult::not_run(row, "no GPU")).collect();
        let report = MatrixReport::new(inventory, true, results);
        report.write(&out)?;
        eprintln!(
            "gpu-test: no GPU visible ({evidence}): nothing was tested (see {})",
            out.join("matrix.txt").display()
        );
        return Ok(ExitCode::from(NO_GPU_EXIT));
    }
    check_gpus(&inventory, &args.matrix)?;
    let mnist = env::var_os("FLODL_MNIST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| args.bundle.join("data").join("mnist"));
    let report = run_matrix(inventory, &build, &args.matrix, &mnist, &out)?;
    fail_unless_ok(&report, &out)?;
    Ok(ExitCode::SUCCESS)
}

/// An error naming the failed rows, unless the matrix passed.
fn fail_unless_ok(report: &MatrixReport, out: &Path) -> Result<()> {
    if !report.ok {
        bail!(
            "GPU matrix failed: {} row(s); see {}",
            report.failures,
            out.join("matrix.txt").display()
        );
    }
    Ok(())
}

/// Fails clearly when no GPU is visible, unless `--allow-no-gpu`.
fn check_gpus(inventory: &GpuInventory, args: &MatrixArgs) -> Result<()> {
    if inventory.count > 0 {
        eprintln!(
            "gpu-test: {} GPU(s) visible ({})",
            inventory.count,
            inventory.evidence.join("; ")
        );
        return Ok(());
    }
    let evidence = inventory.evidence.join("; ");
    if args.allow_no_gpu {
        eprintln!(
            "gpu-test: no GPU visible ({evidence}); --allow-no-gpu: running the CPU rows without FLODL_REQUIRE_GPU"
        );
        return Ok(());
    }
    bail!(
        "no GPU visible ({evidence}). gpu-test needs a GPU: run it on a GPU machine, carry the tests \
         there with `cargo xtask gpu-test --bundle DIR`, or pass --allow-no-gpu to run the CPU rows only"
    )
}

/// Runs every row of the plan and writes matrix.txt, matrix.json and matrix.log into `out`.
fn run_matrix(
    inventory: GpuInventory,
    build: &TestBuild,
    args: &MatrixArgs,
    mnist: &Path,
    out: &Path,
) -> Result<MatrixReport> {
    let require_gpu = inventory.count > 0;
    let context = RunContext {
        gpus: inventory.count,
        require_gpu,
        timeout: Duration::from_secs(args.timeout),
        mnist_dir: mnist.to_path_buf(),
        log_path: file_in(out, "matrix.log")?,
        scratch_path: file_in(out, "row.tmp")?,
        fdl: build.fdl.clone(),
        jobs_dir: out.join("jobs"),
    };
    if context.log_path.exists() {
        fs::remove_file(&context.log_path)?;
    }
    let binaries = &build.binaries;
    let rows = matrix::plan(CASES, JOBS, binaries, args.cases_only, inventory.count);
    let mut results = Vec::with_capacity(rows.len());
    for row in &rows {
        let binary = binaries.iter().find(|b| b.id() == row.binary);
        let result = context.run_row(row, binary)?;
        eprintln!(
            "gpu-test: {:<40} {:<24} {} ({:.1} s)",
            row.label,
            row.binary,
            result.outcome.word(),
            result.seconds
        );
        results.push(result);
    }
    if context.scratch_path.exists() {
        fs::remove_file(&context.scratch_path)?;
    }
    let report = MatrixReport::new(inventory, require_gpu, results);
    report.write(out)?;
    eprintln!("gpu-test: wrote {}/matrix.txt, matrix.json, matrix.log", out.display());
    Ok(report)
}

/// Prints each test binary's tests and the cases that select them, to keep [`CASES`] current.
fn list(binaries: &[TestBinary]) -> Result<()> {
    for binary in binaries {
        let output = Command::new(&binary.exe)
            .args(["--list", "--format", "terse"])
            .current_dir(&binary.manifest_dir)
            .output()
            .with_context(|| format!("cannot start {}", binary.exe.display()))?;
        let tests = matrix::parse_test_list(&String::from_utf8_lossy(&output.stdout));
        println!("{} ({} tests)", binary.id(), tests.len());
        for test in &tests {
            let cases: Vec<&str> = CASES
                .iter()
                .filter(|c| c.binary == binary.id())
                .filter(|c| {
                    matrix::selects(
                        &c.filters.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
                        test,
                    )
                })
                .map(|c| c.name)
                .collect();
            println!(
                "  {test}{}",
                if cases.is_empty() { String::new() } else { format!("  <- {}", cases.join(", ")) }
            );
        }
    }
    for case in CASES.iter().filter(|c| !binaries.iter().any(|b| b.id() == c.binary)) {
        println!("case {:?}: binary {} was not built", case.name, case.binary);
    }
    Ok(())
}
