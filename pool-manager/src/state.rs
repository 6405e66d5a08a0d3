//! The pool lifecycle as an explicit state machine.
//!
//! `Loading → Ready ⇄ Draining → Drained`, `Ready|Drained|Unready → Reloading → Ready`
//! (a failed reload goes back where it came from: a drained pool stays drained), any →
//! `Unready` when the engine dies or a load fails. Whether a pool takes work is the pool's
//! to say (`Pool::accepts_work`): a reload of a drained pool takes none until it is done.

/// Where a pool is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolState {
    Loading,
    Ready,
    Draining,
    Drained,
    /// A new model loads beside the old one; the old one keeps serving.
    Reloading,
    Unready,
}

impl PoolState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Loading => "loading",
            Self::Ready => "ready",
            Self::Draining => "draining",
            Self::Drained => "drained",
            Self::Reloading => "reloading",
            Self::Unready => "unready",
        }
    }

    pub const ALL: [PoolState; 6] = [
        Self::Loading,
        Self::Ready,
        Self::Draining,
        Self::Drained,
        Self::Reloading,
        Self::Unready,
    ];
}

/// What happens to a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolEvent {
    Loaded,
    LoadFailed,
    Drain,
    DrainComplete,
    Resume,
    ReloadStart,
    /// The new model serves now.
    ReloadDone,
    /// The new model failed; `had_engine` tells whether an old engine is still there, `from`
    /// is the state the reload started in (the pool goes back to it).
    ReloadFailed {
        had_engine: bool,
        from: PoolState,
    },
    EngineDied,
}

/// A transition the state machine does not allow, with the reason given to the operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot {event:?} while {}: {reason}", from.as_str())]
pub struct TransitionError {
    pub from: PoolState,
    pub event: PoolEvent,
    pub reason: &'static str,
}

impl PoolState {
    /// The state after `event`, or why the event is not allowed now.
    pub fn on(self, event: PoolEvent) -> Result<PoolState, TransitionError> {
        use PoolEvent as E;
        use PoolState as S;
        let deny = |reason| {
            Err(TransitionError {
                from: self,
                event,
                reason,
            })
        };
        match (self, event) {
            (_, E::EngineDied) => Ok(S::Unready),
            (S::Loading | S::Unready, E::Loaded) => Ok(S::Ready),
            (S::Loading | S::Unready, E::LoadFailed) => Ok(S::Unready),
            (_, E::Loaded | E::LoadFailed) => deny("no load is in progress"),
            (S::Ready, E::Drain) => Ok(S::Draining),
            (S::Draining | S::Drained, E::Drain) => deny("the pool is already draining or drained"),
            (S::Reloading, E::Drain) => deny("a reload is in progress; drain after it ends"),
            (S::Loading | S::Unready, E::Drain) => deny("the pool is not serving"),
            (S::Draining, E::DrainComplete) => Ok(S::Drained),
            (_, E::DrainComplete) => deny("the pool is not draining"),
            (S::Draining | S::Drained, E::Resume) => Ok(S::Ready),
            (S::Ready, E::Resume) => deny("the pool is already serving"),
            // the pool will serve as soon as it can: its load or reload ends in service
            (S::Loading | S::Unready | S::Reloading, E::Resume) => Ok(self),
            (S::Ready | S::Drained | S::Unready, E::ReloadStart) => Ok(S::Reloading),
            (S::Draining, E::ReloadStart) => deny("the pool is draining; wait until it is drained"),
            (S::Reloading, E::ReloadStart) => deny("a reload is already in progress"),
            (S::Loading, E::ReloadStart) => deny("the pool is still loading"),
            (S::Reloading, E::ReloadDone) => Ok(S::Ready),
            (
                S::Reloading,
                E::ReloadFailed {
                    had_engine: false, ..
                },
            ) => Ok(S::Unready),
            (
                S::Reloading,
                E::ReloadFailed {
                    from: S::Drained, ..
                },
            ) => Ok(S::Drained),
            (S::Reloading, E::ReloadFailed { .. }) => Ok(S::Ready),
            (_, E::ReloadDone | E::ReloadFailed { .. }) => deny("no reload is in progress"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PoolEvent as E;
    use PoolState as S;

    /// POOL-SM-1: every legal transition lands where the lifecycle says.
    #[test]
    fn legal_transitions() {
        let cases = [
            (S::Loading, E::Loaded, S::Ready),
            (S::Loading, E::LoadFailed, S::Unready),
            (S::Unready, E::Loaded, S::Ready),
            (S::Ready, E::Drain, S::Draining),
            (S::Draining, E::DrainComplete, S::Drained),
            (S::Drained, E::Resume, S::Ready),
            (S::Draining, E::Resume, S::Ready),
            (S::Ready, E::ReloadStart, S::Reloading),
            (S::Drained, E::ReloadStart, S::Reloading),
            (S::Unready, E::ReloadStart, S::Reloading),
            (S::Reloading, E::ReloadDone, S::Ready),
            (
                S::Reloading,
                E::ReloadFailed {
                    had_engine: true,
                    from: S::Ready,
                },
                S::Ready,
            ),
            // issue 32: a drained pool whose reload failed stays drained (it said "ready"
            // while refusing every task)
            (
                S::Reloading,
                E::ReloadFailed {
                    had_engine: true,
                    from: S::Drained,
                },
                S::Drained,
            ),
            (
                S::Reloading,
                E::ReloadFailed {
                    had_engine: false,
                    from: S::Unready,
                },
                S::Unready,
            ),
            (S::Unready, E::Resume, S::Unready),
            (S::Reloading, E::Resume, S::Reloading),
        ];
        for (from, ev, to) in cases {
            assert_eq!(from.on(ev), Ok(to), "{from:?} + {ev:?}");
        }
        for s in PoolState::ALL {
            assert_eq!(s.on(E::EngineDied), Ok(S::Unready));
        }
    }

    /// POOL-SM-2: illegal transitions are refused with a reason, e.g. reload while draining.
    #[test]
    fn illegal_transitions_are_refused_with_a_reason() {
        let cases = [
            (S::Draining, E::ReloadStart),
            (S::Reloading, E::ReloadStart),
            (S::Reloading, E::Drain),
            (S::Drained, E::Drain),
            (S::Loading, E::Drain),
            (S::Ready, E::Resume),
            (S::Ready, E::DrainComplete),
            (S::Ready, E::ReloadDone),
            (S::Ready, E::Loaded),
            (S::Loading, E::ReloadStart),
        ];
        for (from, ev) in cases {
            let err = from.on(ev).expect_err("must be refused");
            assert!(!err.reason.is_empty());
            assert_eq!(err.from, from);
        }
    }
}
