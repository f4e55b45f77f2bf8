//! The atomics and locks of every field that more than one CPU touches.
//!
//! Three builds of the same names:
//! * normal (the `vcpu_sched` crate, the one `vmm` links): plain `std`
//!   atomics and `std::sync::Mutex` (re-exported, so there is no wrapper at
//!   all and no cost);
//! * `--cfg loom`: loom's atomics, so the loom tests can model the
//!   lock-free parts;
//! * `--cfg sim` (the `vcpu_sched_sim` crate: these sources built for the
//!   simulator, by its build script; no feature of `vcpu_sched` turns it
//!   on): `#[repr(transparent)]` wrappers around the `std` types
//!   that report every access (cache line = address / 64, kind) to a
//!   thread-local [recorder] before doing it. The simulator
//!   (`exec::sim`) turns the reports into coherence traffic. Because the
//!   line comes from the real address, a layout change (a field moved to
//!   its own line, a counter split per node) changes the simulated cost by
//!   itself.
//!
//! A lock reports `Lock` on its word and then the first lines of the data
//! it guards as loads, and on unlock those lines as stores if the guard was
//! used mutably, then `Unlock`: a remote enqueue moves the runqueue's lines,
//! not only its lock word.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
#[cfg(all(not(loom), sim))]
pub(crate) use std::sync::atomic::Ordering;
#[cfg(all(not(loom), not(sim)))]
pub(crate) use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
#[cfg(all(not(loom), sim))]
pub(crate) use wrapped::{AtomicI32, AtomicU32, AtomicU64};

/// The shared fields that loom does not model (cpupri, RT overload, group
/// load, runqueue locks, shard locks, per-CPU hot fields, task state):
/// `std` normally and under loom, reporting wrappers in a simulator build.
pub(crate) mod shared {
    #[cfg(any(loom, not(sim)))]
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
    #[cfg(any(loom, not(sim)))]
    pub(crate) use std::sync::{Mutex, MutexGuard};

    #[cfg(all(not(loom), sim))]
    pub(crate) use super::wrapped::{
        AtomicBool, AtomicI64, AtomicU32, AtomicU64, Mutex, MutexGuard,
    };
    #[cfg(all(not(loom), sim))]
    pub(crate) use std::sync::atomic::Ordering;
}

/// Locks a mutex, ignoring poisoning: the scheduler's data stay consistent
/// at every unlock, and a panicking task body must not take the whole
/// scheduler down with it.
#[inline]
pub(crate) fn lock<L: Lockable>(m: &L) -> L::Guard<'_> {
    m.lock_ignoring_poison()
}

/// Takes a mutex if it is free, ignoring poisoning; `None` when another
/// thread holds it.
#[inline]
pub(crate) fn try_lock<L: Lockable>(m: &L) -> Option<L::Guard<'_>> {
    m.try_lock_ignoring_poison()
}

/// A mutex [`lock`] can take: `std`'s, and in a simulator build the
/// reporting one of [`crate::sync::shared`].
pub(crate) trait Lockable {
    /// Its guard.
    type Guard<'a>
    where
        Self: 'a;
    /// Locks, ignoring poisoning.
    fn lock_ignoring_poison(&self) -> Self::Guard<'_>;
    /// Locks if free, ignoring poisoning.
    fn try_lock_ignoring_poison(&self) -> Option<Self::Guard<'_>>;
}

impl<T> Lockable for std::sync::Mutex<T> {
    type Guard<'a>
        = std::sync::MutexGuard<'a, T>
    where
        Self: 'a;
    #[inline]
    fn lock_ignoring_poison(&self) -> Self::Guard<'_> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[inline]
    fn try_lock_ignoring_poison(&self) -> Option<Self::Guard<'_>> {
        match self.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

impl<L: Lockable> Lockable for std::sync::Arc<L> {
    type Guard<'a>
        = L::Guard<'a>
    where
        Self: 'a;
    #[inline]
    fn lock_ignoring_poison(&self) -> Self::Guard<'_> {
        (**self).lock_ignoring_poison()
    }
    #[inline]
    fn try_lock_ignoring_poison(&self) -> Option<Self::Guard<'_>> {
        (**self).try_lock_ignoring_poison()
    }
}

#[cfg(all(not(loom), sim))]
impl<T> Lockable for shared::Mutex<T> {
    type Guard<'a>
        = shared::MutexGuard<'a, T>
    where
        Self: 'a;
    #[inline]
    fn lock_ignoring_poison(&self) -> Self::Guard<'_> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Reported as a lock. Run to completion (one core call at a time),
    /// no other call holds the lock, so it is always taken; interleaved,
    /// another simulated CPU's call may hold it, and then it is not.
    #[inline]
    fn try_lock_ignoring_poison(&self) -> Option<Self::Guard<'_>> {
        self.try_lock_reported()
    }
}

/// The thread-local access recorder a simulator installs.
#[cfg(all(not(loom), sim))]
pub mod recorder {
    use std::cell::{Cell, RefCell};

    /// What an access does to its line.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum Kind {
        /// A read.
        Load,
        /// A plain write (relaxed or release): on x86 a `mov`, which
        /// retires into the store buffer.
        Store,
        /// A sequentially consistent write: on x86 an `xchg`, a locked
        /// instruction that drains the store buffer first. Charged as a
        /// write like [`Kind::Store`]; only the interleaved simulator's
        /// store buffer tells them apart.
        StoreSeqCst,
        /// A read-modify-write (CAS, fetch_add, swap).
        Rmw,
        /// A lock acquisition on the lock's word.
        Lock,
        /// A lock release on the lock's word.
        Unlock,
    }

    /// One reported access.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Access {
        /// The real address.
        pub addr: u64,
        /// What it did.
        pub kind: Kind,
    }

    /// Why an interleaved core call hands control back to the simulator.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Suspend {
        /// It is about to make this access: the simulator charges it when
        /// virtual time reaches it, and resumes the call when it is done.
        Access(Access),
        /// It found the lock at this address held: resume it when the
        /// holder releases it (its next `lock` attempt is reported anew).
        Blocked(u64),
        /// It has just released the lock at this address (after its
        /// `Unlock` access completed): the first waiter may have it.
        Released(u64),
    }

    /// The handle through which an interleaved call suspends.
    pub type Yielder = corosensei::Yielder<(), Suspend>;

    thread_local! {
        static ON: Cell<bool> = const { Cell::new(false) };
        static LOG: RefCell<Vec<Access>> = const { RefCell::new(Vec::new()) };
        /// The yielder of the interleaved call running on this thread
        /// (null when none is): set by [`enter`] and after every suspend,
        /// cleared by [`leave`] when control is back in the simulator.
        static CALL: Cell<*const Yielder> = const { Cell::new(std::ptr::null()) };
    }

    /// Called first thing by an interleaved call's coroutine, with its own
    /// yielder: from here on its accesses suspend it instead of being
    /// logged.
    pub fn enter(y: &Yielder) {
        CALL.with(|c| c.set(y));
    }

    /// Called by the simulator each time a coroutine hands control back.
    pub fn leave() {
        CALL.with(|c| c.set(std::ptr::null()));
    }

    /// Is an interleaved call running on this thread?
    #[inline]
    pub(crate) fn interleaved() -> bool {
        CALL.with(|c| !c.get().is_null())
    }

    /// Suspends the running interleaved call with `why`.
    fn suspend(why: Suspend) {
        let y = CALL.with(|c| c.get());
        debug_assert!(!y.is_null());
        // SAFETY: `y` was set by `enter` (or below) from the `&Yielder`
        // that corosensei passes to the running coroutine's body, and
        // lives in that body's frame until the body returns. It is only
        // non-null while that coroutine is executing on this thread:
        // `leave` nulls it as soon as the simulator gets control back
        // (every suspend and the return), and the coroutine re-installs
        // its own after each suspend. So it points at the yielder of the
        // coroutine whose stack we are on, which is alive.
        let y: &Yielder = unsafe { &*y };
        y.suspend(why);
        CALL.with(|c| c.set(y));
    }

    /// An interleaved call found the lock at `word` held: waits for its
    /// release (the simulator resumes it then).
    pub(crate) fn wait_unlock(word: usize) {
        suspend(Suspend::Blocked(word as u64));
    }

    /// An interleaved call has released the lock at `word`: the simulator
    /// hands it to the first waiter.
    pub(crate) fn released(word: usize) {
        if interleaved() {
            suspend(Suspend::Released(word as u64));
        }
    }

    /// Set, for good, the first time any thread starts recording. Until
    /// then (a bench that links the simulator's build and never
    /// simulates) every access's check is one relaxed load of this
    /// read-only line, which every core keeps in its cache, instead of a
    /// thread-local lookup: measured, the thread-local check alone cost
    /// the shared runqueue's single-writer path 2x
    /// (docs/data/sim/sync-layer-ab-before-gate.md).
    static EVER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// Is this thread recording?
    #[inline(always)]
    pub(crate) fn on() -> bool {
        EVER.load(std::sync::atomic::Ordering::Relaxed) && ON.with(|o| o.get())
    }

    /// Starts recording on this thread (clears what was recorded).
    pub fn start() {
        EVER.store(true, std::sync::atomic::Ordering::Relaxed);
        LOG.with(|l| l.borrow_mut().clear());
        ON.with(|o| o.set(true));
    }

    /// Turns recording on or off on this thread without touching the log
    /// (the interleaved simulator records only while a call runs, and
    /// never logs: every access suspends the call instead).
    pub fn set_recording(on: bool) {
        if on {
            EVER.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        ON.with(|o| o.set(on));
    }

    /// Stops recording and moves the accesses since [`start`] into `out`
    /// (cleared first), in program order.
    pub fn stop_into(out: &mut Vec<Access>) {
        ON.with(|o| o.set(false));
        LOG.with(|l| {
            out.clear();
            out.append(&mut l.borrow_mut());
        });
    }

    /// Records one access if recording is on.
    #[inline(always)]
    pub(crate) fn record(addr: usize, kind: Kind) {
        if on() {
            push(addr, kind);
        }
    }

    /// The recording itself, out of line: every access site inlines only
    /// the check.
    #[inline(never)]
    fn push(addr: usize, kind: Kind) {
        if interleaved() {
            suspend(Suspend::Access(Access {
                addr: addr as u64,
                kind,
            }));
            return;
        }
        LOG.with(|l| {
            l.borrow_mut().push(Access {
                addr: addr as u64,
                kind,
            })
        });
    }

    /// Records the lines of `[addr, addr + len)` (at most `cap` of them).
    #[inline(always)]
    pub(crate) fn record_range(addr: usize, len: usize, cap: usize, kind: Kind) {
        if len == 0 || !on() {
            return;
        }
        let first = addr / 64;
        let last = ((addr + len - 1) / 64).min(first + cap.saturating_sub(1));
        for line in first..=last {
            record(line * 64, kind);
        }
    }
}

#[cfg(all(not(loom), sim))]
mod wrapped {
    use std::cell::Cell;
    use std::ops::{Deref, DerefMut};
    use std::sync::atomic::Ordering;
    use std::sync::{LockResult, PoisonError, TryLockError};

    use super::recorder::{self, record, record_range, Kind};

    macro_rules! atomic {
        ($name:ident, $std:ty, $t:ty) => {
            /// A reporting wrapper of the `std` atomic of the same name.
            #[repr(transparent)]
            #[derive(Default, Debug)]
            pub struct $name($std);

            #[allow(dead_code)]
            impl $name {
                #[inline(always)]
                fn at(&self, k: Kind) {
                    record(self as *const Self as usize, k);
                }
                /// See `std`.
                pub const fn new(v: $t) -> Self {
                    Self(<$std>::new(v))
                }
                /// See `std`.
                #[inline(always)]
                pub fn load(&self, o: Ordering) -> $t {
                    self.at(Kind::Load);
                    self.0.load(o)
                }
                /// See `std`.
                #[inline(always)]
                pub fn store(&self, v: $t, o: Ordering) {
                    self.at(if o == Ordering::SeqCst {
                        Kind::StoreSeqCst
                    } else {
                        Kind::Store
                    });
                    self.0.store(v, o)
                }
                /// See `std`.
                #[inline(always)]
                pub fn swap(&self, v: $t, o: Ordering) -> $t {
                    self.at(Kind::Rmw);
                    self.0.swap(v, o)
                }
                /// See `std`.
                #[inline(always)]
                pub fn compare_exchange(
                    &self,
                    a: $t,
                    b: $t,
                    s: Ordering,
                    f: Ordering,
                ) -> Result<$t, $t> {
                    self.at(Kind::Rmw);
                    self.0.compare_exchange(a, b, s, f)
                }
                /// See `std`.
                #[inline(always)]
                pub fn compare_exchange_weak(
                    &self,
                    a: $t,
                    b: $t,
                    s: Ordering,
                    f: Ordering,
                ) -> Result<$t, $t> {
                    self.at(Kind::Rmw);
                    self.0.compare_exchange_weak(a, b, s, f)
                }
                /// See `std`.
                #[inline(always)]
                pub fn fetch_and(&self, v: $t, o: Ordering) -> $t {
                    self.at(Kind::Rmw);
                    self.0.fetch_and(v, o)
                }
                /// See `std`.
                #[inline(always)]
                pub fn fetch_or(&self, v: $t, o: Ordering) -> $t {
                    self.at(Kind::Rmw);
                    self.0.fetch_or(v, o)
                }
                /// See `std`.
                #[inline(always)]
                pub fn get_mut(&mut self) -> &mut $t {
                    self.0.get_mut()
                }
                /// See `std`.
                #[inline(always)]
                pub fn into_inner(self) -> $t {
                    self.0.into_inner()
                }
            }
        };
    }
    macro_rules! arith {
        ($name:ident, $t:ty) => {
            #[allow(dead_code)]
            impl $name {
                /// See `std`.
                #[inline(always)]
                pub fn fetch_add(&self, v: $t, o: Ordering) -> $t {
                    self.at(Kind::Rmw);
                    self.0.fetch_add(v, o)
                }
                /// See `std`.
                #[inline(always)]
                pub fn fetch_sub(&self, v: $t, o: Ordering) -> $t {
                    self.at(Kind::Rmw);
                    self.0.fetch_sub(v, o)
                }
                /// See `std`.
                #[inline(always)]
                pub fn fetch_max(&self, v: $t, o: Ordering) -> $t {
                    self.at(Kind::Rmw);
                    self.0.fetch_max(v, o)
                }
                /// See `std`.
                #[inline(always)]
                pub fn fetch_min(&self, v: $t, o: Ordering) -> $t {
                    self.at(Kind::Rmw);
                    self.0.fetch_min(v, o)
                }
            }
        };
    }
    atomic!(AtomicBool, std::sync::atomic::AtomicBool, bool);
    atomic!(AtomicI32, std::sync::atomic::AtomicI32, i32);
    atomic!(AtomicI64, std::sync::atomic::AtomicI64, i64);
    atomic!(AtomicU32, std::sync::atomic::AtomicU32, u32);
    atomic!(AtomicU64, std::sync::atomic::AtomicU64, u64);
    arith!(AtomicI32, i32);
    arith!(AtomicI64, i64);
    arith!(AtomicU32, u32);
    arith!(AtomicU64, u64);

    /// How many lines of a lock's guarded data an acquisition reports: the
    /// head of the structure, where its counters and first queue heads are.
    const GUARDED_LINES: usize = 2;

    /// A reporting wrapper of `std::sync::Mutex`.
    #[derive(Default, Debug)]
    pub struct Mutex<T>(std::sync::Mutex<T>);

    /// Its guard: reports the guarded lines and the release on drop.
    pub struct MutexGuard<'a, T> {
        /// `Some` until the drop releases it: interleaved, the real
        /// unlock happens when the reported `Unlock` completes in virtual
        /// time, and is then announced ([`recorder::released`]) so that
        /// the waiter the simulator hands the lock to finds it free.
        g: Option<std::sync::MutexGuard<'a, T>>,
        word: usize,
        dirty: Cell<bool>,
    }

    fn wrap<T>(g: std::sync::MutexGuard<'_, T>, word: usize) -> MutexGuard<'_, T> {
        record_range(
            &*g as *const T as usize,
            size_of::<T>(),
            GUARDED_LINES,
            Kind::Load,
        );
        MutexGuard {
            g: Some(g),
            word,
            dirty: Cell::new(false),
        }
    }

    #[allow(dead_code)]
    impl<T> Mutex<T> {
        /// See `std`.
        pub const fn new(t: T) -> Self {
            Self(std::sync::Mutex::new(t))
        }
        /// See `std`; the acquisition is reported. Interleaved, a lock
        /// another simulated CPU holds suspends the call until the
        /// simulator hands it over (in order of arrival), and each attempt
        /// is reported; otherwise (run to completion, or a real thread of
        /// a bench) it blocks as `std`'s does.
        pub fn lock(&self) -> LockResult<MutexGuard<'_, T>> {
            let word = self as *const Self as usize;
            loop {
                record(word, Kind::Lock);
                match self.0.try_lock() {
                    Ok(g) => return Ok(wrap(g, word)),
                    Err(TryLockError::Poisoned(e)) => {
                        return Err(PoisonError::new(wrap(e.into_inner(), word)))
                    }
                    Err(TryLockError::WouldBlock) if recorder::interleaved() => {
                        recorder::wait_unlock(word)
                    }
                    Err(TryLockError::WouldBlock) => {
                        return match self.0.lock() {
                            Ok(g) => Ok(wrap(g, word)),
                            Err(e) => Err(PoisonError::new(wrap(e.into_inner(), word))),
                        }
                    }
                }
            }
        }
        /// One attempt, reported as a lock: `None` only when an
        /// interleaved call finds it held by another simulated CPU's call
        /// (run to completion nothing else holds it; a real thread
        /// blocks, as the core's callers of `try_lock` did before
        /// interleaving).
        pub fn try_lock_reported(&self) -> Option<MutexGuard<'_, T>> {
            let word = self as *const Self as usize;
            record(word, Kind::Lock);
            match self.0.try_lock() {
                Ok(g) => Some(wrap(g, word)),
                Err(TryLockError::Poisoned(e)) => Some(wrap(e.into_inner(), word)),
                Err(TryLockError::WouldBlock) if recorder::interleaved() => None,
                Err(TryLockError::WouldBlock) => {
                    Some(wrap(self.0.lock().unwrap_or_else(|e| e.into_inner()), word))
                }
            }
        }
        /// See `std`.
        pub fn get_mut(&mut self) -> LockResult<&mut T> {
            self.0.get_mut()
        }
        /// See `std`.
        pub fn into_inner(self) -> LockResult<T> {
            self.0.into_inner()
        }
    }

    const RELEASED: &str = "a guard is used only until its drop";

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        #[inline(always)]
        fn deref(&self) -> &T {
            self.g.as_ref().expect(RELEASED)
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        #[inline(always)]
        fn deref_mut(&mut self) -> &mut T {
            self.dirty.set(true);
            self.g.as_mut().expect(RELEASED)
        }
    }

    impl<T> Drop for MutexGuard<'_, T> {
        fn drop(&mut self) {
            let Some(g) = self.g.take() else { return };
            if self.dirty.get() {
                record_range(
                    &*g as *const T as usize,
                    size_of::<T>(),
                    GUARDED_LINES,
                    Kind::Store,
                );
            }
            record(self.word, Kind::Unlock);
            drop(g);
            recorder::released(self.word);
        }
    }
}
