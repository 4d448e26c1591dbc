//! The one mirror a process shares between its watchers, the extender's
//! handlers, the standalone loop, the preemptor and the web view.

use std::sync::{Arc, Mutex, MutexGuard};

use super::Mirror;

/// A mirror behind a lock, cheap to clone (every clone is the same mirror).
#[derive(Clone)]
pub struct SharedMirror(Arc<Mutex<Mirror>>);

impl SharedMirror {
    pub fn new(mirror: Mirror) -> SharedMirror {
        SharedMirror(Arc::new(Mutex::new(mirror)))
    }

    /// Locks the mirror. A panic in another holder does not make the data
    /// unusable (every mutation keeps the ledger consistent before it can
    /// panic), so a poisoned lock is taken as it is.
    pub fn lock(&self) -> MutexGuard<'_, Mirror> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder that panicked leaves the mirror usable by the others.
    #[test]
    fn a_poisoned_lock_still_hands_out_the_mirror() {
        let shared = SharedMirror::new(Mirror::new(
            tessera_core::policy::by_name("binpack", &Default::default()).unwrap(),
            b"k".to_vec(),
        ));
        let other = shared.clone();
        let _ = std::thread::spawn(move || {
            let _g = other.lock();
            panic!("a holder panics");
        })
        .join();
        assert!(shared.0.is_poisoned());
        assert_eq!(shared.lock().key(), b"k");
    }
}
