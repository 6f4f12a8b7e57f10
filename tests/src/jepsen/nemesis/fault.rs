//! Fault kinds, targets and parameters, and the seeded random schedule of fault windows.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::{DiskFile, DiskMode};

/// Fault kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum NemesisKind {
    /// Network partitions (netns).
    Partition,
    /// SIGKILL and restart.
    Kill,
    /// SIGSTOP and SIGCONT.
    Pause,
    /// Clock skew of one node (libfaketime offset or rate).
    Clock,
    /// Log-segment corruption between kill and restart.
    Disk,
    /// Kill with loss of every write not yet fsynced (nodes run with
    /// `--unsafe-lose-unsynced-on-kill`).
    LoseUnsynced,
    /// Remove a node and add it back under a new id.
    Membership,
}

impl NemesisKind {
    /// Command-line name.
    pub fn name(&self) -> &'static str {
        match self {
            NemesisKind::Partition => "partition",
            NemesisKind::Kill => "kill",
            NemesisKind::Pause => "pause",
            NemesisKind::Clock => "clock",
            NemesisKind::Disk => "disk",
            NemesisKind::LoseUnsynced => "lose-unsynced",
            NemesisKind::Membership => "membership",
        }
    }

    /// Parses a comma-separated list (`partition,kill`); `none` or empty gives no fault.
    pub fn parse_list(text: &str) -> Result<Vec<NemesisKind>, String> {
        let mut out = Vec::new();
        for part in text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty() && *s != "none")
        {
            let kind = match part {
                "partition" => NemesisKind::Partition,
                "kill" => NemesisKind::Kill,
                "pause" => NemesisKind::Pause,
                "clock" => NemesisKind::Clock,
                "disk" => NemesisKind::Disk,
                "lose-unsynced" => NemesisKind::LoseUnsynced,
                "membership" => NemesisKind::Membership,
                other => return Err(format!("unknown nemesis {other:?}")),
            };
            if !out.contains(&kind) {
                out.push(kind);
            }
        }
        Ok(out)
    }

    /// Why this fault cannot run on `db`, if it cannot.
    pub fn unsupported_reason(&self, substrate: crate::jepsen::db::SubstrateKind) -> Option<String> {
        use crate::jepsen::db::SubstrateKind;
        match self {
            NemesisKind::Partition if substrate == SubstrateKind::Local => {
                Some("partitions need the netns or docker substrate".into())
            }
            NemesisKind::Clock if substrate == SubstrateKind::Docker => Some(
                "the clock nemesis preloads the host's libfaketime into node processes: not on the docker \
                 substrate (use netns or local)"
                    .into(),
            ),
            _ => None,
        }
    }
}

/// Who a fault hits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// A random member.
    Random,
    /// The current leader (random member when none is known).
    Leader,
    /// A random non-leader member.
    Follower,
    /// Every member.
    All,
    /// The node(s) cut off by the last `isolate-one`/`isolate-leader` partition (none once healed).
    Isolated,
    /// A fixed node id.
    Node(u64),
}

/// Partition shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PartitionShape {
    /// One random node alone.
    IsolateOne,
    /// The leader alone.
    IsolateLeader,
    /// One follower alone: never the leader the harness sees when it cuts (a random member when
    /// no leader is known). Scenario steps only; the random schedule keeps `isolate-one`.
    IsolateFollower,
    /// Random majority/minority halves.
    Halves,
    /// a-b-c: b sees both, a and c do not see each other.
    Bridge,
}

/// One fault with its parameters (resolved at run time: the leader is looked up then).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "kebab-case")]
pub enum Fault {
    /// SIGKILL `target`.
    Kill {
        /// Whom.
        target: Target,
    },
    /// SIGSTOP `target`.
    Pause {
        /// Whom.
        target: Target,
    },
    /// Partition.
    Partition {
        /// Shape.
        shape: PartitionShape,
    },
    /// Kill `target`, damage its newest log segment or its snapshot file; restarted at stop.
    Disk {
        /// Whom.
        target: Target,
        /// How.
        mode: DiskMode,
        /// Which file (a snapshot file that does not exist yet: the newest log segment instead).
        #[serde(default = "default_disk_file")]
        file: DiskFile,
    },
    /// Remove a follower and add a fresh node under a new id.
    Membership,
    /// Remove member `target` (no replacement); it is then stopped and wiped.
    Remove {
        /// Whom.
        target: Target,
    },
    /// Start a fresh node under a new id and add it as learner (and promote it to voter).
    Add {
        /// Promote it once it has caught up.
        promote: bool,
    },
    /// Skew `target`'s clock; reset to no skew at stop.
    Clock {
        /// Whom.
        target: Target,
        /// libfaketime offset spec (`+5s`, `-3s`, `+0 x1.5`).
        skew: String,
    },
    /// SIGKILL `target` losing what it had not fsynced; restarted at stop.
    LoseUnsynced {
        /// Whom.
        target: Target,
    },
}

fn default_disk_file() -> DiskFile {
    DiskFile::Log
}

/// Clock skews the random schedule draws from (libfaketime specs: offsets, and rates relative to
/// the process start).
pub const CLOCK_SKEWS: [&str; 7] = ["+5s", "-3s", "+30s", "-10s", "+1s", "+0 x1.5", "+0 x0.7"];

/// A libfaketime spec for an offset of `offset_ms` (`+1.500s`, `-0.250s`, `+0` for zero).
pub fn clock_offset_spec(offset_ms: i64) -> String {
    if offset_ms == 0 {
        return crate::jepsen::db::CLOCK_NO_SKEW.into();
    }
    let sign = if offset_ms < 0 { '-' } else { '+' };
    let abs = offset_ms.unsigned_abs();
    format!("{sign}{}.{:03}s", abs / 1000, abs % 1000)
}

impl Fault {
    /// The fault's kind.
    pub fn kind(&self) -> NemesisKind {
        match self {
            Fault::Kill { .. } => NemesisKind::Kill,
            Fault::Pause { .. } => NemesisKind::Pause,
            Fault::Partition { .. } => NemesisKind::Partition,
            Fault::Disk { .. } => NemesisKind::Disk,
            Fault::Membership | Fault::Remove { .. } | Fault::Add { .. } => NemesisKind::Membership,
            Fault::Clock { .. } => NemesisKind::Clock,
            Fault::LoseUnsynced { .. } => NemesisKind::LoseUnsynced,
        }
    }

    /// A random fault of `kind`.
    pub fn random(kind: NemesisKind, rng: &mut StdRng) -> Option<Fault> {
        let t = match rng.gen_range(0..3) {
            0 => Target::Leader,
            _ => Target::Random,
        };
        Some(match kind {
            NemesisKind::Kill => Fault::Kill { target: t },
            NemesisKind::Pause => Fault::Pause { target: t },
            NemesisKind::Partition => Fault::Partition {
                shape: *[
                    PartitionShape::IsolateOne,
                    PartitionShape::IsolateLeader,
                    PartitionShape::Halves,
                    PartitionShape::Bridge,
                ]
                .choose(rng)?,
            },
            NemesisKind::Disk => Fault::Disk {
                target: Target::Random,
                mode: *[DiskMode::Truncate, DiskMode::ZeroPage, DiskMode::Bitflip].choose(rng)?,
                // Half the faults hit the log, the others a snapshot file's header or body.
                file: *[
                    DiskFile::Log,
                    DiskFile::Log,
                    DiskFile::SnapshotHeader,
                    DiskFile::SnapshotBody,
                ]
                .choose(rng)?,
            },
            NemesisKind::Membership => Fault::Membership,
            NemesisKind::Clock => Fault::Clock {
                target: t,
                skew: (*CLOCK_SKEWS.choose(rng)?).to_string(),
            },
            NemesisKind::LoseUnsynced => Fault::LoseUnsynced {
                target: if rng.gen_bool(0.5) { Target::All } else { t },
            },
        })
    }
}

/// One planned fault window: start `at_ms` after the run starts, stop `hold_ms` later.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Planned {
    /// Start, ms from the start of the run.
    pub at_ms: u64,
    /// Duration before the stop, ms.
    pub hold_ms: u64,
    /// The fault.
    pub fault: Fault,
}

/// Plans fault windows over `time_limit_ms`: a quiet gap of 2-6 s, a fault held 2-8 s (pauses
/// 1-15 s), repeated; faults drawn from `kinds`. Deterministic for a seed.
pub fn schedule(kinds: &[NemesisKind], time_limit_ms: u64, rng: &mut StdRng) -> Vec<Planned> {
    let usable: Vec<NemesisKind> = kinds.to_vec();
    let mut plan = Vec::new();
    if usable.is_empty() {
        return plan;
    }
    let mut t = 0u64;
    loop {
        t += rng.gen_range(2_000..6_000);
        let Some(&kind) = usable.choose(rng) else { break };
        let hold = match kind {
            NemesisKind::Pause => rng.gen_range(1_000..15_000),
            NemesisKind::Membership => 1_000,
            _ => rng.gen_range(2_000..8_000),
        };
        // Shorten the last window to fit; stop when not even a 1 s window fits.
        let hold = hold.min(time_limit_ms.saturating_sub(t + 1_000));
        if hold < 1_000 {
            break;
        }
        if let Some(fault) = Fault::random(kind, rng) {
            plan.push(Planned {
                at_ms: t,
                hold_ms: hold,
                fault,
            });
        }
        t += hold;
    }
    plan
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn parse_list_accepts_names_and_rejects_unknown() {
        assert_eq!(
            NemesisKind::parse_list("partition, kill,pause,kill").unwrap(),
            vec![NemesisKind::Partition, NemesisKind::Kill, NemesisKind::Pause]
        );
        assert_eq!(NemesisKind::parse_list("none").unwrap(), vec![]);
        assert!(NemesisKind::parse_list("meteor").is_err());
    }

    #[test]
    fn schedule_is_seeded_bounded_and_draws_every_kind() {
        let kinds = [NemesisKind::Kill, NemesisKind::Pause, NemesisKind::Clock];
        let a = schedule(&kinds, 60_000, &mut StdRng::seed_from_u64(1));
        let b = schedule(&kinds, 60_000, &mut StdRng::seed_from_u64(1));
        assert_eq!(a, b);
        assert!(!a.is_empty());
        let mut end = 0;
        for p in &a {
            assert!(p.at_ms >= end, "windows overlap");
            end = p.at_ms + p.hold_ms;
            assert!(end < 60_000);
            assert!(kinds.contains(&p.fault.kind()), "{:?}", p.fault);
        }
        assert!(schedule(&[], 60_000, &mut StdRng::seed_from_u64(1)).is_empty());
    }

    #[test]
    fn clock_and_lose_unsynced_faults_are_drawn_with_valid_parameters() {
        let plan = schedule(&[NemesisKind::Clock], 300_000, &mut StdRng::seed_from_u64(2));
        assert!(plan.len() > 10);
        let mut skews = std::collections::BTreeSet::new();
        for p in &plan {
            let Fault::Clock { skew, .. } = &p.fault else {
                panic!("not a clock fault: {:?}", p.fault)
            };
            assert!(CLOCK_SKEWS.contains(&skew.as_str()), "{skew}");
            skews.insert(skew.clone());
        }
        assert!(
            skews.iter().any(|s| s.starts_with('-')),
            "no backwards skew in {skews:?}"
        );
        let plan = schedule(
            &[NemesisKind::LoseUnsynced],
            300_000,
            &mut StdRng::seed_from_u64(2),
        );
        let all = plan
            .iter()
            .filter(|p| matches!(p.fault, Fault::LoseUnsynced { target: Target::All }))
            .count();
        assert!(plan.iter().all(|p| p.fault.kind() == NemesisKind::LoseUnsynced));
        assert!(
            all > 0 && all < plan.len(),
            "{all} of {} whole-cluster kills",
            plan.len()
        );
        assert_eq!(
            NemesisKind::Clock.unsupported_reason(crate::jepsen::db::SubstrateKind::Local),
            None
        );
        assert_eq!(
            NemesisKind::LoseUnsynced.unsupported_reason(crate::jepsen::db::SubstrateKind::Local),
            None
        );
        assert_eq!(
            NemesisKind::LoseUnsynced.unsupported_reason(crate::jepsen::db::SubstrateKind::Docker),
            None
        );
        assert!(NemesisKind::Clock
            .unsupported_reason(crate::jepsen::db::SubstrateKind::Docker)
            .is_some_and(|r| r.contains("docker")));
        assert_eq!(
            NemesisKind::Partition.unsupported_reason(crate::jepsen::db::SubstrateKind::Docker),
            None
        );
    }

    #[test]
    fn clock_offset_specs_are_libfaketime_offsets() {
        assert_eq!(clock_offset_spec(0), "+0");
        assert_eq!(clock_offset_spec(1500), "+1.500s");
        assert_eq!(clock_offset_spec(-250), "-0.250s");
        assert_eq!(clock_offset_spec(-3000), "-3.000s");
    }

    #[test]
    fn the_ci_docker_run_draws_every_fault_kind() {
        // .ci/run: `ftkv-jepsen test --workload register --nemesis kill,pause,partition
        // --time-limit 25s --substrate docker --seed 29`; the runner seeds the schedule with
        // `seed ^ 0x9e37_79b9_7f4a_7c15`. If the schedule changes, pick another seed there.
        let kinds = [NemesisKind::Kill, NemesisKind::Pause, NemesisKind::Partition];
        let plan = schedule(
            &kinds,
            25_000,
            &mut StdRng::seed_from_u64(29 ^ 0x9e37_79b9_7f4a_7c15),
        );
        for k in kinds {
            assert!(
                plan.iter().any(|p| p.fault.kind() == k),
                "seed 29 draws no {} in 25 s: {plan:?}",
                k.name()
            );
        }
    }
}
