//! End-to-end tests of the `fdl` binary on a small MNIST subset.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const FDL: &str = env!("CARGO_BIN_EXE_fdl");

/// The vendored MNIST directory.
fn mnist_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist")
}

/// Runs `fdl args...` with backtraces requested (none may appear anyway).
fn fdl(args: &[&str]) -> Result<Output> {
    Ok(Command::new(FDL).args(args).env("RUST_BACKTRACE", "1").output()?)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A quick training run's flags: 2 CPU ranks, 1,536 training and 300 test images.
const SMALL: [&str; 10] = [
    "--ranks",
    "2",
    "--train-subset",
    "1536",
    "--test-subset",
    "300",
    "--batch-size",
    "32",
    "--epochs",
    "2",
];

fn train_small(out: &Path, extra: &[&str]) -> Result<Output> {
    train_on(out, &SMALL, extra)
}

/// Runs `fdl train` with `base` (a variant of [`SMALL`]) and `extra` flags into `out`.
fn train_on(out: &Path, base: &[&str], extra: &[&str]) -> Result<Output> {
    let out = out.to_str().ok_or("non-UTF-8 temp path")?;
    let mut args = vec!["train", "--out", out];
    args.extend(base);
    args.extend(extra);
    let output = fdl(&args)?;
    if !output.status.success() {
        return Err(format!("fdl train failed: {}", text(&output.stderr)).into());
    }
    Ok(output)
}

/// Asserts the command failed with exactly one `error:` line that mentions each of `needles`.
fn assert_one_line_error(output: &Output, needles: &[&str], case: &str) {
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "{case}: succeeded; stderr {stderr}");
    assert!(output.status.code().is_some_and(|c| c != 0), "{case}: killed? {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{case}: not one line: {stderr:?}");
    assert!(lines[0].starts_with("error: "), "{case}: {stderr:?}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{case}: {stderr:?}");
    for needle in needles {
        assert!(lines[0].contains(needle), "{case}: {needle:?} missing from {stderr:?}");
    }
}

fn finite(v: &Value) -> bool {
    v.as_f64().is_some_and(f64::is_finite)
}

/// Every `attr="..."` value in `svg`.
fn attr_values<'a>(svg: &'a str, attr: &str) -> Vec<&'a str> {
    let key = format!(" {attr}=\"");
    svg.match_indices(&key)
        .filter_map(|(i, _)| {
            let rest = &svg[i + key.len()..];
            rest.find('"').map(|end| &rest[..end])
        })
        .collect()
}

/// Checks the report's structure: six well-formed SVG charts and the ranks' swimlane with
/// finite coordinates, no scripts and nothing loaded from the network.
fn check_report(html: &str) -> Result {
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    assert!(!html.contains("<script") && !html.contains("<link") && !html.contains("src="));
    assert_eq!(
        html.matches("http").count(),
        html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count()
    );
    let opens = html.matches("<svg").count();
    assert_eq!(opens, 7, "charts and swimlane");
    assert!(html.contains("<h2>Rank activity</h2>"));
    assert_eq!(html.matches("</svg>").count(), opens);
    let mut polylines = 0;
    for chunk in html.split("<svg").skip(1) {
        let svg = chunk.split("</svg>").next().ok_or("unterminated svg")?;
        assert!(svg.contains("<title>"), "chart without a title");
        for points in attr_values(svg, "points") {
            polylines += 1;
            let pairs: Vec<&str> = points.split(' ').collect();
            assert!(pairs.len() >= 2, "polyline with {} points", pairs.len());
            for pair in pairs {
                let (x, y) = pair.split_once(',').ok_or("point without a comma")?;
                for c in [x, y] {
                    let v: f64 = c.parse()?;
                    assert!(v.is_finite() && (-1.0..=1000.0).contains(&v), "coordinate {v}");
                }
            }
        }
        for attr in ["cx", "cy", "x1", "y1", "x2", "y2", "x", "width"] {
            for v in attr_values(svg, attr) {
                assert!(v.parse::<f64>()?.is_finite(), "{attr}={v}");
            }
        }
    }
    // Two epochs: train and test loss, accuracy, two throughput lines at least.
    assert!(polylines >= 5, "only {polylines} polylines");
    Ok(())
}

#[test]
fn devices_lists_the_cpu() -> Result {
    let out = fdl(&["devices"])?;
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    let mut lines = stdout.lines();
    assert!(lines.next().is_some_and(|h| h.starts_with("DEVICE") && h.contains("FREE")));
    assert!(lines.next().is_some_and(|l| l.starts_with("cpu ") && l.contains("GiB")));
    Ok(())
}

#[test]
fn train_writes_a_run_directory_and_report_regenerates_it() -> Result {
    let tmp = tempfile::tempdir()?;
    let run = tmp.path().join("run");
    // Four times the small subset: a rank's clock starts when its start orders reach it, so on
    // a loaded machine its breakdown misses (or overlaps) tens of ms of the coordinator's wall,
    // which must stay a small part of it.
    let mut base = SMALL;
    base[3] = "6144";
    let out = train_on(&run, &base, &["--policy", "cadence", "--backend", "host"])?;
    let stdout = text(&out.stdout);
    // Not a terminal: one plain line per epoch, then the result.
    assert!(stdout.contains("epoch 1/2") && stdout.contains("epoch 2/2"), "{stdout}");
    assert!(stdout.contains("test accuracy") && stdout.contains("report.html"), "{stdout}");

    let metrics = fs::read_to_string(run.join("metrics.jsonl"))?;
    let mut epochs = 0;
    let mut reduces = 0;
    let mut guards = Vec::new();
    for line in metrics.lines() {
        let v: Value = serde_json::from_str(line)?;
        match v["kind"].as_str() {
            Some("epoch") => {
                assert_eq!(v["epoch"].as_u64(), Some(epochs));
                epochs += 1;
                for key in ["avg_loss", "epoch_ms", "t_s", "throughput", "sync_ms"] {
                    assert!(finite(&v[key]), "epoch {key}: {line}");
                }
                let ranks = v["ranks"].as_array().ok_or("ranks")?;
                assert_eq!(ranks.len(), 2);
                let share: f64 = ranks.iter().filter_map(|r| r["batch_share"].as_f64()).sum();
                assert!((share - 1.0).abs() < 1e-6, "shares sum to {share}");
                let acc = v["eval"]["accuracy"].as_f64().ok_or("eval.accuracy")?;
                assert!((0.0..=1.0).contains(&acc));
            }
            Some("reduce") => {
                reduces += 1;
                assert_eq!(v["round"].as_u64(), Some(reduces));
                for key in ["at_ms", "sync_ms"] {
                    assert!(finite(&v[key]), "reduce {key}: {line}");
                }
                assert!(v["anchor"].as_u64().is_some_and(|a| a >= 1));
                assert_eq!(v["steps"].as_array().map(Vec::len), Some(2));
            }
            // The guard's reading of a completed reduce (its line may come just before the
            // reduce's: the two are polled apart).
            Some("guard") => {
                guards.push(v["round"].as_u64().ok_or("guard round")?);
                assert!(finite(&v["divergence"]) && v["k_max"].as_u64().is_some(), "{line}");
                let verdict = &v["verdict"];
                assert!(
                    verdict == "Stable"
                        || verdict == "SuppressGrowth"
                        || finite(&verdict["NudgeDown"]["factor"]),
                    "{line}"
                );
            }
            other => panic!("unknown kind {other:?} in {line}"),
        }
    }
    assert_eq!(epochs, 2);
    assert!(reduces >= 1, "no reduce recorded");
    // The guard reads reduces, each once, in order.
    assert!(guards.first().is_some_and(|&r| r >= 1), "guard rounds {guards:?}");
    assert!(guards.windows(2).all(|w| w[0] < w[1]), "guard rounds {guards:?}");
    assert!(guards.last().is_some_and(|&r| r <= reduces), "guard rounds {guards:?}");

    let summary: Value = serde_json::from_str(&fs::read_to_string(run.join("summary.json"))?)?;
    assert_eq!(summary["epochs_completed"].as_u64(), Some(2));
    assert_eq!(summary["syncs"].as_u64(), Some(reduces));
    assert_eq!(summary["devices"], serde_json::json!(["cpu", "cpu"]));
    assert_eq!(summary["config"]["backend"], "host");
    assert!(finite(&summary["train_wall_s"]) && finite(&summary["avg_sync_ms"]));
    let acc = summary["test"]["accuracy"].as_f64().ok_or("test.accuracy")?;
    // 2 epochs on 6,144 images: far better than chance (10%).
    assert!(acc > 0.5, "accuracy {acc}");
    let wall_ms = summary["train_wall_s"].as_f64().ok_or("train_wall_s")? * 1000.0;
    for r in summary["ranks"].as_array().ok_or("ranks")? {
        assert!(r["idle"].as_f64().is_some_and(|i| (0.0..=1.0).contains(&i)));
        assert!(r["samples"].as_u64().is_some_and(|s| s > 0));
        // The breakdown accounts for the training wall (a short run: a few ms of scheduling
        // noise are more than 1% of it).
        let parts = [
            "compute",
            "data",
            "reduce",
            "exchange",
            "waiting",
            "evaluation",
            "checkpoint",
            "other",
        ];
        let sum: f64 = parts.iter().filter_map(|p| r["time"][format!("{p}_ms")].as_f64()).sum();
        assert!((sum - wall_ms).abs() < 0.05 * wall_ms + 5.0, "{sum} ms of {wall_ms} ms: {r}");
    }
    assert!(summary["held_back"]["rank"].as_u64().is_some_and(|r| r < 2), "{summary}");

    let html = fs::read_to_string(run.join("report.html"))?;
    check_report(&html)?;
    fs::remove_file(run.join("report.html"))?;
    let again = fdl(&["report", run.to_str().ok_or("path")?])?;
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(fs::read_to_string(run.join("report.html"))?, html);

    // A damaged metrics file: the report names the file and the line.
    let mut lines: Vec<String> = metrics.lines().map(str::to_owned).collect();
    lines[1] = "{\"kind\":\"epoch\",\"epoch\":".to_owned();
    fs::write(run.join("metrics.jsonl"), lines.join("\n"))?;
    let o = fdl(&["report", run.to_str().ok_or("path")?])?;
    assert_one_line_error(&o, &["metrics.jsonl line 2"], "corrupt metrics");
    Ok(())
}

#[test]
fn config_file_keys_apply_and_flags_override_them() -> Result {
    let tmp = tempfile::tempdir()?;
    let config = tmp.path().join("fdl.toml");
    let toml = "epochs = 5\nbatch-size = 32\npolicy = \"sync\"\nslowdown = [1.0, 1.5]\nschedule = \"step\"\n";
    fs::write(&config, toml)?;
    let run = tmp.path().join("run");
    let cfg = config.to_str().ok_or("path")?;
    // --epochs 2 (in SMALL) overrides the file's 5; policy and slowdown come from the file.
    train_small(&run, &["--config", cfg, "--eval-every", "2"])?;
    let summary: Value = serde_json::from_str(&fs::read_to_string(run.join("summary.json"))?)?;
    assert_eq!(summary["config"]["epochs"], 2);
    assert_eq!(summary["config"]["policy"], "sync");
    assert_eq!(summary["config"]["slowdown"], serde_json::json!([1.0, 1.5]));
    assert_eq!(summary["config"]["schedule"], "step");
    let metrics = fs::read_to_string(run.join("metrics.jsonl"))?;
    let evals: Vec<bool> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "epoch")
        .map(|v| !v["eval"].is_null())
        .collect();
    // eval every 2 epochs: epoch 1 is not evaluated, epoch 2 is.
    assert_eq!(evals, vec![false, true]);
    Ok(())
}

#[test]
fn bench_writes_the_six_mode_table_after_the_solo_runs() -> Result {
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("bench");
    let args = [
        "bench",
        "--out",
        out.to_str().ok_or("path")?,
        "--ranks",
        "2",
        "--train-subset",
        "768",
        "--test-subset",
        "200",
        "--epochs",
        "1",
        "--batch-size",
        "32",
        "--slowdown",
        "1,2",
    ];
    let output = fdl(&args)?;
    assert!(output.status.success(), "{}", text(&output.stderr));
    let md = fs::read_to_string(out.join("bench.md"))?;
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).skip(1).collect();
    let modes: Vec<&str> = rows.iter().filter_map(|r| r.split('|').nth(1)).map(str::trim).collect();
    let want = [
        "solo-0 (cpu)",
        "solo-1 (cpu)",
        "collective-sync",
        "host-sync",
        "collective-cadence",
        "host-cadence",
        "collective-async",
        "host-async",
    ];
    assert_eq!(modes, want);
    let json: Value = serde_json::from_str(&fs::read_to_string(out.join("bench.json"))?)?;
    let rows = json["rows"].as_array().ok_or("rows")?;
    assert_eq!(rows.len(), want.len());
    for row in rows {
        let solo = row["mode"].as_str().is_some_and(|m| m.starts_with("solo"));
        assert_eq!(row["devices"].as_array().map(Vec::len), Some(if solo { 1 } else { 2 }));
        assert!(finite(&row["wall_s"]) && finite(&row["loss"]) && finite(&row["eval_accuracy"]));
        assert_eq!(row["syncs"].as_u64().is_some_and(|s| s > 0), !solo, "{row}");
    }
    // Every mode also has a run directory with its own report.
    for slug in ["solo-0-cpu", "solo-1-cpu", "collective-sync", "host-async"] {
        let html = fs::read_to_string(out.join(slug).join("report.html"))?;
        assert_eq!(html.matches("<svg").count(), 7, "{slug}");
        let summary: Value =
            serde_json::from_str(&fs::read_to_string(out.join(slug).join("summary.json"))?)?;
        assert_eq!(summary["name"], slug);
    }
    Ok(())
}

#[test]
fn bad_flags_and_configs_fail_with_one_line() -> Result {
    let tmp = tempfile::tempdir()?;
    let bad_toml = tmp.path().join("bad.toml");
    fs::write(&bad_toml, "epochs = [\n")?;
    let unknown_key = tmp.path().join("unknown.toml");
    fs::write(&unknown_key, "epochz = 3\n")?;
    let missing = tmp.path().join("missing.toml");
    let p = |p: &Path| p.to_str().map(str::to_owned).ok_or("path");
    let cases: Vec<(Vec<String>, Vec<&str>)> = vec![
        (vec!["train".into(), "--bogus".into()], vec!["--bogus"]),
        (vec!["train".into(), "--epochs".into(), "x".into()], vec!["--epochs"]),
        (vec!["frobnicate".into()], vec!["frobnicate"]),
        (
            vec!["train".into(), "--ranks".into(), "2".into(), "--devices".into(), "cpu".into()],
            vec!["--ranks"],
        ),
        (vec!["train".into(), "--policy".into(), "often".into()], vec!["policy", "often"]),
        (vec!["train".into(), "--backend".into(), "pigeon".into()], vec!["backend", "pigeon"]),
        (vec!["train".into(), "--devices".into(), "cpu,tpu".into()], vec!["tpu"]),
        (vec!["train".into(), "--slowdown".into(), "1,0.5".into()], vec!["slowdown"]),
        (
            vec!["train".into(), "--ranks".into(), "2".into(), "--slowdown".into(), "1,2,3".into()],
            vec!["slowdown", "3"],
        ),
        (
            vec!["train".into(), "--ranks".into(), "3".into(), "--slowdown".into(), "1,2".into()],
            vec!["--slowdown", "2 values", "3 ranks"],
        ),
        (vec!["train".into(), "--ranks".into(), "0".into()], vec!["ranks"]),
        (vec!["train".into(), "--lr".into(), "-1".into()], vec!["lr"]),
        (vec!["train".into(), "--schedule".into(), "zigzag".into()], vec!["schedule"]),
        (vec!["train".into(), "--config".into(), p(&missing)?], vec!["missing.toml"]),
        (vec!["train".into(), "--config".into(), p(&bad_toml)?], vec!["bad.toml", "line"]),
        (vec!["train".into(), "--config".into(), p(&unknown_key)?], vec!["unknown.toml", "epochz"]),
        (vec!["bench".into(), "--epochs".into(), "0".into()], vec!["epochs"]),
        (
            vec!["train".into(), "--devices".into(), "cuda:64".into()],
            vec!["cuda:64", "not available"],
        ),
        (
            vec!["train".into(), "--resume".into(), "nowhere.fdlck".into()],
            vec!["nowhere.fdlck", "no such file"],
        ),
        (
            vec!["train".into(), "--checkpoint-every".into(), "2".into()],
            vec!["checkpoint-every", "checkpoint-dir"],
        ),
        (vec!["train".into(), "--prefetch".into(), "lots".into()], vec!["prefetch", "lots"]),
        (
            vec!["train".into(), "--ranks".into(), "2".into(), "--fail-rank".into(), "2@1".into()],
            vec!["fail-rank", "2@1"],
        ),
        (vec!["train".into(), "--fail-rank".into(), "1".into()], vec!["fail-rank", "RANK@BATCH"]),
        (vec!["bench".into(), "--fail-rank".into(), "1@3".into()], vec!["fail-rank", "bench"]),
        (vec!["bench".into(), "--train-eval".into(), "100".into()], vec!["train-eval", "bench"]),
        (vec!["train".into(), "--train-eval".into(), "0".into()], vec!["train-eval", "at least 1"]),
    ];
    for (args, needles) in cases {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = fdl(&refs)?;
        let case = args.join(" ");
        // clap reports flag errors itself (exit 2) with the same one-line shape.
        assert_one_line_error(&out, &needles, &case);
    }
    Ok(())
}

/// Every option the library checks, set wrong as a new user would, through the real binary:
/// each is refused before anything trains, in one line naming the flag (or the `--config`
/// key, the same name), with exit code 1 — never a panic (101) or an abort (134).
#[test]
fn absurd_values_are_refused_naming_the_flag() -> Result {
    let tmp = tempfile::tempdir()?;
    let file = tmp.path().join("zero.toml");
    fs::write(&file, "eval-every = 0\n")?;
    let file = file.to_str().ok_or("path")?;
    let ck = tmp.path().join("ck");
    let ck = ck.to_str().ok_or("path")?;
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["--epochs", "0"], vec!["--epochs:", "at least 1"]),
        (vec!["--config", file], vec!["--eval-every:", "at least 1"]),
        (vec!["--batch-size", "0"], vec!["--batch-size:"]),
        (vec!["--batch-size", "512"], vec!["--batch-size:", "512 samples"]),
        (vec!["--lr", "0"], vec!["--lr:", "positive"]),
        (vec!["--lr", "-1", "--schedule", "step"], vec!["--lr:", "-1"]),
        (vec!["--lr", "inf"], vec!["--lr:"]),
        (vec!["--watchdog", "1e20"], vec!["--watchdog:", "1e20"]),
        (vec!["--watchdog", "1e9"], vec!["--watchdog:", "a week"]),
        (vec!["--watchdog", "0"], vec!["--watchdog:"]),
        (vec!["--watchdog", "NaN"], vec!["--watchdog:", "NaN"]),
        (vec!["--hidden", "100000,100000"], vec!["--hidden:", "GiB", "free"]),
        (vec!["--ranks", "1000"], vec!["--ranks:", "1000 CPU ranks", "cores"]),
        (vec!["--ranks", "0"], vec!["--ranks:"]),
        (vec!["--slowdown", "1,0.5"], vec!["--slowdown:", "0.5"]),
        (vec!["--slowdown", "1,inf"], vec!["--slowdown:", "inf"]),
        (vec!["--eval-every", "0"], vec!["--eval-every:"]),
        (vec!["--overhead-target", "0.9"], vec!["--overhead-target:", "0.9", "0.01 to 0.5"]),
        (vec!["--overhead-target", "NaN"], vec!["--overhead-target:", "NaN"]),
        (vec!["--checkpoint-dir", ck, "--keep-checkpoints", "0"], vec!["--keep-checkpoints:"]),
    ];
    for (extra, needles) in cases {
        let out = tmp.path().join("run");
        let mut args = vec!["train", "--out", out.to_str().ok_or("path")?];
        // A quick run's flags, but for the one the case sets.
        let base = [
            ("--ranks", "2"),
            ("--train-subset", "512"),
            ("--test-subset", "64"),
            ("--batch-size", "32"),
            ("--epochs", "1"),
        ];
        for (flag, value) in base.into_iter().filter(|(flag, _)| !extra.contains(flag)) {
            args.extend([flag, value]);
        }
        args.extend(&extra);
        let output = fdl(&args)?;
        let case = extra.join(" ");
        assert_one_line_error(&output, &needles, &case);
        assert_eq!(output.status.code(), Some(1), "{case}: {}", text(&output.stderr));
        assert!(!out.exists(), "{case}: a refused run left a run directory");
    }
    Ok(())
}

#[test]
fn missing_or_corrupt_data_fails_with_the_file_named() -> Result {
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("run");
    let out = out.to_str().ok_or("path")?;
    let nowhere = tmp.path().join("nowhere");
    let o = fdl(&["train", "--out", out, "--data", nowhere.to_str().ok_or("path")?])?;
    assert_one_line_error(&o, &["nowhere", "does not exist"], "missing dir");
    // Without --data, the vendored folder comes from FLODL_MNIST_DIR or the build tree: a run
    // that cannot find it names the variable.
    let o = Command::new(FDL)
        .args(["train", "--out", out])
        .env("FLODL_MNIST_DIR", &nowhere)
        .output()?;
    assert_one_line_error(&o, &["nowhere", "does not exist", "FLODL_MNIST_DIR"], "no data found");

    // A directory with the label files but no training images.
    let partial = tmp.path().join("partial");
    fs::create_dir(&partial)?;
    for f in
        ["train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    {
        fs::copy(mnist_dir().join(f), partial.join(f))?;
    }
    let o = fdl(&["train", "--out", out, "--data", partial.to_str().ok_or("path")?])?;
    assert_one_line_error(&o, &["train-images-idx3-ubyte"], "missing file");

    // Garbage in place of the gzip stream, with and without the checksum list.
    fs::write(partial.join("train-images-idx3-ubyte.gz"), b"this is not gzip")?;
    let o = fdl(&["train", "--out", out, "--data", partial.to_str().ok_or("path")?])?;
    assert_one_line_error(&o, &["train-images-idx3-ubyte.gz"], "corrupt file");
    fs::copy(mnist_dir().join("SHA256SUMS"), partial.join("SHA256SUMS"))?;
    let o = fdl(&["train", "--out", out, "--data", partial.to_str().ok_or("path")?])?;
    assert_one_line_error(&o, &["train-images-idx3-ubyte.gz", "sha256"], "checksum");
    Ok(())
}

#[test]
fn unwritable_output_and_bad_run_directories_fail_with_one_line() -> Result {
    let tmp = tempfile::tempdir()?;
    let file = tmp.path().join("plain-file");
    fs::write(&file, "x")?;
    let under_file = file.join("run");
    let mut args = vec!["train", "--out", under_file.to_str().ok_or("path")?];
    args.extend(SMALL);
    let o = fdl(&args)?;
    assert_one_line_error(&o, &["output directory", "plain-file"], "out under a file");

    let out = tmp.path().join("run");
    let mut args = vec!["train", "--out", out.to_str().ok_or("path")?];
    args.extend(SMALL);
    args.extend(["--checkpoint-dir", under_file.to_str().ok_or("path")?]);
    let o = fdl(&args)?;
    assert_one_line_error(&o, &["checkpoint directory", "plain-file"], "checkpoints under a file");
    assert!(!out.exists(), "run directory made for a refused run");

    let nowhere = tmp.path().join("no-run");
    let o = fdl(&["report", nowhere.to_str().ok_or("path")?])?;
    assert_one_line_error(&o, &["no-run", "does not exist"], "report of nothing");

    let broken = tmp.path().join("broken");
    fs::create_dir(&broken)?;
    let o = fdl(&["report", broken.to_str().ok_or("path")?])?;
    assert_one_line_error(&o, &["metrics.jsonl"], "report without records");
    Ok(())
}

/// A quick checkpointed run's flags: like `SMALL`, with a constant LR (so a resumed run may ask
/// for more epochs: other schedules span the epoch count, which is part of the configuration).
fn ckpt_args<'a>(out: &'a str, epochs: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["train", "--out", out, "--epochs", epochs, "--schedule", "constant"];
    args.extend(&SMALL[..SMALL.len() - 2]);
    args.extend(extra);
    args
}

#[test]
fn checkpoints_resume_and_mismatches_are_refused_in_one_line() -> Result {
    let tmp = tempfile::tempdir()?;
    let p = |p: &Path| p.to_str().map(str::to_owned).ok_or("non-UTF-8 temp path");
    let ck = tmp.path().join("ck");
    let config = tmp.path().join("fdl.toml");
    // The checkpoint keys from a config file: every reduce, keep 2.
    let toml = format!(
        "checkpoint-dir = {:?}\ncheckpoint-every-reduces = 1\nkeep-checkpoints = 2\n",
        p(&ck)?
    );
    fs::write(&config, toml)?;
    let first = p(&tmp.path().join("first"))?;
    let cfg = p(&config)?;
    let out = fdl(&ckpt_args(&first, "1", &["--config", &cfg]))?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("checkpoint: "), "{}", text(&out.stdout));
    let summary: Value =
        serde_json::from_str(&fs::read_to_string(Path::new(&first).join("summary.json"))?)?;
    assert!(summary["checkpoint"].as_str().is_some_and(|c| c.ends_with("latest.fdlck")));
    let steps = fs::read_dir(&ck)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("step-") && n.ends_with(".fdlck"))
        .count();
    let saves = summary["syncs"].as_u64().ok_or("syncs")?;
    assert_eq!(steps as u64, saves.min(2), "step bundles kept");

    // Resume the directory with one more epoch: epoch 1 is restored, epoch 2 trained.
    let second = tmp.path().join("second");
    let out = fdl(&ckpt_args(&p(&second)?, "2", &["--resume", &p(&ck)?]))?;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("resuming from") && stdout.contains("1 of 2 epochs done"), "{stdout}");
    assert!(stdout.contains("epoch 1/2") && stdout.contains("(restored from the checkpoint)"));
    assert!(stdout.contains("epoch 2/2") && stdout.contains("1 restored"), "{stdout}");
    let summary: Value = serde_json::from_str(&fs::read_to_string(second.join("summary.json"))?)?;
    assert_eq!(summary["epochs_completed"].as_u64(), Some(2));
    assert_eq!(summary["epochs_restored"].as_u64(), Some(1));
    assert!(summary["resumed_from"].as_str().is_some_and(|r| r.ends_with("latest.fdlck")));
    assert!(summary["test"]["accuracy"].as_f64().is_some_and(|a| a > 0.5));
    let metrics = fs::read_to_string(second.join("metrics.jsonl"))?;
    let epochs: Vec<(u64, bool)> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "epoch")
        .map(|v| (v["epoch"].as_u64().unwrap_or(99), v["restored"] == true))
        .collect();
    assert_eq!(epochs, vec![(0, true), (1, false)]);
    let html = fs::read_to_string(second.join("report.html"))?;
    check_report(&html)?;
    assert!(html.contains("1 (restored)"));

    // Bundles that do not fit: one line naming the bundle and the reason, no run directory.
    let corrupt = tmp.path().join("corrupt.fdlck");
    let mut bytes = fs::read(ck.join("latest.fdlck"))?;
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::write(&corrupt, bytes)?;
    let empty = tmp.path().join("empty");
    fs::create_dir(&empty)?;
    let refused = tmp.path().join("refused");
    let ckp = p(&ck)?;
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        // Another world is an elastic resume, not a refusal; the training terms must match.
        (vec!["--batch-size", "16"], vec!["latest.fdlck", "another batch_size", "16"]),
        (vec!["--seed", "7"], vec!["latest.fdlck", "another seed", "7"]),
        (vec!["--hidden", "64"], vec!["latest.fdlck", "another model"]),
    ];
    let refused_s = p(&refused)?;
    let corrupt_s = p(&corrupt)?;
    let empty_s = p(&empty)?;
    let missing_s = p(&tmp.path().join("missing"))?;
    let mut runs: Vec<(Vec<&str>, Vec<&str>)> = cases
        .into_iter()
        .map(|(extra, needles)| {
            let mut args = vec!["--resume", ckp.as_str()];
            args.extend(extra);
            (args, needles)
        })
        .collect();
    runs.push((vec!["--resume", &corrupt_s], vec!["corrupt.fdlck", "corrupt"]));
    runs.push((vec!["--resume", &empty_s], vec!["empty", "no checkpoint"]));
    runs.push((vec!["--resume", &missing_s], vec!["missing", "no such file"]));
    for (extra, needles) in runs {
        // clap refuses a repeated flag: drop the SMALL pairs the case sets itself.
        let mut args =
            vec!["train", "--out", &refused_s, "--epochs", "2", "--schedule", "constant"];
        let base: Vec<&str> = SMALL[..SMALL.len() - 2].to_vec();
        let mut i = 0;
        while i < base.len() {
            if !extra.contains(&base[i]) {
                args.extend(&base[i..i + 2]);
            }
            i += 2;
        }
        args.extend(&extra);
        let out = fdl(&args)?;
        assert_one_line_error(&out, &needles, &extra.join(" "));
        assert!(!refused.exists(), "{}: run directory left behind", extra.join(" "));
    }
    Ok(())
}

#[test]
fn rank_deaths_are_shown_and_recorded_and_a_lost_run_names_its_failure_bundle() -> Result {
    let tmp = tempfile::tempdir()?;
    let run = tmp.path().join("run");
    // SMALL with 3 ranks: rank 1 fails on its 5th batch, ranks 0 and 2 finish the run.
    let mut args = vec!["train", "--out", run.to_str().ok_or("path")?, "--ranks", "3"];
    args.extend(&SMALL[2..]);
    // Deaths are printed even with --quiet (no progress, but not silent about failures).
    args.extend(["--policy", "sync", "--fail-rank", "1@5", "--quiet"]);
    let out = fdl(&args)?;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let deaths: Vec<&str> = stdout.lines().filter(|l| l.contains(" died at ")).collect();
    assert_eq!(deaths.len(), 1, "{stdout}");
    assert!(deaths[0].starts_with("rank 1 (cpu) died at "), "{stdout}");
    assert!(deaths[0].contains("training step 5") && deaths[0].ends_with("survivors: ranks 0, 2"));
    let summary: Value = serde_json::from_str(&fs::read_to_string(run.join("summary.json"))?)?;
    assert_eq!(summary["epochs_completed"].as_u64(), Some(2));
    let faults = summary["faults"].as_array().ok_or("faults")?;
    assert_eq!(faults.len(), 1);
    assert_eq!(faults[0]["rank"].as_u64(), Some(1));
    assert_eq!(faults[0]["survivors"], serde_json::json!([0, 2]));
    assert!(finite(&faults[0]["at_ms"]));
    let metrics = fs::read_to_string(run.join("metrics.jsonl"))?;
    let recorded: Vec<Value> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "fault")
        .collect();
    assert_eq!(recorded.len(), 1, "{metrics}");
    assert_eq!(recorded[0]["rank"], faults[0]["rank"]);
    assert_eq!(recorded[0]["cause"], faults[0]["cause"]);
    let html = fs::read_to_string(run.join("report.html"))?;
    check_report(&html)?;
    assert!(html.contains("Rank deaths") && html.contains("device failure at training step"));

    // Every rank fails: one line with the reason and the failure bundle to resume from.
    let ck = tmp.path().join("ck");
    let lost = tmp.path().join("lost");
    let mut args = vec!["train", "--out", lost.to_str().ok_or("path")?];
    args.extend(SMALL);
    args.extend(["--fail-rank", "0@5,1@5", "--checkpoint-dir", ck.to_str().ok_or("path")?]);
    let out = fdl(&args)?;
    assert_one_line_error(&out, &["cannot go on", "AllRanksLost", "failure.fdlck"], "all lost");
    assert!(ck.join("failure.fdlck").is_file());
    // The failed run's records keep both deaths.
    let metrics = fs::read_to_string(lost.join("metrics.jsonl"))?;
    let dead: Vec<u64> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "fault")
        .filter_map(|v| v["rank"].as_u64())
        .collect();
    assert_eq!(dead.len(), 2, "{metrics}");
    Ok(())
}

/// `--lr 1e30` trains on NaN within a few steps: the run stops with one line naming the rank
/// and the step and exits non-zero; with a checkpoint directory it keeps its last good state
/// (here the starting one, finite) in `failure.fdlck`.
#[test]
fn a_diverging_run_fails_in_one_line_and_keeps_its_last_good_bundle() -> Result {
    let tmp = tempfile::tempdir()?;
    let p = |p: &Path| p.to_str().map(str::to_owned).ok_or("non-UTF-8 temp path");
    let ck = tmp.path().join("ck");
    for (run, extra) in [("run", vec!["--checkpoint-dir", &p(&ck)?]), ("plain", vec![])] {
        let out = p(&tmp.path().join(run))?;
        let mut args = vec!["train", "--out", &out, "--lr", "1e30"];
        args.extend(SMALL);
        args.extend(extra.iter().copied());
        let o = fdl(&args)?;
        let mut needles = vec!["training diverged on rank ", " at step "];
        if !extra.is_empty() {
            needles.push("failure.fdlck");
        }
        assert_one_line_error(&o, &needles, run);
    }
    let failure = flodl_ddp::checkpoint::Checkpoint::read(&ck.join("failure.fdlck"))?;
    assert_eq!(failure.reason, flodl_ddp::checkpoint::SaveReason::Diverged);
    let finite = failure
        .params
        .records()
        .iter()
        .all(|r| r.to_f32_vec().is_some_and(|v| v.iter().all(|x| x.is_finite())));
    assert!(finite, "the failure bundle holds a non-finite model");
    Ok(())
}

/// A stop signal during `fdl train` with a checkpoint directory — Ctrl-C (SIGINT) or SIGTERM,
/// what Slurm and Kubernetes send before a kill — stops the run at its next reduce after saving
/// a bundle, exits with 128 + the signal's number and one line naming the bundle; `--resume` on
/// the directory then finishes the run.
#[test]
fn a_stop_signal_stops_at_a_checkpoint_and_the_run_resumes() -> Result {
    use std::io::{BufRead, BufReader};
    // (kill's signal name, exit status, first word of the last line)
    let cases = [("INT", 130, "interrupted"), ("TERM", 143, "terminated")];
    for (signal, status, verb) in cases {
        let tmp = tempfile::tempdir()?;
        let (out, ck) = (tmp.path().join("runs"), tmp.path().join("ck"));
        let (out_s, ck_s) = (out.to_string_lossy().into_owned(), ck.to_string_lossy().into_owned());
        // Far more epochs than it will run: the signal comes after the first.
        let mut args = vec!["train", "--out", &out_s, "--checkpoint-dir", &ck_s];
        args.extend(["--epochs", "400", "--schedule", "constant"]);
        args.extend(&SMALL[..SMALL.len() - 2]);
        let mut child = Command::new(FDL)
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        // The first epoch line: the run is under way and its signal handler installed.
        let started =
            lines.by_ref().map_while(std::result::Result::ok).any(|l| l.starts_with("epoch 1/"));
        assert!(started, "SIG{signal}: no epoch line");
        // The `fdl` child itself, by its own pid.
        let sent =
            Command::new("kill").args([format!("-{signal}"), child.id().to_string()]).status()?;
        assert!(sent.success(), "kill -{signal} failed");
        let rest: Vec<String> = lines.map_while(std::result::Result::ok).collect();
        let output = child.wait_with_output()?;
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(status), "SIG{signal}: {stderr}, stdout {rest:?}");
        let last = stderr.lines().last().unwrap_or_default();
        let expected = format!("{verb}: stopped at a checkpoint saved in {ck_s}");
        assert!(last.starts_with(&expected), "SIG{signal}: {stderr}");
        assert!(!stderr.contains("panicked"), "SIG{signal}: {stderr}");

        // The stopped run left no summary: `fdl report` renders what its records hold.
        let run = &out;
        assert!(!run.join("summary.json").exists(), "SIG{signal}: a summary after a stop");
        let report = fdl(&["report", run.to_str().ok_or("path")?])?;
        let said = text(&report.stdout) + &text(&report.stderr);
        assert!(report.status.success(), "SIG{signal}: fdl report failed: {said}");
        assert!(said.contains("the run did not finish"), "SIG{signal}: {said}");
        let html = fs::read_to_string(run.join("report.html"))?;
        assert!(html.contains("(unfinished)") && html.contains("<svg"), "SIG{signal}: {html}");
        let epochs_done = html.matches("<tr><td>").count();
        assert!(epochs_done >= 1, "SIG{signal}: no epoch rows in the report");

        // One epoch more than the bundle holds (a constant rate does not span the epochs).
        let done = flodl_ddp::checkpoint::Checkpoint::read(&ck.join("latest.fdlck"))?.epoch;
        let epochs = (done + 1).to_string();
        let mut args = vec!["train", "--out", &out_s, "--resume", &ck_s];
        args.extend(["--epochs", &epochs, "--schedule", "constant"]);
        args.extend(&SMALL[..SMALL.len() - 2]);
        let resumed = fdl(&args)?;
        let stdout = text(&resumed.stdout);
        let failed = text(&resumed.stderr);
        assert!(resumed.status.success(), "SIG{signal}: resume failed: {failed}");
        assert!(stdout.contains("restored from the checkpoint"), "SIG{signal}: {stdout}");
        assert!(stdout.contains(&format!("epoch {epochs}/{epochs}")), "SIG{signal}: {stdout}");
    }
    Ok(())
}

/// A cluster job's logs, piped (as under a scheduler or `| tee`), are plain text: no colour
/// codes, and optional fields written as their value (`rank=1`), never `rank=Some(1)`.
#[test]
fn piped_logs_are_plain_text() -> Result {
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("run");
    let args = ["launch", "--nproc", "2", "--backend", "host", "--epochs", "1"];
    let output = Command::new(FDL)
        .args(args)
        .args(["--train-subset", "512", "--test-subset", "100", "--out"])
        .arg(&out)
        .env("RUST_LOG", "info")
        .output()?;
    let all = text(&output.stdout) + &text(&output.stderr);
    assert!(output.status.success(), "fdl launch failed: {all}");
    // The check must see log lines to mean anything.
    assert!(all.contains(" INFO ") || all.contains("INFO "), "no log line: {all}");
    assert!(!all.contains('\u{1b}'), "colour codes in a piped log: {all:?}");
    assert!(!all.contains("=Some("), "an optional field written as Some(..): {all}");
    Ok(())
}

/// `--train-eval N` scores the returned model on the first N training samples: where the test
/// files are copies of the training files, it reads the samples the final test evaluation
/// reads, of the same model, so both report the same loss and accuracy; the report shows it.
#[test]
fn train_eval_scores_the_returned_model_on_training_samples() -> Result {
    let data = tempfile::tempdir()?;
    for (train, test) in [
        ("train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz"),
        ("train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
    ] {
        fs::copy(mnist_dir().join(train), data.path().join(train))?;
        fs::copy(mnist_dir().join(train), data.path().join(test))?;
    }
    let dir = data.path().to_str().ok_or("non-UTF-8 temp path")?;
    let tmp = tempfile::tempdir()?;
    // Case: the training samples it scores, and whether the test evaluation reads the same.
    for (n, same) in [("300", true), ("200", false)] {
        let run = tmp.path().join(format!("run-{n}"));
        train_small(&run, &["--data", dir, "--train-eval", n])?;
        let s: Value = serde_json::from_str(&fs::read_to_string(run.join("summary.json"))?)?;
        let (test, train) = (&s["test"], &s["train_eval"]);
        let loss = train["loss"].as_f64().ok_or("no train_eval.loss")?;
        let accuracy = train["accuracy"].as_f64().ok_or("no train_eval.accuracy")?;
        // An untrained MLP scores about ln 10 = 2.30; two epochs bring it well below.
        if !(loss.is_finite() && loss < 1.5 && (0.0..=1.0).contains(&accuracy)) {
            return Err(format!("train_eval {train} is no trained model's").into());
        }
        let test_loss = test["loss"].as_f64().ok_or("no test.loss")?;
        let test_accuracy = test["accuracy"].as_f64().ok_or("no test.accuracy")?;
        let agrees = (loss - test_loss).abs() <= 1e-5 * test_loss && accuracy == test_accuracy;
        if agrees != same {
            return Err(format!("{n} samples: train_eval {train} against test {test}").into());
        }
        let report = fs::read_to_string(run.join("report.html"))?;
        if !report.contains("returned model&#39;s train loss")
            && !report.contains("returned model's train loss")
        {
            return Err("the report does not show the returned model's train loss".into());
        }
    }
    Ok(())
}
