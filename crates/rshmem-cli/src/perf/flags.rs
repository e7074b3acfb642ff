//! Which groups a run has, and the flags a backend or the groups cannot honour (errors
//! before anything runs).

use super::*;

/// Whether no group was asked for (the default run: every group).
pub(super) fn groups_are_default(args: &PerfArgs) -> bool {
    args.suites.is_empty() && !args.coll && !args.ep
}

/// The benchmark groups asked for (default all three: p2p, coll and ep).
pub(super) fn groups(args: &PerfArgs) -> Vec<SuiteArg> {
    if !args.suites.is_empty() {
        args.suites.clone()
    } else if args.coll || args.ep {
        [(args.coll, SuiteArg::Coll), (args.ep, SuiteArg::Ep)]
            .into_iter()
            .filter_map(|(on, g)| on.then_some(g))
            .collect()
    } else {
        vec![SuiteArg::P2p, SuiteArg::Coll, SuiteArg::Ep]
    }
}

pub(super) fn group_names(groups: &[SuiteArg]) -> String {
    groups
        .iter()
        .map(|g| match g {
            SuiteArg::P2p => "p2p",
            SuiteArg::Coll => "coll",
            SuiteArg::Ep => "ep",
            SuiteArg::Fabric => "fabric",
            SuiteArg::FabricGpu => "fabric-gpu",
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The first MoE flag given, if any.
pub(super) fn ep_flag(args: &PerfArgs) -> Option<&'static str> {
    [
        (!args.ep_tokens.is_empty(), "--ep-tokens"),
        (args.ep_hidden.is_some(), "--ep-hidden"),
        (args.ep_topk.is_some(), "--ep-topk"),
        (args.ep_experts.is_some(), "--ep-experts"),
        (args.ep_iters.is_some(), "--ep-iters"),
    ]
    .into_iter()
    .find_map(|(on, f)| on.then_some(f))
}

/// Flags that would do nothing with the groups asked for, whatever the backend.
pub(super) fn check_group_flags(args: &PerfArgs) -> CliResult<()> {
    let groups = groups(args);
    let has = |g: SuiteArg| groups.contains(&g);
    let names = group_names(&groups);
    if !has(SuiteArg::Ep) {
        if let Some(f) = ep_flag(args) {
            return Err(format!(
                "{f} sets the MoE (ep) group, which this run leaves out (groups {names}); add --ep or ep to --suites"
            )
            .into());
        }
    }
    if args.ep_iters == Some(0) {
        return Err("--ep-iters 0: the MoE figures need at least 1 timed call".into());
    }
    if !has(SuiteArg::P2p) {
        for (on, f) in [
            (!args.ops.is_empty(), "--ops"),
            (!args.barrier_pes.is_empty(), "--barrier-pes"),
            (args.pairs, "--pairs"),
        ] {
            if on {
                return Err(format!(
                    "{f} sets the p2p group, which this run leaves out (groups {names}); add p2p to --suites"
                )
                .into());
            }
        }
    }
    if let Some(m) = args.max_size {
        if !has(SuiteArg::P2p) && !has(SuiteArg::Coll) && !has(SuiteArg::Fabric) {
            return Err(format!(
                "--max-size {}: it sizes the p2p, coll and fabric groups, which this run leaves out (groups {names}); the MoE sizes are the --ep-* flags",
                report::human_bytes(m)
            )
            .into());
        }
    }
    if !args.barrier_pes.is_empty() {
        if !args.ops.is_empty() && !args.ops.contains(&Op::Barrier) {
            return Err(
                "--barrier-pes sets the barrier figures, which --ops leaves out; add barrier to --ops"
                    .into(),
            );
        }
        if args.barrier_pes.contains(&0) {
            return Err("--barrier-pes 0: a world needs at least 1 PE".into());
        }
    }
    Ok(())
}

/// Flags the backend cannot honour. `auto`: the backend was picked by `--backend auto`.
pub(super) fn check_backend_flags(args: &PerfArgs, backend: Backend, auto: bool) -> CliResult<()> {
    let b = format!(
        "the {} backend{}",
        backend.name(),
        if auto {
            " (picked by --backend auto)"
        } else {
            ""
        }
    );
    let unhonoured = match backend {
        Backend::Shm => {
            if let Some(n) = args.gpus {
                Some(format!(
                    "--gpus {n}: {b} runs on the CPU; --gpus is for --backend cuda"
                ))
            } else if args.pairs {
                Some(format!(
                    "--pairs: {b} has no GPU pairs; --pairs is for --backend cuda"
                ))
            } else if args.mode == Some(ModeArg::Mixed) && !args.barrier_pes.is_empty() {
                Some(format!(
                    "--barrier-pes: {b} times the barrier of --mode mixed at its 4 PEs only; --barrier-pes is for --mode threads, processes or all"
                ))
            } else {
                None
            }
        }
        Backend::Cuda => {
            if let Some(m) = args.mode.filter(|&m| m != ModeArg::Threads) {
                Some(format!(
                    "--mode {}: {b} runs its PEs as threads of this process; processes and mixed worlds are for --backend shm (leave --mode out or give --mode threads)",
                    m.label()
                ))
            } else if !args.ops.is_empty() {
                Some(format!(
                    "--ops: {b} measures its whole p2p group (device put, get, put-with-signal and barrier); --ops is for --backend shm"
                ))
            } else if !args.barrier_pes.is_empty() {
                Some(format!(
                    "--barrier-pes: {b} times its device barrier at the --gpus PEs; --barrier-pes is for --backend shm"
                ))
            } else {
                args.max_size.filter(|&m| m < 4096).map(|m| {
                    format!(
                        "--max-size {}: {b} measures from 4 KiB up; give at least 4K",
                        report::human_bytes(m)
                    )
                })
            }
        }
    };
    match unhonoured {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
