//! What a partition reader's thread has fetched and decoded but its caller has not taken
//! yet, held to a byte budget: the thread waits while the items it gave fill the budget
//! (an item is always let in when none waits, however large), and the caller waits while
//! none is there. Either side going away is seen by the other: the thread's [`Giver::give`]
//! fails once the [`Taker`] is dropped, and the taker hears [`Taken::Ended`] once the giver
//! is dropped and every item was taken.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A read-ahead of at most `budget` bytes: its two ends.
pub fn read_ahead<T>(budget: usize) -> (Giver<T>, Taker<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            items: VecDeque::new(),
            bytes: 0,
            giver: true,
            taker: true,
        }),
        given: Condvar::new(),
        taken: Condvar::new(),
        budget,
    });
    (
        Giver {
            shared: Arc::clone(&shared),
        },
        Taker { shared },
    )
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Signalled when an item comes or the giver goes.
    given: Condvar,
    /// Signalled when an item is taken or the taker goes.
    taken: Condvar,
    budget: usize,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

struct State<T> {
    items: VecDeque<(T, usize)>,
    bytes: usize,
    giver: bool,
    taker: bool,
}

/// The thread's end.
pub struct Giver<T> {
    shared: Arc<Shared<T>>,
}

/// The taker went away: nobody will take what is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TakerGone;

impl<T> Giver<T> {
    /// Queues `item` of `bytes`, first waiting while the items queued fill the budget.
    pub fn give(&self, item: T, bytes: usize) -> Result<(), TakerGone> {
        let shared = &*self.shared;
        let mut state = shared.lock();
        while state.taker && state.bytes > 0 && state.bytes + bytes > shared.budget {
            state = shared
                .taken
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        if !state.taker {
            return Err(TakerGone);
        }
        state.bytes += bytes;
        state.items.push_back((item, bytes));
        shared.given.notify_all();
        Ok(())
    }
}

impl<T> Drop for Giver<T> {
    fn drop(&mut self) {
        self.shared.lock().giver = false;
        self.shared.given.notify_all();
    }
}

/// The caller's end.
pub struct Taker<T> {
    shared: Arc<Shared<T>>,
}

/// What [`Taker::take`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken<T> {
    /// The oldest item.
    Item(T),
    /// None came in time.
    Nothing,
    /// None will come: the giver is gone and every item was taken.
    Ended,
}

impl<T> Taker<T> {
    /// The oldest item, waiting up to `wait` for one.
    pub fn take(&self, wait: Duration) -> Taken<T> {
        let shared = &*self.shared;
        let deadline = Instant::now() + wait;
        let mut state = shared.lock();
        loop {
            if let Some((item, bytes)) = state.items.pop_front() {
                state.bytes -= bytes;
                shared.taken.notify_all();
                return Taken::Item(item);
            }
            if !state.giver {
                return Taken::Ended;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Taken::Nothing;
            }
            state = shared
                .given
                .wait_timeout(state, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }
}

impl<T> Drop for Taker<T> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.taker = false;
        state.items.clear();
        state.bytes = 0;
        drop(state);
        self.shared.taken.notify_all();
    }
}

impl<T> std::fmt::Debug for Giver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Giver")
    }
}

impl<T> std::fmt::Debug for Taker<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Taker")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::thread;

    #[test]
    fn items_come_out_in_order_and_then_the_end() {
        let (giver, taker) = read_ahead(100);
        giver.give(1, 10).unwrap();
        giver.give(2, 10).unwrap();
        drop(giver);
        assert_eq!(taker.take(Duration::ZERO), Taken::Item(1));
        assert_eq!(taker.take(Duration::ZERO), Taken::Item(2));
        assert_eq!(taker.take(Duration::from_secs(1)), Taken::Ended);
    }

    #[test]
    fn nothing_when_none_came_in_time() {
        let (_giver, taker) = read_ahead::<i32>(100);
        assert_eq!(taker.take(Duration::from_millis(5)), Taken::Nothing);
    }

    #[test]
    fn the_giver_waits_while_the_budget_is_full_and_a_large_item_enters_an_empty_queue() {
        let (giver, taker) = read_ahead(100);
        let given = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&given);
        let thread = thread::spawn(move || {
            for (i, bytes) in [(1, 60), (2, 60), (3, 500)] {
                giver.give(i, bytes).unwrap();
                counted.fetch_add(1, Ordering::SeqCst);
            }
        });
        // The first fits; the second would pass the budget, so it waits for a take.
        while given.load(Ordering::SeqCst) < 1 {
            thread::yield_now();
        }
        thread::sleep(Duration::from_millis(50));
        assert_eq!(given.load(Ordering::SeqCst), 1);
        assert_eq!(taker.take(Duration::from_secs(5)), Taken::Item(1));
        assert_eq!(taker.take(Duration::from_secs(5)), Taken::Item(2));
        // 500 bytes is over the budget alone, and still goes in once the queue is empty.
        assert_eq!(taker.take(Duration::from_secs(5)), Taken::Item(3));
        thread.join().unwrap();
        assert_eq!(taker.take(Duration::from_secs(5)), Taken::Ended);
    }

    #[test]
    fn a_giver_waiting_for_room_fails_once_the_taker_is_dropped() {
        let (giver, taker) = read_ahead(10);
        giver.give(1, 10).unwrap();
        let thread = thread::spawn(move || giver.give(2, 10));
        thread::sleep(Duration::from_millis(20));
        drop(taker);
        assert_eq!(thread.join().unwrap(), Err(TakerGone));
    }
}
