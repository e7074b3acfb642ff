//! Transports between nodes: how bytes and atomics reach a PE whose memory this process cannot
//! map. The backends (`backend/`) move data inside a node; a transport carries it across.
//! A world uses one when its PEs run on more than one node ([`Config::node`](crate::Config::node)):
//! nothing to call here, only [`fabric::probe`] to ask whether the fabric can be used.

pub mod fabric;
