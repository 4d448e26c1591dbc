//! Claims this scheduler wrote (or is writing) that the watch has not shown
//! yet. Pure: `now` is passed in.
//!
//! Between a claim's write and the watch event that shows it, the watched
//! claim still looks unallocated; a second decision made then must count the
//! devices as taken, or two pods get the same GPU. So each decided
//! allocation is assumed here at once, keyed by the claim's UID, with the
//! claim as it will be (and, once the write is answered, as the server
//! returned it, with its new `resourceVersion`). An entry ends when the watch
//! shows the claim at that `resourceVersion` or later, when the write is
//! refused, or when the claim is gone (deleted, or absent from a relist).
//! What is only assumed (a write in flight, or of unknown outcome) also ends
//! at its deadline. A write the server confirmed does not: it is no longer an
//! assumption, and dropping it while the watch is stalled gave its devices to
//! another claim (issue 41, defect 4).
//!
//! A write that failed in a way that may or may not have landed (a 5xx, a
//! lost connection, no answer in time) leaves its entry with its outcome
//! unknown: its devices stay counted as taken, but the claim must not be
//! taken as written for its own pod (which would then be bound with its claim
//! unallocated when the write did not land; the pod writes it again). Such an
//! entry ends as soon as the watch shows the claim at a newer
//! `resourceVersion` than the write's precondition: from then on the write is
//! either shown or can never land.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::types::ResourceClaim;

/// How long an assumed claim outlives its write at most: longer than a write's
/// timeout, as the mirror's reservations (`mirror::RESERVATION_TTL`).
pub const ASSUME_TTL: Duration = Duration::from_secs(30);

/// Where an assumed claim's write stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Sent, not answered yet (`claim` is the claim as it will be, at the
    /// `resourceVersion` it was read at: the write's precondition).
    InFlight,
    /// The server answered it (`claim` is its answer).
    Written,
    /// It failed in a way that may have landed (`claim` as for `InFlight`).
    Unknown,
}

#[derive(Debug, Clone)]
struct Assumed {
    claim: ResourceClaim,
    outcome: Outcome,
    expires: Instant,
}

/// Assumed claims by UID.
#[derive(Debug, Clone, Default)]
pub struct Overlay {
    by_uid: BTreeMap<String, Assumed>,
}

/// Whether `seen` is `written` or later. resourceVersions are opaque to
/// clients, but every API server serves etcd revisions (integers); anything
/// else is only caught up when equal, and otherwise left to the deadline.
fn caught_up(seen: Option<&str>, written: Option<&str>) -> bool {
    match (seen, written) {
        (Some(s), Some(w)) => match (s.parse::<u64>(), w.parse::<u64>()) {
            (Ok(s), Ok(w)) => s >= w,
            _ => s == w,
        },
        _ => false,
    }
}

/// Whether `seen` is newer than `read`: the claim changed since it was read.
fn changed(seen: Option<&str>, read: Option<&str>) -> bool {
    match (seen, read) {
        (Some(s), Some(r)) => match (s.parse::<u64>(), r.parse::<u64>()) {
            (Ok(s), Ok(r)) => s > r,
            _ => s != r,
        },
        _ => false,
    }
}

fn uid(c: &ResourceClaim) -> &str {
    c.metadata.uid.as_deref().unwrap_or_default()
}

impl Overlay {
    /// A decided allocation, before its write: `claim` as it will be.
    pub fn assume(&mut self, claim: ResourceClaim, now: Instant) {
        self.by_uid.insert(
            uid(&claim).to_string(),
            Assumed {
                claim,
                outcome: Outcome::InFlight,
                expires: now + ASSUME_TTL,
            },
        );
    }

    /// The server's answer to the write; dropped at once if the watch already
    /// showed it (`seen_rv`, the watched claim's resourceVersion).
    pub fn written(&mut self, claim: ResourceClaim, seen_rv: Option<&str>, now: Instant) {
        if caught_up(seen_rv, claim.metadata.resource_version.as_deref()) {
            self.by_uid.remove(uid(&claim));
            return;
        }
        self.by_uid.insert(
            uid(&claim).to_string(),
            Assumed {
                claim,
                outcome: Outcome::Written,
                expires: now + ASSUME_TTL,
            },
        );
    }

    /// The claim of an entry in flight now stands at `rv` (an update of ours
    /// on the way, its delete protection): the write's precondition.
    pub fn rebase(&mut self, claim_uid: &str, rv: Option<&str>) {
        if let Some(a) = self.by_uid.get_mut(claim_uid)
            && a.outcome == Outcome::InFlight
        {
            a.claim.metadata.resource_version = rv.map(str::to_string);
        }
    }

    /// The write failed in a way that may have landed: its devices stay
    /// taken until the watch shows the claim changed since it was read
    /// (`seen_rv`, the watched claim's resourceVersion now, may show it
    /// already) or the deadline passes.
    pub fn unknown(&mut self, claim_uid: &str, seen_rv: Option<&str>) {
        let Some(a) = self.by_uid.get_mut(claim_uid) else {
            return;
        };
        if changed(seen_rv, a.claim.metadata.resource_version.as_deref()) {
            self.by_uid.remove(claim_uid);
        } else {
            a.outcome = Outcome::Unknown;
        }
    }

    /// Whether the write of the claim of `claim_uid` failed with its outcome
    /// unknown, and the watch has not settled it yet.
    pub fn is_unknown(&self, claim_uid: &str) -> bool {
        self.by_uid
            .get(claim_uid)
            .is_some_and(|a| a.outcome == Outcome::Unknown)
    }

    /// The write was refused (409, 4xx): nothing of it holds.
    pub fn forget(&mut self, claim_uid: &str) {
        self.by_uid.remove(claim_uid);
    }

    /// The watch shows the claim at `rv`: an answered write it has caught up
    /// with ends, and so does a write of unknown outcome once the claim
    /// changed since it was read. A write still in flight stays (its event
    /// may come before its answer; [`Overlay::written`] and
    /// [`Overlay::unknown`] settle that).
    pub fn observe(&mut self, claim_uid: &str, rv: Option<&str>) {
        if self.by_uid.get(claim_uid).is_some_and(|a| {
            let at = a.claim.metadata.resource_version.as_deref();
            match a.outcome {
                Outcome::Written => caught_up(rv, at),
                Outcome::Unknown => changed(rv, at),
                Outcome::InFlight => false,
            }
        }) {
            self.by_uid.remove(claim_uid);
        }
    }

    /// Drops assumed entries past their deadline; returns how many. Written
    /// ones stay until the watch shows them or the claim is gone.
    pub fn expire(&mut self, now: Instant) -> usize {
        let before = self.by_uid.len();
        self.by_uid
            .retain(|_, a| a.outcome == Outcome::Written || a.expires > now);
        before - self.by_uid.len()
    }

    /// A relist: entries of claims it does not hold are gone with their claims.
    pub fn retain_listed(&mut self, listed: &std::collections::BTreeSet<String>) {
        self.by_uid.retain(|u, _| listed.contains(u));
    }

    /// Written entries the watch has not shown yet (a stalled watch keeps them).
    pub fn written_waiting(&self) -> usize {
        self.by_uid
            .values()
            .filter(|a| a.outcome == Outcome::Written)
            .count()
    }

    /// The assumed claim of `claim_uid`, if any.
    pub fn get(&self, claim_uid: &str) -> Option<&ResourceClaim> {
        self.by_uid.get(claim_uid).map(|a| &a.claim)
    }

    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(uid: &str, rv: &str) -> ResourceClaim {
        let mut c = ResourceClaim::default();
        c.metadata.uid = Some(uid.into());
        c.metadata.resource_version = Some(rv.into());
        c
    }

    #[test]
    fn an_assumed_claim_lasts_until_the_watch_catches_up_or_its_deadline() {
        let t0 = Instant::now();
        let mut o = Overlay::default();
        o.assume(claim("u", "10"), t0);
        // An event for the claim while the write is in flight keeps it.
        o.observe("u", Some("11"));
        assert!(o.get("u").is_some());
        // Answered at rv 12; the watch has shown 11 only.
        o.written(claim("u", "12"), Some("11"), t0);
        o.observe("u", Some("11"));
        assert!(o.get("u").is_some());
        o.observe("u", Some("12"));
        assert!(o.get("u").is_none());
        // An answer the watch already showed is not kept.
        o.written(claim("v", "7"), Some("8"), t0);
        assert!(o.is_empty());
        // Confirmed by the server: kept past any deadline while the watch
        // stalls (defect 4), until the watch shows it or the claim is gone.
        o.written(claim("y", "20"), Some("19"), t0);
        assert_eq!(o.expire(t0 + ASSUME_TTL * 10), 0);
        assert!(o.get("y").is_some());
        assert_eq!(o.written_waiting(), 1);
        o.retain_listed(&["y".to_string()].into());
        assert!(o.get("y").is_some());
        o.retain_listed(&Default::default());
        assert!(o.is_empty());
        // Unconfirmed: gone at the deadline, not before.
        o.assume(claim("w", "3"), t0);
        assert_eq!(o.expire(t0 + ASSUME_TTL - Duration::from_millis(1)), 0);
        assert_eq!(o.expire(t0 + ASSUME_TTL), 1);
        o.assume(claim("x", "3"), t0);
        o.forget("x");
        assert!(o.is_empty());
    }

    /// A write that failed and may have landed keeps its devices taken, is
    /// never taken as written, and ends once the watch shows the claim
    /// changed since it was read (at 10 here), not before.
    #[test]
    fn a_write_of_unknown_outcome_lasts_until_the_claim_changes() {
        let t0 = Instant::now();
        let mut o = Overlay::default();
        o.assume(claim("u", "10"), t0);
        assert!(!o.is_unknown("u"));
        o.unknown("u", Some("10"));
        assert!(o.is_unknown("u") && o.get("u").is_some());
        // The claim as read: the write did not land, or not yet.
        o.observe("u", Some("10"));
        assert!(o.is_unknown("u"));
        o.observe("u", Some("11"));
        assert!(o.get("u").is_none() && !o.is_unknown("u"));
        // The watch had shown the outcome before the failure was known.
        o.assume(claim("v", "10"), t0);
        o.unknown("v", Some("12"));
        assert!(o.is_empty());
        // Unknown for a claim not assumed: nothing.
        o.unknown("w", Some("1"));
        assert!(o.is_empty());
        // Still bounded by the deadline.
        o.assume(claim("x", "3"), t0);
        o.unknown("x", None);
        assert_eq!(o.expire(t0 + ASSUME_TTL), 1);
    }

    #[test]
    fn resource_versions_compare_as_revisions_or_else_only_when_equal() {
        assert!(caught_up(Some("10"), Some("9")));
        assert!(!caught_up(Some("9"), Some("10")));
        assert!(caught_up(Some("a"), Some("a")));
        assert!(!caught_up(Some("b"), Some("a")));
        assert!(!caught_up(None, Some("1")));
        assert!(changed(Some("10"), Some("9")));
        assert!(!changed(Some("9"), Some("9")));
        assert!(changed(Some("b"), Some("a")));
        assert!(!changed(None, Some("1")));
    }
}
