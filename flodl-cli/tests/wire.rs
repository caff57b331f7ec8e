//! Quantized wire formats across rank processes: `fdl launch --wire int8|q4` on the host
//! backend trains every sample once per epoch, as well as f32, in a quarter and an eighth of the
//! bytes per reduce, and resumes from a bundle it saved mid-run.
//!
//! CI cost: fourteen launched jobs of 3 ranks on 4,096 samples, 2 epochs (about 2 s each on 2
//! cores, more under load).

use std::path::Path;
use std::process::Command;

use serde_json::Value;

mod support;

use support::launched::{FDL, Result, accuracy, audit, records, summary};

/// 3 ranks' worth of 4,096 training and 1,000 test images, 2 epochs under `Sync` (the same
/// windows whatever the machine's load, so only the format differs between the jobs).
const JOB: [&str; 14] = [
    "--backend",
    "host",
    "--policy",
    "sync",
    "--train-subset",
    "4096",
    "--test-subset",
    "1000",
    "--epochs",
    "2",
    "--hidden",
    "64",
    "--batch-size",
    "32",
];

/// Runs `fdl launch --nproc 3 --wire <wire>` with `extra` flags into `out`; fails unless every
/// rank exits 0.
fn launch(wire: &str, extra: &[&str], out: &Path) -> Result {
    let run = Command::new(FDL)
        .args(["launch", "--nproc", "3", "--quiet", "--wire", wire, "--out"])
        .arg(out)
        .args(JOB)
        .args(extra)
        .output()?;
    let stdout = String::from_utf8_lossy(&run.stdout);
    if !run.status.success() {
        return Err(format!("{wire}: {stdout}\n{}", String::from_utf8_lossy(&run.stderr)).into());
    }
    for rank in 0..3 {
        if !stdout.contains(&format!("[launch] rank {rank} exited with 0")) {
            return Err(format!("{wire}: rank {rank} did not exit with 0: {stdout}").into());
        }
    }
    Ok(())
}

/// Samples trained in each epoch of a run directory, in epoch order.
fn epoch_samples(dir: &Path) -> Result<Vec<u64>> {
    records(dir, "epoch")?
        .iter()
        .map(|e| e["samples"].as_u64().ok_or_else(|| format!("no samples in {e}").into()))
        .collect()
}

/// The mean bytes of one snapshot and of one update of a remote rank (rank 1, another process),
/// from `summary.json`.
fn bytes_per_reduce(s: &Value) -> Result<(f64, f64)> {
    let wire = &s["ranks"][1]["wire"];
    let get = |k: &str| wire[k].as_f64().ok_or_else(|| format!("no {k} in {s}"));
    Ok((get("sent_per_reduce")?, get("received_per_reduce")?))
}

/// int8 and q4 against f32 on the same job: every sample once per epoch, accuracy within half
/// a point of f32's, and bytes per reduce both ways at most 0.27× (int8) and 0.14× (q4) of
/// f32's, as the controller's end of each connection counted them. The in-process rank 0
/// records no bytes.
#[test]
fn quantized_wires_train_as_well_as_f32_in_fewer_bytes() -> Result {
    let tmp = tempfile::tempdir()?;
    let full = tmp.path().join("f32");
    launch("f32", &[], &full)?;
    let (f32_acc, f32_bytes) = (accuracy(&full)?, bytes_per_reduce(&summary(&full)?)?);
    for (wire, ratio) in [("int8", 0.27), ("q4", 0.14)] {
        let dir = tmp.path().join(wire);
        launch(wire, &[], &dir)?;
        assert_eq!(epoch_samples(&dir)?, vec![4096, 4096], "{wire}: every sample once per epoch");
        let s = summary(&dir)?;
        assert_eq!(s["spec"]["wire"], wire);
        let acc = accuracy(&dir)?;
        assert!((acc - f32_acc).abs() <= 0.005, "{wire}: accuracy {acc} against f32's {f32_acc}");
        let (sent, received) = bytes_per_reduce(&s)?;
        assert!(sent > 0.0 && received > 0.0, "{wire}: no bytes recorded: {s}");
        assert!(sent <= ratio * f32_bytes.0, "{wire}: {sent} bytes a snapshot, f32 {f32_bytes:?}");
        assert!(
            received <= ratio * f32_bytes.1,
            "{wire}: {received} bytes an update, f32 {f32_bytes:?}"
        );
        assert!(s["ranks"][0].get("wire").is_none_or(Value::is_null), "{wire}: rank 0 in memory");
        for r in s["ranks"].as_array().ok_or("no ranks")? {
            assert!(r["time"]["exchange_ms"].as_f64().is_some(), "{wire}: no exchange time: {r}");
        }
    }
    Ok(())
}

/// q4 with the exchange overlapped (`--overlap`: ranks train on while their snapshots travel
/// and merge the consensus when it arrives) against f32 without: every sample once per epoch,
/// accuracy within half a point of f32's.
#[test]
fn an_overlapped_q4_job_trains_as_well_as_f32() -> Result {
    let tmp = tempfile::tempdir()?;
    let (full, overlapped) = (tmp.path().join("f32"), tmp.path().join("q4-overlap"));
    launch("f32", &[], &full)?;
    launch("q4", &["--overlap"], &overlapped)?;
    assert_eq!(epoch_samples(&overlapped)?, vec![4096, 4096], "every sample once per epoch");
    let s = summary(&overlapped)?;
    assert_eq!(s["spec"]["overlap"], 1.0, "{s}");
    let (a, b) = (accuracy(&full)?, accuracy(&overlapped)?);
    assert!((a - b).abs() <= 0.005, "overlapped q4 accuracy {b} against f32's {a}");
    Ok(())
}

/// q4 with the parameters cut into 4 fragments, one synced per reduce in turn (`--fragments 4`)
/// against f32 whole: every sample of every epoch once in the final model (`fdl audit` over the
/// ledger), accuracy within half a point of f32's, and a snapshot and an update at most half of
/// q4's bound against f32 (0.14×): the reference MLP's first layer holds 98% of its values, so
/// one reduce in four carries it and the three others a few hundred values each.
#[test]
fn a_fragmented_q4_job_trains_as_well_as_f32() -> Result {
    let tmp = tempfile::tempdir()?;
    let (full, fragmented) = (tmp.path().join("f32"), tmp.path().join("q4-fragments"));
    launch("f32", &[], &full)?;
    launch("q4", &["--fragments", "4"], &fragmented)?;
    assert_eq!(epoch_samples(&fragmented)?, vec![4096, 4096], "every sample once per epoch");
    audit(&fragmented, &[])?;
    let s = summary(&fragmented)?;
    assert_eq!(s["spec"]["fragments"], 4, "{s}");
    let (a, b) = (accuracy(&full)?, accuracy(&fragmented)?);
    assert!((a - b).abs() <= 0.005, "fragmented q4 accuracy {b} against f32's {a}");
    let (f32_sent, f32_received) = bytes_per_reduce(&summary(&full)?)?;
    let (sent, received) = bytes_per_reduce(&s)?;
    println!(
        "bytes per reduce: f32 {f32_sent}/{f32_received}, q4 in 4 fragments {sent}/{received}"
    );
    assert!(sent > 0.0 && sent <= 0.07 * f32_sent, "{sent} bytes a snapshot, f32 {f32_sent}");
    assert!(
        received > 0.0 && received <= 0.07 * f32_received,
        "{received} bytes an update, f32 {f32_received}"
    );
    Ok(())
}

/// A q4 job resumed (under q4) from a bundle it saved in the middle of its first epoch trains
/// exactly the samples the bundle left of each epoch and ends as well as the job that saved it,
/// with the exchange overlapped or not (a rank asked for a checkpoint part trains nothing until
/// the update, so the bundle is one cut of the run either way), and with the parameters in 4
/// fragments (a reduce that saves a bundle syncs every fragment, so the bundle's consensus holds
/// every rank's work, and the resumed job audits exactly once through the saving job's ledger).
/// The bundle needs no residuals: it holds the f32 consensus, every rank restarts from it
/// whole (its `Init` travels in f32), so both ends' views are the consensus and the residuals
/// start at zero, as at the start of a run.
#[test]
fn a_q4_job_resumes_from_a_mid_run_bundle() -> Result {
    a_q4_job_resumes_with(&[])?;
    a_q4_job_resumes_with(&["--overlap"])?;
    a_q4_job_resumes_with(&["--fragments", "4"])
}

/// [`a_q4_job_resumes_from_a_mid_run_bundle`] with `extra` flags on both jobs.
fn a_q4_job_resumes_with(extra: &[&str]) -> Result {
    use flodl_ddp::checkpoint::{Checkpoint, step_bundles};
    let tmp = tempfile::tempdir()?;
    let (ck, saved, resumed) =
        (tmp.path().join("ck"), tmp.path().join("saved"), tmp.path().join("resumed"));
    let ck_arg = ck.to_str().ok_or("path")?;
    let saving =
        ["--checkpoint-every-reduces", "5", "--keep-checkpoints", "100", "--checkpoint-dir"];
    launch("q4", &[extra, &saving[..], &[ck_arg]].concat(), &saved)?;
    let mut chosen = None;
    for (_, path) in step_bundles(&ck)? {
        let c = Checkpoint::read(&path)?;
        if c.epoch == 0 && c.coverage_of(0).is_some_and(|e| !e.is_complete() && e.done_count() > 0)
        {
            chosen = Some((path, c));
            break;
        }
    }
    let (bundle, ckpt) = chosen.ok_or("no mid-epoch bundle")?;
    let left = |e: u64| ckpt.coverage_of(e).map_or(4096, |c| c.total - c.done_count()) as u64;
    launch("q4", &[extra, &["--resume", bundle.to_str().ok_or("path")?]].concat(), &resumed)?;
    assert_eq!(
        epoch_samples(&resumed)?,
        vec![left(0), left(1)],
        "{extra:?}: the rest of each epoch"
    );
    let (a, b) = (accuracy(&saved)?, accuracy(&resumed)?);
    assert!((a - b).abs() <= 0.02, "{extra:?}: saved {a} against resumed {b}");
    audit(&resumed, &[&saved])?;
    Ok(())
}
