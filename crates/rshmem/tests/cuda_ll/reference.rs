//! Inputs of the low-latency tests and their expected outputs, computed on the host.

use rshmem::bf16;
use rshmem::cuda::ep::LlConfig;

/// How a step routes its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Random ids, about one slot in six -1, duplicates allowed.
    Random,
    /// Every slot -1: no expert gets a row.
    AllMinusOne,
    /// Every slot of every token names expert 1 (duplicates: one row, weights summed per slot).
    OneExpert,
    /// No token names an expert of the last PE.
    NoneToLast,
    /// Token t's experts all on PE t % n.
    OnePe,
    /// Random, and on PE 0 every third token has an id E + 3 in slot 0 (taken as -1).
    BadIdOnPe0,
}

impl Routing {
    /// The routings every test may use (not the bad ones).
    pub const ALL: [Routing; 5] = [
        Routing::Random,
        Routing::AllMinusOne,
        Routing::OneExpert,
        Routing::NoneToLast,
        Routing::OnePe,
    ];
}

/// One step's inputs on every PE (each PE derives every PE's from these).
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub routing: Routing,
    pub t: usize,
    pub top_k: usize,
    pub seed: u64,
    pub i64_ids: bool,
    pub fp8: bool,
}

/// A PE's top-k ids (`t * top_k`) and weights.
pub struct Ids {
    pub ids: Vec<i64>,
    pub w: Vec<f32>,
}

fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

impl Step {
    pub fn random(t: usize, top_k: usize, seed: u64) -> Step {
        Step {
            routing: Routing::Random,
            t,
            top_k,
            seed,
            i64_ids: false,
            fp8: false,
        }
    }

    /// PE `p`'s routing (`n` PEs).
    pub fn routing(&self, p: usize, n: usize, c: &LlConfig) -> Ids {
        let mut r = xorshift(self.seed * 7919 + p as u64 * 104_729 + 17);
        let e = c.num_experts;
        let l = e / n;
        let mut ids = Vec::new();
        let mut w = Vec::new();
        for tok in 0..self.t {
            for j in 0..self.top_k {
                let v = match self.routing {
                    Routing::Random | Routing::BadIdOnPe0 => {
                        if r().is_multiple_of(6) {
                            -1
                        } else {
                            (r() % e as u64) as i64
                        }
                    }
                    Routing::AllMinusOne => -1,
                    Routing::OneExpert => 1,
                    Routing::NoneToLast => (r() % (e - l) as u64) as i64,
                    Routing::OnePe => ((tok % n) * l) as i64 + (r() % l as u64) as i64,
                };
                let v = if self.routing == Routing::BadIdOnPe0 && p == 0 && tok % 3 == 0 && j == 0 {
                    e as i64 + 3
                } else {
                    v
                };
                ids.push(v);
                // Multiples of 1/8 in [-1, 1]: products with the rows are exact in f32.
                w.push((r() % 17) as f32 / 8.0 - 1.0);
            }
        }
        Ids { ids, w }
    }

    /// PE `p`'s rows `[max_tokens, hidden]` (small multiples of 1/4: exact in bf16).
    pub fn x(&self, p: usize, c: &LlConfig) -> Vec<bf16> {
        let h = c.hidden;
        (0..c.max_tokens * h)
            .map(|i| {
                let (t, k) = (i / h, i % h);
                let v = (p * 131 + t * 17 + k * 7 + self.seed as usize * 29) % 61;
                bf16::from_f32((v as f32 - 30.0) / 4.0)
            })
            .collect()
    }
}

fn valid(id: i64, e: usize) -> bool {
    id >= 0 && (id as usize) < e
}

/// For each local expert of PE `me`: its rows as (source PE, token), in receive order.
pub fn expert_rows(st: &Step, n: usize, me: usize, c: &LlConfig) -> Vec<Vec<(usize, usize)>> {
    let l = c.num_experts / n;
    let mut rows = vec![Vec::new(); l];
    for s in 0..n {
        let r = st.routing(s, n, c);
        for t in 0..st.t {
            let ids = &r.ids[t * st.top_k..(t + 1) * st.top_k];
            for (e, er) in rows.iter_mut().enumerate() {
                let ge = (me * l + e) as i64;
                if ids.contains(&ge) {
                    er.push((s, t));
                }
            }
        }
    }
    rows
}

/// The stand-in experts' factor for global expert `ge` (a power of two: exact).
pub fn factor(ge: usize) -> f32 {
    [0.5, 1.0, 2.0, 4.0][ge % 4]
}

/// The rows as the experts see them: `x`, or with FP8 the dequantised reference quantisation.
pub fn seen_rows(st: &Step, p: usize, c: &LlConfig) -> Vec<f32> {
    let x: Vec<f32> = st.x(p, c).iter().map(|v| v.to_f32()).collect();
    if !st.fp8 {
        return x;
    }
    let mut out = Vec::with_capacity(x.len());
    for g in x.chunks(128) {
        let (q, scale) = super::fp8::quantise(g);
        out.extend(q.iter().map(|&b| super::fp8::e4m3_to_f32(b) * scale));
    }
    out
}

/// PE `me`'s expected combine output `[t, H]`: identity experts (y = the row as received, bf16
/// only) or the host experts (y = bf16(row * factor)).
pub fn combined(st: &Step, n: usize, me: usize, c: &LlConfig, identity: bool) -> Vec<bf16> {
    let h = c.hidden;
    let r = st.routing(me, n, c);
    let x = seen_rows(st, me, c);
    let mut out = Vec::with_capacity(st.t * h);
    for t in 0..st.t {
        for i in 0..h {
            let mut acc = 0f32;
            for j in 0..st.top_k {
                let id = r.ids[t * st.top_k + j];
                if !valid(id, c.num_experts) {
                    continue;
                }
                let xv = x[t * h + i];
                let y = if identity {
                    bf16::from_f32(xv).to_f32()
                } else {
                    bf16::from_f32(xv * factor(id as usize)).to_f32()
                };
                acc += r.w[t * st.top_k + j] * y;
            }
            out.push(bf16::from_f32(acc));
        }
    }
    out
}
