//! Identity from each launcher's environment, and the typed errors of partial or bad ones.

use std::collections::HashMap;

use flodl_cluster::identity::first_host;
use flodl_cluster::{ControllerAddr, Identity, IdentityError, Launcher};

use crate::support::TestResult;

/// The fields of an expected identity: rank, world, local rank, host, port, launcher.
type Want = (usize, usize, usize, &'static str, u16, Launcher);

/// One environment and what it must give.
struct Case {
    name: &'static str,
    vars: &'static [(&'static str, &'static str)],
    want: Result<Option<Want>, IdentityError>,
}

fn read(vars: &[(&str, &str)]) -> Result<Option<Identity>, IdentityError> {
    let map: HashMap<String, String> =
        vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Identity::from_vars(|name| map.get(name).cloned())
}

#[test]
fn each_launcher_and_each_bad_environment() -> TestResult {
    use IdentityError as E;
    use Launcher::*;
    let cases = [
        Case { name: "nothing set", vars: &[("PATH", "/bin")], want: Ok(None) },
        Case {
            name: "fdl launch",
            vars: &[
                ("FLODL_RANK", "2"),
                ("FLODL_WORLD_SIZE", "4"),
                ("FLODL_LOCAL_RANK", "2"),
                ("FLODL_CONTROLLER_ADDR", "127.0.0.1"),
                ("FLODL_CONTROLLER_PORT", "41000"),
            ],
            want: Ok(Some((2, 4, 2, "127.0.0.1", 41000, Fdl))),
        },
        Case {
            name: "fdl launch, port in the address",
            vars: &[
                ("FLODL_RANK", "0"),
                ("FLODL_WORLD_SIZE", "1"),
                ("FLODL_LOCAL_RANK", "0"),
                ("FLODL_CONTROLLER_ADDR", "[::1]:41001"),
            ],
            want: Ok(Some((0, 1, 0, "::1", 41001, Fdl))),
        },
        Case {
            name: "fdl wins over torchrun's variables",
            vars: &[
                ("FLODL_RANK", "1"),
                ("FLODL_WORLD_SIZE", "2"),
                ("FLODL_LOCAL_RANK", "1"),
                ("FLODL_CONTROLLER_ADDR", "a"),
                ("RANK", "0"),
                ("WORLD_SIZE", "8"),
            ],
            want: Ok(Some((1, 2, 1, "a", 29600, Fdl))),
        },
        Case {
            name: "torchrun, MASTER_PORT ignored",
            vars: &[
                ("RANK", "3"),
                ("WORLD_SIZE", "8"),
                ("LOCAL_RANK", "1"),
                ("MASTER_ADDR", "node7"),
                ("MASTER_PORT", "29500"),
            ],
            want: Ok(Some((3, 8, 1, "node7", 29600, Torchrun))),
        },
        Case {
            name: "torchrun with the controller's own port and address override",
            vars: &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("LOCAL_RANK", "0"),
                ("MASTER_ADDR", "node7"),
                ("FLODL_CONTROLLER_ADDR", "10.0.0.5"),
                ("FLODL_CONTROLLER_PORT", "5000"),
            ],
            want: Ok(Some((0, 2, 0, "10.0.0.5", 5000, Torchrun))),
        },
        Case {
            name: "Slurm, step node list first",
            vars: &[
                ("SLURM_PROCID", "5"),
                ("SLURM_NTASKS", "6"),
                ("SLURM_LOCALID", "1"),
                ("SLURM_STEP_NODELIST", "gpu[03-05,09],cpu1"),
                ("SLURM_JOB_NODELIST", "other[1-9]"),
            ],
            want: Ok(Some((5, 6, 1, "gpu03", 29600, Slurm))),
        },
        Case {
            name: "Slurm, job node list",
            vars: &[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_LOCALID", "0"),
                ("SLURM_JOB_NODELIST", "rack[1-2]-n[07,09]"),
            ],
            want: Ok(Some((0, 2, 0, "rack1-n07", 29600, Slurm))),
        },
        Case {
            name: "Open MPI with MASTER_ADDR",
            vars: &[
                ("OMPI_COMM_WORLD_RANK", "1"),
                ("OMPI_COMM_WORLD_SIZE", "3"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
                ("MASTER_ADDR", "head"),
            ],
            want: Ok(Some((1, 3, 0, "head", 29600, OpenMpi))),
        },
        Case {
            name: "Open MPI with FLODL_CONTROLLER_ADDR",
            vars: &[
                ("OMPI_COMM_WORLD_RANK", "0"),
                ("OMPI_COMM_WORLD_SIZE", "3"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
                ("FLODL_CONTROLLER_ADDR", "head:7000"),
            ],
            want: Ok(Some((0, 3, 0, "head", 7000, OpenMpi))),
        },
        Case {
            name: "a rank without a world",
            vars: &[("RANK", "0"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "h")],
            want: Err(E::Missing { launcher: Torchrun, present: "RANK", missing: "WORLD_SIZE" }),
        },
        Case {
            name: "rank at the world size",
            vars: &[
                ("FLODL_RANK", "4"),
                ("FLODL_WORLD_SIZE", "4"),
                ("FLODL_LOCAL_RANK", "0"),
                ("FLODL_CONTROLLER_ADDR", "h"),
            ],
            want: Err(E::OutOfRange {
                var: "FLODL_RANK",
                value: 4,
                world_var: "FLODL_WORLD_SIZE",
                world: 4,
            }),
        },
        Case {
            name: "local rank beyond the world",
            vars: &[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_LOCALID", "2"),
                ("SLURM_JOB_NODELIST", "n1"),
            ],
            want: Err(E::OutOfRange {
                var: "SLURM_LOCALID",
                value: 2,
                world_var: "SLURM_NTASKS",
                world: 2,
            }),
        },
        Case {
            name: "not a number",
            vars: &[
                ("OMPI_COMM_WORLD_RANK", "one"),
                ("OMPI_COMM_WORLD_SIZE", "2"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
                ("MASTER_ADDR", "h"),
            ],
            want: Err(E::NotANumber { var: "OMPI_COMM_WORLD_RANK", value: "one".into() }),
        },
        Case {
            name: "a negative world",
            vars: &[("RANK", "0"), ("WORLD_SIZE", "-2"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "h")],
            want: Err(E::NotANumber { var: "WORLD_SIZE", value: "-2".into() }),
        },
        Case {
            name: "an empty world",
            vars: &[("RANK", "0"), ("WORLD_SIZE", "0"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "h")],
            want: Err(E::EmptyWorld { var: "WORLD_SIZE" }),
        },
        Case {
            name: "Open MPI without a controller host",
            vars: &[
                ("OMPI_COMM_WORLD_RANK", "0"),
                ("OMPI_COMM_WORLD_SIZE", "2"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ],
            want: Err(E::Missing {
                launcher: OpenMpi,
                present: "OMPI_COMM_WORLD_RANK",
                missing: "FLODL_CONTROLLER_ADDR or MASTER_ADDR",
            }),
        },
        Case {
            name: "Slurm without a node list",
            vars: &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "0")],
            want: Err(E::Missing {
                launcher: Slurm,
                present: "SLURM_PROCID",
                missing: "SLURM_STEP_NODELIST or SLURM_JOB_NODELIST",
            }),
        },
        Case {
            name: "a broken node list",
            vars: &[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_LOCALID", "0"),
                ("SLURM_JOB_NODELIST", "gpu[03-05"),
            ],
            want: Err(E::HostList {
                var: "SLURM_JOB_NODELIST",
                value: "gpu[03-05".into(),
                reason: "a '[' without its ']'",
            }),
        },
        Case {
            name: "a bad port",
            vars: &[
                ("RANK", "0"),
                ("WORLD_SIZE", "1"),
                ("LOCAL_RANK", "0"),
                ("MASTER_ADDR", "h"),
                ("FLODL_CONTROLLER_PORT", "70000"),
            ],
            want: Err(E::Port { var: "FLODL_CONTROLLER_PORT", value: "70000".into() }),
        },
        Case {
            name: "ports that disagree",
            vars: &[
                ("FLODL_RANK", "0"),
                ("FLODL_WORLD_SIZE", "1"),
                ("FLODL_LOCAL_RANK", "0"),
                ("FLODL_CONTROLLER_ADDR", "h:5000"),
                ("FLODL_CONTROLLER_PORT", "5001"),
            ],
            want: Err(E::PortConflict { in_addr: 5000, in_port: 5001 }),
        },
        Case {
            name: "a bad address",
            vars: &[
                ("FLODL_RANK", "0"),
                ("FLODL_WORLD_SIZE", "1"),
                ("FLODL_LOCAL_RANK", "0"),
                ("FLODL_CONTROLLER_ADDR", "h:x:y"),
            ],
            want: Err(E::Address { var: "FLODL_CONTROLLER_ADDR", value: "h:x:y".into() }),
        },
    ];
    for case in cases {
        let want = case.want.map(|o| {
            o.map(|(rank, world, local_rank, host, port, launcher)| Identity {
                rank,
                world,
                local_rank,
                controller: ControllerAddr { host: host.into(), port },
                launcher,
            })
        });
        let got = read(case.vars);
        if got != want {
            return Err(format!("{}: got {got:?}, want {want:?}", case.name).into());
        }
        if let Err(e) = &got {
            // The message names the variable at fault.
            let text = e.to_string();
            if !case.vars.iter().any(|(k, _)| text.contains(k))
                && !text.contains("FLODL_CONTROLLER_ADDR")
            {
                return Err(format!("{}: {text:?} names no variable", case.name).into());
            }
        }
    }
    Ok(())
}

#[test]
fn slurm_host_lists() -> TestResult {
    let cases: [(&str, Result<&str, ()>); 9] = [
        ("node1", Ok("node1")),
        ("gpu[03-05,09],cpu1", Ok("gpu03")),
        ("cpu1,gpu[03-05]", Ok("cpu1")),
        ("a[7]", Ok("a7")),
        ("rack[1-2]-n[07,09]", Ok("rack1-n07")),
        ("", Err(())),
        ("gpu]", Err(())),
        ("gpu[a-b]", Err(())),
        ("gpu[[1]]", Err(())),
    ];
    for (list, want) in cases {
        let got = first_host(list).map_err(|_| ());
        if got.as_deref().map_err(|_| ()) != want {
            return Err(format!("{list:?}: got {got:?}, want {want:?}").into());
        }
    }
    Ok(())
}
