//! Teams: creation by splitting a parent (strided or by color), the slots and generations
//! that keep a destroyed team's handle from reaching its successor, and destruction.

use super::*;

impl Pe {
    fn used_words(&self) -> Vec<u64> {
        let used = self
            .inner
            .team_used
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut w = vec![0u64; used.len().div_ceil(64)];
        for (i, &u) in used.iter().enumerate() {
            if u {
                w[i / 64] |= 1 << (i % 64);
            }
        }
        w
    }

    fn free_slots(&self, all: &[Vec<u64>]) -> Vec<usize> {
        let n = self.inner.config.max_teams;
        let mut or = vec![0u64; n.div_ceil(64)];
        for r in all {
            for (k, w) in r[EXCH_FIXED..].iter().enumerate() {
                or[k] |= w;
            }
        }
        (0..n)
            .filter(|&i| or[i / 64] & (1 << (i % 64)) == 0)
            .collect()
    }

    fn make_team(&self, slot: usize, parent: &Team, members_in_parent: &[usize]) -> Team {
        let members: Arc<[usize]> = members_in_parent
            .iter()
            .map(|&i| parent.members[i])
            .collect();
        let my_index = members
            .iter()
            .position(|&m| m == self.inner.me)
            .unwrap_or(0);
        self.inner
            .team_used
            .lock()
            .unwrap_or_else(|e| e.into_inner())[slot] = true;
        self.inner.team_epochs[slot].store(0, Ordering::Relaxed);
        let generation = self.inner.team_gens[slot].fetch_add(1, Ordering::AcqRel) + 1;
        Team {
            slot,
            members,
            my_index,
            job: self.inner.job,
            generation,
        }
    }

    /// A team of an ended world is [`Error::WorldEnded`]; another PE's team handle an
    /// [`Error::Team`].
    pub(crate) fn check_team(&self, team: &Team) -> Result<()> {
        if team.job != self.inner.job {
            return Err(Error::WorldEnded);
        }
        if team.members.get(team.my_index) != Some(&self.inner.me) {
            return Err(Error::Team(format!(
                "PE {} is not a member of this team",
                self.inner.me
            )));
        }
        self.check_generation(team)
    }

    /// A copy of a destroyed team ([`Team::tracked_copy`]) is an [`Error::Team`].
    pub(super) fn check_generation(&self, team: &Team) -> Result<()> {
        if self.inner.team_gens[team.slot].load(Ordering::Acquire) != team.generation {
            return Err(Error::Team(
                "the team was destroyed (an object built on it outlived it)".into(),
            ));
        }
        Ok(())
    }

    fn split_record(&self, tag: u64, args: [u64; 4]) -> Vec<u64> {
        let mut rec = vec![0u64; EXCH_FIXED];
        rec[0] = tag;
        rec[1..5].copy_from_slice(&args);
        rec.extend(self.used_words());
        rec
    }

    /// Collective over `parent`: the team of parent members `start, start+stride, …` (`size` of
    /// them). Members get `Some(team)`, the others `None`. Every parent member must pass the same
    /// arguments.
    pub fn team_split_strided(
        &self,
        parent: &Team,
        start: usize,
        stride: usize,
        size: usize,
    ) -> Result<Option<Team>> {
        self.check_team(parent)?;
        let _exch = self.take_exchange(TAG_SPLIT_STRIDED)?;
        let shape = strided_members(parent.n_pes(), start, stride, size);
        let rec = self.split_record(
            TAG_SPLIT_STRIDED,
            [start as u64, stride as u64, size as u64, 0],
        );
        let all = self.exchange(parent, &rec, CallKind::TeamSplitStrided)?;
        for (i, r) in all.iter().enumerate() {
            if r[..5] != rec[..5] {
                return Err(Error::CollectiveMismatch {
                    op: "team_split_strided",
                    pe: parent.members[i],
                    mine: format!("start {start} stride {stride} size {size}"),
                    theirs: format!(
                        "{} start {} stride {} size {}",
                        tag_name(r[0]),
                        r[1],
                        r[2],
                        r[3]
                    ),
                });
            }
        }
        let members = shape?;
        let slot = *self
            .free_slots(&all)
            .first()
            .ok_or_else(|| self.no_slot())?;
        Ok(members
            .contains(&parent.my_index)
            .then(|| self.make_team(slot, parent, &members)))
    }

    fn no_slot(&self) -> Error {
        Error::Team(format!(
            "no free team slot: {} teams alive (raise RSHMEM_MAX_TEAMS)",
            self.inner.config.max_teams
        ))
    }

    /// Collective over `parent`: members with the same `color` form a team, ordered by `key`
    /// (then parent index); `None` joins no team and gets `None`.
    pub fn team_split(&self, parent: &Team, color: Option<u32>, key: i64) -> Result<Option<Team>> {
        self.check_team(parent)?;
        let _exch = self.take_exchange(TAG_SPLIT_COLOR)?;
        let c = color.map_or(u64::MAX, u64::from);
        let rec = self.split_record(TAG_SPLIT_COLOR, [c, key as u64, 0, 0]);
        let all = self.exchange(parent, &rec, CallKind::TeamSplit)?;
        if let Some(i) = all.iter().position(|r| r[0] != TAG_SPLIT_COLOR) {
            return Err(Error::CollectiveMismatch {
                op: "team_split",
                pe: parent.members[i],
                mine: "team_split".into(),
                theirs: tag_name(all[i][0]).into(),
            });
        }
        let colors: Vec<Option<u32>> = all
            .iter()
            .map(|r| (r[1] != u64::MAX).then_some(r[1] as u32))
            .collect();
        let keys: Vec<i64> = all.iter().map(|r| r[2] as i64).collect();
        let groups = color_groups(&colors, &keys);
        let free = self.free_slots(&all);
        if free.len() < groups.len() {
            return Err(self.no_slot());
        }
        Ok(groups
            .iter()
            .zip(free)
            .find(|((_, m), _)| m.contains(&parent.my_index))
            .map(|((_, m), slot)| self.make_team(slot, parent, m)))
    }

    /// Collective over the team: releases it (the world team cannot be destroyed).
    ///
    /// The world team is only lent (`&Team`), so it cannot even be passed here:
    ///
    /// ```compile_fail,E0507
    /// rshmem::Launch::new().threads().run(1, |pe| {
    ///     let world: rshmem::Team = *pe.world_team(); // cannot move out of a reference
    ///     pe.team_destroy(world)
    /// }).values();
    /// ```
    pub fn team_destroy(&self, team: Team) -> Result<()> {
        self.check_team(&team)?;
        if team.is_world() {
            return Err(Error::Team("the world team cannot be destroyed".into()));
        }
        let _exch = self.take_exchange(TAG_DESTROY)?;
        let rec = self.split_record(TAG_DESTROY, [0; 4]);
        let (all, _slot) = self.exchange_held(&team, &rec[..EXCH_FIXED], CallKind::TeamDestroy)?;
        if let Some(i) = all.iter().position(|r| r[0] != TAG_DESTROY) {
            return Err(Error::CollectiveMismatch {
                op: "team_destroy",
                pe: team.members[i],
                mine: "team_destroy".into(),
                theirs: tag_name(all[i][0]).into(),
            });
        }
        // Every signal addressed to this PE in this slot has arrived (all barriers completed),
        // so its counters can be reset for the slot's next team.
        let inner = &*self.inner;
        // Still holding the slot: no copy of the team passes a barrier from here on.
        inner.team_gens[team.slot].fetch_add(1, Ordering::AcqRel);
        for r in 0..inner.layout.rounds {
            for lane in 0..LANES {
                inner.ctrls[inner.me]
                    .word(inner.layout.barrier_word(team.slot, r) + lane)
                    .store(0, Ordering::Release);
            }
        }
        inner.team_used.lock().unwrap_or_else(|e| e.into_inner())[team.slot] = false;
        Ok(())
    }
}
