//! What devices are holding, by device: one model for every allocator's
//! holdings (issue 41). A holding is what one allocation takes of one device —
//! the whole device, a share of its consumable capacities, or a holding that
//! cannot be verified and so takes the whole device whatever it allows. The DRA
//! adapter (`tessera-k8s` `dra`) fills it from allocated ResourceClaims, whoever
//! allocated them, and from what this scheduler assumed it wrote; preemption
//! plans subtract what victims free from it ([`Holdings::release`]); the
//! allocator asks it what is left of a device ([`DeviceUse`]). Adding and
//! subtracting follow one rule here, so no caller counts a holding its own way.
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

    /// Takes away what `other` (a sum of holdings of this device) holds.
    pub fn release(&mut self, other: &DeviceUse) {
        self.allocations = self.allocations.saturating_sub(other.allocations);
        self.exclusive = self.exclusive.saturating_sub(other.exclusive);
        for (name, q) in &other.consumed {
            if let Some(sum) = self.consumed.get_mut(name) {
                *sum = sum.saturating_sub(*q);
            }
        }
    }
}

/// Every device's holdings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holdings {
    pub devices: BTreeMap<DeviceKey, DeviceUse>,
    /// Holdings that could not be verified, and why (their devices held whole).
    pub unreadable: Vec<String>,
}

impl Holdings {
    /// Adds one allocation's holding of `key`.
    pub fn hold(&mut self, key: DeviceKey, hold: &Hold) {
        self.devices.entry(key).or_default().hold(hold);
    }

    /// Adds a holding of `key` that cannot be verified, saying why.
    pub fn hold_unverifiable(&mut self, key: DeviceKey, why: String) {
        self.hold(key, &Hold::Unverifiable);
        self.unreadable.push(why);
    }

    /// Adds everything `other` holds.
    pub fn add(&mut self, other: &Holdings) {
        for (key, u) in &other.devices {
            let e = self.devices.entry(key.clone()).or_default();
            e.allocations = e.allocations.saturating_add(u.allocations);
            e.exclusive = e.exclusive.saturating_add(u.exclusive);
            e.consume(&u.consumed);
        }
        self.unreadable.extend(other.unreadable.iter().cloned());
    }

    /// Takes away what `other` holds (what leaving allocations free); devices
    /// left with nothing are dropped.
    pub fn release(&mut self, other: &Holdings) {
        for (key, u) in &other.devices {
            if let Some(e) = self.devices.get_mut(key) {
                e.release(u);
                if e.is_free() {
                    self.devices.remove(key);
                }
            }
        }
    }

    /// What holds device `key` (nothing: the default).
    pub fn of(&self, key: &DeviceKey) -> DeviceUse {
        self.devices.get(key).cloned().unwrap_or_default()
    }
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
    fn holdings_add_up_and_release_to_nothing() {
        let mut all = Holdings::default();
        all.hold(key("gpu-0"), &share(1024));
        all.hold(key("gpu-0"), &share(2048));
        all.hold(key("gpu-1"), &Hold::Whole);
        let g0 = all.of(&key("gpu-0"));
        assert_eq!((g0.allocations, g0.exclusive), (2, 0));
        assert_eq!(g0.consumed["memory"], Quantity::from_units(3072 << 20));
        assert_eq!(all.of(&key("gpu-1")).exclusive, 1);

        let mut leaving = Holdings::default();
        leaving.hold(key("gpu-0"), &share(1024));
        leaving.hold(key("gpu-1"), &Hold::Whole);
        let mut after = all.clone();
        after.release(&leaving);
        assert_eq!(after.of(&key("gpu-0")).allocations, 1);
        assert_eq!(
            after.of(&key("gpu-0")).consumed["memory"],
            Quantity::from_units(2048 << 20)
        );
        assert!(!after.devices.contains_key(&key("gpu-1")));

        // Adding what left gives the whole back.
        after.add(&leaving);
        assert_eq!(after, all);
    }

    /// A holding that cannot be verified, or whose sum overflows, takes the
    /// device whole.
    #[test]
    fn what_cannot_be_counted_blocks_the_device() {
        let mut h = Holdings::default();
        h.hold_unverifiable(key("gpu-0"), "claim c: gpu-0: bad quantity".into());
        assert_eq!(h.of(&key("gpu-0")).exclusive, 1);
        assert_eq!(h.unreadable.len(), 1);

        let huge = Hold::Share(BTreeMap::from([(
            "memory".to_string(),
            Quantity::from_nano(i128::MAX - 1),
        )]));
        h.hold(key("gpu-1"), &huge);
        assert_eq!(h.of(&key("gpu-1")).exclusive, 0);
        h.hold(key("gpu-1"), &huge);
        assert_eq!(h.of(&key("gpu-1")).exclusive, 1, "{h:?}");
        assert!(!h.of(&key("gpu-1")).is_free());
    }
}
