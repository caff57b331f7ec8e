//! The GPU test matrix: a table of cases, each a test binary plus the exact names of its tests.
//!
//! Keep the table in step with the crates: `cargo xtask gpu-test --list` shows every test binary,
//! its tests, and which case each test falls under. Beside the tests, [`JOBS`] runs `fdl` itself
//! on the GPU machine (its devices, and short trainings whose run directories come back).

use serde::Serialize;

use crate::cargo_artifact::TestBinary;

/// One cell of the matrix: named tests of one binary (all of its tests when none are named).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Case {
    /// What the case covers (`nccl world 1`).
    pub(crate) name: &'static str,
    /// The test binary, as [`TestBinary::id`] names it (`flodl-nccl/nccl_comm`).
    pub(crate) binary: &'static str,
    /// Full test names, run with libtest's `--exact`; empty means every test of the binary.
    pub(crate) filters: &'static [&'static str],
    /// How many GPUs the case needs; 0 for a CPU case.
    pub(crate) gpus: usize,
    /// Whether its tests must run one at a time (they share GPUs or an NCCL world).
    pub(crate) serial: bool,
}

/// The matrix, in the order it runs.
///
/// The DDP rows name `flodl-ddp/tests/gpu.rs`, whose tests train on the visible GPUs: one per
/// policy × backend (`sync_collective` … `async_host`) and `mixed_gpu_cpu_host` (GPU ranks plus
/// CPU ranks on the host backend). A renamed test makes its row MISSING, which fails the run.
pub(crate) const CASES: &[Case] = &[
    Case {
        name: "tensor kernels",
        binary: "flodl-tensor/kernels",
        filters: &[],
        gpus: 1,
        serial: false,
    },
    Case {
        name: "tensor copies, pinned buffers, events",
        binary: "flodl-tensor/tensor",
        filters: &[
            "copies_between_tensors_devices_and_pinned_buffers",
            "events_order_and_time_work",
            "device_discovery_lists_the_cpu_first",
        ],
        gpus: 1,
        serial: false,
    },
    Case {
        name: "kernels as CUBIN, PTX fallback",
        binary: "flodl-tensor/lib",
        filters: &["cuda::kernels::gpu_tests::kernels_load_as_cubin_and_the_ptx_fallback_runs"],
        gpus: 1,
        serial: false,
    },
    Case {
        name: "pinned slice upload waited for",
        binary: "flodl-tensor/tensor",
        filters: &["a_pinned_slice_upload_is_done_before_the_buffer_is_refilled"],
        gpus: 1,
        serial: false,
    },
    Case {
        name: "pinned buffer of another GPU refused",
        binary: "flodl-tensor/tensor",
        filters: &["a_pinned_buffer_of_another_gpu_is_refused_up_front"],
        gpus: 2,
        serial: false,
    },
    Case {
        name: "tensor errors on CUDA",
        binary: "flodl-tensor/errors",
        filters: &["cuda_unavailable_or_absent_device_is_an_error", "out_of_memory_is_an_error"],
        gpus: 1,
        serial: true,
    },
    Case {
        name: "nccl world 1",
        binary: "flodl-nccl/nccl",
        filters: &[
            "one_rank_reduces_broadcasts_and_aborts",
            "init_times_out_when_a_rank_never_joins",
            "unique_ids_round_trip_as_bytes",
        ],
        gpus: 1,
        serial: true,
    },
    Case {
        name: "nccl multi-GPU",
        binary: "flodl-nccl/nccl",
        filters: &["ranks_on_several_gpus_reduce_and_abort_unblocks_a_waiting_rank"],
        gpus: 2,
        serial: true,
    },
    Case {
        name: "nccl Collective on tensors, world 1",
        binary: "flodl-nccl/nccl_collective",
        filters: &[
            "a_world_of_one_reduces_tensors_in_place",
            "bad_tensors_are_rejected_before_nccl_and_abort_ends_the_group",
        ],
        gpus: 1,
        serial: true,
    },
    Case {
        name: "nccl watchdog stress: weighted all-reduces",
        binary: "flodl-nccl/nccl_collective",
        filters: &["weighted_all_reduces_under_the_watchdog_stay_exact"],
        gpus: 1,
        serial: true,
    },
    Case {
        name: "nccl Collective on tensors, multi-GPU",
        binary: "flodl-nccl/nccl_collective",
        filters: &["one_rank_per_gpu_averages_sums_and_broadcasts"],
        gpus: 2,
        serial: true,
    },
    Case {
        name: "tensor device addresses for NCCL",
        binary: "flodl-tensor/device_address",
        filters: &["foreign_work_through_an_address_is_ordered_with_flodl_work"],
        gpus: 1,
        serial: false,
    },
    Case {
        name: "pinned prefetch",
        binary: "flodl-data/it",
        filters: &["prefetch::cuda_batches_match_a_synchronous_fetch_in_order"],
        gpus: 1,
        serial: false,
    },
    Case {
        name: "checkpoint on CUDA",
        binary: "flodl-ddp/it",
        filters: &["checkpoint::capture_and_restore_are_bitwise_on_cuda"],
        gpus: 1,
        serial: false,
    },
    Case {
        name: "sync x collective",
        binary: "flodl-ddp/it",
        filters: &["gpu::sync_collective"],
        gpus: 1,
        serial: true,
    },
    Case {
        name: "sync x host",
        binary: "flodl-ddp/it",
        filters: &["gpu::sync_host"],
        gpus: 1,
        serial: true,
    },
    Case {
        name: "cadence x collective",
        binary: "flodl-ddp/it",
        filters: &["gpu::cadence_collective"],
        gpus: 1,
        serial: true,
    },
    Case {
        name: "cadence x host",
        binary: "flodl-ddp/it",
        filters: &["gpu::cadence_host"],
        gpus: 1,
        serial: true,
    },
    Case {
        name: "async x collective",
        binary: "flodl-ddp/it",
        filters: &["gpu::async_collective"],
        gpus: 1,
        serial: true,
    },
    Case {
        name: "async x host",
        binary: "flodl-ddp/it",
        filters: &["gpu::async_host"],
        gpus: 1,
        serial: true,
    },
    Case {
        name: "mixed GPU + CPU ranks (host)",
        binary: "flodl-ddp/it",
        filters: &["gpu::mixed_gpu_cpu_host"],
        gpus: 1,
        serial: true,
    },
    Case {
        name: "NCCL group of one formed through the controller",
        binary: "flodl-ddp/it",
        filters: &["gpu::nccl_group_of_one_through_the_controller"],
        gpus: 1,
        serial: true,
    },
    Case {
        name: "NCCL rank rejoins through the controller",
        binary: "flodl-ddp/it",
        filters: &["gpu::nccl_rank_rejoins_through_the_controller"],
        gpus: 2,
        serial: true,
    },
    Case {
        name: "CPU ranks: policy x backend",
        binary: "flodl-ddp/it",
        filters: &["runtime::every_mode_trains"],
        gpus: 0,
        serial: false,
    },
];

/// A run of the `fdl` binary on the GPU machine, whose output (a run directory) comes back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Job {
    /// What the job shows (`train cpu + cuda:0, host`).
    pub(crate) name: &'static str,
    /// `fdl`'s arguments; [`OUT_DIR`] stands for the job's own folder under the results.
    pub(crate) args: &'static [&'static str],
    /// How many GPUs the job needs.
    pub(crate) gpus: usize,
}

/// The placeholder in a [`Job`]'s arguments for its folder under the results (`out/jobs/<slug>`).
pub(crate) const OUT_DIR: &str = "{out}";

/// The `fdl` runs of the matrix, after the cases: the devices it sees, a truly unequal pair (a
/// CPU rank beside the GPU) on both backends, and the GPU alone, each a short training whose run
/// directory (`summary.json` with samples/s per rank, `report.html`) lands under `out/jobs/`.
pub(crate) const JOBS: &[Job] = &[
    Job { name: "fdl devices", args: &["devices"], gpus: 1 },
    Job {
        name: "fdl train cpu + cuda:0, host",
        args: &[
            "train",
            "--devices",
            "cpu,cuda:0",
            "--backend",
            "host",
            "--epochs",
            "2",
            "--quiet",
            "--out",
            OUT_DIR,
        ],
        gpus: 1,
    },
    Job {
        name: "fdl train cpu + cuda:0, collective",
        args: &[
            "train",
            "--devices",
            "cpu,cuda:0",
            "--backend",
            "collective",
            "--epochs",
            "2",
            "--quiet",
            "--out",
            OUT_DIR,
        ],
        gpus: 1,
    },
    Job {
        name: "fdl train cuda:0 alone",
        args: &["train", "--devices", "cuda:0", "--epochs", "2", "--quiet", "--out", OUT_DIR],
        gpus: 1,
    },
];

impl Job {
    /// The job's folder name under `out/jobs/`: its name in lowercase words joined by `-`.
    pub(crate) fn slug(&self) -> String {
        let words: Vec<String> = self
            .name
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_ascii_lowercase)
            .collect();
        words.join("-")
    }

    /// The `--flags` its arguments use (checked against `fdl`'s help when a bundle is made).
    pub(crate) fn flags(&self) -> impl Iterator<Item = &'static str> {
        self.args.iter().copied().filter(|a| a.starts_with("--"))
    }
}

/// What a row runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum RowKind {
    /// A case: named tests of a binary, which must exist.
    Case,
    /// A whole test binary, less the tests of cases that cannot run here (`skip`).
    Binary {
        /// Exact test names left out, because the case that owns them needs more GPUs than are
        /// visible: that case's own row reports them as not run.
        skip: Vec<String>,
    },
    /// An `fdl` job.
    Job {
        /// `fdl`'s arguments, [`OUT_DIR`] still in place.
        args: Vec<String>,
        /// The job's folder name under `out/jobs/`.
        slug: String,
    },
}

/// One line of the plan: a case, an `fdl` job, or a whole test binary run in full.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Row {
    /// The case name, or `all tests` for a full binary.
    pub(crate) label: String,
    /// The test binary id.
    pub(crate) binary: String,
    /// libtest filters (empty: every test).
    pub(crate) filters: Vec<String>,
    /// GPUs needed; 0 for CPU.
    pub(crate) gpus: usize,
    /// Run with `--test-threads=1`.
    pub(crate) serial: bool,
    /// What the row runs.
    #[serde(flatten)]
    pub(crate) kind: RowKind,
}

impl Row {
    fn from_case(case: &Case) -> Row {
        Row {
            label: case.name.to_string(),
            binary: case.binary.to_string(),
            filters: case.filters.iter().map(|f| f.to_string()).collect(),
            gpus: case.gpus,
            serial: case.serial,
            kind: RowKind::Case,
        }
    }

    fn from_job(job: &Job) -> Row {
        Row {
            label: job.name.to_string(),
            binary: FDL.to_string(),
            filters: Vec::new(),
            gpus: job.gpus,
            serial: true,
            kind: RowKind::Job {
                args: job.args.iter().map(|a| a.to_string()).collect(),
                slug: job.slug(),
            },
        }
    }
}

/// The binary id of `fdl` itself in rows of [`RowKind::Job`].
pub(crate) const FDL: &str = "fdl";

/// The rows to run with `gpus` visible: every case, then every job, then (unless `cases_only`)
/// each built binary in full, less the tests of the cases that need more GPUs than are visible
/// (reported once, by their case, as not run).
pub(crate) fn plan(
    cases: &[Case],
    jobs: &[Job],
    binaries: &[TestBinary],
    cases_only: bool,
    gpus: usize,
) -> Vec<Row> {
    let mut rows: Vec<Row> = cases.iter().map(Row::from_case).collect();
    rows.extend(jobs.iter().map(Row::from_job));
    if !cases_only {
        rows.extend(binaries.iter().map(|binary| {
            let id = binary.id();
            let skip = cases
                .iter()
                .filter(|c| c.binary == id && c.gpus > gpus)
                .flat_map(|c| c.filters.iter().map(|f| f.to_string()))
                .collect();
            Row {
                label: "all tests".to_string(),
                binary: id,
                filters: Vec::new(),
                gpus: 0,
                serial: false,
                kind: RowKind::Binary { skip },
            }
        }));
    }
    rows
}

/// Whether libtest with `--exact` would run `test` under these filters (none means all).
pub(crate) fn selects(filters: &[String], test: &str) -> bool {
    filters.is_empty() || filters.iter().any(|f| f == test)
}

/// The filters that name no test in `tests` (a stale matrix).
pub(crate) fn unmatched<'a>(filters: &'a [String], tests: &[String]) -> Vec<&'a str> {
    filters.iter().filter(|f| !tests.contains(f)).map(String::as_str).collect()
}

/// Test names from `<binary> --list --format terse` (`name: test` lines; benches are skipped).
pub(crate) fn parse_test_list(output: &str) -> Vec<String> {
    output.lines().filter_map(|line| line.strip_suffix(": test")).map(String::from).collect()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn binary(package: &str, kind: &str, target: &str) -> TestBinary {
        TestBinary {
            package: package.into(),
            target: target.into(),
            kind: kind.into(),
            exe: PathBuf::from("/t").join(target),
            manifest_dir: PathBuf::from("/w").join(package),
        }
    }

    #[test]
    fn cases_are_unique_and_well_formed() {
        let mut names: Vec<&str> = CASES.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CASES.len(), "case names repeat");
        for case in CASES {
            assert!(case.binary.contains('/'), "{} names no package", case.name);
            assert!(
                case.filters.iter().all(|f| !f.is_empty()),
                "{} has an empty filter",
                case.name
            );
        }
        assert!(CASES.iter().any(|c| c.gpus >= 2), "no multi-GPU case");
        assert!(CASES.iter().any(|c| c.gpus == 0), "no CPU case for --allow-no-gpu");
    }

    #[test]
    fn plan_lists_cases_then_jobs_then_full_binaries() {
        let binaries =
            [binary("flodl-tensor", "lib", "flodl_tensor"), binary("flodl-nccl", "test", "nccl")];
        let full = plan(CASES, JOBS, &binaries, false, 2);
        let (n_cases, n_jobs) = (CASES.len(), JOBS.len());
        assert_eq!(full.len(), n_cases + n_jobs + binaries.len());
        assert!(full[..n_cases].iter().all(|r| r.kind == RowKind::Case));
        assert!(
            full[n_cases..n_cases + n_jobs].iter().all(|r| r.binary == FDL
                && matches!(&r.kind, RowKind::Job { args, .. } if !args.is_empty()))
        );
        let tail: Vec<&str> = full[n_cases + n_jobs..].iter().map(|r| r.binary.as_str()).collect();
        assert_eq!(tail, ["flodl-tensor/lib", "flodl-nccl/nccl"]);
        assert!(
            full[n_cases + n_jobs..].iter().all(|r| r.kind == RowKind::Binary { skip: Vec::new() }
                && r.filters.is_empty()
                && r.gpus == 0)
        );
        assert_eq!(plan(CASES, JOBS, &binaries, true, 2).len(), n_cases + n_jobs);
    }

    #[test]
    fn full_binaries_leave_out_the_cases_that_need_more_gpus() {
        let binaries = [binary("flodl-nccl", "test", "nccl")];
        let multi: Vec<String> = CASES
            .iter()
            .filter(|c| c.binary == "flodl-nccl/nccl" && c.gpus > 1)
            .flat_map(|c| c.filters.iter().map(|f| f.to_string()))
            .collect();
        assert!(!multi.is_empty(), "the table has a multi-GPU nccl case");
        for (gpus, want) in [(0, None), (1, Some(multi.clone())), (2, Some(Vec::new()))] {
            let rows = plan(CASES, &[], &binaries, false, gpus);
            let RowKind::Binary { skip } = &rows[CASES.len()].kind else {
                panic!("the last row is not a full binary");
            };
            match want {
                // With no GPU every nccl case is left out (they all need one or more).
                None => assert!(multi.iter().all(|t| skip.contains(t)), "{gpus}: {skip:?}"),
                Some(want) => assert_eq!(skip, &want, "{gpus} GPUs"),
            }
        }
    }

    #[test]
    fn jobs_are_named_uniquely_and_write_into_their_folder() {
        let mut slugs: Vec<String> = JOBS.iter().map(Job::slug).collect();
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), JOBS.len(), "job slugs repeat");
        assert_eq!(JOBS[1].slug(), "fdl-train-cpu-cuda-0-host");
        for job in JOBS.iter().filter(|j| j.args.first() == Some(&"train")) {
            assert!(job.args.contains(&OUT_DIR), "{} writes no run directory", job.name);
            assert!(job.gpus >= 1, "{} is a GPU job", job.name);
        }
        assert!(JOBS.iter().any(|j| j.args.contains(&"cpu,cuda:0")), "no mixed CPU+GPU run");
    }

    #[test]
    fn filters_select_exact_names_like_libtest() {
        let filters = ["sync_collective".to_string(), "prefetch::cuda_pinned".to_string()];
        let cases = [
            (&filters[..], "sync_collective", true),
            (&filters[..], "async_collective", false),
            (&filters[..], "prefetch::cuda_pinned", true),
            (&filters[..], "prefetch::cuda_pinned_twice", false),
            (&[][..], "anything", true),
        ];
        for (filters, test, want) in cases {
            assert_eq!(selects(filters, test), want, "{test}");
        }
        let tests = ["sync_collective".to_string(), "async_host".to_string()];
        assert_eq!(unmatched(&filters, &tests), ["prefetch::cuda_pinned"]);
        assert!(unmatched(&[], &tests).is_empty());
    }

    #[test]
    fn test_lists_parse() {
        let output = "a::b: test\nc: test\nbench_x: benchmark\n\n";
        assert_eq!(parse_test_list(output), ["a::b", "c"]);
        assert!(parse_test_list("").is_empty());
    }
}
