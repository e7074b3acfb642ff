//! Tuning of the GPU MoE buffers: [`EpTuning`], one typed value with the measured defaults,
//! read from the environment once ([`EpTuning::from_env`]) and handed to [`GpuBuffer::new`].
//! docs/tuning.md lists the variables.

use super::*;

/// How the GPU MoE kernels run. Every PE of a team must use the same values (a buffer agrees
/// on its grid at creation; the combine paths are checked per call). `Default` holds the
/// measured defaults; [`EpTuning::from_env`] reads the `RSHMEM_EP_*` and
/// `RSHMEM_CUDA_EP_NVRTC_OPTS` variables once.
///
/// ```
/// use rshmem::cuda::ep::{EpTuning, TokensCombine};
/// let t = EpTuning { combine_tokens: TokensCombine::Push, ..EpTuning::default() };
/// assert!(t.check().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpTuning {
    /// How [`GpuBuffer::combine_tokens`] moves the rows back (`RSHMEM_EP_COMBINE_TOKENS`).
    pub combine_tokens: TokensCombine,
    /// Whether `combine` may take the split kernel where every PE of the team has its GPU
    /// alone (`RSHMEM_EP_SPLIT_COMBINE`).
    pub split_combine: bool,
    /// Normal-mode dispatch synchronises its stream before reading the counts instead of
    /// waiting for the readback's number (`RSHMEM_EP_READBACK_SYNC`; measurements).
    pub readback_sync: bool,
    /// Threads per block of `ep_send`, a multiple of 32 from 64 to 512
    /// (`RSHMEM_EP_SEND_THREADS`); `None`: by the receive layout.
    pub send_threads: Option<u32>,
    /// Threads per block of `ep_pstream`, a multiple of 32 from 64 to 512
    /// (`RSHMEM_EP_PSTREAM_THREADS`).
    pub pstream_threads: u32,
    /// Blocks of `ep_send` and `ep_pstream`, at most 1024 (`RSHMEM_EP_SEND_BLOCKS`,
    /// `RSHMEM_EP_PSTREAM_BLOCKS`); 0: the agreed grid.
    pub send_blocks: u32,
    pub pstream_blocks: u32,
    /// Extra NVRTC options of the MoE kernels: the compile-time switches of `kernels/`, for
    /// measurements (`RSHMEM_CUDA_EP_NVRTC_OPTS`). The switches in
    /// [`EP_WRONG_RESULT_SWITCHES`] break the kernels on purpose, for rshmem's own tests;
    /// [`EpTuning::from_env`] refuses them.
    pub nvrtc_options: Vec<String>,
}

/// Compile-time switches of the MoE kernels that give wrong results on purpose (mutations
/// that show what a wait, a refill or a store back guards): never from an environment
/// variable.
pub const EP_WRONG_RESULT_SWITCHES: &[&str] = &[
    "EP_SEND_SKIP_SELF",
    "EP_SPLIT_WAIT",
    "EP_DISPATCH_KEEP",
    "EP_DISPATCH_WAIT",
    "EP_DISPATCH_REFILL",
    "EP_SPLIT_KEEP",
];

impl Default for EpTuning {
    fn default() -> Self {
        EpTuning {
            combine_tokens: TokensCombine::Auto,
            split_combine: true,
            readback_sync: false,
            send_threads: None,
            pstream_threads: PSTREAM_BLOCK,
            send_blocks: 0,
            pstream_blocks: 0,
            nvrtc_options: Vec::new(),
        }
    }
}

impl EpTuning {
    /// The defaults with every variable that is set applied, checked: an unparsable or
    /// out-of-range value is an error naming the variable.
    pub fn from_env() -> Result<EpTuning> {
        let d = EpTuning::default();
        let threads = |name: &str, default: u32| {
            block_threads(name, std::env::var(name).ok().as_deref(), default)
        };
        let blocks = |name: &str| {
            knobs::knob_from_env(name, 0, |v| v <= MAX_GRID as usize, "at most 1024")
                .map(|v| v as u32)
        };
        let send_threads = match std::env::var("RSHMEM_EP_SEND_THREADS") {
            Ok(v) if !v.trim().is_empty() => {
                Some(block_threads("RSHMEM_EP_SEND_THREADS", Some(&v), BLOCK)?)
            }
            _ => None,
        };
        let t = EpTuning {
            combine_tokens: TokensCombine::from_env()?,
            split_combine: knobs::knob_from_env(
                "RSHMEM_EP_SPLIT_COMBINE",
                1,
                |v| v <= 1,
                "0 or 1",
            )? == 1,
            readback_sync: knobs::knob_from_env(
                "RSHMEM_EP_READBACK_SYNC",
                0,
                |v| v <= 1,
                "0 or 1",
            )? == 1,
            send_threads,
            pstream_threads: threads("RSHMEM_EP_PSTREAM_THREADS", d.pstream_threads)?,
            send_blocks: blocks("RSHMEM_EP_SEND_BLOCKS")?,
            pstream_blocks: blocks("RSHMEM_EP_PSTREAM_BLOCKS")?,
            nvrtc_options: nvrtc_options_value(
                "RSHMEM_CUDA_EP_NVRTC_OPTS",
                &std::env::var("RSHMEM_CUDA_EP_NVRTC_OPTS").unwrap_or_default(),
            )?,
        };
        t.check()?;
        Ok(t)
    }

    /// Whether the values are ones the kernels run with.
    pub fn check(&self) -> Result<()> {
        let ok = |t: u32| (64..=BLOCK).contains(&t) && t.is_multiple_of(32);
        for (name, t) in [
            ("send_threads", self.send_threads.unwrap_or(BLOCK)),
            ("pstream_threads", self.pstream_threads),
        ] {
            if !ok(t) {
                return Err(Error::invalid(format!(
                    "EpTuning: {name} {t} is not a multiple of 32 from 64 to {BLOCK}"
                )));
            }
        }
        for (name, b) in [
            ("send_blocks", self.send_blocks),
            ("pstream_blocks", self.pstream_blocks),
        ] {
            if b > MAX_GRID {
                return Err(Error::invalid(format!(
                    "EpTuning: {name} {b} is more than {MAX_GRID}"
                )));
            }
        }
        Ok(())
    }

    /// Threads per block of `ep_send` for a receive layout.
    pub(super) fn send_threads_for(&self, layout: RecvLayout) -> u32 {
        self.send_threads.unwrap_or(match layout {
            RecvLayout::ExpertMajor => EM_SEND_BLOCK,
            RecvLayout::TokenMajor => BLOCK,
        })
    }
}

fn nvrtc_options_value(name: &str, v: &str) -> Result<Vec<String>> {
    knobs::nvrtc_options(name, v, EP_WRONG_RESULT_SWITCHES)
}

#[cfg(test)]
mod tuning_tests {
    use super::*;

    #[test]
    fn ep_tuning_is_checked() {
        assert!(EpTuning::default().check().is_ok());
        for bad in [
            EpTuning {
                pstream_threads: 48,
                ..EpTuning::default()
            },
            EpTuning {
                send_threads: Some(1024),
                ..EpTuning::default()
            },
            EpTuning {
                send_blocks: MAX_GRID + 1,
                ..EpTuning::default()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        let d = EpTuning::default();
        assert_eq!(d.send_threads_for(RecvLayout::ExpertMajor), EM_SEND_BLOCK);
        assert_eq!(d.send_threads_for(RecvLayout::TokenMajor), BLOCK);
    }

    #[test]
    fn ep_wrong_result_switches_stay_out_of_the_environment() {
        let ok = nvrtc_options_value("V", "-DEP_STAMPS=1 -DEP_PSTREAM_U=4").unwrap();
        assert_eq!(ok, ["-DEP_STAMPS=1", "-DEP_PSTREAM_U=4"]);
        for bad in ["-DEP_DISPATCH_KEEP=1", "-DEP_STAMPS=1 -DEP_SPLIT_KEEP=2"] {
            match nvrtc_options_value("V", bad) {
                Err(Error::InvalidArgument(m)) => assert!(m.contains("wrong results"), "{m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
