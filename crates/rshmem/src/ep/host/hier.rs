//! The internode path (DeepEP's internode design, on the host): a token whose destination PEs
//! are on another node crosses the network once, to the PE of its source's local index there
//! ([`NodeMap::peer`]), which forwards it over shared memory to the destination PEs of its
//! node, into the same receive rows, with the same records and signals as a direct put: the
//! receivers cannot tell the difference, so dispatch returns exactly what the flat path does.
//!
//! Combine is the reverse: each PE folds, in `f32`, its rows of every token from another node
//! into one partial per token (`px`), the forwarding PE sums its node's partials (ascending
//! PE) and sends one `f32` row per token back, in one put per source; the source adds each
//! node's partial where that node's first slot (combine) or PE (combine_tokens) comes, and
//! rounds once. Against the flat path only the grouping of float additions differs.
//!
//! Signals (`fsig` area): `fsig[s]`/`fdone[s]` on a forwarder: source `s`'s rows to forward
//! are in (dispatch); `fsig[f]`/`fdone[f]` on a source: forwarder `f`'s partials are in
//! (combine); `psig[d]` on a forwarder: member `d` of its node wrote its partials (combine).
//! All are set to the call's number, waited for in the same call.

use super::combine::{narrow, widen};
use super::dispatch::Src;
use super::*;
use crate::ep::Forward;

impl<T: Elem> HostBuffer<T> {
    /// Team members served by this PE as a forwarder: the sources on other nodes whose
    /// local index maps to it.
    fn served(&self) -> Vec<usize> {
        let nm = &self.nodes;
        let k = nm.node(self.me);
        (0..self.n)
            .filter(|&s| nm.node(s) != k && nm.peer(k, nm.local(s)) == self.me)
            .collect()
    }

    /// The team members on node `k` that the top-k ids of a row record name, ascending.
    fn dests_on(&self, ids: &[u32], k: usize) -> Result<Vec<usize>> {
        let mut out = Vec::new();
        for &id in ids {
            let id = id as i32 as i64;
            if id == -1 {
                continue;
            }
            if id < 0 || id >= self.cfg.num_experts as i64 {
                return Err(Error::invalid(format!(
                    "ep dispatch: forwarded expert id {id}"
                )));
            }
            let d = id as usize / self.epp;
            if self.nodes.node(d) == k && !out.contains(&d) {
                out.push(d);
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Dispatch's movement on the internode path: direct puts to the PEs of this node; one
    /// staged put of rows and one of records per other node, to the forwarder there; then,
    /// as a forwarder, every served source's rows into the receive areas of this node's PEs.
    /// Returns what was forwarded (for combine).
    pub(super) fn send_internode<I: TopkId>(
        &self,
        pe: &Pe,
        rec: &Records,
        src: &Src<'_, T, I>,
    ) -> Result<Vec<Forward>> {
        let nm = &self.nodes;
        let (me, n, h, rmw) = (self.me, self.n, self.cfg.hidden, self.rmw);
        let mt = self.cfg.max_tokens;
        let k = nm.node(me);
        let fsig = self.fsig()?;
        // To the PEs of this node, directly (shared memory).
        let local = nm.members(k);
        let at = local.iter().position(|&m| m == me).unwrap_or(0);
        for i in 0..local.len() {
            self.send_direct(pe, rec, src, local[(at + 1 + i) % local.len()])?;
        }
        // To every other node, once per token, through the forwarder of this local index.
        let mut rows: Vec<T> = Vec::new();
        let mut meta: Vec<u32> = Vec::new();
        for dj in 1..nm.n_nodes() {
            let j = (k + dj) % nm.n_nodes();
            let f = nm.peer(j, nm.local(me));
            let wf = self.members[f];
            rows.clear();
            meta.clear();
            let mut c = 0;
            for t in 0..src.layout.num_tokens() {
                if !nm
                    .members(j)
                    .iter()
                    .any(|&d| src.layout.is_token_in_pe(t, d))
                {
                    continue;
                }
                rows.extend_from_slice(&src.x[t * h..(t + 1) * h]);
                src.record(t, rmw, &mut meta);
                c += 1;
            }
            if c > 0 {
                pe.put(&self.fx::<T>()?, me * mt * h, &rows, wf)?;
                pe.put(&self.fm()?, me * mt * rmw, &meta, wf)?;
            }
            pe.fence();
            pe.put_signal(
                &fsig,
                n + me,
                &[c as u64],
                Signal::set(&fsig, me, self.epoch),
                wf,
            )?;
        }
        // As a forwarder: each served source's rows to their destinations on this node, at
        // the rows and with the records and signals the source would have put itself.
        let mut fwd = Vec::new();
        for s in self.served() {
            let ws = self.members[s];
            pe.wait_until_from(&fsig, s, Cmp::Ge, self.epoch, ws, "ep dispatch (forward)")?;
            let c = pe.g(&fsig, n + s, pe.my_pe())? as usize;
            let corrupt = |why: &str| {
                Error::invalid(format!(
                    "ep dispatch: rows forwarded from PE {ws} are inconsistent ({why})"
                ))
            };
            if c > mt {
                return Err(corrupt("count"));
            }
            let mut x = vec![T::ZERO; c * h];
            let mut m = vec![0u32; c * rmw];
            pe.get(&self.fx::<T>()?, s * mt * h, &mut x, pe.my_pe())?;
            pe.get(&self.fm()?, s * mt * rmw, &mut m, pe.my_pe())?;
            let mut r = vec![0usize; n];
            let top_k = rec.rows[s][R_TOPK] as usize;
            let mut prev: Option<u32> = None;
            for (i, mr) in m.chunks(rmw).enumerate() {
                let t = mr[0];
                if t as usize >= rec.tokens(s) || prev.is_some_and(|p| p >= t) {
                    return Err(corrupt("token index"));
                }
                prev = Some(t);
                let dests = self.dests_on(&mr[1..1 + top_k], k)?;
                if dests.is_empty() {
                    return Err(corrupt("a token for no PE of this node"));
                }
                let mut to = Vec::with_capacity(dests.len());
                for d in dests {
                    let row = self.base(rec, s, d) + r[d];
                    if r[d] >= rec.cnt(s, d) {
                        return Err(corrupt("more rows than announced"));
                    }
                    let wd = self.members[d];
                    pe.put(&self.recv_x()?, row * h, &x[i * h..(i + 1) * h], wd)?;
                    pe.put(&self.recv_meta()?, row * rmw, mr, wd)?;
                    to.push((d as u32, r[d] as u32));
                    r[d] += 1;
                }
                fwd.push(Forward {
                    src: s as u32,
                    token: t,
                    to,
                });
            }
            for &d in nm.members(k) {
                self.signal_done_as(pe, s, d, r[d])?;
            }
        }
        Ok(fwd)
    }

    /// Combine's movement and reduction on the internode path (after the agreement).
    pub(super) fn combine_internode(
        &self,
        pe: &Pe,
        handle: &Handle,
        rows: &[T],
        tokens: bool,
        rec: &Records,
    ) -> Result<Vec<T>> {
        let nm = &self.nodes;
        let (me, n, h, k) = (self.me, self.n, self.cfg.hidden, handle.top_k);
        let mt = self.cfg.max_tokens;
        let node = nm.node(me);
        let fsig = self.fsig()?;
        // Expert row of each (received token, slot).
        let mut row_of = vec![usize::MAX; handle.num_recv_tokens() * k];
        for (r, (&i, &j)) in handle.row_token.iter().zip(&handle.row_slot).enumerate() {
            row_of[i as usize * k + j as usize] = r;
        }
        let mut first_of = vec![0usize; n + 1];
        for s in 0..n {
            first_of[s + 1] = first_of[s] + handle.recv_tokens_per_pe[s];
        }
        // Rows for sources of this node go straight back, as on the flat path; for sources of
        // other nodes this PE writes one f32 partial per token into its own `px`.
        let mut send = vec![0usize; n];
        let mut wide = vec![0f32; h];
        let mut q = vec![0f32; h];
        for s in 0..n {
            let ws = self.members[s];
            let here = nm.node(s) == node;
            for i in first_of[s]..first_of[s + 1] {
                let t = handle.recv_src_token[i] as usize;
                q.fill(0.0);
                for j in 0..k {
                    if handle.recv_topk_local[i * k + j] < 0 {
                        continue;
                    }
                    let y = if tokens { i } else { row_of[i * k + j] };
                    let y = rows
                        .get(y * h..(y + 1) * h)
                        .ok_or_else(|| Error::invalid("ep: internal: expert row"))?;
                    if here {
                        pe.put(&self.comb()?, (t * k + j) * h, y, ws)?;
                        send[s] += 1;
                    } else {
                        widen(y, &mut wide);
                        let w = if tokens {
                            1.0
                        } else {
                            handle.recv_topk_weights[i * k + j]
                        };
                        for (a, v) in q.iter_mut().zip(&wide) {
                            *a += if tokens { *v } else { w * v };
                        }
                    }
                    if tokens {
                        break; // one row per received token
                    }
                }
                if !here {
                    let r = i - first_of[s];
                    pe.put(&self.px()?, (s * mt + r) * h, &q, pe.my_pe())?;
                }
            }
        }
        for &d in nm.members(node) {
            self.signal_done(pe, d, send[d])?;
        }
        // Partials ready: tell every forwarder of this node.
        pe.fence();
        for &d in nm.members(node) {
            pe.atomic_set(&fsig, 2 * n + me, self.epoch, self.members[d])?;
        }
        // As a forwarder: sum this node's partials of each served source's tokens, one put of
        // f32 rows back per source.
        for &d in nm.members(node) {
            let wd = self.members[d];
            pe.wait_until_from(&fsig, 2 * n + d, Cmp::Ge, self.epoch, wd, "ep combine")?;
        }
        let mut acc: Vec<f32> = Vec::new();
        for s in self.served() {
            acc.clear();
            for f in handle.fwd.iter().filter(|f| f.src as usize == s) {
                let at = acc.len();
                acc.resize(at + h, 0.0);
                for &(d, r) in &f.to {
                    let at_d = (s * mt + r as usize) * h;
                    pe.get(&self.px()?, at_d, &mut q, self.members[d as usize])?;
                    for (a, v) in acc[at..].iter_mut().zip(&q) {
                        *a += v;
                    }
                }
            }
            let c = acc.len() / h;
            if c > 0 {
                pe.put(&self.fx::<f32>()?, node * mt * h, &acc, self.members[s])?;
            }
            pe.fence();
            pe.put_signal(
                &fsig,
                n + me,
                &[c as u64],
                Signal::set(&fsig, me, self.epoch),
                self.members[s],
            )?;
        }
        // This PE as a source: rows from its node, one partial per token from each other node.
        let t_n = handle.num_tokens;
        let slot_pe = &handle.src_slot_pe;
        // Per other node: my tokens that went there, in order (the rows of its partials).
        let mut part_row = vec![usize::MAX; t_n * nm.n_nodes()];
        let mut per_node = vec![0usize; nm.n_nodes()];
        for t in 0..t_n {
            let mut seen = vec![false; nm.n_nodes()];
            for &p in &slot_pe[t * k..(t + 1) * k] {
                if p >= 0 {
                    let j = nm.node(p as usize);
                    if j != node && !seen[j] {
                        seen[j] = true;
                        part_row[t * nm.n_nodes() + j] = per_node[j];
                        per_node[j] += 1;
                    }
                }
            }
        }
        for &d in nm.members(node) {
            let wd = self.members[d];
            pe.wait_until_from(&self.sig()?, d, Cmp::Ge, self.epoch, wd, "ep combine")?;
            let got = pe.g(&self.done()?, d, pe.my_pe())? as usize;
            if got != rec.cnt(d, me) {
                return Err(Error::invalid(format!(
                    "ep combine: PE {wd} sent {got} rows, {} announced",
                    rec.cnt(d, me)
                )));
            }
        }
        let mut partials = vec![Vec::new(); nm.n_nodes()];
        for j in (0..nm.n_nodes()).filter(|&j| j != node) {
            let f = nm.peer(j, nm.local(me));
            let wf = self.members[f];
            pe.wait_until_from(&fsig, f, Cmp::Ge, self.epoch, wf, "ep combine")?;
            let got = pe.g(&fsig, n + f, pe.my_pe())? as usize;
            if got != per_node[j] {
                return Err(Error::invalid(format!(
                    "ep combine: PE {wf} sent {got} partials for node {j}, {} expected",
                    per_node[j]
                )));
            }
            let mut v = vec![0f32; got * h];
            pe.get(&self.fx::<f32>()?, j * mt * h, &mut v, pe.my_pe())?;
            partials[j] = v;
        }
        let mut got = vec![T::ZERO; t_n * k * h];
        pe.get(&self.comb()?, 0, &mut got, pe.my_pe())?;
        let mut out = vec![T::ZERO; t_n * h];
        let mut sum = vec![0f32; h];
        for t in 0..t_n {
            sum.fill(0.0);
            let slots = &slot_pe[t * k..(t + 1) * k];
            let mut added = vec![false; n];
            let mut node_added = vec![false; nm.n_nodes()];
            // combine: slot order; combine_tokens: ascending PE (each PE's row once).
            let order: Vec<usize> = if tokens {
                let mut ps: Vec<usize> = (0..k).filter(|&j| slots[j] >= 0).collect();
                ps.sort_by_key(|&j| (slots[j], j));
                ps
            } else {
                (0..k).filter(|&j| slots[j] >= 0).collect()
            };
            for j in order {
                let p = slots[j] as usize;
                let pj = nm.node(p);
                if pj != node {
                    if !node_added[pj] {
                        node_added[pj] = true;
                        let r = part_row[t * nm.n_nodes() + pj];
                        let part = partials[pj]
                            .get(r * h..(r + 1) * h)
                            .ok_or_else(|| Error::invalid("ep: internal: partial row"))?;
                        for (a, v) in sum.iter_mut().zip(part) {
                            *a += v;
                        }
                    }
                    continue;
                }
                if tokens && std::mem::replace(&mut added[p], true) {
                    continue;
                }
                widen(&got[(t * k + j) * h..(t * k + j + 1) * h], &mut wide);
                let w = if tokens {
                    1.0
                } else {
                    handle.src_weights[t * k + j]
                };
                for (a, v) in sum.iter_mut().zip(&wide) {
                    *a += if tokens { *v } else { w * v };
                }
            }
            narrow(&sum, &mut out[t * h..(t + 1) * h]);
        }
        Ok(out)
    }
}
