//! Call signatures (what every member of a collective must agree on, carried by its first
//! barrier or LL header) and the launch arguments the kernels mirror.

use super::*;

/// Copies per copy-kernel launch (`RSHMEMI_COLL_MAX_COPIES`); more copies take more launches.
pub(super) const MAX_COPIES: usize = 64;
/// Members per all_to_all_v (host counts) list chunk, one launch each (`RSHMEMI_A2AV_CHUNK`).
pub(super) const A2AV_CHUNK: usize = 64;
pub(super) const THREADS: u32 = 512;
/// Staging memory allocated up front (and the least any growth allocates).
pub(super) const MIN_STAGING: usize = 1 << 16;

// Signatures and the error record: mirrors `kernels/`.
/// Words of a call signature (`RSHMEMI_SIG_WORDS`).
pub(super) const SIG_WORDS: usize = 6;
/// Error record flags.
pub(super) const ERR_CAPACITY: u64 = 1;
pub(super) const ERR_A2AV: u64 = 2;
pub(super) const ERR_MISMATCH: u64 = 4;
/// Error record words: the first differing member (world PE), this PE's and its signature.
pub(super) const ERR_MM_PE: usize = 5;
pub(super) const ERR_MM_MINE: usize = 6;
pub(super) const ERR_MM_THEIRS: usize = ERR_MM_MINE + SIG_WORDS;
/// First skip flag (one per team slot); the words before it are the record proper.
pub(super) const ERR_SKIP: usize = 32;
const _: () = assert!(ERR_MM_THEIRS + SIG_WORDS <= ERR_SKIP);

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct CopyDesc {
    pub(super) dst: u64,
    pub(super) src: u64,
    pub(super) bytes: u64,
    pub(super) pe: i64,
}

#[repr(C)]
pub(super) struct Copies {
    pub(super) d: [CopyDesc; MAX_COPIES],
}

#[repr(C)]
pub(super) struct A2avList {
    pub(super) count: [u64; A2AV_CHUNK],
    pub(super) displ: [u64; A2AV_CHUNK],
}

/// The kinds a signature names: the plan collectives and the device-count all_to_all_v.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SigKind {
    Coll(CollKind),
    A2avDevice,
}

impl SigKind {
    pub(super) fn code(self) -> u64 {
        match self {
            SigKind::Coll(k) => k.code(),
            SigKind::A2avDevice => CollKind::ALL.len() as u64 + 1,
        }
    }
    pub(super) fn name(self) -> &'static str {
        match self {
            SigKind::Coll(k) => k.name(),
            SigKind::A2avDevice => "all_to_all_v_device",
        }
    }
    pub(super) fn from_code(c: u64) -> Option<SigKind> {
        CollKind::ALL
            .iter()
            .map(|&k| SigKind::Coll(k))
            .chain([SigKind::A2avDevice])
            .find(|k| k.code() == c)
    }
}

/// Everything about one collective call that must agree across the team's members, as its
/// first barrier carries it (see `kernels/`): packed into [`SIG_WORDS`] words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CallSig {
    pub(super) kind: SigKind,
    pub(super) elem: ElemKind,
    pub(super) op: Option<ReduceOp>,
    pub(super) algo: Option<Algo>,
    pub(super) in_place: bool,
    /// Barriers the call performs (every member pads to the largest on a mismatch).
    pub(super) syncs: usize,
    pub(super) count: u64,
    /// The root (broadcast, reduce); the counts object's offset (all_to_all_v_device).
    pub(super) aux: u64,
    /// Byte offsets of the symmetric source and destination.
    pub(super) src: u64,
    pub(super) dst: u64,
    /// The team as every member sees it (size, first member, stride).
    pub(super) team: (i32, i32, i32),
    /// Runs as an LL call (no barrier waits; see `kernels/`).
    pub(super) ll: bool,
    /// Runs as the pull all_to_all (LL handshake, data read from the peers' src).
    pub(super) pull: bool,
    /// A pull broadcast along a chain (each member reads from the one before it).
    pub(super) chain: bool,
    /// A pair's pull all_reduce moving its data by stores (each member into the other's dst).
    pub(super) push: bool,
}

pub(super) const SIG_MARK: u64 = 1 << 63;

pub(super) fn fnv(words: &[u64]) -> u64 {
    words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &w| {
        (h ^ w).wrapping_mul(0x0100_0000_01b3)
    })
}

impl CallSig {
    pub(super) fn pack(&self) -> Result<[u64; SIG_WORDS]> {
        let syncs = u64::try_from(self.syncs)
            .ok()
            .filter(|&x| x <= 0xffff)
            .ok_or_else(|| Error::invalid("collective plan with more than 65535 barriers"))?;
        let w0 = SIG_MARK
            | syncs << 32
            | self.kind.code()
            | (self.elem as u64 + 1) << 8
            | self.op.map_or(0, ReduceOp::code) << 16
            | u64::from(self.in_place) << 24
            | self.algo.map_or(0, Algo::code) << 25
            | u64::from(self.ll) << 27
            | u64::from(self.pull) << 28
            | u64::from(self.chain) << 29
            | u64::from(self.push) << 30;
        let (size, start, stride) = self.team;
        let team = fnv(&[size as u64, start as u64, stride as u64]);
        Ok([w0, self.count, self.aux, self.src, self.dst, team])
    }

    /// Barriers the call of a packed signature performs (as the kernels read it).
    pub(super) fn syncs_of(w: &[u64; SIG_WORDS]) -> usize {
        ((w[0] >> 32) & 0xffff) as usize
    }

    /// A packed signature in words, for error messages.
    pub(super) fn describe(w: &[u64; SIG_WORDS]) -> String {
        if w[0] & SIG_MARK == 0 {
            return "no collective signature (a different call: a barrier, an LL all_reduce, a \
                    collective that failed its own checks, or none)"
                .to_string();
        }
        let kind = SigKind::from_code(w[0] & 0xff);
        let elem = ELEMS.iter().find(|k| **k as u64 + 1 == (w[0] >> 8) & 0xff);
        let op = ReduceOp::ALL
            .iter()
            .find(|o| o.code() == (w[0] >> 16) & 0xff);
        let algo = [Algo::OneShot, Algo::TwoShot]
            .into_iter()
            .find(|a| a.code() == (w[0] >> 25) & 3);
        let mut out = format!(
            "{} {}",
            kind.map_or("?", SigKind::name),
            elem.map_or("?", |e| e.name())
        );
        if let Some(op) = op {
            out += &format!(" {}", op.name());
        }
        out += &format!(" count {}", w[1]);
        match kind {
            Some(SigKind::Coll(CollKind::Broadcast | CollKind::Reduce)) => {
                out += &format!(" root {}", w[2])
            }
            Some(SigKind::A2avDevice) => out += &format!(" counts @{:#x}", w[2]),
            _ => {}
        }
        out += &format!(
            " in_place {} algo {} barriers {} src @{:#x} dst @{:#x} team {:x}",
            (w[0] >> 24) & 1 != 0,
            if (w[0] >> 30) & 1 != 0 {
                "push"
            } else if (w[0] >> 29) & 1 != 0 {
                "chain"
            } else if (w[0] >> 28) & 1 != 0 && algo == Some(Algo::TwoShot) {
                "pull_two_shot"
            } else if (w[0] >> 28) & 1 != 0 {
                "pull"
            } else if (w[0] >> 27) & 1 != 0 {
                "ll"
            } else {
                algo.map_or("-", Algo::name)
            },
            Self::syncs_of(w),
            w[3],
            w[4],
            w[5]
        );
        out
    }
}

/// What a collective's first barrier needs (`rshmemi_check`): the signature, this PE's slot
/// row of the team's slot, the error record.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct Check {
    pub(super) sig: [u64; SIG_WORDS],
    pub(super) slots: u64,
    pub(super) err: u64,
}

/// Every element kind, in the order the kernels' tables use.
pub(super) const ELEMS: [ElemKind; 12] = ElemKind::ALL;

pub(super) fn reduce_name(k: ElemKind, op: ReduceOp) -> String {
    format!("rshmemi_coll_reduce_{}_{}", k.name(), op.name())
}

/// The kernel names of `kernels/` (every one is compiled and loaded by [`GpuColl::new`]): the
/// untyped kernels, then each element type's.
pub fn coll_kernel_names() -> Vec<String> {
    let mut v = untyped_kernel_names();
    for k in ELEMS {
        v.extend(typed_kernel_names(k));
    }
    v
}

/// The kernels that take no element type (barriers, copies, the LL and pull data movers, the
/// cross-node rounds).
pub(super) fn untyped_kernel_names() -> Vec<String> {
    [
        "rshmemi_coll_copy",
        "rshmemi_coll_a2av_dev",
        "rshmemi_coll_a2av_meta",
        "rshmemi_coll_a2av_host",
        "rshmemi_coll_sync_sig",
        "rshmemi_coll_ll_move_a2a_words",
        "rshmemi_coll_ll_move_a2a_bytes",
        "rshmemi_coll_ll_move_gather_words",
        "rshmemi_coll_ll_move_gather_bytes",
        "rshmemi_coll_ll_move_bcast_words",
        "rshmemi_coll_ll_move_bcast_bytes",
        "rshmemi_coll_pull_a2a",
        "rshmemi_coll_pull_bcast",
        "rshmemi_coll_net_round",
        "rshmemi_coll_net_a2av",
        "rshmemi_coll_net_a2avd",
    ]
    .map(String::from)
    .to_vec()
}

/// The reduce, LL all_reduce, pull all_reduce and cross-node fold kernels of elements of
/// kind `k`, for every operation defined on it.
pub(super) fn typed_kernel_names(k: ElemKind) -> Vec<String> {
    let mut v = Vec::new();
    for op in ReduceOp::ALL {
        if op.supports(k) {
            v.push(reduce_name(k, op));
            v.push(ll_name(k, op));
            v.push(pull_ar_name(k, op));
            v.push(net_fold_name(k, op));
        }
    }
    v
}

/// Where [`GpuColl`] keeps the kernels of (element type, operation).
pub(super) fn typed_index(k: ElemKind, op: ReduceOp) -> usize {
    k as usize * ReduceOp::ALL.len() + op as usize
}

pub(super) fn pull_ar_name(k: ElemKind, op: ReduceOp) -> String {
    format!("rshmemi_coll_pull_ar_{}_{}", k.name(), op.name())
}

pub(super) fn net_fold_name(k: ElemKind, op: ReduceOp) -> String {
    format!("rshmemi_coll_net_fold_{}_{}", k.name(), op.name())
}

pub(super) fn ll_name(k: ElemKind, op: ReduceOp) -> String {
    format!("rshmemi_coll_ll_{}_{}", k.name(), op.name())
}

pub(super) fn mul(n: usize, count: usize) -> Result<usize> {
    n.checked_mul(count)
        .ok_or_else(|| Error::invalid("count times team size overflows"))
}

/// The signature of a call (its barrier count is the plan's, filled in by `exec`).
#[allow(clippy::too_many_arguments)]
pub(super) fn call_sig<T: Elem>(
    kind: CollKind,
    op: Option<ReduceOp>,
    algo: Option<Algo>,
    in_place: bool,
    count: usize,
    aux: usize,
    src: &(impl AsSym<T> + ?Sized),
    dst: &(impl AsSym<T> + ?Sized),
    dt: DeviceTeam,
) -> CallSig {
    raw_sig(
        SigKind::Coll(kind),
        T::KIND,
        op,
        algo,
        in_place,
        count,
        aux,
        src.raw(),
        dst.raw(),
        dt,
    )
}

#[allow(clippy::too_many_arguments)]
pub(super) fn raw_sig(
    kind: SigKind,
    elem: ElemKind,
    op: Option<ReduceOp>,
    algo: Option<Algo>,
    in_place: bool,
    count: usize,
    aux: usize,
    src: RawSym,
    dst: RawSym,
    dt: DeviceTeam,
) -> CallSig {
    CallSig {
        kind,
        elem,
        op,
        algo,
        in_place,
        syncs: 0,
        count: count as u64,
        aux: aux as u64,
        src: src.offset as u64,
        dst: dst.offset as u64,
        team: (dt.size, dt.start, dt.stride),
        ll: false,
        pull: false,
        chain: false,
        push: false,
    }
}

/// The mismatch recorded in an error record (`w[..ERR_SKIP]`), if any.
pub(super) fn mismatch_error(w: &[u64]) -> Option<Error> {
    if w.first().copied().unwrap_or(0) & ERR_MISMATCH == 0 {
        return None;
    }
    let sig = |at: usize| -> [u64; SIG_WORDS] {
        let mut x = [0u64; SIG_WORDS];
        for (i, v) in x.iter_mut().enumerate() {
            *v = w.get(at + i).copied().unwrap_or(0);
        }
        x
    };
    let (mine, theirs) = (sig(ERR_MM_MINE), sig(ERR_MM_THEIRS));
    Some(Error::CollectiveMismatch {
        op: SigKind::from_code(mine[0] & 0xff).map_or("cuda collective", SigKind::name),
        pe: w.get(ERR_MM_PE).copied().unwrap_or(0) as usize,
        mine: CallSig::describe(&mine),
        theirs: CallSig::describe(&theirs),
    })
}

pub(super) fn check_root(root: usize, dt: DeviceTeam) -> Result<()> {
    if root >= dt.size as usize {
        return Err(Error::PeOutOfRange {
            pe: root,
            n_pes: dt.size as usize,
            what: "team",
        });
    }
    Ok(())
}
