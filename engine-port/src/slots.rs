//! An engine's slots: the one count of the sequences it runs. A sequence needs a
//! [`SlotPermit`] to start; the engine gives the permit back when it lets go of the sequence's
//! row (after its last event), so a slot is free exactly when the engine can run another
//! sequence in it. Whoever holds a permit may hang hooks on its release (a pool wakes its
//! dispatcher; a worker link finishes a drain).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

struct Count {
    capacity: usize,
    used: AtomicUsize,
}

/// The slots of one engine (cheap to clone: clones count the same slots).
#[derive(Clone)]
pub struct Slots(Arc<Count>);

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slots({}/{})", self.in_use(), self.capacity())
    }
}

impl Slots {
    pub fn new(capacity: usize) -> Self {
        Self(Arc::new(Count {
            capacity,
            used: AtomicUsize::new(0),
        }))
    }

    /// One slot, or `None` when all are taken.
    pub fn try_acquire(&self) -> Option<SlotPermit> {
        let cap = self.0.capacity;
        self.0
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()?;
        Some(SlotPermit {
            count: self.0.clone(),
            released: false,
            hooks: Vec::new(),
        })
    }

    /// Permits taken and not yet released.
    pub fn in_use(&self) -> usize {
        self.0.used.load(Ordering::SeqCst)
    }

    pub fn capacity(&self) -> usize {
        self.0.capacity
    }

    /// Whether `permit` was taken from these slots.
    pub fn owns(&self, permit: &SlotPermit) -> bool {
        Arc::ptr_eq(&self.0, &permit.count)
    }
}

type Hook = Box<dyn FnOnce() + Send + Sync>;

/// One taken slot. Released once: by [`SlotPermit::release`] or on drop, whichever is first;
/// the hooks run after the count went down, in the order they were added.
pub struct SlotPermit {
    count: Arc<Count>,
    released: bool,
    hooks: Vec<Hook>,
}

impl std::fmt::Debug for SlotPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotPermit")
            .field("released", &self.released)
            .finish()
    }
}

impl SlotPermit {
    /// Runs `hook` when the slot is given back.
    pub fn on_release(&mut self, hook: impl FnOnce() + Send + Sync + 'static) {
        if self.released {
            hook();
        } else {
            self.hooks.push(Box::new(hook));
        }
    }

    /// Gives the slot back (later calls do nothing).
    pub fn release(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        self.count.used.fetch_sub(1, Ordering::SeqCst);
        for hook in self.hooks.drain(..) {
            hook();
        }
    }
}

impl Drop for SlotPermit {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn counts_once_and_runs_hooks_after_the_count_went_down() {
        let slots = Slots::new(2);
        let mut a = slots.try_acquire().unwrap();
        let b = slots.try_acquire().unwrap();
        assert!(slots.try_acquire().is_none(), "only two slots");
        assert!(slots.owns(&a) && !Slots::new(1).owns(&a));
        let seen = Arc::new(AtomicUsize::new(99));
        let (s, c) = (seen.clone(), slots.clone());
        a.on_release(move || s.store(c.in_use(), Ordering::SeqCst));
        a.release();
        assert_eq!(seen.load(Ordering::SeqCst), 1, "hook saw the slot free");
        a.release();
        drop(a);
        assert_eq!(slots.in_use(), 1, "a second release gives back nothing");
        drop(b);
        assert_eq!(slots.in_use(), 0);
        let late = Arc::new(AtomicBool::new(false));
        let mut p = slots.try_acquire().unwrap();
        p.release();
        let l = late.clone();
        p.on_release(move || l.store(true, Ordering::SeqCst));
        assert!(
            late.load(Ordering::SeqCst),
            "a hook added after release runs at once"
        );
    }
}
