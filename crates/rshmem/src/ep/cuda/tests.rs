//! Unit tests of the GPU MoE buffer that need no GPU: the kernels' signatures and constants
//! against the Rust side, the plan of the areas, the knobs, a lint over the kernel source.

use super::params::*;
use super::*;
use crate::ep::EpMode;

#[test]
fn overlap_of_objects_and_views() {
    let r = crate::Launch::new()
        .config(crate::Config::default())
        .threads()
        .run(1, |pe| -> Result<()> {
            let a = pe.alloc::<u16>(100)?;
            let b = pe.alloc::<u16>(100)?;
            assert!(overlaps::<u16>(&a, &a));
            assert!(!overlaps::<u16>(&a, &b) && !overlaps::<u16>(&b, &a));
            // Views in bytes: [20, 60) and [58, 100) share bytes 58..60, [60, 100) none.
            let v = a.view::<u16>(20, 20)?;
            assert!(overlaps::<u16>(&v, &a.view::<u16>(58, 21)?));
            assert!(!overlaps::<u16>(&v, &a.view::<u16>(60, 20)?));
            // An empty view overlaps nothing.
            assert!(!overlaps::<u16>(&a.view::<u16>(30, 0)?, &a));
            Ok(())
        })
        .values()
        .expect("world");
    for x in r {
        x.expect("PE");
    }
}

/// `(name, parameter list)` of every `extern "C" __global__` kernel of `src`.
fn kernels(src: &str) -> Vec<(&str, &str)> {
    src.split("extern \"C\" __global__")
        .skip(1)
        .map(|d| {
            let d = d.trim_start().trim_start_matches("void").trim_start();
            // Launch bounds or a register cap: `__launch_bounds__(N) name(`,
            // `__maxnreg__(N) name(`.
            let d = match d
                .strip_prefix("__launch_bounds__(")
                .or_else(|| d.strip_prefix("__maxnreg__("))
            {
                Some(r) => r[r.find(')').expect("launch bounds") + 1..].trim_start(),
                None => d,
            };
            let open = d.find('(').expect("parameter list");
            let close = d.find(')').expect("parameter list");
            (d[..open].trim(), &d[open + 1..close])
        })
        .collect()
}

/// Parameter types of kernel `name` as declared in `src` (pointers as `ptr`, `const`
/// dropped).
fn kernel_params(src: &str, name: &str) -> Vec<String> {
    let (_, list) = kernels(src)
        .into_iter()
        .find(|k| k.0 == name)
        .unwrap_or_else(|| panic!("kernel {name} not declared"));
    crate::backend::cuda::srcparse::param_types(list)
}

/// Every kernel of [`EP_KERNELS`] takes the parameters its launch site passes, in order (the
/// driver reads as many bytes per parameter as the kernel declares): `KernelArg::Ptr` ↔
/// pointer, `I32` ↔ `int`, `I64` ↔ `long long`, `U64` ↔ `unsigned long long` (the
/// buffer's files; rshmem-bench checks its baseline's kernels the same way).
#[test]
fn launches_match_the_kernel_signatures() {
    let (p, i) = ("ptr", "int");
    let launches: [(&str, Vec<&str>); 17] = [
        // the buffer (mod.rs, dispatch.rs, combine.rs)
        ("ep_layout", vec![p, p, p, i, i, i, i]),
        ("ep_send", vec![p, p, p, p]),
        ("ep_dwait", vec![p]),
        ("ep_cwait", vec![p]),
        ("ep_permute", vec![p]),
        ("ep_pstream", vec![p, p, p]),
        ("ep_csend", vec![p, p, i]),
        ("ep_csplit", vec![p, p, p, i]),
        ("ep_crecv", vec![p, p, p]),
        ("ep_scale_experts", vec![p, p, p, p, i]),
        ("ep_cready", vec![p, p]),
        ("ep_cpull", vec![p, p]),
        ("ep_cdone", vec![p]),
        ("ep_ccopy", vec![p, p]),
        ("ep_readback", vec![p, p, i, "unsigned long long"]),
        ("ep_fwd", vec![p]),
        ("ep_cfwd", vec![p]),
    ];
    for (name, want) in &launches {
        assert_eq!(&kernel_params(EP_KERNELS, name), want, "{name}");
    }
    // Every extern "C" kernel of the file is in the list above.
    let all = kernels(EP_KERNELS);
    assert_eq!(all.len(), launches.len());
    for (name, _) in all {
        assert!(
            launches.iter().any(|l| l.0 == name),
            "kernel {name} has no checked launch"
        );
    }
}

/// `(type, name)` of every field of `struct name { ... };` in `src` (comma lists split).
fn struct_fields(src: &str, name: &str) -> Vec<(String, String)> {
    let body = src
        .split(&format!("struct {name} {{"))
        .nth(1)
        .and_then(|b| b.split("};").next())
        .unwrap_or_else(|| panic!("struct {name}"));
    // Line comments out first (a field's comment may span lines before it).
    let body: String = body
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    for decl in body.split(';').map(str::trim).filter(|d| !d.is_empty()) {
        let decl = decl.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut names = decl.split(',').map(str::trim);
        let first = names.next().expect("declaration");
        let (ty, n0) = first.rsplit_once(' ').expect("type and name");
        out.push((ty.to_string(), n0.to_string()));
        out.extend(names.map(|n| (ty.to_string(), n.to_string())));
    }
    out
}

/// The parameter block the host writes has the fields of `ep_params`, in order, all 8 bytes.
#[test]
fn params_block_matches_ep_params() {
    let fields = struct_fields(EP_KERNELS, "ep_params");
    let cfg = EpConfig {
        num_experts: 12,
        max_tokens: 40,
        hidden: 72,
        max_topk: 8,
        mode: EpMode::Capturable { capacity: 30 },
        layout: RecvLayout::ExpertMajor,
    };
    let (n, base) = (3, 1u64 << 40);
    let p = plan(&cfg, n, 2).unwrap();
    let dt = crate::device::DeviceTeam {
        slot: 0,
        my_index: 2,
        size: 3,
        start: 1,
        stride: 2,
    };
    let st = stage_plan(&cfg, &crate::team::NodeMap::from_nodes(&[0, 1, 1]), 2).unwrap();
    let words = param_words(base, &p, Some((base + 4096, &st)), &cfg, n, &dt, 132, true);
    let names: Vec<&str> = words.iter().map(|w| w.0).collect();
    let want: Vec<&str> = fields.iter().map(|f| f.1.as_str()).collect();
    assert_eq!(names, want);
    for (ty, name) in &fields {
        assert!(
            ty == "unsigned long long" || ty == "long long",
            "{name}: {ty} is not 8 bytes"
        );
    }
    let get = |k: &str| words.iter().find(|w| w.0 == k).unwrap().1;
    assert_eq!(get("recv_x"), base + p.recv_x as u64);
    assert_eq!(get("tok_rows"), base + p.tok_rows as u64);
    assert_eq!(
        (get("n"), get("me"), get("start"), get("stride")),
        (3, 2, 1, 2)
    );
    assert_eq!((get("cap"), get("el"), get("experts")), (30, 4, 12));
    assert_eq!(
        (get("rmax"), get("grid"), get("sentinel")),
        (3 * 30 * 8, 132, 1)
    );
    // The block fits its area.
    assert!(p.params + PARAM_WORDS * 8 <= p.total);
    assert_eq!(get("acc"), base + p.acc as u64);
    let acc_words = 12 + 3 + 2 + MAX_GRID as usize * 3;
    assert!(
        p.acc + acc_words * 4 <= p.params,
        "the accumulators fit their area"
    );
}

/// A buffer whose team spans nodes has the areas of the internode design after its plan, each
/// on a 256-byte boundary, node areas of `min(max_tokens, lmax * C)` rows per source; the
/// parameter block points into them, and holds 0 there on one node; the node table.
#[test]
fn staging_area_across_nodes() {
    let cfg = EpConfig {
        num_experts: 12,
        max_tokens: 40,
        hidden: 72,
        max_topk: 8,
        mode: EpMode::Normal,
        layout: RecvLayout::TokenMajor,
    };
    let es = 2;
    // Nodes of 1 and 2 PEs: ncap = max_tokens.
    let nm = crate::team::NodeMap::from_nodes(&[4, 9, 9]);
    let n = 3;
    let st = stage_plan(&cfg, &nm, es).unwrap();
    // Per node: 40 rows of 72 bf16 (2 * 40 * 144 = 11520); a header and 40 records of 17 words
    // (2 * 684 * 4 = 5472 -> 5632); count records (3 * (4 + 4) * 8 = 192 -> 256); per source
    // 40 rows (17280 -> 17408), records (3 * 684 * 4 = 8208 -> 8448), summed rows (17408);
    // positions (3 * 40 * 2 * 4 = 960 -> 1024); combine positions (40 * 3 * 4 = 480 -> 512),
    // node positions (160 -> 256); signals (48 -> 256), node table (20 -> 256), counter (16).
    let sizes = [
        11520, 5632, 256, 17408, 8448, 17408, 1024, 512, 256, 256, 256, 256,
    ];
    let offs: Vec<usize> = sizes
        .iter()
        .scan(0, |a, s| {
            let o = *a;
            *a += s;
            Some(o)
        })
        .collect();
    assert_eq!(
        [
            st.x, st.meta, st.rec, st.nx, st.nmeta, st.cx, st.fpos, st.cpos, st.npos, st.fsig,
            st.ntab, st.xcount
        ],
        offs[..12]
    );
    assert_eq!(st.total, sizes.iter().sum::<usize>());
    assert_eq!((st.ncap, st.lmax), (40, 2));
    assert_eq!(node_table(&nm), [0, 1, 1, 2, 2]);
    // Capturable: node areas of lmax * capacity rows where that is below max_tokens.
    let capt = EpConfig {
        mode: EpMode::Capturable { capacity: 15 },
        ..cfg
    };
    assert_eq!(stage_plan(&capt, &nm, es).unwrap().ncap, 30);
    let p = plan(&cfg, n, es).unwrap();
    let dt = crate::device::DeviceTeam {
        slot: 0,
        my_index: 0,
        size: 3,
        start: 0,
        stride: 1,
    };
    let base = 1u64 << 40;
    let sb = base + p.total as u64;
    let get = |w: &[(&str, u64)], k: &str| w.iter().find(|x| x.0 == k).unwrap().1;
    let names = [
        "xstage", "mstage", "rstage", "nx", "fsig", "ntab", "xcount", "ncap",
    ];
    let words = param_words(base, &p, Some((sb, &st)), &cfg, n, &dt, 4, false);
    assert_eq!(
        names.map(|k| get(&words, k)),
        [
            sb,
            sb + st.meta as u64,
            sb + st.rec as u64,
            sb + st.nx as u64,
            sb + st.fsig as u64,
            sb + st.ntab as u64,
            sb + st.xcount as u64,
            40
        ]
    );
    let words = param_words(base, &p, None, &cfg, n, &dt, 4, false);
    assert_eq!(names.map(|k| get(&words, k)), [0; 8]);
    let huge = EpConfig {
        max_tokens: usize::MAX / 4,
        ..cfg
    };
    assert!(stage_plan(&huge, &nm, es).is_err());
}

/// The block-size knobs take multiples of 32 from 64 to 512 only, and name themselves
/// when refused; unset, the default holds.
#[test]
fn block_threads_knobs() {
    let k = "RSHMEM_EP_SEND_THREADS";
    assert_eq!(block_threads(k, None, 256).unwrap(), 256);
    assert_eq!(block_threads(k, Some(""), 512).unwrap(), 512);
    assert_eq!(block_threads(k, Some("384"), 256).unwrap(), 384);
    assert_eq!(block_threads(k, Some("64"), 512).unwrap(), 64);
    for bad in ["0", "32", "100", "544", "1024", "x", "-256"] {
        let e = block_threads("RSHMEM_EP_PSTREAM_THREADS", Some(bad), 256)
            .unwrap_err()
            .to_string();
        assert!(e.contains("RSHMEM_EP_PSTREAM_THREADS"), "{bad}: {e}");
    }
}

/// Normal mode's readback covers the control words, every source's receive count and
/// every expert offset, in 8-byte words (what `ep_readback` copies), and the parse reads
/// each field where the plan put it.
#[test]
fn readback_covers_the_counts_and_offsets() {
    for (n, e) in [(2usize, 256usize), (3, 9), (4, 4)] {
        let cfg = EpConfig {
            num_experts: e,
            max_tokens: 100,
            hidden: 64,
            max_topk: 4,
            mode: EpMode::Normal,
            layout: RecvLayout::ExpertMajor,
        };
        let p = plan(&cfg, n, 2).unwrap();
        let el = e / n;
        let len = readback_len(&p, el);
        assert_eq!(len % 8, 0);
        assert!(len >= p.expert_off + (el + 1) * 4 - p.ctl);
        assert!(len < p.expert_off + (el + 1) * 4 - p.ctl + 8);
        let mut b = vec![0u8; len];
        for i in 0..16 {
            b[8 * i..8 * i + 8].copy_from_slice(&(1000 + i as u64).to_le_bytes());
        }
        for s in 0..n {
            let at = p.recv_cnt - p.ctl + 4 * s;
            b[at..at + 4].copy_from_slice(&(7 + s as u32).to_le_bytes());
        }
        for x in 0..=el {
            let at = p.expert_off - p.ctl + 4 * x;
            b[at..at + 4].copy_from_slice(&(3 * x as u32).to_le_bytes());
        }
        let r = parse_ctl(&b, &p, n, el);
        assert_eq!(r.ctl, (0..16).map(|i| 1000 + i).collect::<Vec<u64>>());
        assert_eq!(r.recv, (0..n).map(|s| 7 + s).collect::<Vec<_>>());
        assert_eq!(r.off, (0..=el).map(|x| 3 * x).collect::<Vec<_>>());
    }
}

/// A token-major buffer has no expert-major area and no progress words: issue 7's size (T =
/// 4096, H = 7168 bf16, k = 8, 2 PEs) takes 940 MB (and 16 KiB) less per PE; every other
/// area is where it was.
#[test]
fn token_major_plan_drops_the_expert_major_area() {
    let em = EpConfig {
        num_experts: 256,
        max_tokens: 4096,
        hidden: 7168,
        max_topk: 8,
        mode: EpMode::Normal,
        layout: RecvLayout::ExpertMajor,
    };
    let tm = EpConfig {
        layout: RecvLayout::TokenMajor,
        ..em
    };
    let (a, b) = (plan(&em, 2, 2).unwrap(), plan(&tm, 2, 2).unwrap());
    let expanded = 2 * 4096 * 8 * 7168 * 2;
    let progress = 2 * MAX_GRID as usize * 8;
    assert_eq!(a.total - b.total, expanded + progress);
    assert_eq!(
        a.params - a.prog,
        progress,
        "the progress words before the parameters"
    );
    assert_eq!(b.params, b.prog, "no progress words");
    assert_eq!(
        (a.recv_x, a.recv_meta, a.comb),
        (b.recv_x, b.recv_meta, b.comb)
    );
    assert_eq!(a.expert_x, b.expert_x);
    assert_eq!(b.rec, b.expert_x, "no bytes between expert_x and rec");
    assert_eq!(
        a.rmax, b.rmax,
        "the index still holds every expert-major row"
    );
}

/// The control read-back of normal mode finds each area at its plan offset.
#[test]
fn control_read_back_parses_every_area() {
    let cfg = EpConfig::new(12, 40, 72, 8);
    let (n, el) = (3, 4);
    let p = plan(&cfg, n, 2).unwrap();
    let mut b = vec![0xAAu8; p.expert_off + (el + 1) * 4 - p.ctl];
    for i in 0..16 {
        b[8 * i..8 * i + 8].copy_from_slice(&(1000 + i as u64).to_le_bytes());
    }
    let rc = p.recv_cnt - p.ctl;
    for s in 0..n {
        b[rc + 4 * s..rc + 4 * s + 4].copy_from_slice(&(7 * s as u32 + 1).to_le_bytes());
    }
    let eo = p.expert_off - p.ctl;
    for e in 0..=el {
        b[eo + 4 * e..eo + 4 * e + 4].copy_from_slice(&(100 * e as u32).to_le_bytes());
    }
    let r = parse_ctl(&b, &p, n, el);
    assert_eq!(r.ctl, (1000..1016).collect::<Vec<u64>>());
    assert_eq!(r.recv, vec![1, 8, 15]);
    assert_eq!(r.off, vec![0, 100, 200, 300, 400]);
    // The areas are laid out control, receive counts, offsets (one copy reads all three).
    assert!(p.ctl < p.recv_cnt && p.recv_cnt < p.expert_off);
}

/// Sizes the kernels' 32-bit indices cannot address are refused before anything is
/// allocated.
#[test]
fn plan_refuses_what_32_bit_indices_cannot_address() {
    let c = |max_tokens: usize, k: usize, mode| EpConfig {
        num_experts: 2,
        max_tokens,
        hidden: 1,
        max_topk: k,
        mode,
        layout: RecvLayout::ExpertMajor,
    };
    assert!(plan(&c(1 << 20, 8, EpMode::Normal), 2, 2).is_ok());
    // int tokens: 2^31 - 1 tokens pass the CPU validation but not the GPU plan.
    let big = i32::MAX as usize;
    assert!(plan(&c(big, 1, EpMode::Capturable { capacity: 1 }), 1, 2).is_err());
    // int expert-major rows: n * cap * k > 2^31 - 1 with (n*cap*k) * k < 2^32.
    assert!(plan(&c(1 << 30, 1, EpMode::Normal), 2, 2).is_err());
    // u32 row_src: rows * k >= 2^32.
    assert!(plan(&c(1 << 26, 8, EpMode::Normal), 2, 2).is_err());
    assert!(plan(&c(1 << 24, 8, EpMode::Normal), 2, 2).is_ok());
}

/// Constants shared with the kernels.
#[test]
fn constants_match_the_kernels() {
    let src = EP_KERNELS;
    for (name, v) in [
        ("EP_CTL_GO", CTL_GO),
        ("EP_CTL_ERR", CTL_ERR),
        ("EP_CTL_INFO", CTL_INFO),
        ("EP_CTL_ROWS", CTL_ROWS),
        ("EP_CTL_XABORT", CTL_XABORT),
        ("EP_REC_FIXED", REC_FIXED),
        ("EP_SIG_GROUPS", SIG_GROUPS),
        ("EP_MAX_PES", MAX_GPU_EP_PES),
        ("EP_INDEX_EXPERTS", INDEX_EXPERTS),
        ("EP_SPLIT_BLOCK", SPLIT_BLOCK as usize),
    ] {
        assert!(src.contains(&format!("#define {name} {v}\n")), "{name}");
    }

    for (name, v) in [
        ("EP_ERR_MINE", ERR_MINE),
        ("EP_ERR_PEER", ERR_PEER),
        ("EP_ERR_CAPACITY", ERR_CAPACITY),
        ("EP_ERR_CORRUPT", ERR_CORRUPT),
        ("EP_ERR_ABORT", ERR_ABORT),
    ] {
        assert!(src.contains(&format!("#define {name} {v}ull\n")), "{name}");
    }
    // ep_layout: dynamic shared memory of MAX_GPU_EXPERTS words beside about 2 KiB of static
    // shared memory stays within the 48 KiB a launch gets without opting in.
    const _: () = assert!(MAX_GPU_EXPERTS * 4 + (8 << 10) <= 48 << 10);
    // The token-major index: 2 * INDEX_EXPERTS words likewise.
    const _: () = assert!(INDEX_EXPERTS * 8 + (8 << 10) <= 48 << 10);
}

/// Byte ranges `{ ... }` (or the single statement) of the body that starts after `at`.
fn body_after(src: &str, at: usize) -> &str {
    let b = src.as_bytes();
    let mut i = at;
    while b[i].is_ascii_whitespace() {
        i += 1;
    }
    if b[i] != b'{' {
        let end = src[i..].find(';').expect("statement") + i;
        return &src[i..=end];
    }
    let mut depth = 0;
    for (j, &c) in b.iter().enumerate().skip(i) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return &src[i..=j];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced braces")
}

/// The end of the parenthesised list that opens at `open` (index of `(`).
fn close_paren(src: &str, open: usize) -> usize {
    let mut depth = 0;
    for (j, c) in src.bytes().enumerate().skip(open) {
        match c {
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced parentheses")
}

/// No warp or block collective (`__shfl*_sync`, `__ballot_sync`, `__syncwarp`,
/// `__syncthreads`, or a function of the file that uses one) runs inside a loop that starts
/// at the lane or thread index: such a loop runs a different number of times on different
/// lanes, and a collective with a full mask on some lanes only is undefined (a hang or wrong
/// values). A lint over the source (loops whose first clause names `lane`, `tid` or
/// `threadIdx.x` other than as `>> 5`).
#[test]
fn no_collective_under_lane_dependent_loops() {
    let src = EP_KERNELS;
    let mut collective: Vec<String> = ["__shfl", "__ballot_sync", "__syncwarp", "__syncthreads"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // Device functions of the file that use a collective, to a fixpoint.
    let defs: Vec<(String, &str)> = src
        .match_indices("__device__ ")
        .filter_map(|(at, _)| {
            let open = at + src[at..].find('(')?;
            let name = src[..open].split_whitespace().last()?.to_string();
            let close = close_paren(src, open);
            let rest = src[close + 1..].trim_start();
            rest.starts_with('{')
                .then(|| (name, body_after(src, close + 1)))
        })
        .collect();
    loop {
        let before = collective.len();
        for (name, body) in &defs {
            if !collective.contains(name) && collective.iter().any(|c| body.contains(c.as_str())) {
                collective.push(name.clone());
            }
        }
        if collective.len() == before {
            break;
        }
    }
    assert!(collective.iter().any(|c| c == "ep_sum_slots"));
    let lane_level = |init: &str| {
        let init = init.replace("threadIdx.x >> 5", "").replace("tid >> 5", "");
        init.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
            .any(|w| w == "lane" || w == "tid" || w == "threadIdx.x")
    };
    let mut checked = 0;
    for (at, _) in src.match_indices("for (") {
        let open = at + 4;
        let close = close_paren(src, open);
        let init = src[open + 1..close].split(';').next().unwrap_or("");
        if !lane_level(init) {
            continue;
        }
        checked += 1;
        let body = body_after(src, close + 1);
        for c in &collective {
            let called = body.match_indices(c.as_str()).any(|(i, _)| {
                let after = &body[i + c.len()..];
                c.starts_with("__") || after.starts_with('(') || after.starts_with('<')
            });
            assert!(
                !called,
                "a loop starting at the lane (`for ({init};...`) uses {c}: {body}"
            );
        }
    }
    assert!(checked > 10, "the lint found only {checked} lane loops");
}

/// The kernel source is assembled from the files of `kernels/` (`EP_KERNELS`): every piece ends
/// a line (so no two lines are glued) and is cut at the top level (braces, parentheses and
/// `#if`/`#endif` balance within it), and the pieces listed here are the whole source, in
/// order, so that a piece added to one list and not the other is caught.
#[test]
fn kernel_source_is_its_pieces_cut_at_the_top_level() {
    let pieces = [
        ("common.cuh", include_str!("kernels/common.cuh")),
        ("layout.cu", include_str!("kernels/layout.cu")),
        ("rows.cuh", include_str!("kernels/rows.cuh")),
        ("fwd.cu", include_str!("kernels/fwd.cu")),
        ("send.cu", include_str!("kernels/send.cu")),
        ("waits.cu", include_str!("kernels/waits.cu")),
        ("expand.cu", include_str!("kernels/expand.cu")),
        ("combine.cu", include_str!("kernels/combine.cu")),
        ("split.cu", include_str!("kernels/split.cu")),
        ("crecv.cu", include_str!("kernels/crecv.cu")),
        ("pull.cu", include_str!("kernels/pull.cu")),
        ("experts.cu", include_str!("kernels/experts.cu")),
    ];
    let whole: String = pieces.iter().map(|p| p.1).collect();
    assert_eq!(
        whole, EP_KERNELS,
        "EP_KERNELS is not the pieces in this order"
    );
    for (name, src) in pieces {
        assert!(src.ends_with('\n'), "{name} does not end a line");
        // Comments out (line comments only: the files have no block comments), then count.
        assert!(!src.contains("/*"), "{name} has a block comment");
        let code: String = src
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let count = |c: char| code.matches(c).count();
        assert_eq!(count('{'), count('}'), "{name}: braces");
        assert_eq!(count('('), count(')'), "{name}: parentheses");
        let directive = |d: &str| {
            code.lines()
                .filter(|l| l.trim_start().starts_with(d))
                .count()
        };
        assert_eq!(directive("#if"), directive("#endif"), "{name}: #if/#endif");
    }
    // Each kernel is defined once in the assembled source.
    let names: Vec<&str> = kernels(EP_KERNELS).iter().map(|k| k.0).collect();
    for name in &names {
        assert_eq!(names.iter().filter(|n| *n == name).count(), 1, "{name}");
    }
}

/// Nothing a kernel sends to a PE of another node is an add: every signal through the proxy
/// (`rshmemi_proxy_signal_at`, `rshmemi_proxy_put_signal`, and the header's signal functions,
/// which take the proxy for such a PE) is a set, and every counter add (`ep_signal`) sits behind
/// a test that its PE is on this node, or in `ep_csplit` (never taken across nodes). A set is
/// served at the target by a stream memory write; an add would take a one-thread kernel there,
/// which may find no room beside the kernels that wait for it.
#[test]
fn signals_to_other_nodes_are_sets() {
    let src = EP_KERNELS;
    assert!(
        // Spelt in two parts: `rshmem info`'s test takes whole "RSHMEM_..." literals for
        // environment variables.
        !src.contains(concat!("RSHMEM_", "SIGNAL_ADD")),
        "a signal add in the EP kernels"
    );
    let mut sets = 0;
    for f in [
        "rshmemi_proxy_signal_at(",
        "rshmemi_proxy_put_signal(",
        "rshmemi_signal_op_collective(",
        "rshmem_signal_op(",
    ] {
        for (at, _) in src.match_indices(f) {
            let open = at + f.len() - 1;
            let args = &src[open..=close_paren(src, open)];
            assert!(
                args.contains(concat!("RSHMEM_", "SIGNAL_SET")),
                "{f}{args}: not a set"
            );
            sets += 1;
        }
    }
    assert!(sets >= 6, "only {sets} signals found");
    let ep_csplit = src.find("ep_csplit(").expect("ep_csplit");
    let csplit_body = {
        let open = ep_csplit + "ep_csplit".len();
        let close = close_paren(src, open);
        close + 1..close + 1 + body_after(src, close + 1).len()
    };
    let mut adds = 0;
    for (at, _) in src.match_indices("ep_signal(") {
        // The definition, and calls inside ep_csplit.
        if src[..at].ends_with("void ") || csplit_body.contains(&at) {
            continue;
        }
        let before = &src[at.saturating_sub(200)..at];
        assert!(
            before.contains("!(span && ep_remote("),
            "an ep_signal call not kept to this node: ...{}",
            &src[at.saturating_sub(120)..at + 40]
        );
        adds += 1;
    }
    assert_eq!(adds, 2, "ep_send's and ep_csend's adds");
}

/// The counter words across nodes, modelled on the host: receiver `r`'s word of source `s`
/// (data: ep_dwait waits for `call * grid`; combine: ep_cwait likewise), where a source on
/// this node adds its blocks' shares (any split of the grid over fewer sending blocks) and a
/// source of another node sets `ep_xsig(call, grid)` once its last block is done. Over several
/// calls: the word is below the wait's threshold until the source's last signal of the call,
/// reaches it exactly then, and never satisfies the next call's wait early.
#[test]
fn counters_across_nodes_reach_the_waits_exactly() {
    fn xsig(call: u64, grid: u64) -> u64 {
        call * grid
    }
    let mut rnd = super::fwd_model::xorshift(0x9e37_79b9_7f4a_7c15);
    for grid in [1u64, 2, 7, 132] {
        // Sources: even on this node, odd on another.
        let n = 4usize;
        let mut word = vec![0u64; n];
        for call in 1..=6u64 {
            let want = call * grid;
            for (s, w) in word.iter_mut().enumerate() {
                assert!(*w < want, "grid {grid} call {call} source {s}: early");
                if s % 2 == 0 {
                    // Sending blocks: block i of `sb` takes layout blocks b0..b1.
                    let sb = 1 + rnd() % grid;
                    for i in 0..sb {
                        let (b0, b1) = (grid * i / sb, grid * (i + 1) / sb);
                        *w += b1 - b0;
                        if i + 1 < sb {
                            assert!(*w < want, "grid {grid} call {call}: early after block {i}");
                        }
                    }
                } else {
                    *w = xsig(call, grid);
                }
                assert_eq!(*w, want, "grid {grid} call {call} source {s}");
            }
        }
    }
}
