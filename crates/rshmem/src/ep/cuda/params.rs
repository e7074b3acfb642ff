//! The buffer's layout in its symmetric allocation and the words the kernels read from it,
//! mirrored from `ep_params` and the control area of the kernels: the plan of the areas, the
//! parameter block the host writes once per buffer, and the parse of normal mode's readback.

use super::{MAX_GPU_EP_PES, MAX_GPU_EXPERTS, MAX_GRID, REC_FIXED, SIG_GROUPS};
use crate::ep::{pack_areas, EpConfig, EpMode, RecvLayout};
use crate::error::{Error, Result};
use crate::team::NodeMap;

/// Byte offsets of the areas in the buffer's one symmetric allocation.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub(super) cap: usize,
    pub(super) rmax: usize,
    pub(super) rmw: usize,
    pub(super) recv_x: usize,
    pub(super) recv_meta: usize,
    pub(super) comb: usize,
    pub(super) expert_x: usize,
    pub(super) rec: usize,
    pub(super) sig: usize,
    pub(super) ctl: usize,
    pub(super) recv_cnt: usize,
    pub(super) expert_off: usize,
    pub(super) fill: usize,
    pub(super) tok_pos: usize,
    pub(super) row_src: usize,
    pub(super) tok_rows: usize,
    pub(super) acc: usize,
    pub(super) prog: usize,
    pub(super) params: usize,
    pub(super) total: usize,
}

fn mul(a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| Error::invalid("ep: buffer size overflows"))
}

pub(super) fn plan(cfg: &EpConfig, n: usize, es: usize) -> Result<Plan> {
    cfg.validate(n)?;
    if n > MAX_GPU_EP_PES {
        return Err(Error::invalid(format!(
            "ep: GPU teams have at most {MAX_GPU_EP_PES} PEs, not {n}"
        )));
    }
    if cfg.num_experts > MAX_GPU_EXPERTS {
        return Err(Error::invalid(format!(
            "ep: at most {MAX_GPU_EXPERTS} experts on GPUs, not {}",
            cfg.num_experts
        )));
    }
    let cap = match cfg.mode {
        EpMode::Normal => cfg.max_tokens,
        EpMode::Capturable { capacity } => capacity,
    };
    let el = cfg.num_experts / n;
    let k = cfg.max_topk;
    let rows = mul(n, cap)?;
    // Duplicate ids in one token's slots make up to k rows per received token.
    let rmax = mul(rows, k)?;
    let rmw = 1 + 2 * k;
    let rw = REC_FIXED + el;
    let h = cfg.hidden;
    let sizes = [
        mul(mul(rows, h)?, es)?,
        mul(mul(rows, rmw)?, 4)?,
        mul(mul(mul(rows, h)?, es)?, 2)?,
        // The expert-major area only where dispatch writes expanded rows.
        match cfg.layout {
            RecvLayout::ExpertMajor => mul(mul(rmax, h)?, es)?,
            RecvLayout::TokenMajor => 0,
        },
        mul(mul(n, rw)?, 8)?,
        // Signals: records, data, combine, ready, then the pull combine's ready, done and y
        // offsets (n words each).
        SIG_GROUPS * n * 8,
        // 16 control words, then 32 for EP_STAMPS measurements.
        48 * 8,
        n * 4,
        (el + 1) * 4,
        el * 4,
        mul(mul(cfg.max_tokens, n)?, 4)?,
        mul(rmax, 4)?,
        mul(mul(rows, k)?, 4)?,
        // ep_layout's accumulators (pairs per expert, tokens per destination, a flag, a
        // ticket), then each block's tokens per destination.
        (cfg.num_experts + n + 2 + MAX_GRID as usize * n) * 4,
        // "Records in" words (expert-major buffers: ep_pstream moves rows as they come in),
        // one per (source, source block).
        match cfg.layout {
            RecvLayout::ExpertMajor => MAX_GRID as usize * n * 8,
            RecvLayout::TokenMajor => 0,
        },
        PARAM_WORDS * 8,
    ];
    let (offs, at) = pack_areas("ep", sizes)?;
    // Row indices are u32 (row_src: row * kmax + slot) and int (tok_rows, expert-major rows);
    // token counts and positions are int, ep_send steps over tokens 512 at a time in int.
    if rmax.saturating_mul(k) > u32::MAX as usize
        || rmax > i32::MAX as usize
        || cfg.max_tokens > i32::MAX as usize - 1024
    {
        return Err(Error::invalid(
            "ep: buffer too large for 32-bit row indices",
        ));
    }
    Ok(Plan {
        cap,
        rmax,
        rmw,
        recv_x: offs[0],
        recv_meta: offs[1],
        comb: offs[2],
        expert_x: offs[3],
        rec: offs[4],
        sig: offs[5],
        ctl: offs[6],
        recv_cnt: offs[7],
        expert_off: offs[8],
        fill: offs[9],
        tok_pos: offs[10],
        row_src: offs[11],
        tok_rows: offs[12],
        acc: offs[13],
        prog: offs[14],
        params: offs[15],
        total: at,
    })
}

/// Byte offsets, from its start, of the area a buffer whose team spans nodes has after its
/// plan's areas (DeepEP's internode design, `kernels/fwd.cu`): what this PE sends to each other
/// node (`x`, `meta`: rows and row records per node, `ncap` per node, the records after a
/// 16-byte header holding their count) and its count records to PEs of other nodes (`rec`); as
/// a forwarder, the node rows and records each source of another node put here (`nx`, `nmeta`,
/// `ncap` per source, keyed by the source), their positions at this node's PEs (`fpos`, `lmax`
/// per row) and combine's summed rows for them (`cx`); the combine positions of this PE's own
/// tokens (`cpos`, `[max_tokens][n]`) and their node positions (`npos`, one node at a time);
/// the forwarding signals (`fsig`: a source's node rows are in, `n` words; a member's partial
/// rows are in, `n` words); the node table (`ntab`: each member's node, the node count, the most
/// members of one node) and the counter of bytes put across nodes (`xcount`: dispatch rows and
/// records, combine rows).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Stage {
    pub(super) x: usize,
    pub(super) meta: usize,
    pub(super) rec: usize,
    pub(super) nx: usize,
    pub(super) nmeta: usize,
    pub(super) cx: usize,
    pub(super) fpos: usize,
    pub(super) cpos: usize,
    pub(super) npos: usize,
    pub(super) fsig: usize,
    pub(super) ntab: usize,
    pub(super) xcount: usize,
    pub(super) total: usize,
    /// Rows per source of a node area: `min(max_tokens, lmax * C)`, which holds a source's
    /// tokens for one node whenever each of its pairs fits `C` (fwd_model.rs).
    pub(super) ncap: usize,
    pub(super) lmax: usize,
}

pub(super) fn stage_plan(cfg: &EpConfig, nm: &NodeMap, es: usize) -> Result<Stage> {
    let n = nm.n_pes();
    let p = plan(cfg, n, es)?;
    let (nodes, lmax) = (nm.n_nodes(), nm.max_local());
    let ncap = cfg.max_tokens.min(mul(lmax, p.cap)?);
    // u32 words of one source's node records: a 4-word header, then ncap records.
    let nrec = mul(ncap, p.rmw)?
        .checked_add(4)
        .ok_or_else(|| Error::invalid("ep: buffer size overflows"))?;
    let row_bytes = mul(cfg.hidden, es)?;
    let sizes = [
        mul(mul(nodes, ncap)?, row_bytes)?,
        mul(mul(nodes, nrec)?, 4)?,
        mul(mul(n, REC_FIXED + cfg.num_experts / n)?, 8)?,
        mul(mul(n, ncap)?, row_bytes)?,
        mul(mul(n, nrec)?, 4)?,
        mul(mul(n, ncap)?, row_bytes)?,
        mul(mul(mul(n, ncap)?, lmax)?, 4)?,
        mul(mul(cfg.max_tokens, n)?, 4)?,
        mul(cfg.max_tokens, 4)?,
        2 * n * 8,
        (n + 2) * 4,
        2 * 8,
    ];
    let (offs, at) = pack_areas("ep", sizes)?;
    // Node rows and positions are int in the kernels.
    if mul(n, ncap)? > i32::MAX as usize {
        return Err(Error::invalid(
            "ep: buffer too large for 32-bit row indices",
        ));
    }
    Ok(Stage {
        x: offs[0],
        meta: offs[1],
        rec: offs[2],
        nx: offs[3],
        nmeta: offs[4],
        cx: offs[5],
        fpos: offs[6],
        cpos: offs[7],
        npos: offs[8],
        fsig: offs[9],
        ntab: offs[10],
        xcount: offs[11],
        total: at,
        ncap,
        lmax,
    })
}

/// The node table's words (`Stage::ntab`): each member's node (numbered from 0 in order of first
/// appearance), the node count, the most members of one node.
pub(super) fn node_table(nm: &NodeMap) -> Vec<u32> {
    let mut t: Vec<u32> = (0..nm.n_pes()).map(|i| nm.node(i) as u32).collect();
    t.push(nm.n_nodes() as u32);
    t.push(nm.max_local() as u32);
    t
}

/// The words of the kernels' `ep_params` block, in declaration order and named as in
/// `kernels/common.cuh` (`base`: the device address of the buffer's area; `stage`: that of its
/// staging area and its plan, where the team spans nodes, else the staging words are 0).
#[allow(clippy::too_many_arguments)]
pub(super) fn param_words(
    base: u64,
    p: &Plan,
    stage: Option<(u64, &Stage)>,
    cfg: &EpConfig,
    n: usize,
    dt: &crate::device::DeviceTeam,
    grid: u32,
    sentinel: bool,
) -> [(&'static str, u64); PARAM_WORDS] {
    let a = |off: usize| base + off as u64;
    [
        ("recv_x", a(p.recv_x)),
        ("recv_meta", a(p.recv_meta)),
        ("comb", a(p.comb)),
        ("rec", a(p.rec)),
        ("sig", a(p.sig)),
        ("ctl", a(p.ctl)),
        ("recv_cnt", a(p.recv_cnt)),
        ("expert_off", a(p.expert_off)),
        ("fill", a(p.fill)),
        ("tok_pos", a(p.tok_pos)),
        ("row_src", a(p.row_src)),
        ("tok_rows", a(p.tok_rows)),
        ("acc", a(p.acc)),
        (
            "prog",
            match cfg.layout {
                RecvLayout::ExpertMajor => a(p.prog),
                RecvLayout::TokenMajor => 0,
            },
        ),
        ("xstage", stage.map_or(0, |(b, st)| b + st.x as u64)),
        ("mstage", stage.map_or(0, |(b, st)| b + st.meta as u64)),
        ("rstage", stage.map_or(0, |(b, st)| b + st.rec as u64)),
        ("nx", stage.map_or(0, |(b, st)| b + st.nx as u64)),
        ("nmeta", stage.map_or(0, |(b, st)| b + st.nmeta as u64)),
        ("cx", stage.map_or(0, |(b, st)| b + st.cx as u64)),
        ("fpos", stage.map_or(0, |(b, st)| b + st.fpos as u64)),
        ("cpos", stage.map_or(0, |(b, st)| b + st.cpos as u64)),
        ("npos", stage.map_or(0, |(b, st)| b + st.npos as u64)),
        ("fsig", stage.map_or(0, |(b, st)| b + st.fsig as u64)),
        ("ntab", stage.map_or(0, |(b, st)| b + st.ntab as u64)),
        ("xcount", stage.map_or(0, |(b, st)| b + st.xcount as u64)),
        ("n", n as u64),
        ("me", dt.my_index as u64),
        ("start", dt.start as u64),
        ("stride", dt.stride as u64),
        ("cap", p.cap as u64),
        ("hidden", cfg.hidden as u64),
        ("kmax", cfg.max_topk as u64),
        ("el", (cfg.num_experts / n) as u64),
        ("experts", cfg.num_experts as u64),
        ("max_tokens", cfg.max_tokens as u64),
        ("rmax", p.rmax as u64),
        ("grid", grid as u64),
        ("sentinel", sentinel as u64),
        ("ncap", stage.map_or(0, |(_, st)| st.ncap as u64)),
    ]
}

/// Words of the kernels' `ep_params` block.
pub(super) const PARAM_WORDS: usize = 40;

/// What normal-mode dispatch reads back after the count exchange.
pub(super) struct CtlRead {
    /// The 16 control words.
    pub(super) ctl: Vec<u64>,
    /// Tokens received from each source.
    pub(super) recv: Vec<usize>,
    /// The `E/n + 1` expert offsets.
    pub(super) off: Vec<usize>,
}

/// Bytes from the control words to the end of the `el + 1` expert offsets (the areas are
/// adjacent: control, receive counts, offsets), rounded up to 8.
pub(super) fn readback_len(p: &Plan, el: usize) -> usize {
    (p.expert_off + (el + 1) * 4 - p.ctl).next_multiple_of(8)
}

/// Parses the bytes from the control area to the end of the expert offsets (`b`, starting at
/// `p.ctl`, little-endian): control words, `n` receive counts at `p.recv_cnt`, `el + 1` offsets
/// at `p.expert_off`.
pub(super) fn parse_ctl(b: &[u8], p: &Plan, n: usize, el: usize) -> CtlRead {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[8 * i..8 * i + 8]);
        u64::from_le_bytes(w)
    };
    let u32s = |at: usize, count: usize| -> Vec<usize> {
        (0..count)
            .map(|i| {
                let mut w = [0u8; 4];
                w.copy_from_slice(&b[at + 4 * i..at + 4 * i + 4]);
                u32::from_le_bytes(w) as usize
            })
            .collect()
    };
    CtlRead {
        ctl: (0..16).map(word).collect(),
        recv: u32s(p.recv_cnt - p.ctl, n),
        off: u32s(p.expert_off - p.ctl, el + 1),
    }
}
