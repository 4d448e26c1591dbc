//! What devices are holding, by consumer and by device: one model for every
//! allocator's holdings (issue 41). A holding is what one consumer takes of
//! one device — the whole device, a share of its consumable capacities, or a
//! holding that cannot be verified and so takes the whole device whatever it
//! allows. The DRA adapter (`tessera-k8s` `dra`) fills it from allocated
//! ResourceClaims (consumer: the claim's UID), whoever allocated them, from
//! what this scheduler assumed it wrote, and from the `tessera.io` grants on
//! the same GPUs (consumer: the grant's allocation); preemption plans ask what
//! is left once their victims' consumers hold nothing ([`Holdings::without`]);
//! the allocator asks it what is left of a device ([`DeviceUse`]). Adding
//! follows one rule here and freeing is adding the rest again, so no caller
//! counts or subtracts a holding its own way.
//!
//! Pure: keys and quantities in, sums out.

use std::collections::BTreeMap;

use crate::quantity::Quantity;

/// A device by name: `<driver>/<pool>/<device>` (a DRA device's identity; the
/// pool of a node's devices is named after the node).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceKey {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

impl std::fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// What one allocation takes of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// The whole device: an allocation that names no consumed capacity (on a
    /// shareable device, another allocator's whole allocation).
    Whole,
    /// A share: these amounts of the device's consumable capacities.
    Share(BTreeMap<String, Quantity>),
    /// A holding whose amounts cannot be verified (an unreadable quantity, an
    /// allocation of an object that does not read, or one whose amounts do not
    /// add up): it takes the device whole, as an unverifiable grant blocks its GPU.
    Unverifiable,
}

/// What every holding of one device adds up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceUse {
    /// Allocations holding it.
    pub allocations: u32,
    /// Capacity consumed by shares, summed.
    pub consumed: BTreeMap<String, Quantity>,
    /// Holdings that take the whole device whatever it allows ([`Hold::Whole`]
    /// and [`Hold::Unverifiable`], and a share whose sum overflows). No share
    /// and no allocation gets the device while one is there.
    pub exclusive: u32,
}

impl DeviceUse {
    /// Nothing holds the device.
    pub fn is_free(&self) -> bool {
        self.allocations == 0 && self.exclusive == 0
    }

    /// Adds one holding.
    pub fn hold(&mut self, hold: &Hold) {
        self.allocations = self.allocations.saturating_add(1);
        match hold {
            Hold::Whole | Hold::Unverifiable => self.exclusive = self.exclusive.saturating_add(1),
            Hold::Share(amounts) => self.consume(amounts),
        }
    }

    /// Adds `amounts` to what shares consumed; a sum that overflows takes the
    /// device whole (it can no longer be checked).
    fn consume(&mut self, amounts: &BTreeMap<String, Quantity>) {
        let mut sound = true;
        for (name, q) in amounts {
            let sum = self.consumed.entry(name.clone()).or_default();
            match sum.checked_add(*q) {
                Some(t) => *sum = t,
                None => sound = false,
            }
        }
        if !sound {
            self.exclusive = self.exclusive.saturating_add(1);
        }
    }
}

/// Who holds: the name an allocator gives a holder (a ResourceClaim's UID, a
/// `tessera.io` grant's allocation), the same for all of its holdings.
pub type Consumer = String;

/// What one consumer holds: its holdings, and why those that cannot be
/// verified cannot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    pub holds: Vec<(DeviceKey, Hold)>,
    pub unverifiable: Vec<String>,
}

/// Every device's holdings, kept by consumer; the per-device sums are those
/// holdings added up by [`DeviceUse::hold`], the one rule, so what a set of
/// consumers frees ([`Holdings::without`]) is the sum of the others, counted
/// as from the start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holdings {
    /// Per device, what its holdings add up to.
    pub devices: BTreeMap<DeviceKey, DeviceUse>,
    by: BTreeMap<Consumer, Held>,
}

impl Holdings {
    /// Adds `consumer`'s holding of `key`.
    pub fn hold(&mut self, consumer: &str, key: DeviceKey, hold: Hold) {
        self.devices.entry(key.clone()).or_default().hold(&hold);
        self.by
            .entry(consumer.to_string())
            .or_default()
            .holds
            .push((key, hold));
    }

    /// Adds a holding of `key` by `consumer` that cannot be verified, saying
    /// why.
    pub fn hold_unverifiable(&mut self, consumer: &str, key: DeviceKey, why: String) {
        self.hold(consumer, key, Hold::Unverifiable);
        self.by
            .entry(consumer.to_string())
            .or_default()
            .unverifiable
            .push(why);
    }

    /// Adds everything `other` holds, consumer by consumer.
    pub fn add(&mut self, other: &Holdings) {
        for (consumer, held) in &other.by {
            self.add_held(consumer, held);
        }
    }

    fn add_held(&mut self, consumer: &str, held: &Held) {
        for (key, hold) in &held.holds {
            self.hold(consumer, key.clone(), hold.clone());
        }
        self.by
            .entry(consumer.to_string())
            .or_default()
            .unverifiable
            .extend(held.unverifiable.iter().cloned());
    }

    /// What is held once `gone` hold nothing (what leaving consumers free):
    /// the other consumers' holdings, added up again.
    pub fn without<'a>(&self, gone: impl IntoIterator<Item = &'a str>) -> Holdings {
        let gone: std::collections::BTreeSet<&str> = gone.into_iter().collect();
        let mut out = Holdings::default();
        for (consumer, held) in &self.by {
            if !gone.contains(consumer.as_str()) {
                out.add_held(consumer, held);
            }
        }
        out
    }

    /// What `consumer` holds (nothing: empty).
    pub fn held_by(&self, consumer: &str) -> &[(DeviceKey, Hold)] {
        self.by.get(consumer).map_or(&[], |h| &h.holds)
    }

    /// Why the holdings that could not be verified could not (their devices
    /// are held whole).
    pub fn unreadable(&self) -> impl Iterator<Item = &str> {
        self.by
            .values()
            .flat_map(|h| &h.unverifiable)
            .map(String::as_str)
    }

    /// Every consumer holding something.
    pub fn consumers(&self) -> impl Iterator<Item = &str> {
        self.by.keys().map(String::as_str)
    }

    /// What holds device `key` (nothing: the default).
    pub fn of(&self, key: &DeviceKey) -> DeviceUse {
        self.devices.get(key).cloned().unwrap_or_default()
    }
}

/// What one consumer holds of one GPU, by the GPU's UUID: how a holding of a
/// DRA device is counted where GPUs are known by UUID (the ledger of a node
/// whose `GpuNode` still lists them).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuHold {
    /// The node.
    pub node: String,
    /// The GPU's UUID (for a MIG device, its parent's).
    pub uuid: String,
    /// Who holds it ([`Consumer`]).
    pub consumer: Consumer,
    /// A share of the GPU: memory MiB and compute per mille. `None`: the
    /// whole GPU (a whole device, a MIG device of it, an unverifiable holding,
    /// a share whose memory is not known).
    pub share: Option<(u64, u32)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(d: &str) -> DeviceKey {
        DeviceKey {
            driver: "gpu.tessera.io".into(),
            pool: "n1".into(),
            device: d.into(),
        }
    }

    fn share(mib: i64) -> Hold {
        Hold::Share(BTreeMap::from([(
            "memory".to_string(),
            Quantity::from_units(mib << 20),
        )]))
    }

    #[test]
    fn holdings_add_up_by_consumer_and_free_what_leaves() {
        let mut all = Holdings::default();
        all.hold("c1", key("gpu-0"), share(1024));
        all.hold("c2", key("gpu-0"), share(2048));
        all.hold("c2", key("gpu-1"), Hold::Whole);
        let g0 = all.of(&key("gpu-0"));
        assert_eq!((g0.allocations, g0.exclusive), (2, 0));
        assert_eq!(g0.consumed["memory"], Quantity::from_units(3072 << 20));
        assert_eq!(all.of(&key("gpu-1")).exclusive, 1);
        assert_eq!(all.held_by("c2").len(), 2);
        assert_eq!(all.consumers().collect::<Vec<_>>(), ["c1", "c2"]);

        // c2 leaves: its share and its whole GPU are free.
        let after = all.without(["c2"]);
        assert_eq!(after.of(&key("gpu-0")).allocations, 1);
        assert_eq!(
            after.of(&key("gpu-0")).consumed["memory"],
            Quantity::from_units(1024 << 20)
        );
        assert!(!after.devices.contains_key(&key("gpu-1")));
        assert!(after.held_by("c2").is_empty());
        // Nobody leaving, or a consumer holding nothing: the same sums.
        assert_eq!(all.without([]), all);
        assert_eq!(all.without(["nobody"]), all);
        assert!(all.without(["c1", "c2"]).devices.is_empty());

        // Adding what left gives the sums back.
        let mut back = after.clone();
        let mut leaving = Holdings::default();
        leaving.hold("c2", key("gpu-0"), share(2048));
        leaving.hold("c2", key("gpu-1"), Hold::Whole);
        back.add(&leaving);
        assert_eq!(back.devices, all.devices);
    }

    /// A holding that cannot be verified, or whose sum overflows, takes the
    /// device whole.
    #[test]
    fn what_cannot_be_counted_blocks_the_device() {
        let mut h = Holdings::default();
        h.hold_unverifiable("c", key("gpu-0"), "claim c: gpu-0: bad quantity".into());
        assert_eq!(h.of(&key("gpu-0")).exclusive, 1);
        assert_eq!(h.unreadable().count(), 1);
        // The reason leaves with its consumer.
        assert_eq!(h.without(["c"]).unreadable().count(), 0);
        assert_eq!(h.without(["other"]).unreadable().count(), 1);

        let huge = Hold::Share(BTreeMap::from([(
            "memory".to_string(),
            Quantity::from_nano(i128::MAX - 1),
        )]));
        h.hold("d", key("gpu-1"), huge.clone());
        assert_eq!(h.of(&key("gpu-1")).exclusive, 0);
        h.hold("e", key("gpu-1"), huge);
        assert_eq!(h.of(&key("gpu-1")).exclusive, 1, "{h:?}");
        assert!(!h.of(&key("gpu-1")).is_free());
        // Once either share leaves, the other is counted again, soundly.
        let one = h.without(["e"]).of(&key("gpu-1"));
        assert_eq!((one.allocations, one.exclusive), (1, 0));
    }
}
