//! The allocator: can this node satisfy the claim, and with which devices? Pure.
//!
//! Requests are satisfied in order; for each, its alternatives (the request, or
//! its `firstAvailable` subrequests in order) are tried until one can be
//! satisfied together with every later request. A device matches when the
//! class's and the request's selectors all say so; it is available when no
//! other claim holds it (or, for a device that allows several allocations,
//! when its capacities and counters have room for the share) and its taints
//! are tolerated. `adminAccess` takes matching devices whatever holds them, and
//! holds nothing itself. `matchAttribute` constraints are tried value by value
//! (best scored first), `distinctAttribute` ones exclude values already taken.
//!
//! Among the devices a request may take, [`super::choose`] picks with Tessera's
//! policy (and partitionable MIG placements by the core's MIG layout,
//! [`super::mig`]); the node's score is the sum of the picks' scores, so the
//! caller can rank nodes. A node that cannot satisfy the claim gets a typed
//! [`Unfit`].

use std::collections::BTreeMap;

use tessera_core::policy::Policy;

use super::cel::{AttrValue, Env};
use super::choose::{Host, choose};
use super::claim::{Alternative, ClaimAsk, ClaimError, ConstraintKind, MAX_RESULTS, Mode};
use super::inventory::{DeviceKey, DeviceUse, Holdings, NodeInventory, UseOf};
use super::quantity::Quantity;
use super::types::DeviceToleration;

/// One device given to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    /// `<request>` or `<request>/<subrequest>`.
    pub request: String,
    pub device: DeviceKey,
    pub admin_access: bool,
    /// What a share consumes (every capacity of the device); empty when the
    /// device is taken whole.
    pub consumed: BTreeMap<String, Quantity>,
}

/// The claim's devices on one node, and the policy's score of them.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeAllocation {
    pub node: String,
    pub results: Vec<Chosen>,
    pub score: f64,
}

/// Why a node cannot satisfy a claim (a "does not fit", not an error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    #[error("request {request}: no device matches its class and selectors")]
    NoMatchingDevice { request: String },
    #[error("request {request}: {want} matching device(s) wanted, {free} available")]
    NotEnoughDevices {
        request: String,
        want: u32,
        free: u32,
    },
    #[error("request {request}: allocationMode All, but {busy} of the matching devices are in use")]
    AllBusy { request: String, busy: u32 },
    #[error("request {request}: allocationMode All, but pool {pool} is incomplete")]
    PoolIncomplete { request: String, pool: String },
    #[error("request {request}: no devices satisfy the claim's constraints together")]
    Constraints { request: String },
    #[error("the policy declined the node")]
    PolicyDeclined,
    #[error(
        "{results} devices would be allocated, but the API server stores at most {MAX_RESULTS} results in one claim's allocation"
    )]
    TooManyResults { results: usize },
}

/// Device `i` of the node: what other claims hold, plus this claim's picks.
struct State<'a> {
    inv: &'a NodeInventory,
    usage: &'a Holdings,
    picks: Vec<(usize, Chosen)>,
}

impl State<'_> {
    fn counters_used(&self, set: &(String, String, String), counter: &str) -> Quantity {
        let mut sum = Quantity::ZERO;
        for (i, d) in self.inv.devices.iter().enumerate() {
            let key = (d.key.driver.clone(), d.key.pool.clone());
            if key.0 != set.0 || key.1 != set.1 || self.use_of(i).allocations == 0 {
                continue;
            }
            if let Some(q) = d.consumes.get(&set.2).and_then(|c| c.get(counter)) {
                sum = sum.checked_add(*q).unwrap_or(sum);
            }
        }
        sum
    }

    /// Whether taking device `i` (not held yet) leaves every counter it consumes ≥ 0.
    fn counters_fit(&self, i: usize) -> bool {
        let d = &self.inv.devices[i];
        d.consumes.iter().all(|(set, counters)| {
            let k = (d.key.driver.clone(), d.key.pool.clone(), set.clone());
            let Some(total) = self.inv.counters.get(&k) else {
                return false;
            };
            counters.iter().all(|(c, want)| {
                let left = total.get(c).map_or(Quantity::ZERO, |t| {
                    t.saturating_sub(self.counters_used(&k, c))
                });
                *want <= left
            })
        })
    }
}

impl UseOf for State<'_> {
    fn use_of(&self, i: usize) -> DeviceUse {
        let key = &self.inv.devices[i].key;
        let mut u = self.usage.devices.get(key).cloned().unwrap_or_default();
        for (j, c) in &self.picks {
            if *j == i && !c.admin_access {
                u.allocations += 1;
                for (k, q) in &c.consumed {
                    let s = u.consumed.entry(k.clone()).or_default();
                    *s = s.checked_add(*q).unwrap_or(*s);
                }
            }
        }
        u
    }

    fn counters_touched(&self, i: usize) -> bool {
        let d = &self.inv.devices[i];
        d.consumes.iter().any(|(set, counters)| {
            let k = (d.key.driver.clone(), d.key.pool.clone(), set.clone());
            counters
                .keys()
                .any(|c| self.counters_used(&k, c) > Quantity::ZERO)
        })
    }

    fn counters_left(&self, i: usize) -> i128 {
        let d = &self.inv.devices[i];
        let mut left = 0i128;
        for set in d.consumes.keys() {
            let k = (d.key.driver.clone(), d.key.pool.clone(), set.clone());
            for (c, total) in self.inv.counters.get(&k).into_iter().flatten() {
                left += total.saturating_sub(self.counters_used(&k, c)).nano();
            }
        }
        left
    }
}

fn tolerated(taint: &super::types::DeviceTaint, tolerations: &[DeviceToleration]) -> bool {
    if !matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute") {
        return true;
    }
    tolerations.iter().any(|t| {
        let effect_ok = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == taint.effect);
        let key_ok = t
            .key
            .as_deref()
            .is_none_or(|k| k.is_empty() || k == taint.key);
        let value_ok = match t.operator.as_deref().unwrap_or("Equal") {
            "Exists" => true,
            _ => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        };
        effect_ok && key_ok && value_ok
    })
}

/// What device `i` would consume for `alt` (`Some(empty)`: taken whole), or
/// `None` when it is not available to it.
fn available(state: &State<'_>, i: usize, alt: &Alternative) -> Option<BTreeMap<String, Quantity>> {
    let d = &state.inv.devices[i];
    if !d.taints.iter().all(|t| tolerated(t, &alt.tolerations)) {
        return None;
    }
    if alt.admin_access {
        return Some(BTreeMap::new());
    }
    let u = state.use_of(i);
    // A capacity the device does not have cannot be given.
    if alt.capacity.keys().any(|k| !d.capacity.contains_key(k)) {
        return None;
    }
    if !d.shared {
        let fits = alt
            .capacity
            .iter()
            .all(|(k, q)| d.capacity.get(k).is_some_and(|c| *q <= c.value));
        return (u.is_free() && fits && state.counters_fit(i)).then(BTreeMap::new);
    }
    if u.exclusive > 0 {
        return None;
    }
    let mut consumed = BTreeMap::new();
    for (k, cap) in &d.capacity {
        let take = cap.consumed_by(alt.capacity.get(k).copied())?;
        let used = u.consumed.get(k).copied().unwrap_or_default();
        if used.checked_add(take)? > cap.value {
            return None;
        }
        consumed.insert(k.clone(), take);
    }
    // Counters are paid once, by the first share.
    (u.allocations > 0 || state.counters_fit(i)).then_some(consumed)
}

/// Decides whether `inv`'s node can satisfy `ask`, given what `usage` says other
/// claims hold, choosing devices with `policy` (which sees the node's `host`
/// resources and the pod's ask of them with the claim's first request).
pub fn allocate(
    ask: &ClaimAsk,
    inv: &NodeInventory,
    usage: &Holdings,
    policy: &dyn Policy,
    env: &Env,
    host: Host,
) -> Result<Result<NodeAllocation, Unfit>, ClaimError> {
    // Selectors are evaluated once per (alternative, device); an error is the claim's.
    let mut matches: Vec<Vec<Vec<bool>>> = Vec::new();
    for (r, req) in ask.requests.iter().enumerate() {
        let mut per_alt = Vec::new();
        for (a, alt) in req.alternatives.iter().enumerate() {
            let mut m = Vec::with_capacity(inv.devices.len());
            for d in &inv.devices {
                let mut ok = true;
                for (k, s) in alt.selectors.iter().enumerate() {
                    if !s
                        .matches(env, &d.cel)
                        .map_err(|source| ClaimError::Selector {
                            field: format!(
                                "request {} alternative {a} selector {k} on device {}",
                                ask.requests[r].name, d.key
                            ),
                            source,
                        })?
                    {
                        ok = false;
                        break;
                    }
                }
                m.push(ok);
            }
            per_alt.push(m);
        }
        matches.push(per_alt);
    }
    let mut state = State {
        inv,
        usage,
        picks: Vec::new(),
    };
    let mut search = Search {
        ask,
        matches: &matches,
        policy,
        host,
        first_unfit: None,
    };
    Ok(match search.request(0, &mut state) {
        Some(score) => Ok(NodeAllocation {
            node: inv.node.clone(),
            results: state.picks.into_iter().map(|(_, c)| c).collect(),
            score,
        }),
        None => Err(search.first_unfit.unwrap_or(Unfit::PolicyDeclined)),
    })
}

struct Search<'a> {
    ask: &'a ClaimAsk,
    matches: &'a [Vec<Vec<bool>>],
    policy: &'a dyn Policy,
    host: Host,
    first_unfit: Option<Unfit>,
}

impl Search<'_> {
    fn unfit(&mut self, u: Unfit) {
        self.first_unfit.get_or_insert(u);
    }

    /// Satisfies requests `r..`; on success the picks stay in `state`.
    fn request(&mut self, r: usize, state: &mut State<'_>) -> Option<f64> {
        let Some(req) = self.ask.requests.get(r) else {
            // More results than the API server stores (allocationMode All on
            // a node with many matching devices): no allocation on this node.
            if state.picks.len() > MAX_RESULTS {
                self.unfit(Unfit::TooManyResults {
                    results: state.picks.len(),
                });
                return None;
            }
            return Some(0.0);
        };
        for (a, alt) in req.alternatives.iter().enumerate() {
            if let Some(score) = self.alternative(r, a, alt, state) {
                return Some(score);
            }
        }
        None
    }

    /// The attribute values this alternative's devices must have (matchAttribute
    /// with a value fixed by earlier picks), must avoid (distinctAttribute), and
    /// the matchAttribute names still free.
    fn constraint_filter(&self, alt: &Alternative, state: &State<'_>, i: usize) -> bool {
        let d = &state.inv.devices[i];
        for c in self.ask.constraints.iter().filter(|c| c.covers(&alt.name)) {
            let earlier = state
                .picks
                .iter()
                .filter(|(_, p)| c.covers(&p.request))
                .map(|(j, _)| &state.inv.devices[*j]);
            match &c.kind {
                ConstraintKind::Match(attr) => {
                    let Some(v) = d.attribute(attr) else {
                        return false;
                    };
                    if earlier.into_iter().any(|e| e.attribute(attr) != Some(v)) {
                        return false;
                    }
                }
                ConstraintKind::Distinct(attr) => {
                    let Some(v) = d.attribute(attr) else {
                        return false;
                    };
                    if earlier.into_iter().any(|e| e.attribute(attr) == Some(v)) {
                        return false;
                    }
                }
            }
        }
        true
    }

    fn alternative(
        &mut self,
        r: usize,
        a: usize,
        alt: &Alternative,
        state: &mut State<'_>,
    ) -> Option<f64> {
        let matching: Vec<usize> = (0..state.inv.devices.len())
            .filter(|&i| self.matches[r][a][i])
            .collect();
        if matching.is_empty() {
            self.unfit(Unfit::NoMatchingDevice {
                request: alt.name.clone(),
            });
            return None;
        }
        let free: Vec<(usize, BTreeMap<String, Quantity>)> = matching
            .iter()
            .filter_map(|&i| available(state, i, alt).map(|c| (i, c)))
            .collect();
        let base = state.picks.len();
        match alt.mode {
            Mode::All => {
                if let Some(d) = matching
                    .iter()
                    .find(|&&i| !state.inv.devices[i].pool_complete)
                {
                    let pool = state.inv.devices[*d].key.pool.clone();
                    self.unfit(Unfit::PoolIncomplete {
                        request: alt.name.clone(),
                        pool,
                    });
                    return None;
                }
                if free.len() < matching.len() {
                    self.unfit(Unfit::AllBusy {
                        request: alt.name.clone(),
                        busy: (matching.len() - free.len()) as u32,
                    });
                    return None;
                }
                for (i, consumed) in free {
                    if !self.constraint_filter(alt, state, i) {
                        state.picks.truncate(base);
                        self.unfit(Unfit::Constraints {
                            request: alt.name.clone(),
                        });
                        return None;
                    }
                    self.push(state, i, alt, consumed);
                }
                match self.request(r + 1, state) {
                    Some(s) => Some(s),
                    None => {
                        state.picks.truncate(base);
                        None
                    }
                }
            }
            Mode::Count(n) => {
                if (free.len() as u32) < n {
                    self.unfit(Unfit::NotEnoughDevices {
                        request: alt.name.clone(),
                        want: n,
                        free: free.len() as u32,
                    });
                    return None;
                }
                self.count(r, alt, n, &free, state)
            }
        }
    }

    fn push(
        &self,
        state: &mut State<'_>,
        i: usize,
        alt: &Alternative,
        consumed: BTreeMap<String, Quantity>,
    ) {
        let device = state.inv.devices[i].key.clone();
        state.picks.push((
            i,
            Chosen {
                request: alt.name.clone(),
                device,
                admin_access: alt.admin_access,
                consumed,
            },
        ));
    }

    /// `n` devices of `free` for `alt`, then the later requests.
    fn count(
        &mut self,
        r: usize,
        alt: &Alternative,
        n: u32,
        free: &[(usize, BTreeMap<String, Quantity>)],
        state: &mut State<'_>,
    ) -> Option<f64> {
        let ok: Vec<usize> = free
            .iter()
            .map(|(i, _)| *i)
            .filter(|&i| self.constraint_filter(alt, state, i))
            .collect();
        // Groups: devices sharing the values of the matchAttributes that cover
        // this alternative (one group when none does); distinctAttribute keeps
        // one device per value inside a group.
        let mut groups: BTreeMap<Vec<Option<AttrValue>>, Vec<usize>> = BTreeMap::new();
        for &i in &ok {
            let d = &state.inv.devices[i];
            let mut key = Vec::new();
            let mut distinct_seen = false;
            for c in self.ask.constraints.iter().filter(|c| c.covers(&alt.name)) {
                match &c.kind {
                    ConstraintKind::Match(attr) => key.push(d.attribute(attr).cloned()),
                    ConstraintKind::Distinct(attr) => {
                        let v = d.attribute(attr).cloned();
                        let g = groups.entry(key.clone()).or_default();
                        distinct_seen |= g
                            .iter()
                            .any(|&j| state.inv.devices[j].attribute(attr).cloned() == v);
                    }
                }
            }
            if !distinct_seen {
                groups.entry(key).or_default().push(i);
            }
        }
        // Score each group's best pick, then try them best first.
        let consumed_of = |i: usize| {
            free.iter()
                .find(|(j, _)| *j == i)
                .map(|(_, c)| c.clone())
                .unwrap_or_default()
        };
        let mut options: Vec<(f64, Vec<usize>)> = Vec::new();
        for members in groups.values() {
            if (members.len() as u32) < n {
                continue;
            }
            let consumed = consumed_of(members[0]);
            let host = if r == 0 {
                self.host
            } else {
                self.host.after_ask()
            };
            if let Some((pick, score)) =
                choose(self.policy, state.inv, &*state, members, n, &consumed, host)
            {
                options.push((score, pick));
            }
        }
        if options.is_empty() {
            self.unfit(if groups.values().any(|g| g.len() as u32 >= n) {
                Unfit::PolicyDeclined
            } else {
                Unfit::Constraints {
                    request: alt.name.clone(),
                }
            });
            return None;
        }
        options.sort_by(|a, b| b.0.total_cmp(&a.0));
        let base = state.picks.len();
        for (score, pick) in options {
            for &i in &pick {
                self.push(state, i, alt, consumed_of(i));
            }
            if let Some(rest) = self.request(r + 1, state) {
                return Some(score + rest);
            }
            state.picks.truncate(base);
        }
        None
    }
}
