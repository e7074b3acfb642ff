//! all_to_all_v and all_to_all_v_device of [`GpuColl`] on teams spanning nodes: the node's
//! members by the node-local kernels, each pair of members of different nodes by one put
//! through the proxy straight into the receiver's `dst`.

use super::net::*;
use super::net_sched::*;
use super::*;

/// `phase` of the all_to_all_v kernel: `RSHMEMI_NET_A2AV_META`, `_PUT`, `_WAIT`.
const A2AV_META: i32 = 1;
const A2AV_PUT: i32 = 2;
const A2AV_WAIT: i32 = 4;
/// `phase` of the all_to_all_v_device kernel: `RSHMEMI_NET_A2AVD_ROWS`, `_PUT`, `_WAIT`.
const A2AVD_ROWS: i32 = 1;
const A2AVD_PUT: i32 = 2;
const A2AVD_WAIT: i32 = 4;

#[repr(C)]
struct NetA2av {
    pe: [i32; NET_MAX],
    at: [u64; NET_MAX],
    count: [u64; NET_MAX],
}

impl GpuColl<'_> {
    /// [`GpuColl::all_to_all_v`] on a team spanning nodes (`v` checked against the objects):
    /// the node's members by the node-local call, the members of other nodes by puts at the
    /// displacements the receivers publish before their ready arrival.
    pub(super) fn net_all_to_all_v<T: Elem>(
        &self,
        s: &Stream,
        nt: &NetTeam,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        v: &AllToAllV<'_>,
    ) -> Result<()> {
        let net = self
            .net
            .as_ref()
            .ok_or_else(|| Error::invalid("internal: no cross-node state"))?;
        let arrays = [v.send_counts, v.send_displs, v.recv_counts, v.recv_displs];
        let split = all_to_all_v_split(&nt.map, nt.me, arrays);
        let (sr, d) = (self.g.ptr(src)?, self.g.ptr(dst)?);
        let es = std::mem::size_of::<T>();
        let me = nt.me;
        if nt.node.size == 1 && v.send_counts[me] != v.recv_counts[me] {
            return Err(Error::invalid(format!(
                "all_to_all_v: member {me} sends itself {} elements but receives {}",
                v.send_counts[me], v.recv_counts[me]
            )));
        }
        let world = |m: usize| nt.members[m] as i32;
        let list = self.net_list.clamp(1, NET_MAX);
        let lists = |l: &[(usize, usize, usize)]| -> Vec<(NetA2av, usize)> {
            l.chunks(list)
                .map(|c| {
                    let mut a = NetA2av {
                        pe: [0; NET_MAX],
                        at: [0; NET_MAX],
                        count: [0; NET_MAX],
                    };
                    for (i, &(m, at, n)) in c.iter().enumerate() {
                        a.pe[i] = world(m);
                        a.at[i] = at as u64;
                        a.count[i] = n as u64;
                    }
                    (a, c.len())
                })
                .collect()
        };
        let (meta_lists, put_lists) = (lists(&split.meta), lists(&split.puts));
        let sig = call_sig::<T>(
            CollKind::AllToAllV,
            None,
            None,
            false,
            0,
            0,
            src,
            dst,
            nt.dt,
        );
        let ck = self.check(nt.dt, sig.pack()?)?;
        // Inside the node: the node-local call on the node's arrays (or the own share).
        if nt.node.size > 1 {
            let [sc, sd, rc, rd] = &split.node;
            let nv = AllToAllV {
                send_counts: sc,
                send_displs: sd,
                recv_counts: rc,
                recv_displs: rd,
            };
            self.all_to_all_v_on(s, nt.node, dst, src, &nv)?;
        } else if v.send_counts[me] > 0 {
            let to = d + (v.recv_displs[me] * es) as u64;
            let from = sr + (v.send_displs[me] * es) as u64;
            self.g
                .copy_raw_on_stream(s, to, from, v.send_counts[me] * es)?;
        }
        let n = self.n_pes;
        let (skip, sigw, exp) = self.net_rows(net, nt.dt)?;
        let meta = self.g.ptr(&net.meta)?;
        let a2av = |phase: i32, (mut l, nl): (NetA2av, usize)| -> Result<()> {
            let (mut e, mut sg, mut m, mut ni, mut ph) = (exp, sigw, meta, n as i32, phase);
            let (mut dd, mut ss, mut el, mut nli) = (d, sr, es as u64, nl as i32);
            let (mut er, mut sk) = (self.err.ptr, skip);
            let mut a = [
                &mut e as *mut u64 as *mut std::ffi::c_void,
                &mut sg as *mut u64 as *mut _,
                &mut m as *mut u64 as *mut _,
                &mut ni as *mut i32 as *mut _,
                &mut ph as *mut i32 as *mut _,
                &mut dd as *mut u64 as *mut _,
                &mut ss as *mut u64 as *mut _,
                &mut el as *mut u64 as *mut _,
                &mut l as *mut NetA2av as *mut _,
                &mut nli as *mut i32 as *mut _,
                &mut er as *mut u64 as *mut _,
                &mut sk as *mut u64 as *mut _,
            ];
            // SAFETY: matches rshmemi_coll_net_a2av(u64*, u64*, u64*, int, int, u64, u64, u64,
            // rshmemi_net_a2av_list, int, u64*, u64*) (repr(C) list of NET_MAX); `exp` and
            // `sig` are this slot's rows of the net state, `meta` the symmetric metadata rows,
            // `er` our error record and `sk` the slot's skip flag in it; the ranges put were
            // checked on the host against the objects (this PE's send ranges; the receivers'
            // ranges by the receivers, whose counts must equal ours for anything to move).
            unsafe { gpu::launch(&s.raw, net.f_a2av, 1, 32, 0, &mut a) }
        };
        // Publish what this PE expects from each partner, then the ready handshake, then the
        // data (every put before any wait).
        for l in meta_lists {
            a2av(A2AV_META, l)?;
        }
        let partners: Vec<usize> = split.meta.iter().map(|x| x.0).collect();
        self.net_ready(s, nt, &partners, ck, skip, false)?;
        if put_lists.len() == 1 {
            let l = put_lists.into_iter().next().expect("one list");
            a2av(A2AV_PUT | A2AV_WAIT, l)?;
        } else {
            let waits: Vec<_> = lists(&split.puts);
            for l in put_lists {
                a2av(A2AV_PUT, l)?;
            }
            for l in waits {
                a2av(A2AV_WAIT, l)?;
            }
        }
        Ok(())
    }
}

impl GpuColl<'_> {
    /// [`GpuColl::all_to_all_v_device`] on a team spanning nodes (arguments checked, `ck` the
    /// call's check): the node's barrier carrying the signature; each member's count row to
    /// every member of another node before the ready handshake; the count kernel (the whole
    /// matrix, the verdict, `recv`, the copies inside the node and this PE's puts across
    /// nodes); the puts with their signals and the waits for the partners'; the node's closing
    /// barrier (its members read each other's `src` until then).
    pub(super) fn net_all_to_all_v_device<T: Elem>(
        &self,
        s: &Stream,
        nt: &NetTeam,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        counts: DeviceCounts<'_>,
        ck: Check,
    ) -> Result<()> {
        let net = self
            .net
            .as_ref()
            .ok_or_else(|| Error::invalid("internal: no cross-node state"))?;
        let n = nt.members.len();
        if n > net.row_stride {
            return Err(ffi::err(format!(
                "cuda all_to_all_v_device across nodes serves teams of at most {} members; \
                 this one has {n}",
                net.row_stride
            )));
        }
        let partners = all_to_all_v_device_partners(&nt.map, nt.me);
        let list = self.net_list.clamp(1, NET_MAX);
        let lists: Vec<(NetWaits, usize)> = partners
            .chunks(list)
            .map(|c| {
                let mut w = NetWaits { pe: [0; NET_MAX] };
                for (i, &m) in c.iter().enumerate() {
                    w.pe[i] = nt.members[m] as i32;
                }
                (w, c.len())
            })
            .collect();
        let (skip, sig, exp) = self.net_rows(net, nt.dt)?;
        let rows = self.g.ptr(&net.rows)?;
        let counts_send = self.buf(counts.send, n)?;
        let (sr, d) = (self.g.ptr(src)?, self.g.ptr(dst)?);
        let es = std::mem::size_of::<T>() as u64;
        let stride = net.row_stride as u64;
        let launch = |phase: i32, (mut l, nl): (NetWaits, usize)| -> Result<()> {
            let (mut e, mut sg, mut r, mut st, mut c) = (exp, sig, rows, stride, counts_send);
            let (mut ni, mut ph, mut dd, mut ss, mut el) = (n as i32, phase, d, sr, es);
            let (mut pl, mut nli, mut sk) = (net.plan.ptr, nl as i32, skip);
            let mut a = [
                &mut e as *mut u64 as *mut std::ffi::c_void,
                &mut sg as *mut u64 as *mut _,
                &mut r as *mut u64 as *mut _,
                &mut st as *mut u64 as *mut _,
                &mut c as *mut u64 as *mut _,
                &mut ni as *mut i32 as *mut _,
                &mut ph as *mut i32 as *mut _,
                &mut dd as *mut u64 as *mut _,
                &mut ss as *mut u64 as *mut _,
                &mut el as *mut u64 as *mut _,
                &mut pl as *mut u64 as *mut _,
                &mut l as *mut NetWaits as *mut _,
                &mut nli as *mut i32 as *mut _,
                &mut sk as *mut u64 as *mut _,
            ];
            // SAFETY: matches rshmemi_coll_net_a2avd(u64*, u64*, u64*, u64, const u64*, int,
            // int, u64, u64, u64, const u64*, rshmemi_net_waits, int, u64*) (repr(C) list of
            // NET_MAX); `exp` and `sig` are this slot's rows of the net state, `rows` the
            // symmetric rows (n_pes rows of `stride` >= n words), `c` n words of the counts
            // object, `pl` the plan (3 words per world PE), `sk` the slot's skip flag in our
            // error record; the puts' ranges are those the count kernel checked against the
            // objects' lengths (the same on every PE) before it wrote the plan.
            unsafe { gpu::launch(&s.raw, net.f_a2avd, 1, 32, 0, &mut a) }
        };
        let local = nt.node.size > 1;
        if local {
            // The node's members meet first (their counts are written), carrying the
            // signature; the ready handshake then adds its partners' verdict.
            self.sig_sync(s, nt.node, ck)?;
        }
        for l in &lists {
            launch(A2AVD_ROWS, (l.0.clone(), l.1))?;
        }
        self.net_ready(s, nt, &partners, ck, skip, local)?;
        let plan = [rows, stride, net.plan.ptr];
        self.a2av_dev_launch(s, nt.dt, dst, src, counts, plan)?;
        if lists.len() == 1 {
            launch(A2AVD_PUT | A2AVD_WAIT, (lists[0].0.clone(), lists[0].1))?;
        } else {
            for l in &lists {
                launch(A2AVD_PUT, (l.0.clone(), l.1))?;
            }
            for l in &lists {
                launch(A2AVD_WAIT, (l.0.clone(), l.1))?;
            }
        }
        if local {
            self.sync(s, nt.node)?;
        }
        Ok(())
    }
}
