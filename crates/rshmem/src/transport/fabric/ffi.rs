//! The libfabric 1.17 ABI, written by hand from `rdma/fabric.h`, `fi_domain.h`, `fi_endpoint.h`,
//! `fi_eq.h`, `fi_cm.h`, `fi_rma.h` and `fi_atomic.h`: the structs the transport reads or fills
//! and the ops tables it calls through. libfabric's data-path calls (`fi_write`, `fi_cq_read`,
//! ...) are static inline functions in the headers that call through these tables, so only a
//! handful of symbols are exported (see `loader.rs`). Entries the transport never calls are kept
//! as opaque pointers so that the offsets of the ones it calls are right; the test
//! `fabric_abi_matches_the_headers` compares sizes and offsets with the installed headers.

#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_void};

pub type fi_addr_t = u64;
pub type ssize_t = isize;
/// An entry of an ops table that the transport never calls (kept for the layout).
pub type Unused = *const c_void;

pub const FI_MAJOR_VERSION: u32 = 1;
pub const FI_MINOR_VERSION: u32 = 17;
pub const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

// Capabilities and operation flags (fabric.h).
pub const FI_MSG: u64 = 1 << 1;
pub const FI_RMA: u64 = 1 << 2;
pub const FI_ATOMIC: u64 = 1 << 4;
pub const FI_READ: u64 = 1 << 8;
pub const FI_WRITE: u64 = 1 << 9;
pub const FI_RECV: u64 = 1 << 10;
pub const FI_SEND: u64 = 1 << 11;
pub const FI_TRANSMIT: u64 = FI_SEND;
pub const FI_REMOTE_READ: u64 = 1 << 12;
pub const FI_REMOTE_WRITE: u64 = 1 << 13;
pub const FI_FENCE: u64 = 1 << 21;
pub const FI_COMPLETION: u64 = 1 << 24;
pub const FI_INJECT: u64 = 1 << 25;
pub const FI_TRANSMIT_COMPLETE: u64 = 1 << 27;
pub const FI_DELIVERY_COMPLETE: u64 = 1 << 28;
/// Device (GPU) memory as a source or target of data transfers.
pub const FI_HMEM: u64 = 1 << 47;

// Memory registration modes (fabric.h).
pub const FI_MR_LOCAL: c_int = 1 << 2;
pub const FI_MR_RAW: c_int = 1 << 3;
pub const FI_MR_VIRT_ADDR: c_int = 1 << 4;
pub const FI_MR_ALLOCATED: c_int = 1 << 5;
pub const FI_MR_PROV_KEY: c_int = 1 << 6;
pub const FI_MR_ENDPOINT: c_int = 1 << 9;
pub const FI_MR_HMEM: c_int = 1 << 10;

// Message ordering (fabric.h).
pub const FI_ORDER_RAW: u64 = 1 << 1;
pub const FI_ORDER_WAW: u64 = 1 << 4;
pub const FI_ORDER_SAW: u64 = 1 << 7;
pub const FI_ORDER_SAS: u64 = 1 << 8;
pub const FI_ORDER_RMA_WAW: u64 = 1 << 35;

// Enumerations, as C ints.
pub const FI_EP_RDM: c_int = 3;
pub const FI_AV_TABLE: c_int = 2;
pub const FI_THREAD_SAFE: c_int = 1;
pub const FI_PROGRESS_AUTO: c_int = 1;
pub const FI_PROGRESS_MANUAL: c_int = 2;
pub const FI_CQ_FORMAT_CONTEXT: c_int = 1;
pub const FI_WAIT_NONE: c_int = 0;
pub const FI_ENABLE: c_int = 6;
/// `fi_setopt` level of endpoint options.
pub const FI_OPT_ENDPOINT: c_int = 0;
/// Endpoint option (bool): whether the provider may call the CUDA API itself. Added in 1.18
/// (after `FI_OPT_XPU_TRIGGER`, 9); a 1.17 provider refuses it as unknown.
pub const FI_OPT_CUDA_API_PERMITTED: c_int = 10;

// fi_datatype.
pub const FI_UINT32: c_int = 5;
pub const FI_UINT64: c_int = 7;
// fi_op.
pub const FI_SUM: c_int = 2;
pub const FI_BOR: c_int = 6;
pub const FI_BAND: c_int = 7;
pub const FI_BXOR: c_int = 9;
pub const FI_ATOMIC_READ: c_int = 10;
pub const FI_ATOMIC_WRITE: c_int = 11;
pub const FI_CSWAP: c_int = 12;

// Errors (fi_errno.h: the errno values, negated on return).
pub const FI_EAGAIN: isize = libc::EAGAIN as isize;
pub const FI_EAVAIL: isize = 259;
pub const FI_ENODATA: c_int = libc::ENODATA;

#[repr(C)]
pub struct fi_tx_attr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub inject_size: usize,
    pub size: usize,
    pub iov_limit: usize,
    pub rma_iov_limit: usize,
    pub tclass: u32,
}

#[repr(C)]
pub struct fi_rx_attr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub total_buffered_recv: usize,
    pub size: usize,
    pub iov_limit: usize,
}

#[repr(C)]
pub struct fi_ep_attr {
    pub type_: c_int,
    pub protocol: u32,
    pub protocol_version: u32,
    pub max_msg_size: usize,
    pub msg_prefix_size: usize,
    pub max_order_raw_size: usize,
    pub max_order_war_size: usize,
    pub max_order_waw_size: usize,
    pub mem_tag_format: u64,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub auth_key_size: usize,
    pub auth_key: *mut u8,
}

#[repr(C)]
pub struct fi_domain_attr {
    pub domain: *mut fid_domain,
    pub name: *mut c_char,
    pub threading: c_int,
    pub control_progress: c_int,
    pub data_progress: c_int,
    pub resource_mgmt: c_int,
    pub av_type: c_int,
    pub mr_mode: c_int,
    pub mr_key_size: usize,
    pub cq_data_size: usize,
    pub cq_cnt: usize,
    pub ep_cnt: usize,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub max_ep_tx_ctx: usize,
    pub max_ep_rx_ctx: usize,
    pub max_ep_stx_ctx: usize,
    pub max_ep_srx_ctx: usize,
    pub cntr_cnt: usize,
    pub mr_iov_limit: usize,
    pub caps: u64,
    pub mode: u64,
    pub auth_key: *mut u8,
    pub auth_key_size: usize,
    pub max_err_data: usize,
    pub mr_cnt: usize,
    pub tclass: u32,
}

#[repr(C)]
pub struct fi_fabric_attr {
    pub fabric: *mut fid_fabric,
    pub name: *mut c_char,
    pub prov_name: *mut c_char,
    pub prov_version: u32,
    pub api_version: u32,
}

#[repr(C)]
pub struct fi_info {
    pub next: *mut fi_info,
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub src_addrlen: usize,
    pub dest_addrlen: usize,
    pub src_addr: *mut c_void,
    pub dest_addr: *mut c_void,
    pub handle: *mut fid,
    pub tx_attr: *mut fi_tx_attr,
    pub rx_attr: *mut fi_rx_attr,
    pub ep_attr: *mut fi_ep_attr,
    pub domain_attr: *mut fi_domain_attr,
    pub fabric_attr: *mut fi_fabric_attr,
    pub nic: *mut c_void,
}

#[repr(C)]
pub struct fi_ops {
    pub size: usize,
    pub close: unsafe extern "C" fn(fid: *mut fid) -> c_int,
    pub bind: unsafe extern "C" fn(fid: *mut fid, bfid: *mut fid, flags: u64) -> c_int,
    pub control: unsafe extern "C" fn(fid: *mut fid, command: c_int, arg: *mut c_void) -> c_int,
    pub ops_open: Unused,
    pub tostr: Unused,
    pub ops_set: Unused,
}

#[repr(C)]
pub struct fid {
    pub fclass: usize,
    pub context: *mut c_void,
    pub ops: *mut fi_ops,
}

#[repr(C)]
pub struct fi_ops_fabric {
    pub size: usize,
    pub domain: unsafe extern "C" fn(
        fabric: *mut fid_fabric,
        info: *mut fi_info,
        dom: *mut *mut fid_domain,
        context: *mut c_void,
    ) -> c_int,
    pub passive_ep: Unused,
    pub eq_open: Unused,
    pub wait_open: Unused,
    pub trywait: Unused,
    pub domain2: Unused,
}

#[repr(C)]
pub struct fid_fabric {
    pub fid: fid,
    pub ops: *mut fi_ops_fabric,
    pub api_version: u32,
}

#[repr(C)]
pub struct fi_av_attr {
    pub type_: c_int,
    pub rx_ctx_bits: c_int,
    pub count: usize,
    pub ep_per_node: usize,
    pub name: *const c_char,
    pub map_addr: *mut c_void,
    pub flags: u64,
}

#[repr(C)]
pub struct fi_cq_attr {
    pub size: usize,
    pub flags: u64,
    pub format: c_int,
    pub wait_obj: c_int,
    pub signaling_vector: c_int,
    pub wait_cond: c_int,
    pub wait_set: *mut c_void,
}

#[repr(C)]
pub struct fi_ops_domain {
    pub size: usize,
    pub av_open: unsafe extern "C" fn(
        domain: *mut fid_domain,
        attr: *mut fi_av_attr,
        av: *mut *mut fid_av,
        context: *mut c_void,
    ) -> c_int,
    pub cq_open: unsafe extern "C" fn(
        domain: *mut fid_domain,
        attr: *mut fi_cq_attr,
        cq: *mut *mut fid_cq,
        context: *mut c_void,
    ) -> c_int,
    pub endpoint: unsafe extern "C" fn(
        domain: *mut fid_domain,
        info: *mut fi_info,
        ep: *mut *mut fid_ep,
        context: *mut c_void,
    ) -> c_int,
    pub scalable_ep: Unused,
    pub cntr_open: Unused,
    pub poll_open: Unused,
    pub stx_ctx: Unused,
    pub srx_ctx: Unused,
    pub query_atomic: Unused,
    pub query_collective: Unused,
    pub endpoint2: Unused,
}

#[repr(C)]
pub struct fi_ops_mr {
    pub size: usize,
    pub reg: unsafe extern "C" fn(
        fid: *mut fid,
        buf: *const c_void,
        len: usize,
        access: u64,
        offset: u64,
        requested_key: u64,
        flags: u64,
        mr: *mut *mut fid_mr,
        context: *mut c_void,
    ) -> c_int,
    pub regv: Unused,
    pub regattr: unsafe extern "C" fn(
        fid: *mut fid,
        attr: *const fi_mr_attr,
        flags: u64,
        mr: *mut *mut fid_mr,
    ) -> c_int,
}

/// `enum fi_hmem_iface`: CUDA device memory.
pub const FI_HMEM_CUDA: c_int = 1;

/// A registration's attributes (`fi_mr_regattr`), as of 1.17: later versions append fields
/// that a provider reads only from callers of their version.
#[repr(C)]
pub struct fi_mr_attr {
    pub mr_iov: *const iovec,
    pub iov_count: usize,
    pub access: u64,
    pub offset: u64,
    pub requested_key: u64,
    pub context: *mut c_void,
    pub auth_key_size: usize,
    pub auth_key: *mut u8,
    pub iface: c_int,
    /// The device union (`cuda` is its first `int`); 8 bytes wide.
    pub device: u64,
}

#[repr(C)]
pub struct fid_domain {
    pub fid: fid,
    pub ops: *mut fi_ops_domain,
    pub mr: *mut fi_ops_mr,
}

#[repr(C)]
pub struct fid_mr {
    pub fid: fid,
    pub mem_desc: *mut c_void,
    pub key: u64,
}

#[repr(C)]
pub struct fi_ops_av {
    pub size: usize,
    pub insert: unsafe extern "C" fn(
        av: *mut fid_av,
        addr: *const c_void,
        count: usize,
        fi_addr: *mut fi_addr_t,
        flags: u64,
        context: *mut c_void,
    ) -> c_int,
    pub insertsvc: Unused,
    pub insertsym: Unused,
    pub remove: Unused,
    pub lookup: Unused,
    pub straddr: Unused,
    pub av_set: Unused,
}

#[repr(C)]
pub struct fid_av {
    pub fid: fid,
    pub ops: *mut fi_ops_av,
}

#[repr(C)]
pub struct fi_cq_entry {
    pub op_context: *mut c_void,
}

#[repr(C)]
pub struct fi_cq_err_entry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
    pub tag: u64,
    pub olen: usize,
    pub err: c_int,
    pub prov_errno: c_int,
    pub err_data: *mut c_void,
    pub err_data_size: usize,
}

#[repr(C)]
pub struct fi_ops_cq {
    pub size: usize,
    pub read: unsafe extern "C" fn(cq: *mut fid_cq, buf: *mut c_void, count: usize) -> ssize_t,
    pub readfrom: Unused,
    pub readerr:
        unsafe extern "C" fn(cq: *mut fid_cq, buf: *mut fi_cq_err_entry, flags: u64) -> ssize_t,
    pub sread: Unused,
    pub sreadfrom: Unused,
    pub signal: Unused,
    pub strerror: unsafe extern "C" fn(
        cq: *mut fid_cq,
        prov_errno: c_int,
        err_data: *const c_void,
        buf: *mut c_char,
        len: usize,
    ) -> *const c_char,
}

#[repr(C)]
pub struct fid_cq {
    pub fid: fid,
    pub ops: *mut fi_ops_cq,
}

#[repr(C)]
pub struct fi_ops_ep {
    pub size: usize,
    pub cancel: Unused,
    pub getopt: Unused,
    pub setopt: unsafe extern "C" fn(
        fid: *mut fid,
        level: c_int,
        optname: c_int,
        optval: *const c_void,
        optlen: usize,
    ) -> c_int,
    pub tx_ctx: Unused,
    pub rx_ctx: Unused,
    pub rx_size_left: Unused,
    pub tx_size_left: Unused,
}

#[repr(C)]
pub struct fi_ops_cm {
    pub size: usize,
    pub setname: Unused,
    pub getname:
        unsafe extern "C" fn(fid: *mut fid, addr: *mut c_void, addrlen: *mut usize) -> c_int,
    pub getpeer: Unused,
    pub connect: Unused,
    pub listen: Unused,
    pub accept: Unused,
    pub reject: Unused,
    pub shutdown: Unused,
    pub join: Unused,
}

#[repr(C)]
pub struct iovec {
    pub iov_base: *mut c_void,
    pub iov_len: usize,
}

#[repr(C)]
pub struct fi_rma_iov {
    pub addr: u64,
    pub len: usize,
    pub key: u64,
}

#[repr(C)]
pub struct fi_msg_rma {
    pub msg_iov: *const iovec,
    pub desc: *mut *mut c_void,
    pub iov_count: usize,
    pub addr: fi_addr_t,
    pub rma_iov: *const fi_rma_iov,
    pub rma_iov_count: usize,
    pub context: *mut c_void,
    pub data: u64,
}

#[repr(C)]
pub struct fi_ops_rma {
    pub size: usize,
    pub read: unsafe extern "C" fn(
        ep: *mut fid_ep,
        buf: *mut c_void,
        len: usize,
        desc: *mut c_void,
        src_addr: fi_addr_t,
        addr: u64,
        key: u64,
        context: *mut c_void,
    ) -> ssize_t,
    pub readv: Unused,
    pub readmsg: Unused,
    pub write: unsafe extern "C" fn(
        ep: *mut fid_ep,
        buf: *const c_void,
        len: usize,
        desc: *mut c_void,
        dest_addr: fi_addr_t,
        addr: u64,
        key: u64,
        context: *mut c_void,
    ) -> ssize_t,
    pub writev: Unused,
    pub writemsg:
        unsafe extern "C" fn(ep: *mut fid_ep, msg: *const fi_msg_rma, flags: u64) -> ssize_t,
    pub inject: Unused,
    pub writedata: Unused,
    pub injectdata: Unused,
}

#[repr(C)]
pub struct fi_ops_atomic {
    pub size: usize,
    pub write: unsafe extern "C" fn(
        ep: *mut fid_ep,
        buf: *const c_void,
        count: usize,
        desc: *mut c_void,
        dest_addr: fi_addr_t,
        addr: u64,
        key: u64,
        datatype: c_int,
        op: c_int,
        context: *mut c_void,
    ) -> ssize_t,
    pub writev: Unused,
    pub writemsg: Unused,
    pub inject: Unused,
    pub readwrite: unsafe extern "C" fn(
        ep: *mut fid_ep,
        buf: *const c_void,
        count: usize,
        desc: *mut c_void,
        result: *mut c_void,
        result_desc: *mut c_void,
        dest_addr: fi_addr_t,
        addr: u64,
        key: u64,
        datatype: c_int,
        op: c_int,
        context: *mut c_void,
    ) -> ssize_t,
    pub readwritev: Unused,
    pub readwritemsg: Unused,
    pub compwrite: unsafe extern "C" fn(
        ep: *mut fid_ep,
        buf: *const c_void,
        count: usize,
        desc: *mut c_void,
        compare: *const c_void,
        compare_desc: *mut c_void,
        result: *mut c_void,
        result_desc: *mut c_void,
        dest_addr: fi_addr_t,
        addr: u64,
        key: u64,
        datatype: c_int,
        op: c_int,
        context: *mut c_void,
    ) -> ssize_t,
    pub compwritev: Unused,
    pub compwritemsg: Unused,
    pub writevalid: Unused,
    pub readwritevalid: Unused,
    pub compwritevalid: Unused,
}

#[repr(C)]
pub struct fid_ep {
    pub fid: fid,
    pub ops: *mut fi_ops_ep,
    pub cm: *mut fi_ops_cm,
    pub msg: *mut c_void,
    pub rma: *mut fi_ops_rma,
    pub tagged: *mut c_void,
    pub atomic: *mut fi_ops_atomic,
    pub collective: *mut c_void,
}

/// A struct's name, size and `(field, offset)` pairs.
#[cfg(test)]
pub(crate) type Layout = (&'static str, usize, Vec<(&'static str, usize)>);

/// The layout of every struct above, for the ABI test.
#[cfg(test)]
pub(crate) fn layouts() -> Vec<Layout> {
    use std::mem::{offset_of, size_of};
    macro_rules! l {
        ($t:ident; $($f:ident),*) => {
            (stringify!($t), size_of::<$t>(), vec![$((stringify!($f), offset_of!($t, $f))),*])
        };
    }
    vec![
        l!(fi_tx_attr; caps, op_flags, msg_order, inject_size, size, rma_iov_limit, tclass),
        l!(fi_rx_attr; caps, msg_order, total_buffered_recv, iov_limit),
        l!(fi_ep_attr; protocol, max_msg_size, max_order_waw_size, mem_tag_format, auth_key),
        l!(fi_domain_attr; name, threading, data_progress, av_type, mr_mode, mr_key_size, cq_data_size, mr_iov_limit, caps, mode, auth_key, max_err_data, mr_cnt, tclass),
        l!(fi_fabric_attr; name, prov_name, prov_version, api_version),
        l!(fi_info; next, caps, mode, addr_format, src_addrlen, dest_addrlen, src_addr, dest_addr, handle, tx_attr, rx_attr, ep_attr, domain_attr, fabric_attr, nic),
        l!(fi_ops; close, bind, control, ops_open, tostr, ops_set),
        l!(fid; fclass, context, ops),
        l!(fi_ops_fabric; domain, passive_ep, domain2),
        l!(fid_fabric; fid, ops, api_version),
        l!(fi_av_attr; rx_ctx_bits, count, ep_per_node, name, map_addr, flags),
        l!(fi_cq_attr; flags, format, wait_obj, signaling_vector, wait_cond, wait_set),
        l!(fi_ops_domain; av_open, cq_open, endpoint, query_atomic, endpoint2),
        l!(fi_ops_mr; reg, regv, regattr),
        l!(fi_mr_attr; mr_iov, iov_count, access, offset, requested_key, context, auth_key_size, auth_key, iface, device),
        l!(fid_domain; fid, ops, mr),
        l!(fid_mr; fid, mem_desc, key),
        l!(fi_ops_av; insert, insertsvc, av_set),
        l!(fid_av; fid, ops),
        l!(fi_cq_entry; op_context),
        l!(fi_cq_err_entry; flags, len, buf, data, tag, olen, err, prov_errno, err_data, err_data_size),
        l!(fi_ops_cq; read, readfrom, readerr, sread, signal, strerror),
        l!(fid_cq; fid, ops),
        l!(fi_ops_ep; cancel, getopt, setopt, tx_size_left),
        l!(fi_ops_cm; setname, getname, getpeer, join),
        l!(fi_rma_iov; addr, len, key),
        l!(fi_msg_rma; msg_iov, desc, iov_count, addr, rma_iov, rma_iov_count, context, data),
        l!(fi_ops_rma; read, readv, readmsg, write, writev, writemsg, inject, writedata, injectdata),
        l!(fi_ops_atomic; write, writev, writemsg, inject, readwrite, readwritev, readwritemsg, compwrite, compwritev, compwritemsg, writevalid, readwritevalid, compwritevalid),
        l!(fid_ep; fid, ops, cm, msg, rma, tagged, atomic, collective),
    ]
}
