//! The low-latency MoE benchmark ([`rshmem::cuda::ep::LowLatencyBuffer`]), part of
//! [`ep_bench`](crate::ep_cuda::ep_bench): dispatch and combine by CUDA graph replay in bf16 and
//! FP8, and the hook halves (send only, receive only), beside the same run's NCCL baseline,
//! with the receive counts and the combine output checked.

use crate::ep_cuda::EpBenchRecord;
use crate::timing::stage_times;
use rshmem::cuda::ep::{LlConfig, LlDispatchOpts, LowLatencyBuffer};
use rshmem::cuda::{CudaPe, Stream};
use rshmem::{bf16, Pe, Result, Sym};

/// Most tokens per PE the low-latency mode is measured at (its receive area grows with
/// `E * n * T * H`: decode sizes only).
pub const LL_MAX_TOKENS: usize = 1024;

/// Whether the low-latency mode is measured at `t` tokens of `h` elements: up to
/// [`LL_MAX_TOKENS`], rows of whole 16-byte vectors (FP8 too where `h` is a multiple of 128).
pub fn measured(t: usize, h: usize) -> bool {
    t > 0 && t <= LL_MAX_TOKENS && h.is_multiple_of(8)
}

/// Symmetric bytes per PE of the low-latency buffer at `t` tokens (0 where not [`measured`]).
pub fn ll_heap_bytes(t: usize, h: usize, e: usize, k: usize, n: usize) -> Result<usize> {
    if !measured(t, h) {
        return Ok(0);
    }
    LowLatencyBuffer::bytes_for(&LlConfig::new(t, h, e, k), n)
}

/// What one token count's run shares with the other modes of [`ep_bench`](crate::ep_cuda::ep_bench).
pub(crate) struct LlRun<'a> {
    pub pe: &'a Pe,
    pub g: &'a CudaPe<'a>,
    pub s: &'a Stream,
    pub x: &'a Sym<bf16>,
    pub ids: &'a Sym<i32>,
    pub w: &'a Sym<f32>,
    /// Combine output `[t, h]`.
    pub out: &'a Sym<bf16>,
    /// Every PE's routing (ids, weights).
    pub routes: &'a [(Vec<i32>, Vec<f32>)],
    pub t: usize,
    pub h: usize,
    pub k: usize,
    pub e: usize,
    pub iters: usize,
    pub nvrtc_options: &'a [String],
    /// Bytes sent per dispatch / combine in bf16, the NCCL baseline's times, and why it is missing.
    pub dbytes: usize,
    pub cbytes: usize,
    pub base_d: f64,
    pub base_c: f64,
    pub baseline: &'a str,
    pub why: Option<String>,
}

impl LlRun<'_> {
    fn record(
        &self,
        op: &'static str,
        mode: &'static str,
        tu: f64,
        bytes: usize,
        base: f64,
    ) -> EpBenchRecord {
        EpBenchRecord {
            op,
            api: "device",
            backend: "cuda",
            mode,
            pes: self.pe.n_pes(),
            tokens: self.t,
            bytes,
            iters: self.iters,
            time_us: tu,
            gbps: if tu > 0.0 {
                bytes as f64 / (tu * 1e3)
            } else {
                0.0
            },
            baseline: self.baseline.to_string(),
            baseline_note: self.why.clone(),
            baseline_time_us: base,
            ratio: if tu > 0.0 && base > 0.0 {
                base / tu
            } else {
                0.0
            },
        }
    }

    /// Checks the last call's receive counts and combine output (identity experts:
    /// `out[t] = sum_j w[t, j] * row`, exact in bf16, within e4m3's rounding with FP8).
    fn check(
        &self,
        buf: &LowLatencyBuffer,
        d: &rshmem::cuda::ep::LlDispatch,
        fp8: bool,
    ) -> Result<Option<String>> {
        let (pe, n, me) = (self.pe, self.pe.n_pes(), self.pe.my_pe());
        let l = self.e / n;
        let mut want = vec![0i32; l];
        for (ids, _) in self.routes {
            for tok in ids.chunks(self.k) {
                for (le, c) in want.iter_mut().enumerate() {
                    if tok.contains(&((me * l + le) as i32)) {
                        *c += 1;
                    }
                }
            }
        }
        let got = pe.local_vec(&buf.recv_count(d)?)?;
        if got != want {
            return Ok(Some(format!(
                "low-latency receive counts {got:?}, expected {want:?}"
            )));
        }
        let x = pe.local_vec(&self.x.slice(..self.t * self.h)?)?;
        let out = pe.local_vec(&self.out.slice(..self.t * self.h)?)?;
        let (ids, w) = &self.routes[me];
        for tok in 0..self.t {
            for i in 0..self.h {
                let xv = x[tok * self.h + i].to_f32();
                let (mut acc, mut mag) = (0f32, 0f32);
                for j in 0..self.k {
                    if ids[tok * self.k + j] >= 0 {
                        acc += w[tok * self.k + j] * xv;
                        mag += (w[tok * self.k + j] * xv).abs();
                    }
                }
                let g = out[tok * self.h + i];
                let ok = if fp8 {
                    (g.to_f32() - acc).abs() <= mag / 16.0 + 1e-3
                } else {
                    g == bf16::from_f32(acc)
                };
                if !ok {
                    return Ok(Some(format!(
                        "low-latency combine{}: out[{tok}][{i}] = {g}, expected {acc}",
                        if fp8 { " (fp8)" } else { "" }
                    )));
                }
            }
        }
        Ok(None)
    }

    /// Runs the low-latency measurements; data check failures go to `bad`.
    pub fn run(&self, bad: &mut Vec<String>) -> Result<Vec<EpBenchRecord>> {
        let (pe, s) = (self.pe, self.s);
        let (t, k) = (self.t, self.k);
        let buf = LowLatencyBuffer::new(
            pe,
            pe.world_team(),
            LlConfig::new(t, self.h, self.e, k),
            self.nvrtc_options,
        )?;
        let mut out = Vec::new();
        let r = self.measure(&buf, bad, &mut out);
        s.synchronize()?;
        pe.barrier_all()?;
        pe.free(buf)?;
        r?;
        Ok(out)
    }

    fn measure(
        &self,
        buf: &LowLatencyBuffer,
        bad: &mut Vec<String>,
        out: &mut Vec<EpBenchRecord>,
    ) -> Result<()> {
        let (pe, s) = (self.pe, self.s);
        let (t, k) = (self.t, self.k);
        let ids = self.ids.slice(..t * k)?;
        let none =
            || rshmem::Error::InvalidArgument("ep low latency bench: nothing captured".into());
        // A bf16 dispatch first: its receive area is the identity experts' output `y` of every
        // combine below (an FP8 dispatch's combine then sums rows that are not its own: only
        // its dispatch is timed and checked).
        let d0 = buf.dispatch(pe, s, self.x, &ids, k, LlDispatchOpts::default())?;
        let y = buf.recv_x(&d0)?;
        buf.combine(pe, s, &d0, &y, self.w, self.out)?;
        s.synchronize()?;
        buf.check(pe)?;
        if let Some(m) = self.check(buf, &d0, false)? {
            bad.push(format!("T={t}: {m}"));
        }
        pe.barrier_all()?;
        let fp8s: &[bool] = if self.h.is_multiple_of(128) {
            &[false, true]
        } else {
            &[false]
        };
        for &fp8 in fp8s {
            let opts = LlDispatchOpts { fp8 };
            let dbytes = if fp8 {
                // e4m3 bytes and one f32 per 128 elements instead of bf16.
                self.dbytes / (2 * self.h) * (self.h + self.h / 32)
            } else {
                self.dbytes
            };
            let (mode, hooks) = if fp8 {
                ("low_latency+fp8", "low_latency+fp8+hooks")
            } else {
                ("low_latency", "low_latency+hooks")
            };
            // Dispatch and combine, one graph each, replayed in turn (a dispatch must follow
            // the combine of the one before the last).
            s.begin_capture()?;
            let d = buf.dispatch(pe, s, self.x, &ids, k, opts);
            let gd = s.end_capture()?;
            let d = d?;
            let y = if fp8 {
                buf.recv_x(&d0)?
            } else {
                buf.recv_x(&d)?
            };
            s.begin_capture()?;
            let r = buf.combine(pe, s, &d, &y, self.w, self.out);
            let gc = s.end_capture()?;
            r?;
            let tt = stage_times(self.g, s, self.iters, |m| {
                gd.launch(s)?;
                m()?;
                gc.launch(s)?;
                m()
            })?;
            s.synchronize()?;
            buf.check(pe)?;
            if let Some(m) = self.check(buf, &d, fp8)? {
                bad.push(format!("T={t}: {m}"));
            }
            out.push(self.record("ep_dispatch", mode, tt[0], dbytes, self.base_d));
            if !fp8 {
                out.push(self.record("ep_combine", mode, tt[1], self.cbytes, self.base_c));
            }
            pe.barrier_all()?;
            // The hook halves, one graph each: send only, receive only.
            s.begin_capture()?;
            let sent = buf.dispatch_send(pe, s, self.x, &ids, k, opts);
            let gds = s.end_capture()?;
            let sent = sent?;
            s.begin_capture()?;
            let d = buf.dispatch_recv(pe, s, sent);
            let gdr = s.end_capture()?;
            let d = d?;
            let y = if fp8 {
                buf.recv_x(&d0)?
            } else {
                buf.recv_x(&d)?
            };
            s.begin_capture()?;
            let cs = buf.combine_send(pe, s, &d, &y);
            let gcs = s.end_capture()?;
            let cs = cs?;
            s.begin_capture()?;
            let r = buf.combine_recv(pe, s, cs, self.w, self.out);
            let gcr = s.end_capture()?;
            r?;
            let th = stage_times(self.g, s, self.iters, |m| {
                for gr in [&gds, &gdr, &gcs, &gcr] {
                    gr.launch(s)?;
                    m()?;
                }
                Ok(())
            })?;
            s.synchronize()?;
            buf.check(pe)?;
            if th.len() < 4 || tt.len() < 2 {
                return Err(none());
            }
            out.push(self.record("ep_dispatch_send", hooks, th[0], dbytes, 0.0));
            out.push(self.record("ep_dispatch_recv", hooks, th[1], dbytes, 0.0));
            if !fp8 {
                out.push(self.record("ep_combine_send", hooks, th[2], self.cbytes, 0.0));
                out.push(self.record("ep_combine_recv", hooks, th[3], self.cbytes, 0.0));
            }
            pe.barrier_all()?;
        }
        Ok(())
    }
}
