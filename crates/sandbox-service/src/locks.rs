//! Taking the daemon's locks: one rule for all of them.
//!
//! Every table behind these locks (boxes, execs, tasks, connections, tokens) is changed in
//! single steps under its lock — an insert, a remove, a field set — with nothing that can
//! panic half-way through, so a lock poisoned by a panic elsewhere in the holding task still
//! guards consistent data. The daemon then keeps serving instead of failing every later
//! request that takes the lock; the panic itself has already been reported.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// [`Mutex::lock`], recovering a poisoned lock's guard (see the module doc for why that is
/// sound here).
pub(crate) trait Locked<T> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|poisoned: PoisonError<_>| {
            tracing::error!("a daemon lock was poisoned by a panic; continuing with its data");
            poisoned.into_inner()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_gives_its_data() {
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _guard = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        m.locked().push(2);
        assert_eq!(*m.locked(), [1, 2]);
    }
}
