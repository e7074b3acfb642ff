//! Captured graphs replayed with changing routings, normal mode, token-major rows, overflow.

use super::*;

fn graph_body(pe: &Pe) -> Result<()> {
    graph_body_with(pe, RecvLayout::ExpertMajor)
}

fn graph_body_with(pe: &Pe, layout: RecvLayout) -> Result<()> {
    graph_body_mode(pe, EpMode::Capturable { capacity: 40 }, layout)
}

fn graph_body_mode(pe: &Pe, mode: EpMode, layout: RecvLayout) -> Result<()> {
    let n = pe.n_pes();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let c = EpConfig {
        layout,
        ..cfg(n, mode)
    };
    let buf = GpuBuffer::<bf16>::new(pe, pe.world_team(), c, &ep_tuning())?;
    let inp = inputs::<bf16>(pe, &c, n)?;
    let t = 37;
    let k = 6;
    let first = Step {
        case: Case::Random,
        t,
        k,
        seed: 100,
        i64_ids: false,
        scale: true,
    };
    write_inputs(pe, &c, &inp, &first)?;
    pe.barrier_all()?;
    s.begin_capture()?;
    let captured = dispatch(pe, &s, &buf, &inp, &first).and_then(|d| {
        // Counts stay on the device while capturing, in both modes.
        assert_eq!(d.rows(), None);
        assert!(s.is_capturing()?);
        expert_and_combine(pe, &s, &buf, &inp, &d, true)
    });
    let graph = s.end_capture()?;
    captured?;
    // A replay with `st`'s inputs: exact results.
    let replay = |st: &Step| -> Result<()> {
        write_inputs(pe, &c, &inp, st)?;
        poison_output(pe, &buf)?;
        pe.barrier_all()?;
        graph.launch(&s)?;
        s.synchronize()?;
        buf.check(pe)?;
        verify(pe, &c, &buf, &inp, st, None)?;
        pe.barrier_all()
    };
    for rep in 0..14u64 {
        let case = match rep % 7 {
            3 => Case::OnePe,
            4 => Case::AllMinusOne,
            5 => Case::NoneToLast,
            _ => Case::Random,
        };
        let st = Step {
            case,
            t,
            k,
            seed: 200 + rep,
            i64_ids: false,
            scale: true,
        };
        replay(&st)?;
    }
    // Every slot of every token to one expert (duplicate ids): 444 rows on PE 0.
    let one = Step {
        case: Case::OneExpert,
        t,
        k,
        seed: 1,
        i64_ids: false,
        scale: true,
    };
    replay(&one)?;
    drop(graph);
    free_inputs(pe, inp)?;
    pe.free(buf)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_graph_replay_changing_routing() {
    on_gpus(2, graph_body);
}

gpu_mode_test!(
    gpu_ep_graph_replay_changing_routing,
    gpu_config(4),
    graph_body,
    [processes(2), mixed(4)]
);

/// Token-major buffers (each token once per PE, experts gather through the expert-major
/// index): every routing, both modes and id types, identity and scaling experts, wide rows.
fn token_major_body(pe: &Pe) -> Result<()> {
    let tm = RecvLayout::TokenMajor;
    routings_body_with::<bf16>(pe, EpMode::Normal, 72, 0, 1..=8, tm)?;
    routings_body_with::<f32>(pe, EpMode::Capturable { capacity: 40 }, 1028, 1, 3..=4, tm)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_token_major_routings() {
    on_gpus(2, token_major_body);
}

gpu_mode_test!(
    gpu_ep_token_major_routings,
    gpu_config(4),
    token_major_body,
    [processes(2)]
);

/// Normal mode captured too: while the stream captures, dispatch does not synchronise (the
/// counts stay on the device, `rows()` is `None`), and the graph replays with changing routing.
#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_graph_replay_normal_mode() {
    on_gpus(2, |pe| {
        graph_body_mode(pe, EpMode::Normal, RecvLayout::ExpertMajor)?;
        graph_body_mode(pe, EpMode::Normal, RecvLayout::TokenMajor)
    });
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_token_major_graph_replay() {
    on_gpus(2, |pe| graph_body_with(pe, RecvLayout::TokenMajor));
}

fn graph_overflow_body(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let c = cfg(n, EpMode::Capturable { capacity: 12 });
    let buf = GpuBuffer::<f32>::new(pe, pe.world_team(), c, &ep_tuning())?;
    let inp = inputs::<f32>(pe, &c, n)?;
    let t = 20;
    let k = 3;
    let good = |seed| Step {
        case: Case::OnePe,
        t,
        k,
        seed,
        i64_ids: true,
        scale: true,
    }; // 10 per PE
    write_inputs(pe, &c, &inp, &good(1))?;
    pe.barrier_all()?;
    s.begin_capture()?;
    let captured = dispatch(pe, &s, &buf, &inp, &good(1))
        .and_then(|d| expert_and_combine(pe, &s, &buf, &inp, &d, true));
    let graph = s.end_capture()?;
    captured?;
    for rep in 0..10u64 {
        let overflow = rep % 3 == 1;
        let st = if overflow {
            Step {
                case: Case::OneExpert,
                t,
                k,
                seed: rep,
                i64_ids: true,
                scale: true,
            } // 20 > 12
        } else {
            good(10 + rep)
        };
        write_inputs(pe, &c, &inp, &st)?;
        pe.local_fill(&buf.expert_x()?, -55.0)?;
        pe.barrier_all()?;
        graph.launch(&s)?;
        s.synchronize()?;
        if overflow {
            match buf.check(pe) {
                Err(Error::Capacity {
                    needed: 20,
                    capacity: 12,
                    ..
                }) => {}
                other => panic!(
                    "PE {} replay {rep}: expected a capacity error, got {other:?}",
                    pe.my_pe()
                ),
            }
            assert!(
                pe.local_vec(&inp.out)?.iter().all(|v| *v == -77.0),
                "combine wrote despite overflow"
            );
        } else {
            buf.check(pe)?;
            verify(pe, &c, &buf, &inp, &st, None)?;
        }
        pe.barrier_all()?;
    }
    drop(graph);
    free_inputs(pe, inp)?;
    pe.free(buf)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_graph_replay_with_overflow() {
    on_gpus(2, graph_overflow_body);
}
