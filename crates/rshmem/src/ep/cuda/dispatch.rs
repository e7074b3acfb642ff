//! Dispatch: the host checks of the inputs, the kernel launches, and normal mode's wait for
//! the counts read back from the device.

use super::params::{parse_ctl, readback_len, CtlRead};
use super::{Dispatch, GpuBuffer, BLOCK, INDEX_EXPERTS};
use crate::device::{CudaPe, KernelArg, Stream};
use crate::elem::{Elem, ElemKind};
use crate::ep::{EpMode, RecvLayout, TopkId};
use crate::error::{Error, Result};
use crate::sym::AsSym;
use crate::Pe;

/// `what` holds `got` elements: at least `expected`, else a length mismatch naming it.
pub(super) fn need(what: &'static str, got: usize, expected: usize) -> Result<()> {
    if got < expected {
        Err(Error::LengthMismatch {
            what,
            got,
            expected,
        })
    } else {
        Ok(())
    }
}

impl<T: Elem> GpuBuffer<T> {
    fn validate_dispatch<I: Elem>(
        &self,
        g: &CudaPe,
        x: &(impl AsSym<T> + ?Sized),
        ids: &(impl AsSym<I> + ?Sized),
        w: &(impl AsSym<f32> + ?Sized),
        t: usize,
        top_k: usize,
    ) -> Result<(u64, u64, u64)> {
        let c = &self.cfg;
        if top_k == 0 || top_k > c.max_topk {
            return Err(Error::invalid(format!(
                "ep: top_k {top_k} is out of range 1..={} (max_topk of the buffer)",
                c.max_topk
            )));
        }
        if !ids.raw().len.is_multiple_of(top_k) {
            return Err(Error::invalid(format!(
                "ep: topk_ids has {} elements, not a whole number of tokens of top_k {top_k} \
                 (pass a slice of tokens * top_k elements)",
                ids.raw().len
            )));
        }
        if t > c.max_tokens {
            return Err(Error::invalid(format!(
                "ep: {t} tokens exceed max_tokens {} of the buffer",
                c.max_tokens
            )));
        }
        need("x (tokens * hidden)", x.raw().len, t * c.hidden)?;
        need("topk_ids (tokens * top_k)", ids.raw().len, t * top_k)?;
        need("topk_weights (tokens * top_k)", w.raw().len, t * top_k)?;
        // ptr() checks that each object belongs to this world (this PE's GPU heap).
        Ok((g.ptr(x)?, g.ptr(ids)?, g.ptr(w)?))
    }

    /// Dispatches this PE's tokens (see the [module docs](super)): `topk_ids [T, top_k]` (its
    /// length gives T: pass `ids.slice(..t * top_k)?` for fewer tokens than the object holds),
    /// `x [T, H]` and `topk_weights [T, top_k]` (at least that long), all symmetric objects of
    /// this PE's heap, on stream `s`. Collective over the team.
    ///
    /// Normal mode waits until the rows and the counts arrived (every dispatch kernel has
    /// ended; `s` itself is not synchronised) and returns errors found on the device at once,
    /// except while `s` is being captured into a graph;
    /// capturable mode never synchronises (call [`check`](Self::check) after synchronising).
    /// The expert-major rows are in [`expert_x`](Self::expert_x) once `s` reaches the end of
    /// the queued work.
    pub fn dispatch<I: TopkId + Elem>(
        &self,
        pe: &Pe,
        s: &Stream,
        x: &(impl AsSym<T> + ?Sized),
        topk_ids: &(impl AsSym<I> + ?Sized),
        topk_weights: &(impl AsSym<f32> + ?Sized),
        top_k: usize,
    ) -> Result<Dispatch> {
        self.dispatch_marked(pe, s, x, topk_ids, topk_weights, top_k, &mut || Ok(()))
    }

    // for rshmem-bench: its RSHMEM_EP_BREAKDOWN timeline (events between the kernels).
    /// [`dispatch`](Self::dispatch) calling `mark` after each kernel launch (for timelines).
    /// A benchmark hook, not part of the supported API.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch_marked<I: TopkId + Elem>(
        &self,
        pe: &Pe,
        s: &Stream,
        x: &(impl AsSym<T> + ?Sized),
        topk_ids: &(impl AsSym<I> + ?Sized),
        topk_weights: &(impl AsSym<f32> + ?Sized),
        top_k: usize,
        mark: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Dispatch> {
        self.check_pe(pe)?;
        // (A top_k of 0 is refused with the other inputs below, after the team learns of it.)
        let num_tokens = topk_ids.raw().len.checked_div(top_k).unwrap_or(0);
        let g = CudaPe::new(pe)?;
        if s.device() != g.device() {
            return Err(Error::invalid("ep: stream of another GPU"));
        }
        let (layout, send) = match I::KIND {
            ElemKind::I64 => (&self.layout64, &self.send64),
            _ => (&self.layout32, &self.send32),
        };
        let prm = KernelArg::Ptr(self.params_ptr(&g)?);
        let capturable = matches!(self.cfg.mode, EpMode::Capturable { .. });
        let checked = self.validate_dispatch(&g, x, topk_ids, topk_weights, num_tokens, top_k);
        let (xp, ip, wp, t, k, mine) = match checked {
            Ok((a, b, c)) => (a, b, c, num_tokens as i32, top_k as i32, None),
            // Invalid here: ep_send reads no input (T = 0) and reports this PE as invalid.
            Err(e) => (0, 0, 0, 0, 1, Some(e)),
        };
        let expert_major = self.cfg.layout == RecvLayout::ExpertMajor;
        // SAFETY: ep_layout(const ep_params*, const ep_id*, const float*, int, int, int, int),
        // ep_send(const ep_params*, const ep_t*, const ep_id*, const float*),
        // ep_dwait(const ep_params*): the pointers were checked to be this PE's symmetric
        // objects with at least T*H / T*k elements (or T = 0 and `invalid`: none is read); the
        // params block lies in the buffer; ep_layout runs the agreed grid (the accumulators
        // hold MAX_GRID blocks' counts), ep_send at most as many blocks (each takes a range of
        // ep_layout's blocks' tokens; any block size up to 512 threads); ep_layout's dynamic
        // shared memory holds E
        // counters; ep_send and ep_dwait are launched as dependents: both start with a wait
        // for ep_layout's gate (opened before ep_layout lets ep_send in), ep_send waits for
        // ep_layout's end before it ends and ep_dwait for ep_send's.
        let smem = (self.cfg.num_experts * 4) as u32;
        unsafe {
            g.launch(
                layout,
                s,
                self.grid,
                BLOCK,
                smem,
                &[
                    prm,
                    KernelArg::Ptr(ip),
                    KernelArg::Ptr(wp),
                    KernelArg::I32(t),
                    KernelArg::I32(k),
                    KernelArg::I32(capturable as i32),
                    KernelArg::I32(mine.is_some() as i32),
                ],
            )?;
            mark()?;
            g.launch_dependent(
                send,
                s,
                self.send_grid,
                self.send_block,
                0,
                &[
                    prm,
                    KernelArg::Ptr(xp),
                    KernelArg::Ptr(ip),
                    KernelArg::Ptr(wp),
                ],
            )?;
            mark()?;
            if self.spans_nodes() {
                // ep_fwd(const ep_params*): a block per team member (the sources this PE
                // forwards for; the others end at once), launched as a dependent: it lets
                // ep_dwait in at its start and waits for ep_send's end before it ends.
                g.launch_dependent(&self.fwd, s, self.n as u32, BLOCK, 0, &[prm])?;
            }
            g.launch_dependent(&self.dwait, s, 1, 1024, 0, &[prm])?;
        }
        mark()?;
        if expert_major {
            let out = g.ptr(&self.expert_x()?)?;
            // SAFETY: ep_pstream(const ep_params*, ep_t*, const ep_t*): `out` is the buffer's
            // expert-major area (max_rows rows, every row index checked against the offsets);
            // `xp` is the checked input (T*H elements; ep_pstream reads the rows of the tokens
            // ep_send recorded for this PE, all below T), or 0 with an invalid input, when no
            // row moves; it starts on ep_dwait's gate and ends with rshmemi_grid_dep_wait (a
            // dependent).
            unsafe {
                g.launch_dependent(
                    &self.pstream,
                    s,
                    self.pstream_grid,
                    self.pstream_block,
                    0,
                    &[prm, KernelArg::Ptr(out), KernelArg::Ptr(xp)],
                )?;
            }
        } else {
            // The index counts each block's pairs per local expert in shared memory.
            let el = self.cfg.num_experts / self.n;
            let smem = if el <= INDEX_EXPERTS {
                (2 * el * 4) as u32
            } else {
                0
            };
            // SAFETY: ep_permute(const ep_params*): with El <= EP_INDEX_EXPERTS its dynamic
            // shared memory holds 2 * El counters; it begins with rshmemi_grid_dep_wait (a
            // dependent).
            unsafe {
                g.launch_dependent(&self.permute, s, self.grid, BLOCK, smem, &[prm])?;
            }
        }
        mark()?;
        self.dispatches.set(self.dispatches.get() + 1);
        let mut rows = None;
        let mut counts = None;
        let mut recv_tokens = None;
        // Normal mode reads the counts back once the step is done, except while `s` is being
        // captured into a graph: then, as in capturable mode, they stay on the device (normal
        // mode's receive area holds the worst case, so nothing can overflow) and errors are
        // latched for `check`, so both modes can be captured.
        if !capturable && !s.is_capturing()? {
            // ep_readback (one block behind the last kernel) writes the counts, the device
            // error word and then its number into mapped page-locked memory.
            let el = self.cfg.num_experts / self.n;
            let len = readback_len(&self.plan, el);
            let seq = self.readbacks.get() + 1;
            self.readbacks.set(seq);
            // SAFETY: ep_readback(const ep_params*, unsigned long long*, int, unsigned long
            // long): `readback` holds len + 16 bytes, the kernel writes len / 8 words, the
            // error word and the number after them; it begins with rshmemi_grid_dep_wait (a
            // dependent).
            unsafe {
                g.launch_dependent(
                    &self.readback_k,
                    s,
                    1,
                    64,
                    0,
                    &[
                        prm,
                        KernelArg::Ptr(self.readback_dev),
                        KernelArg::I32((len / 8) as i32),
                        KernelArg::U64(seq),
                    ],
                )?;
            }
            self.wait_readback(s, len + 8, seq)?;
            let b = self.readback.bytes();
            let CtlRead { ctl, recv, off } = parse_ctl(b, &self.plan, self.n, el);
            let dev_err = u64::from_le_bytes(b[len..len + 8].try_into().unwrap_or_default());
            if let Some(e) = mine {
                self.clear_error(pe, &ctl)?;
                return Err(e);
            }
            // The device error word was 0 behind the kernels: no device wait of this PE timed
            // out, so its check (a copy and a synchronisation more) is left out.
            self.check_words(pe, &ctl, dev_err != 0)?;
            rows = Some(off[el]);
            counts = Some(off.windows(2).map(|w| w[1] - w[0]).collect());
            recv_tokens = Some(recv);
        }
        if let Some(e) = mine {
            return Err(e);
        }
        Ok(Dispatch {
            buffer_id: self.id,
            seq: self.dispatches.get(),
            num_tokens,
            top_k,
            rows,
            expert_counts: counts,
            recv_tokens,
        })
    }

    /// Waits until normal mode's readback number `seq` is in `readback` at byte `at` (the
    /// readback kernel writes it after the counts and the error word): spinning on the word,
    /// asking the stream every 256 spins whether it failed (its error is returned) or went idle
    /// without the number (an error). `RSHMEM_EP_READBACK_SYNC=1`: synchronise the stream
    /// instead (measurements).
    fn wait_readback(&self, s: &Stream, at: usize, seq: u64) -> Result<()> {
        if self.readback_sync {
            s.synchronize()?;
        } else {
            let mut spins = 0u32;
            while self.readback.word(at) != seq {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(256) && s.idle()? {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        if self.readback.word(at) != seq {
            return Err(Error::invalid(format!(
                "ep dispatch: the stream finished without the counts' readback {seq}"
            )));
        }
        Ok(())
    }
}
