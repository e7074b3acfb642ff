//! Transports between nodes: how bytes and atomics reach a PE whose memory this process cannot
//! map. The backends (`backend/`) move data inside a node; a transport carries it across.

pub(crate) mod fabric;
