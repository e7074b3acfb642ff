//! Teams: ordered subsets of the world's PEs with index translation. The world team is slot 0;
//! split teams get a slot agreed by their parent's members, whose barrier counters they use.

use crate::error::{Error, Result};
use std::sync::Arc;

/// A team as one PE holds it. Not `Clone`: [`Pe::team_destroy`](crate::Pe::team_destroy)
/// consumes it, so a destroyed team's slot cannot be used through a stale copy.
#[derive(Debug)]
pub struct Team {
    pub(crate) slot: usize,
    pub(crate) members: Arc<[usize]>,
    pub(crate) my_index: usize,
    pub(crate) job: u64,
    /// The slot's generation when this team got it (`PeInner::team_gens`): a copy kept by an
    /// object built on the team ([`tracked_copy`](Self::tracked_copy)) is refused once the
    /// team is destroyed, even after its slot went to another team.
    pub(crate) generation: u64,
}

impl Team {
    pub(crate) fn world(job: u64, me: usize, n: usize) -> Team {
        Team {
            slot: 0,
            members: (0..n).collect(),
            my_index: me,
            job,
            generation: 0,
        }
    }

    /// A copy for an object built on this team that uses the team's barriers in later calls
    /// (the host MoE buffer). Safe where a public `Clone` would not be: every use of a team
    /// (`Pe::check_team`, and each barrier with the slot held) compares its generation with
    /// the slot's, which [`Pe::team_destroy`](crate::Pe::team_destroy) advances, so the copy
    /// of a destroyed team is an [`Error::Team`], never a barrier on a reused slot.
    pub(crate) fn tracked_copy(&self) -> Team {
        Team {
            slot: self.slot,
            members: self.members.clone(),
            my_index: self.my_index,
            job: self.job,
            generation: self.generation,
        }
    }
    /// Number of PEs in the team.
    pub fn n_pes(&self) -> usize {
        self.members.len()
    }
    /// This PE's index in the team.
    pub fn my_pe(&self) -> usize {
        self.my_index
    }
    /// The world index of team member `i`.
    pub fn world_pe(&self, i: usize) -> Result<usize> {
        self.members.get(i).copied().ok_or(Error::PeOutOfRange {
            pe: i,
            n_pes: self.members.len(),
            what: "team",
        })
    }
    /// The team index of world PE `pe`, if it is a member.
    pub fn team_pe(&self, world_pe: usize) -> Option<usize> {
        self.members.iter().position(|&m| m == world_pe)
    }
    /// Translates member `i` of this team to its index in `other` (`None`: not a member there).
    pub fn translate(&self, i: usize, other: &Team) -> Result<Option<usize>> {
        Ok(other.team_pe(self.world_pe(i)?))
    }
    /// The members' world indices, in team order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }
    /// True for the world team.
    pub fn is_world(&self) -> bool {
        self.slot == 0
    }
}

/// Where a team's members run, node by node: the topology hierarchical collectives and the
/// internode MoE path follow ([`Pe::node_map`](crate::Pe::node_map)).
///
/// Nodes are numbered in order of their lowest team member; a member's *local index* is its
/// rank among its node's members in team order; the *leader* of a node is its local index 0.
/// Nodes may differ in size (3 PEs on one, 1 on another). The *peer* of local index `l` on a
/// node of `L` members is its member of local index `l % L`: the PE that carries traffic for
/// local index `l` of every other node, so that every local index (and NIC) of a node has a
/// share of the cross-node work.
///
/// ```
/// use rshmem::NodeMap;
/// // world nodes of the members, in team order: 3 PEs on node 5, 1 on node 2
/// let m = NodeMap::from_nodes(&[5, 5, 2, 5]);
/// assert_eq!(m.n_nodes(), 2);
/// assert_eq!((m.node(3), m.local(3)), (0, 2));
/// assert_eq!(m.members(1), &[2]);
/// assert_eq!(m.leader(0), 0);
/// assert_eq!(m.peer(1, 2), 2); // local index 2 of node 0 talks to node 1 through member 2
/// assert!(!m.is_single_node());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMap {
    node: Vec<usize>,
    local: Vec<usize>,
    members: Vec<Vec<usize>>,
}

impl NodeMap {
    /// The map of a team whose member `i` runs on node `nodes[i]` (any node numbering, such as
    /// the world's [`Placement::node`](crate::Placement::node)).
    pub fn from_nodes(nodes: &[usize]) -> NodeMap {
        let mut ids: Vec<usize> = Vec::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        let mut node = Vec::with_capacity(nodes.len());
        let mut local = Vec::with_capacity(nodes.len());
        for (i, id) in nodes.iter().enumerate() {
            let k = match ids.iter().position(|x| x == id) {
                Some(k) => k,
                None => {
                    ids.push(*id);
                    members.push(Vec::new());
                    ids.len() - 1
                }
            };
            node.push(k);
            local.push(members[k].len());
            members[k].push(i);
        }
        NodeMap {
            node,
            local,
            members,
        }
    }
    /// Number of team members.
    pub fn n_pes(&self) -> usize {
        self.node.len()
    }
    /// Number of nodes the team spans.
    pub fn n_nodes(&self) -> usize {
        self.members.len()
    }
    /// True when every member runs on one node (or the team is empty).
    pub fn is_single_node(&self) -> bool {
        self.members.len() <= 1
    }
    /// True when the team spans several nodes and some node holds more than one member: the
    /// case where hierarchical algorithms save cross-node traffic.
    pub fn is_hierarchical(&self) -> bool {
        self.members.len() > 1 && self.members.len() < self.node.len()
    }
    /// Node of member `i` (panics when `i` is not a member).
    pub fn node(&self, i: usize) -> usize {
        self.node[i]
    }
    /// Local index of member `i` within its node.
    pub fn local(&self, i: usize) -> usize {
        self.local[i]
    }
    /// The members of node `k`, in team order.
    pub fn members(&self, k: usize) -> &[usize] {
        &self.members[k]
    }
    /// The leader (local index 0) of node `k`.
    pub fn leader(&self, k: usize) -> usize {
        self.members[k][0]
    }
    /// Most members on one node.
    pub fn max_local(&self) -> usize {
        self.members.iter().map(Vec::len).max().unwrap_or(0)
    }
    /// The member of node `k` with local index `l % L` (`L` members there): the peer there of
    /// local index `l` of any other node.
    pub fn peer(&self, k: usize, l: usize) -> usize {
        let m = &self.members[k];
        m[l % m.len()]
    }
}

/// Heap traffic of one PE across nodes ([`Pe::net_traffic`](crate::Pe::net_traffic)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NetTraffic {
    /// Puts and gets to PEs of other nodes (a put of several fabric messages counts once).
    pub ops: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Operations on control blocks of PEs of other nodes: barrier arrivals, call-word and
    /// note reads, exchange-record reads (each one message across nodes).
    pub ctrl_ops: u64,
}

/// The members (parent indices) of a strided split, or an error for a bad shape.
pub(crate) fn strided_members(
    parent_n: usize,
    start: usize,
    stride: usize,
    size: usize,
) -> Result<Vec<usize>> {
    if size == 0 {
        return Err(Error::invalid("a team needs at least one PE"));
    }
    if stride == 0 && size > 1 {
        return Err(Error::invalid("stride 0 with more than one PE"));
    }
    let last = stride
        .checked_mul(size - 1)
        .and_then(|x| x.checked_add(start));
    match last {
        Some(l) if l < parent_n => Ok((0..size).map(|k| start + k * stride).collect()),
        _ => Err(Error::invalid(format!(
            "strided team start {start} stride {stride} size {size} does not fit a parent of {parent_n} PEs"
        ))),
    }
}

/// Groups of a color split: for each color (ascending) the parent indices ordered by (key, index).
pub(crate) fn color_groups(colors: &[Option<u32>], keys: &[i64]) -> Vec<(u32, Vec<usize>)> {
    let mut cs: Vec<u32> = colors.iter().flatten().copied().collect();
    cs.sort_unstable();
    cs.dedup();
    cs.into_iter()
        .map(|c| {
            let mut m: Vec<usize> = (0..colors.len())
                .filter(|&i| colors[i] == Some(c))
                .collect();
            m.sort_by_key(|&i| (keys[i], i));
            (c, m)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn strided() {
        assert_eq!(strided_members(8, 1, 2, 4).unwrap(), vec![1, 3, 5, 7]);
        assert_eq!(strided_members(8, 7, 1, 1).unwrap(), vec![7]);
        assert_eq!(strided_members(3, 0, 1, 3).unwrap(), vec![0, 1, 2]);
        assert_eq!(strided_members(8, 5, 0, 1).unwrap(), vec![5]);
        for (start, stride, size) in [
            (1, 2, 5),          // last member 9 of 8
            (0, 0, 2),          // stride 0 with two members
            (0, usize::MAX, 3), // overflow
            (8, 1, 1),          // start outside
            (0, 1, 0),          // empty
        ] {
            let r = strided_members(8, start, stride, size);
            assert!(
                matches!(r, Err(Error::InvalidArgument(_))),
                "({start}, {stride}, {size}): {r:?}"
            );
        }
    }
    #[test]
    fn node_maps() {
        let m = NodeMap::from_nodes(&[7, 3, 7, 3, 9]);
        assert_eq!(m.n_nodes(), 3);
        assert_eq!(
            (0..5).map(|i| m.node(i)).collect::<Vec<_>>(),
            [0, 1, 0, 1, 2]
        );
        assert_eq!(
            (0..5).map(|i| m.local(i)).collect::<Vec<_>>(),
            [0, 0, 1, 1, 0]
        );
        assert_eq!(m.members(1), &[1, 3]);
        assert_eq!(m.leader(2), 4);
        assert_eq!((m.peer(2, 1), m.peer(0, 3)), (4, 2));
        assert_eq!(m.max_local(), 2);
        assert!(m.is_hierarchical());
        let one = NodeMap::from_nodes(&[4, 4, 4]);
        assert!(one.is_single_node() && !one.is_hierarchical());
        // one PE per node: nothing to gain inside nodes
        assert!(!NodeMap::from_nodes(&[0, 1, 2]).is_hierarchical());
        assert!(NodeMap::from_nodes(&[]).is_single_node());
    }

    #[test]
    fn colors() {
        let g = color_groups(&[Some(1), None, Some(0), Some(1)], &[5, 0, 0, -1]);
        assert_eq!(g, vec![(0, vec![2]), (1, vec![3, 0])]);
        // equal keys keep the parent order; colors ascend whatever order they come in
        let g = color_groups(
            &[Some(9), Some(2), Some(9), Some(2), Some(9)],
            &[1, 0, 1, 0, 0],
        );
        assert_eq!(g, vec![(2, vec![1, 3]), (9, vec![4, 0, 2])]);
        assert!(color_groups(&[None, None], &[0, 0]).is_empty());
        assert!(color_groups(&[], &[]).is_empty());
    }
}
