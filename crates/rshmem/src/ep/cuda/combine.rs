//! Combine: the expert outputs back to their source tokens (pushed, pulled or split), and the
//! stand-in expert computation used by tests and the benchmark.

use super::{overlaps, Dispatch, GpuBuffer, BLOCK, SPLIT_BLOCK};
use crate::device::{CudaPe, KernelArg, Stream};
use crate::elem::Elem;
use crate::ep::RecvLayout;
use crate::error::{Error, Result};
use crate::sym::{AsSym, RawSym};
use crate::Pe;

impl<T: Elem> GpuBuffer<T> {
    /// Combines the expert outputs `y` (`[rows, H]`, in [`expert_x`](Self::expert_x)'s row
    /// order; at least `rows * H` elements, `max_rows * H` in capturable mode) back into
    /// `out [T, H]` on the source PEs, on stream `s`. `handle` must be this buffer's latest
    /// dispatch (the device keeps one layout). Collective over the team.
    pub fn combine(
        &self,
        pe: &Pe,
        s: &Stream,
        handle: &Dispatch,
        y: &(impl AsSym<T> + ?Sized),
        out: &(impl AsSym<T> + ?Sized),
    ) -> Result<()> {
        self.combine_marked(pe, s, handle, y, out, false, &mut || Ok(()))
    }

    /// Combine for callers that reduce over their local experts themselves (DeepEP's combine):
    /// `y` holds one row per receive row, indexed like [`recv_x`](Self::recv_x) (`[n * C, H]`,
    /// at least that many elements; only the rows of received tokens are read), each already
    /// the token's result on this PE (weights applied by the caller). Every row goes back to
    /// its source, which sums a token's rows over the PEs it went to (ascending, `f32`, rounded
    /// once) into `out [T, H]`; tokens without experts give zeros. Works with either layout;
    /// collective over the team (every PE calls `combine_tokens` for the same dispatch).
    pub fn combine_tokens(
        &self,
        pe: &Pe,
        s: &Stream,
        handle: &Dispatch,
        y: &(impl AsSym<T> + ?Sized),
        out: &(impl AsSym<T> + ?Sized),
    ) -> Result<()> {
        self.combine_marked(pe, s, handle, y, out, true, &mut || Ok(()))
    }

    // for rshmem-bench: its RSHMEM_EP_BREAKDOWN timeline (events between the kernels).
    /// [`combine`](Self::combine) (`tokens` false) or [`combine_tokens`](Self::combine_tokens)
    /// (`tokens` true) calling `mark` after each kernel launch (for timelines). A benchmark
    /// hook, not part of the supported API.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn combine_marked(
        &self,
        pe: &Pe,
        s: &Stream,
        handle: &Dispatch,
        y: &(impl AsSym<T> + ?Sized),
        out: &(impl AsSym<T> + ?Sized),
        tokens: bool,
        mark: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        self.check_pe(pe)?;
        let g = CudaPe::new(pe)?;
        if handle.buffer_id != self.id {
            return Err(Error::invalid(
                "ep combine: the handle comes from another buffer",
            ));
        }
        if handle.seq != self.dispatches.get() {
            return Err(Error::invalid(
                "ep combine: the handle is not the buffer's latest dispatch",
            ));
        }
        let h = self.cfg.hidden;
        let (what, rows) = if tokens {
            (
                "token outputs (n * C receive rows * hidden)",
                self.recv_rows(),
            )
        } else {
            (
                "expert outputs (rows * hidden)",
                handle.rows.unwrap_or(self.plan.rmax),
            )
        };
        if y.raw().len < rows * h {
            return Err(Error::LengthMismatch {
                what,
                got: y.raw().len,
                expected: rows * h,
            });
        }
        if out.raw().len < handle.num_tokens * h {
            return Err(Error::LengthMismatch {
                what: "combine output (tokens * hidden)",
                got: out.raw().len,
                expected: handle.num_tokens * h,
            });
        }
        let prm = KernelArg::Ptr(self.params_ptr(&g)?);
        let yp = KernelArg::Ptr(g.ptr(y)?);
        let op = KernelArg::Ptr(g.ptr(out)?);
        if tokens && self.tokens_combine_pulls() {
            // The pull combine: every PE reads its tokens' rows from its peers' y. Where out
            // overlaps y (which peers read until the done handshake), the sums go to temporary
            // rows (half of the combine area, n * C rows) and are copied to out afterwards.
            let temp = overlaps(y, out);
            if temp && handle.num_tokens > self.recv_rows() {
                return Err(Error::invalid(format!(
                    "ep combine_tokens: out overlaps y, and the {} tokens exceed the {} temporary rows; \
                     give out its own memory",
                    handle.num_tokens,
                    self.recv_rows()
                )));
            }
            let dst = if temp { KernelArg::Ptr(0) } else { op };
            // SAFETY: (all launched as dependents, each beginning with rshmemi_grid_dep_wait)
            // ep_cready(const ep_params*, const ep_t*), ep_cpull(const ep_params*, ep_t*),
            // ep_cdone(const ep_params*), ep_ccopy(const ep_params*, ep_t*): y is this PE's
            // symmetric object of n * C receive rows (checked above; peers read those rows at
            // the offset ep_cready publishes), out holds T rows, or null: the temporary rows,
            // n * C >= T (checked above), copied to out by ep_ccopy.
            unsafe {
                g.launch_dependent(&self.cready, s, 1, 64, 0, &[prm, yp])?;
                mark()?;
                g.launch_dependent(&self.cpull, s, self.grid, BLOCK, 0, &[prm, dst])?;
                mark()?;
                g.launch_dependent(&self.cdone, s, 1, 64, 0, &[prm])?;
                if temp {
                    g.launch_dependent(&self.ccopy, s, self.grid, BLOCK, 0, &[prm, op])?;
                }
            }
            mark()?;
            return Ok(());
        }
        // combine_tokens pushed: this PE's rows for its own tokens are read from y by ep_crecv
        // instead of being copied to the combine area first, unless out overlaps y (then
        // ep_crecv's writes could meet rows it has yet to read).
        let (mode, own_p) = match (tokens, tokens && !overlaps(y, out)) {
            (true, true) => (2, yp),
            (t, _) => (t as i32, KernelArg::Ptr(0)),
        };
        // SAFETY: (all three launched as dependents, each beginning with rshmemi_grid_dep_wait)
        // ep_csend(const ep_params*, const ep_t*, int), ep_cwait(const ep_params*),
        // ep_crecv(const ep_params*, ep_t*, const ep_t*): y holds the rows the device reads
        // (checked above: expert-major rows, or n*C receive rows with `tokens`), out holds T
        // rows; ep_crecv reads y only with mode 2, when out does not overlap it.
        if !tokens && self.split {
            // The split combine: half the grid puts the peers' rows, half sums this PE's own
            // tokens as their rows come in. Where out overlaps y or this buffer (rows the
            // kernel still reads while others are summed), this PE sums after it instead
            // (ep_cwait, ep_crecv); its peers cannot tell.
            let (o, area) = (out.raw(), self.area.raw());
            let in_area = RawSym {
                len: o.len * std::mem::size_of::<T>(),
                ..o
            }
            .overlaps(&area, 1);
            let fin = !overlaps(y, out) && !in_area;
            // SAFETY: (all launched as dependents, each beginning with rshmemi_grid_dep_wait)
            // ep_csplit(const ep_params*, const ep_t*, ep_t*, int): y holds the expert-major
            // rows (checked above), out T rows (checked above) that, with fin, overlap neither
            // y nor the buffer; the grid is the agreed one (at least 2 blocks, one per SM of
            // EP_SPLIT_BLOCK threads: every block resident, as the summers' waits need) and
            // every PE of the team has its GPU alone (`split`); ep_cwait(const ep_params*),
            // ep_crecv(const ep_params*, ep_t*, const ep_t*) as below, with no rows in y.
            unsafe {
                g.launch_dependent(
                    &self.csplit,
                    s,
                    self.grid,
                    SPLIT_BLOCK,
                    0,
                    &[prm, yp, op, KernelArg::I32(fin as i32)],
                )?;
                mark()?;
                g.launch_dependent(&self.cwait, s, 1, 64, 0, &[prm])?;
                if !fin {
                    mark()?;
                    g.launch_dependent(
                        &self.crecv,
                        s,
                        self.grid,
                        BLOCK,
                        0,
                        &[prm, op, KernelArg::Ptr(0)],
                    )?;
                }
            }
            mark()?;
            return Ok(());
        }
        unsafe {
            g.launch_dependent(
                &self.csend,
                s,
                self.grid,
                BLOCK,
                0,
                &[prm, yp, KernelArg::I32(mode)],
            )?;
            mark()?;
            if self.spans_nodes() {
                // ep_cfwd(const ep_params*): as ep_fwd in dispatch, after ep_csend.
                g.launch_dependent(&self.cfwd, s, self.n as u32, BLOCK, 0, &[prm])?;
            }
            g.launch_dependent(&self.cwait, s, 1, 64, 0, &[prm])?;
            mark()?;
            g.launch_dependent(&self.crecv, s, self.grid, BLOCK, 0, &[prm, op, own_p])?;
        }
        mark()?;
        Ok(())
    }

    /// A stand-in expert computation on stream `s`: `y[r] = x[r] * factors[local expert of r]`
    /// for the rows of the last dispatch (row count read on the device: capturable). On a
    /// [`RecvLayout::TokenMajor`] buffer `x` is the receive area ([`recv_x`](Self::recv_x)) and
    /// row `r` reads the receive row [`expert_src`](Self::expert_src) names, as a gathering
    /// expert kernel would; `y` is expert-major in both layouts (combine's input).
    pub fn scale_experts(
        &self,
        pe: &Pe,
        s: &Stream,
        x: &(impl AsSym<T> + ?Sized),
        y: &(impl AsSym<T> + ?Sized),
        factors: &(impl AsSym<f32> + ?Sized),
    ) -> Result<()> {
        self.check_pe(pe)?;
        let g = CudaPe::new(pe)?;
        let h = self.cfg.hidden;
        let gather = self.cfg.layout == RecvLayout::TokenMajor;
        let x_rows = if gather {
            self.recv_rows()
        } else {
            self.plan.rmax
        };
        for (what, len, want) in [
            ("expert input", x.raw().len, x_rows * h),
            ("expert output", y.raw().len, self.plan.rmax * h),
        ] {
            if len < want {
                return Err(Error::LengthMismatch {
                    what,
                    got: len,
                    expected: want,
                });
            }
        }
        let el = self.cfg.num_experts / self.n;
        if factors.raw().len < el {
            return Err(Error::LengthMismatch {
                what: "expert factors",
                got: factors.raw().len,
                expected: el,
            });
        }
        let args = [
            KernelArg::Ptr(self.params_ptr(&g)?),
            KernelArg::Ptr(g.ptr(x)?),
            KernelArg::Ptr(g.ptr(y)?),
            KernelArg::Ptr(g.ptr(factors)?),
            KernelArg::I32(gather as i32),
        ];
        // SAFETY: ep_scale_experts(const ep_params*, const ep_t*, ep_t*, const float*, int)
        // with an output of max_rows rows, an input of max_rows rows (n*C receive rows when
        // gathering: every index the permute wrote is below n*C) and E/n factors.
        unsafe { g.launch(&self.scale, s, self.grid, BLOCK, 0, &args) }
    }
}
