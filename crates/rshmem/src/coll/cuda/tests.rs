use super::*;

fn shape(n: usize, me: usize, in_place: bool) -> Shape {
    Shape {
        n,
        me,
        in_place,
        chunk: usize::MAX,
    }
}

#[test]
fn ll_threads_refused_past_a_kernels_limit() {
    let limits = [
        ("rshmemi_coll_ll_float_sum", 768),
        ("rshmemi_coll_ll_bfloat16_max", 640),
    ];
    assert!(ll_threads_within(limits, 256).is_ok());
    assert!(ll_threads_within(limits, 640).is_ok());
    let e = ll_threads_within(limits, 768).unwrap_err().to_string();
    assert!(e.contains("RSHMEM_CUDA_COLL_LL_THREADS=768"), "{e}");
    assert!(
        e.contains("rshmemi_coll_ll_bfloat16_max runs at most 640"),
        "{e}"
    );
    assert!(ll_threads_within([], 1024).is_ok());
}

#[test]
fn ll_a2a_grid_spreads_past_two_lines_per_thread() {
    // 256 threads, a cap of 64 blocks: a line per thread up to 64 blocks (16384 lines),
    // two per thread up to 32768 lines on 64 blocks, then more blocks at two per thread up
    // to 128, then more lines per thread.
    for (lines, cap) in [
        (1, 64),
        (16384, 64),
        (32768, 64),
        (32769, 65),
        (65536, 128),
        (1 << 20, 128),
    ] {
        assert_eq!(ll_a2a_grid_cap(lines, 256, 64), cap, "{lines} lines");
    }
    // The knob's cap scales it: on a cap of 1 block, 600 lines take 2 (twice the cap at
    // most), 512 lines (two per thread) stay on 1.
    assert_eq!(ll_a2a_grid_cap(600, 256, 1), 2);
    assert_eq!(ll_a2a_grid_cap(512, 256, 1), 1);
}

#[test]
fn default_ll_sizes_fit_a_sixteenth_of_the_heap() {
    let z = |r: usize, t: usize| LlSizes {
        all_reduce: r << 10,
        all_to_all: t << 10,
    };
    let heap = 128 << 20;
    assert_eq!(default_ll_sizes(heap, 2), z(128, 256));
    assert_eq!(default_ll_sizes(heap, 7), z(64, 128));
    assert_eq!(default_ll_sizes(heap, 8), z(32, 64));
    assert_eq!(default_ll_sizes(heap, 72), z(4, 8));
    assert_eq!(default_ll_sizes(2560 << 20, 2), z(512, 1024));
    for n in [2, 3, 8, 16, 72, 1000] {
        let d = default_ll_sizes(heap, n);
        if d.all_reduce > 0 {
            let area = d.area(n).unwrap();
            assert!(area <= heap / 16, "{n} PEs: {d:?} takes {area}");
            assert!(d.all_to_all >= 2 * d.all_reduce, "{n} PEs: {d:?}");
        }
    }
    // A heap too small for even 1 KiB: off, never an allocation failure.
    assert_eq!(default_ll_sizes(1 << 20, 72), z(0, 0));
    assert_eq!(default_ll_sizes(0, 2), z(0, 0));
    // The region: an all_reduce message or a team of 2's share of an all_to_all.
    assert_eq!(z(64, 1024).region(), 512 << 10);
    assert_eq!(z(64, 64).region(), 64 << 10);
}

#[test]
fn which_plans_fuse() {
    let lim = COLL_FUSED_BYTES;
    // one-shot all_reduce out of place: 4 members × 1000 f32 = 16 000 bytes read
    let p = plan::all_reduce(shape(4, 1, false), 1000, Algo::OneShot);
    assert!(fusable(&p, 4, lim));
    assert!(!fusable(&p, 4, 15_999));
    assert!(!fusable(&p, 4, 0));
    // in place one-shot stages in Temp; two-shot has three syncs
    assert!(!fusable(
        &plan::all_reduce(shape(4, 1, true), 10, Algo::OneShot),
        4,
        lim
    ));
    assert!(!fusable(
        &plan::all_reduce(shape(4, 1, false), 10, Algo::TwoShot),
        4,
        lim
    ));
    // all_to_all / all_gather out of place fuse, in-place all_to_all does not
    assert!(fusable(&plan::all_to_all(shape(3, 2, false), 10), 8, lim));
    assert!(!fusable(&plan::all_to_all(shape(3, 2, true), 10), 8, lim));
    assert!(fusable(&plan::all_gather(shape(3, 0, true), 10), 8, lim));
    // reduce: the root fuses, the others have nothing between their two syncs
    assert!(fusable(&plan::reduce(shape(3, 1, false), 1, 10), 8, lim));
    assert!(!fusable(&plan::reduce(shape(3, 0, false), 1, 10), 8, lim));
    // nothing to move: not fused (the barriers still run as kernels)
    assert!(!fusable(&plan::all_gather(shape(3, 0, false), 0), 8, lim));
    // every plan keeps two or more syncs, so fused and unfused members agree
    for p in [
        plan::reduce(shape(3, 0, false), 1, 10),
        plan::broadcast(shape(3, 0, false), 1, 10, Algo::OneShot),
    ] {
        assert!(p.syncs() >= 2);
    }
}

fn sig(kind: CollKind, count: usize) -> CallSig {
    let dt = DeviceTeam {
        slot: 3,
        my_index: 1,
        size: 4,
        start: 0,
        stride: 1,
    };
    CallSig {
        syncs: 2,
        ..raw_sig(
            SigKind::Coll(kind),
            ElemKind::F32,
            Some(ReduceOp::Sum),
            Some(Algo::OneShot),
            false,
            count,
            0,
            RawSym {
                offset: 4096,
                len: 100,
                job: 1,
                owner: 1,
            },
            RawSym {
                offset: 8192,
                len: 100,
                job: 1,
                owner: 1,
            },
            dt,
        )
    }
}

#[test]
fn signature_packs_every_field() {
    let base = sig(CollKind::AllReduce, 100);
    let w = base.pack().unwrap();
    assert_ne!(w[0] & SIG_MARK, 0, "a written slot is never 0");
    assert_eq!(CallSig::syncs_of(&w), 2);
    assert_eq!(w[1], 100);
    assert_eq!((w[3], w[4]), (4096, 8192));
    // every field that must agree changes the packed words
    let variants = [
        CallSig {
            kind: SigKind::Coll(CollKind::Reduce),
            ..base
        },
        CallSig {
            kind: SigKind::A2avDevice,
            ..base
        },
        CallSig {
            elem: ElemKind::I32,
            ..base
        },
        CallSig {
            op: Some(ReduceOp::Max),
            ..base
        },
        CallSig { op: None, ..base },
        CallSig {
            algo: Some(Algo::TwoShot),
            ..base
        },
        CallSig {
            in_place: true,
            ..base
        },
        CallSig { syncs: 3, ..base },
        CallSig { count: 101, ..base },
        CallSig { aux: 1, ..base },
        CallSig { src: 0, ..base },
        CallSig { dst: 0, ..base },
        CallSig {
            team: (4, 0, 2),
            ..base
        },
        CallSig {
            team: (3, 0, 1),
            ..base
        },
    ];
    let mut seen = vec![w];
    for v in variants {
        let p = v.pack().unwrap();
        assert!(!seen.contains(&p), "{v:?} packs like an earlier variant");
        seen.push(p);
    }
    // my_index and slot are not part of it: every member computes the same words
    let other = DeviceTeam {
        slot: 3,
        my_index: 2,
        size: 4,
        start: 0,
        stride: 1,
    };
    let r = RawSym {
        offset: 4096,
        len: 7,
        job: 1,
        owner: 2,
    };
    let d = RawSym { offset: 8192, ..r };
    let theirs = CallSig {
        syncs: 2,
        ..raw_sig(
            SigKind::Coll(CollKind::AllReduce),
            ElemKind::F32,
            Some(ReduceOp::Sum),
            Some(Algo::OneShot),
            false,
            100,
            0,
            r,
            d,
            other,
        )
    };
    assert_eq!(
        theirs.pack().unwrap(),
        w,
        "lengths and my_index do not count"
    );
    assert!(CallSig {
        syncs: 0x1_0000,
        ..base
    }
    .pack()
    .is_err());
}

#[test]
fn signature_syncs_follow_the_plan() {
    let sh = shape(4, 1, false);
    let one = plan::all_reduce(sh, 1000, Algo::OneShot).syncs();
    let two = plan::all_reduce(sh, 1000, Algo::TwoShot).syncs();
    assert_eq!((one, two), (2, 3));
    let a = CallSig {
        syncs: one,
        ..sig(CollKind::AllReduce, 1000)
    };
    let b = CallSig {
        syncs: two,
        algo: Some(Algo::TwoShot),
        ..a
    };
    assert_eq!(CallSig::syncs_of(&a.pack().unwrap()), 2);
    assert_eq!(CallSig::syncs_of(&b.pack().unwrap()), 3);
    for k in CollKind::ALL
        .iter()
        .map(|&k| SigKind::Coll(k))
        .chain([SigKind::A2avDevice])
    {
        assert_eq!(SigKind::from_code(k.code()), Some(k));
        assert!(k.code() < 256);
    }
    assert_eq!(SigKind::from_code(0), None);
}

#[test]
fn signature_descriptions_name_the_fields() {
    let w = sig(CollKind::AllReduce, 100).pack().unwrap();
    let d = CallSig::describe(&w);
    assert!(
        d.starts_with("all_reduce float sum count 100 in_place false algo one_shot barriers 2 src @0x1000 dst @0x2000"),
        "{d}"
    );
    let b = CallSig {
        kind: SigKind::Coll(CollKind::Broadcast),
        op: None,
        aux: 3,
        ..sig(CollKind::AllReduce, 5)
    };
    let d = CallSig::describe(&b.pack().unwrap());
    assert!(d.starts_with("broadcast float count 5 root 3 "), "{d}");
    assert!(CallSig::describe(&[0; SIG_WORDS]).starts_with("no collective signature"));
    // The LL all_reduce: its own signature (differs from the one-shot call's), named "ll".
    let l = CallSig {
        algo: None,
        ll: true,
        ..sig(CollKind::AllReduce, 100)
    };
    let lw = l.pack().unwrap();
    assert_ne!(lw, w);
    let d = CallSig::describe(&lw);
    assert!(d.contains(" algo ll barriers 2 "), "{d}");
    // The pull all_to_all: differs from the LL one of the same call, named "pull".
    let a = CallSig {
        kind: SigKind::Coll(CollKind::AllToAll),
        op: None,
        algo: None,
        ll: true,
        ..sig(CollKind::AllReduce, 100)
    };
    let p = CallSig { pull: true, ..a };
    let (aw, pw) = (a.pack().unwrap(), p.pack().unwrap());
    assert_ne!(aw, pw);
    assert!(CallSig::describe(&aw).contains(" algo ll "), "{aw:?}");
    let d = CallSig::describe(&pw);
    assert!(d.starts_with("all_to_all float count 100 "), "{d}");
    assert!(d.contains(" algo pull barriers 2 "), "{d}");
    // A pull broadcast along a chain: differs from the one where everyone reads the root.
    let pb = CallSig {
        kind: SigKind::Coll(CollKind::Broadcast),
        pull: true,
        ..a
    };
    let cb = CallSig { chain: true, ..pb };
    let (pbw, cbw) = (pb.pack().unwrap(), cb.pack().unwrap());
    assert_ne!(pbw, cbw);
    assert!(CallSig::describe(&pbw).contains(" algo pull "), "{pbw:?}");
    assert!(CallSig::describe(&cbw).contains(" algo chain "), "{cbw:?}");
    // A pair's all_reduce by pushes: differs from the pull one, named "push".
    let pa = CallSig { pull: true, ..l };
    let pu = CallSig { push: true, ..pa };
    let (paw, puw) = (pa.pack().unwrap(), pu.pack().unwrap());
    assert_ne!(paw, puw);
    assert!(CallSig::describe(&paw).contains(" algo pull "), "{paw:?}");
    assert!(CallSig::describe(&puw).contains(" algo push "), "{puw:?}");
}

#[test]
fn mismatch_records_become_errors() {
    let mine = sig(CollKind::AllReduce, 100).pack().unwrap();
    let theirs = sig(CollKind::AllReduce, 200).pack().unwrap();
    let mut w = [0u64; ERR_SKIP];
    assert!(mismatch_error(&w).is_none());
    w[0] = ERR_CAPACITY;
    assert!(mismatch_error(&w).is_none());
    w[0] |= ERR_MISMATCH;
    w[ERR_MM_PE] = 3;
    w[ERR_MM_MINE..ERR_MM_MINE + SIG_WORDS].copy_from_slice(&mine);
    w[ERR_MM_THEIRS..ERR_MM_THEIRS + SIG_WORDS].copy_from_slice(&theirs);
    match mismatch_error(&w) {
        Some(Error::CollectiveMismatch {
            op,
            pe,
            mine: m,
            theirs: t,
        }) => {
            assert_eq!((op, pe), ("all_reduce", 3));
            assert!(m.contains("count 100 "), "{m}");
            assert!(t.contains("count 200 "), "{t}");
        }
        other => panic!("{other:?}"),
    }
    // a member that wrote nothing
    w[ERR_MM_THEIRS..ERR_MM_THEIRS + SIG_WORDS].fill(0);
    let e = mismatch_error(&w).unwrap().to_string();
    assert!(e.contains("no collective signature"), "{e}");
}

#[test]
fn layouts_match_the_kernels() {
    // rshmemi_check: six signature words, two pointers; the error record fits every slot.
    assert_eq!(std::mem::size_of::<Check>(), 8 * (SIG_WORDS + 2));
    assert_eq!(std::mem::size_of::<A2avList>(), 16 * A2AV_CHUNK);
    let src = super::modules::COLL_SOURCE;
    for (name, v) in [
        ("RSHMEMI_SIG_WORDS", SIG_WORDS),
        ("RSHMEMI_ERR_MM_PE", ERR_MM_PE),
        ("RSHMEMI_ERR_MM_MINE", ERR_MM_MINE),
        ("RSHMEMI_ERR_SKIP", ERR_SKIP),
        ("RSHMEMI_A2AV_CHUNK", A2AV_CHUNK),
        ("RSHMEMI_COLL_MAX_COPIES", MAX_COPIES),
        ("RSHMEMI_LL_MAX_BLOCKS", LL_KERNEL_MAX_BLOCKS as usize),
    ] {
        assert!(
            src.contains(&format!("#define {name} {v}\n")),
            "{name} must be {v} in coll.cu"
        );
    }
    for (name, v) in [
        ("RSHMEMI_ERR_CAPACITY", ERR_CAPACITY),
        ("RSHMEMI_ERR_A2AV", ERR_A2AV),
        ("RSHMEMI_ERR_MISMATCH", ERR_MISMATCH),
    ] {
        assert!(src.contains(&format!("#define {name} {v}ull\n")), "{name}");
    }
}

/// Parameter types of kernel `name` as declared in `src` (pointers as `ptr`, `const`
/// dropped), the declaration possibly inside a macro.
fn kernel_params(src: &str, name: &str) -> Vec<String> {
    let at = src
        .find(&format!("void {name}("))
        .unwrap_or_else(|| panic!("kernel {name} not declared"));
    let rest = &src[at + name.len() + 6..];
    let list = &rest[..rest.find(')').expect("parameter list")];
    crate::backend::cuda::srcparse::param_types(list)
}

/// Field types of `struct name { ... };` in `src`, in order.
fn struct_fields(src: &str, name: &str) -> Vec<String> {
    let body = src
        .split(&format!("struct {name} {{"))
        .nth(1)
        .and_then(|b| b.split("};").next())
        .unwrap_or_else(|| panic!("struct {name}"));
    body.lines()
        .filter_map(|l| l.split("//").next())
        .flat_map(|l| l.split(';'))
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            if d.contains('*') {
                "ptr".to_string()
            } else {
                d.rsplit_once(' ').expect("type and name").0.to_string()
            }
        })
        .collect()
}

/// Every kernel this file launches takes the parameters its launch site passes, in order
/// (the driver reads as many bytes per parameter as the kernel declares), and every struct
/// passed by value has the layout of its Rust mirror.
#[test]
fn launches_match_the_kernel_signatures() {
    use std::mem::{offset_of, size_of};
    let coll = super::modules::COLL_SOURCE;
    let internal = crate::backend::cuda::nvrtc::INTERNAL_KERNELS;
    let header = crate::backend::cuda::nvrtc::DEVICE_HEADER;
    let (p, u, i, team, ck) = ("ptr", "rshmem_u64", "int", "rshmem_team", "rshmemi_check");
    // What `sync`, `sig_sync`, `reduce_launch`, `flush`, `all_to_all_v`,
    // `all_to_all_v_device` and its cross-node launches pass (u64 addresses go to pointer or rshmem_u64 parameters).
    let launches: [(&str, &str, Vec<&str>); 13] = [
        (internal, "rshmemi_team_sync", vec![team]),
        (coll, "rshmemi_coll_sync_sig", vec![team, ck]),
        (
            coll,
            "rshmemi_coll_reduce_##NAME##_##OPN",
            vec![p, p, u, team, i, ck],
        ),
        (
            coll,
            "rshmemi_coll_copy",
            vec!["rshmemi_copies", i, team, i, ck],
        ),
        (
            coll,
            "rshmemi_coll_ll_##NAME##_##OPN",
            vec![p, p, u, team, ck, "rshmemi_ll", u],
        ),
        (
            coll,
            "rshmemi_coll_pull_ar_##NAME##_##OPN",
            vec![p, p, u, team, ck, "rshmemi_ll", u],
        ),
        (
            coll,
            "rshmemi_coll_ll_move_##KN##_##SN",
            vec![p, p, u, team, ck, "rshmemi_ll", u],
        ),
        (
            coll,
            "rshmemi_coll_pull_a2a",
            vec![p, p, u, team, ck, "rshmemi_ll", u],
        ),
        (
            coll,
            "rshmemi_coll_pull_bcast",
            vec![p, p, u, team, ck, "rshmemi_ll", u],
        ),
        (
            coll,
            "rshmemi_coll_a2av_dev",
            vec![p, p, p, p, p, u, u, u, team, p, u, p],
        ),
        (
            coll,
            "rshmemi_coll_net_a2avd",
            vec![p, p, p, u, p, i, i, u, u, u, p, "rshmemi_net_waits", i, p],
        ),
        (
            coll,
            "rshmemi_coll_a2av_meta",
            vec![p, "rshmemi_a2av_list", i, i, u],
        ),
        (
            coll,
            "rshmemi_coll_a2av_host",
            vec![p, p, p, "rshmemi_a2av_list", i, i, u, p, u, u, u, team],
        ),
    ];
    for (src, name, want) in launches {
        assert_eq!(kernel_params(src, name), want, "{name}");
    }
    // Structs by value: field types, sizes, offsets.
    assert_eq!(struct_fields(header, "rshmem_team"), vec![i; 5]);
    assert_eq!(size_of::<DeviceTeam>(), 5 * 4);
    assert_eq!(
        [
            offset_of!(DeviceTeam, slot),
            offset_of!(DeviceTeam, my_index),
            offset_of!(DeviceTeam, size),
            offset_of!(DeviceTeam, start),
            offset_of!(DeviceTeam, stride),
        ],
        [0, 4, 8, 12, 16]
    );
    assert!(header.contains(
        "struct rshmem_team {\n    int slot;\n    int my_index;\n    int size;\n    int start;\n    int stride;\n};"
    ));
    assert_eq!(struct_fields(coll, "rshmemi_sig"), vec![u]);
    assert!(coll.contains("rshmem_u64 w[RSHMEMI_SIG_WORDS];"));
    assert_eq!(
        struct_fields(coll, "rshmemi_check"),
        vec!["rshmemi_sig", p, p]
    );
    assert_eq!(
        (offset_of!(Check, slots), offset_of!(Check, err)),
        (8 * SIG_WORDS, 8 * SIG_WORDS + 8)
    );
    assert_eq!(struct_fields(coll, "rshmemi_ll"), vec![u, u, p, u]);
    assert_eq!(
        (
            offset_of!(LlArg, lines),
            offset_of!(LlArg, done),
            offset_of!(LlArg, flags),
            size_of::<LlArg>()
        ),
        (8, 16, 24, 32)
    );
    assert!(coll.contains(&format!(
        "#define RSHMEMI_LL_MAX_MEMBERS {LL_MAX_MEMBERS}\n"
    )));
    assert_eq!(
        struct_fields(coll, "rshmemi_copy_desc"),
        vec![u, u, u, "long long"]
    );
    assert_eq!(size_of::<CopyDesc>(), 32);
    assert_eq!(size_of::<Copies>(), 32 * MAX_COPIES);
    assert!(coll.contains("rshmemi_copy_desc d[RSHMEMI_COLL_MAX_COPIES];"));
    assert_eq!(struct_fields(coll, "rshmemi_a2av_list"), vec![u, u]);
    assert!(coll.contains("rshmem_u64 count[RSHMEMI_A2AV_CHUNK];"));
    assert!(coll.contains("rshmem_u64 displ[RSHMEMI_A2AV_CHUNK];"));
    assert_eq!(offset_of!(A2avList, displ), 8 * A2AV_CHUNK);
    // The largest parameter list stays far below the 4 KiB every architecture takes.
    let copy_params = size_of::<Copies>() + 4 + size_of::<DeviceTeam>() + 4 + size_of::<Check>();
    assert!(copy_params + 16 < 4096, "{copy_params}");
}

#[test]
fn a2av_device_team_limit() {
    // H100/H200: 227 KiB opt-in → 170 members; a small world needs no opt-in.
    let (want, max) = a2av_dev_limit(227 << 10, 256);
    assert_eq!(want, (227 << 10) - 1024);
    assert_eq!(max, 170);
    assert!(max * max * 8 <= want && (max + 1) * (max + 1) * 8 > want);
    let (want, max) = a2av_dev_limit(227 << 10, 64);
    assert_eq!(want, 64 * 64 * 8);
    assert!(want <= SHARED_DEFAULT && max >= 64);
    // unknown attribute: the default 47 KiB → 77 members
    assert_eq!(a2av_dev_limit(-1, 1024).1, 77);
}

#[test]
fn every_gpu_plan_opens_with_a_barrier_and_has_two() {
    // `exec` relies on it: the first barrier carries the signature, and a second one
    // keeps the slots from being rewritten before every member has read them.
    for n in 1..6 {
        for me in 0..n {
            for ip in [false, true] {
                for count in [0, 1, 7, 1000] {
                    let sh = shape(n, me, ip);
                    let mut plans = vec![
                        plan::reduce(sh, n - 1, count),
                        plan::all_gather(sh, count),
                        plan::reduce_scatter(sh, count),
                        plan::all_to_all(sh, count),
                    ];
                    for algo in [Algo::OneShot, Algo::TwoShot] {
                        plans.push(plan::broadcast(sh, me, count, algo));
                        plans.push(plan::all_reduce(sh, count, algo));
                    }
                    for p in plans {
                        assert_eq!(p.steps.first(), Some(&Step::Sync), "{p:?}");
                        assert!(p.syncs() >= 2 && p.syncs() <= 0xffff, "{p:?}");
                    }
                }
            }
        }
    }
}

/// The signature carries the plan's barrier count (`exec`), so every member of one call
/// must plan as many barriers whatever its index, or identical calls would read as a
/// mismatch (and pad). Roots are the same on every member here, as the call requires.
#[test]
fn every_member_of_a_call_plans_as_many_barriers() {
    for n in 1..8 {
        for ip in [false, true] {
            for count in [0, 1, 2, 3, 7, 64, 1000] {
                let syncs = |mk: &dyn Fn(Shape) -> Plan| -> Vec<usize> {
                    (0..n).map(|me| mk(shape(n, me, ip)).syncs()).collect()
                };
                let mut all: Vec<(String, Vec<usize>)> = vec![
                    (
                        "all_gather".into(),
                        syncs(&|sh| plan::all_gather(sh, count)),
                    ),
                    (
                        "reduce_scatter".into(),
                        syncs(&|sh| plan::reduce_scatter(sh, count)),
                    ),
                    (
                        "all_to_all".into(),
                        syncs(&|sh| plan::all_to_all(sh, count)),
                    ),
                ];
                for root in 0..n {
                    all.push((
                        format!("reduce root {root}"),
                        syncs(&|sh| plan::reduce(sh, root, count)),
                    ));
                    for algo in [Algo::OneShot, Algo::TwoShot] {
                        all.push((
                            format!("broadcast root {root} {algo:?}"),
                            syncs(&|sh| plan::broadcast(sh, root, count, algo)),
                        ));
                    }
                }
                for algo in [Algo::OneShot, Algo::TwoShot] {
                    all.push((
                        format!("all_reduce {algo:?}"),
                        syncs(&|sh| plan::all_reduce(sh, count, algo)),
                    ));
                }
                for (what, s) in all {
                    assert!(
                        s.iter().all(|&x| x == s[0] && x >= 2),
                        "{what}, {n} members, in place {ip}, count {count}: barriers per \
                         member {s:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn control_warp_on_several_blocks_up_to_its_size() {
    // One block (up to 256 lines): none; 2 to 8 blocks of 256 lines: one each; past
    // LL_CTRL_LINES or with the knob at 0: none.
    for (lines, want) in [
        (1, false),
        (256, false),
        (257, true),
        (2048, true),
        (2049, false),
    ] {
        assert_eq!(
            uses_ctrl_warp(lines, 256, LL_CTRL_LINES),
            want,
            "{lines} lines"
        );
    }
    assert!(!uses_ctrl_warp(512, 256, 0));
    assert!(uses_ctrl_warp(129, 128, LL_CTRL_LINES));
}

#[test]
fn ll_sizes() {
    assert_eq!(
        (ll_lines(0), ll_lines(1), ll_lines(8), ll_lines(9)),
        (6, 7, 7, 8)
    );
    assert_eq!(ll_lines(64 << 10), 6 + 8192);
    assert_eq!(ll_area_bytes(64 << 10, 2, 4), Some(4 * 2 * 2 * 8198 * 16));
    assert_eq!(ll_area_bytes(usize::MAX / 4, 2, 4), None);
    // The end arrivals, then a copy of every pair sequence per block.
    assert_eq!(ll_notes(72), 1 + 128 * 72);
}

#[test]
fn kernel_names_cover_every_type_and_op() {
    let names = coll_kernel_names();
    // 14 untyped (the net round among them); reduce, LL, pull and net fold per type and op.
    assert_eq!(names.len(), 16 + 4 * (8 * 7 + 4 * 4));
    assert!(names.contains(&"rshmemi_coll_net_round".to_string()));
    assert!(names.contains(&"rshmemi_coll_net_fold_half_max".to_string()));
    assert!(!names.contains(&"rshmemi_coll_net_fold_float_or".to_string()));
    assert!(names.contains(&"rshmemi_coll_pull_a2a".to_string()));
    assert!(names.contains(&"rshmemi_coll_pull_ar_half_min".to_string()));
    assert!(!names.contains(&"rshmemi_coll_pull_ar_double_and".to_string()));
    assert!(names.contains(&"rshmemi_coll_reduce_bfloat16_max".to_string()));
    assert!(names.contains(&"rshmemi_coll_ll_bfloat16_max".to_string()));
    assert!(names.contains(&"rshmemi_coll_ll_int8_and".to_string()));
    assert!(!names.contains(&"rshmemi_coll_ll_half_or".to_string()));
    assert!(names.contains(&"rshmemi_coll_reduce_uint8_xor".to_string()));
    assert!(!names.contains(&"rshmemi_coll_reduce_float_xor".to_string()));
}

/// Each module's source (its prelude, then the collectives' source with its
/// `RSHMEMI_COLL_TYPED_ONLY` guards) defines exactly the kernels its `kernel_names` lists,
/// which `GpuColl::new` takes from it; the modules' kernels are disjoint and together every
/// kernel of `coll_kernel_names()`, as the source alone defines them.
#[test]
fn coll_modules_partition_the_kernels() {
    use crate::backend::cuda::srcparse::kernel_names;
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let mut owner: HashMap<String, String> = HashMap::new();
    for m in super::COLL_MODULES {
        let defined = kernel_names(&m.source());
        assert!(!defined.is_empty(), "module {}", m.name());
        assert_eq!(
            sorted(defined.clone()),
            sorted(m.kernel_names()),
            "module {}",
            m.name()
        );
        for n in defined {
            if let Some(other) = owner.insert(n.clone(), m.name()) {
                panic!("kernel {n} in modules {other} and {}", m.name());
            }
        }
    }
    let all = sorted(coll_kernel_names());
    assert_eq!(sorted(owner.into_keys().collect()), all);
    assert_eq!(sorted(kernel_names(super::modules::COLL_SOURCE)), all);
    // Every element type in one module; the untyped kernels in the last (started last: it
    // compiles fastest).
    let mut types: Vec<ElemKind> = super::COLL_MODULES
        .iter()
        .flat_map(|m| m.types.to_vec())
        .collect();
    types.sort_by_key(|&k| k as usize);
    assert_eq!(types, ElemKind::ALL);
    assert_eq!(
        super::COLL_MODULES.last().map(|m| m.name()),
        Some("untyped".to_string())
    );
}

/// Every signal the collectives send (through the proxy to PEs of other nodes: the cross-node
/// rounds, ready arrivals, acknowledgements and all_to_all_v's) is a set: the proxy applies a
/// set by a copy, but an add by a one-thread kernel at the target, which cannot become resident
/// beside a grid that fills that GPU.
#[test]
fn signals_to_other_nodes_are_sets() {
    let src = super::modules::COLL_SOURCE;
    assert!(
        // Spelt in two parts: `rshmem info`'s test takes whole "RSHMEM_..." literals for
        // environment variables.
        !src.contains(concat!("RSHMEM_", "SIGNAL_ADD")),
        "a signal add in the collectives' kernels"
    );
    let close = |open: usize| {
        let mut depth = 0;
        for (j, c) in src.bytes().enumerate().skip(open) {
            match c {
                b'(' => depth += 1,
                b')' if depth == 1 => return j,
                b')' => depth -= 1,
                _ => {}
            }
        }
        panic!("unbalanced parentheses")
    };
    let mut sets = 0;
    for f in [
        "rshmem_signal_op(",
        "rshmem_putmem_signal_nbi(",
        "rshmem_putmem_signal(",
        "rshmem_signal_op_collective(",
    ] {
        for (at, _) in src.match_indices(f) {
            let open = at + f.len() - 1;
            let args = &src[open..=close(open)];
            assert!(
                args.contains(concat!("RSHMEM_", "SIGNAL_SET")),
                "{f}{args}: not a set"
            );
            sets += 1;
        }
    }
    // Ready arrivals, acknowledgements, round puts, all_to_all_v's three and
    // all_to_all_v_device's two.
    assert_eq!(sets, 8, "signals found");
    // A ready arrival sets the pair's call count, which the wait expects.
    assert!(src.contains("rshmem_signal_op(sig + n_pes + me, call, RSHMEM_SIGNAL_SET, w.pe[i]);"));
    assert!(src.contains("rshmemi_net_wait(sig + n_pes + pe, want, pe);"));
}
