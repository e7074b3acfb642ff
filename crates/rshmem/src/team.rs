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
