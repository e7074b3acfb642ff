//! What a team barrier is part of. Every barrier carries its call's kind in a call word (see
//! [`checked_barrier`](crate::sync::checked_barrier)), so a barrier is only ever passed with
//! members inside the same kind of call: a `barrier_all` against an `alloc` is a
//! [`CollectiveMismatch`](crate::Error::CollectiveMismatch) on every member, never a success.

/// The kind of collective call a team barrier belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum CallKind {
    BarrierAll = 1,
    SyncAll,
    TeamBarrier,
    TeamSync,
    Alloc,
    Free,
    TeamSplitStrided,
    TeamSplit,
    TeamDestroy,
    Finalize,
    Broadcast,
    Reduce,
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    AllToAllV,
    EpBufferNew,
    EpDispatch,
    EpCombine,
}

const ALL: [CallKind; 20] = [
    CallKind::BarrierAll,
    CallKind::SyncAll,
    CallKind::TeamBarrier,
    CallKind::TeamSync,
    CallKind::Alloc,
    CallKind::Free,
    CallKind::TeamSplitStrided,
    CallKind::TeamSplit,
    CallKind::TeamDestroy,
    CallKind::Finalize,
    CallKind::Broadcast,
    CallKind::Reduce,
    CallKind::AllReduce,
    CallKind::AllGather,
    CallKind::ReduceScatter,
    CallKind::AllToAll,
    CallKind::AllToAllV,
    CallKind::EpBufferNew,
    CallKind::EpDispatch,
    CallKind::EpCombine,
];

impl CallKind {
    /// The code in call words (never 0, so an unwritten word matches no call).
    pub(crate) fn code(self) -> u64 {
        self as u64
    }

    /// The call with code `code`, if any.
    pub(crate) fn from_code(code: u64) -> Option<CallKind> {
        ALL.iter().copied().find(|c| c.code() == code)
    }

    /// The name of the API call, as errors show it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            CallKind::BarrierAll => "barrier_all",
            CallKind::SyncAll => "sync_all",
            CallKind::TeamBarrier => "team_barrier",
            CallKind::TeamSync => "team_sync",
            CallKind::Alloc => "alloc",
            CallKind::Free => "free",
            CallKind::TeamSplitStrided => "team_split_strided",
            CallKind::TeamSplit => "team_split",
            CallKind::TeamDestroy => "team_destroy",
            CallKind::Finalize => "finalize",
            CallKind::Broadcast => "broadcast",
            CallKind::Reduce => "reduce",
            CallKind::AllReduce => "all_reduce",
            CallKind::AllGather => "all_gather",
            CallKind::ReduceScatter => "reduce_scatter",
            CallKind::AllToAll => "all_to_all",
            CallKind::AllToAllV => "all_to_all_v",
            CallKind::EpBufferNew => "ep buffer new",
            CallKind::EpDispatch => "ep dispatch",
            CallKind::EpCombine => "ep combine",
        }
    }

    /// A call word as errors show it: the call's name and the team barrier's number.
    pub(crate) fn describe(word: u64) -> String {
        let epoch = word & ((1 << crate::sync::CALL_EPOCH_BITS) - 1);
        match CallKind::from_code(word >> crate::sync::CALL_EPOCH_BITS) {
            Some(c) => format!("{} (team barrier #{epoch})", c.name()),
            None => format!("an unknown call (word {word:#x})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_differ() {
        for (i, c) in ALL.iter().enumerate() {
            assert_eq!(CallKind::from_code(c.code()), Some(*c));
            assert!(c.code() != 0 && c.code() < 256);
            assert!(ALL[..i]
                .iter()
                .all(|o| o.code() != c.code() && o.name() != c.name()));
        }
        assert_eq!(CallKind::from_code(0), None);
        let w = crate::sync::call_word(CallKind::Alloc.code(), 12);
        assert_eq!(CallKind::describe(w), "alloc (team barrier #12)");
    }
}
