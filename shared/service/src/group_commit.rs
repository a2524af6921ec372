//! Group commit: concurrent tasks each hand over one item to write, and one of them writes the items
//! waiting at that moment in one go, then hands each task its own result.
//!
//! Invariants: every item is written at most once, by one writer, in the order it was queued, at most
//! [`Limits::max_items`] in one write; a task gets the result of its own item and no other. While a
//! write is under way, the items that arrive wait for it to end, unless [`Limits`] says they have
//! waited long enough or are enough to fill a write: then another write starts beside it. A caller
//! may have its item handed back instead of waiting ([`GroupCommits::queue_unless_writing`]). This
//! module knows nothing about payments or databases: the caller passes the writer in.
//!
//! [`GroupCommits`] keeps one group per key (the worker's and the api's: per tenant), so that items of
//! different keys are never written together and one key's write never waits for another's.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

/// How big a write may grow, and how long an item waits for the write under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most items one write takes. When this many are waiting, another write starts at once.
    pub max_items: usize,
    /// How long the item that has waited longest waits for the write under way to end; then another
    /// write starts beside it. `None`: it waits for as long as that write takes.
    pub max_wait: Option<Duration>,
}

impl Default for Limits {
    /// One write at a time, taking every item waiting.
    fn default() -> Self {
        Self { max_items: usize::MAX, max_wait: None }
    }
}

/// Items waiting to be written, and the writes under way.
///
/// A transaction per item costs a commit (a WAL flush) and a round trip or more each, which on a busy
/// database is most of what a short write costs (see BENCHMARKS.md). Here the first item to arrive
/// when nothing is being written is written at once, alone; the items that arrive during that write
/// queue up, and the next task to start a write takes them all together. No timer delays a write:
/// under light load every write is one item and nothing waits; under heavy load writes grow by
/// themselves, up to [`Limits`].
pub struct GroupCommit<T, R> {
    limits: Limits,
    // A std mutex: held only to queue, take or count, never across an `.await`.
    state: Mutex<State<T, R>>,
    // Signalled when a write ends, so that the tasks still waiting look again.
    write_ended: Notify,
}

struct State<T, R> {
    waiting: VecDeque<Waiting<T, R>>,
    writes: usize,
}

struct Waiting<T, R> {
    item: T,
    result: oneshot::Sender<R>,
    since: Instant,
}

/// What a task does next.
enum Turn<T, R> {
    /// Write these items.
    Write(Vec<Waiting<T, R>>),
    /// Wait for its result, for a write to end, or until this instant (when set).
    Wait(Option<Instant>),
}

impl<T, R> Default for GroupCommit<T, R> {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

impl<T, R> GroupCommit<T, R> {
    /// An empty group with these limits. A `max_items` of 0 counts as 1.
    pub fn new(limits: Limits) -> Self {
        let limits = Limits { max_items: limits.max_items.max(1), ..limits };
        Self { limits, state: Mutex::new(State { waiting: VecDeque::new(), writes: 0 }), write_ended: Notify::new() }
    }

    /// Queues `item` and returns its result: written by this task, together with other items waiting
    /// when it starts a write, or by another task. `write` gets the items in queue order and must
    /// return exactly one result per item, in the same order. `None`: the task writing this item
    /// stopped before it delivered the result (its future was dropped, as when the worker's shutdown
    /// grace runs out); treat the item's fate as unknown.
    pub async fn submit<W, F>(&self, item: T, write: W) -> Option<R>
    where
        W: Fn(Vec<T>) -> F,
        F: Future<Output = Vec<R>>,
    {
        let result = Self::queue(&mut self.state(), item);
        self.written(result, &write).await
    }

    /// Queues `item` as [`GroupCommit::submit`] does, unless a write is under way and no item
    /// waiting for it `matches`: then `item` is handed back unqueued. The check and the queueing are
    /// one step, so an item never waits for a write that started after it was checked.
    fn queue_unless_writing(&self, item: T, matches: impl Fn(&T) -> bool) -> Result<oneshot::Receiver<R>, T> {
        let mut state = self.state();
        if state.writes > 0 && !state.waiting.iter().any(|waiting| matches(&waiting.item)) {
            return Err(item);
        }
        Ok(Self::queue(&mut state, item))
    }

    /// Queues `item`; its result will come on the receiver.
    fn queue(state: &mut State<T, R>, item: T) -> oneshot::Receiver<R> {
        let (sender, result) = oneshot::channel();
        state.waiting.push_back(Waiting { item, result: sender, since: Instant::now() });
        result
    }

    /// Waits for the result of a queued item, writing the items waiting whenever it is this task's
    /// turn.
    async fn written<W, F>(&self, mut result: oneshot::Receiver<R>, write: &W) -> Option<R>
    where
        W: Fn(Vec<T>) -> F,
        F: Future<Output = Vec<R>>,
    {
        loop {
            // Registered before the state is read, so that a write ending in between is not missed.
            let write_ended = self.write_ended.notified();
            let mut write_ended = std::pin::pin!(write_ended);
            write_ended.as_mut().enable();
            let turn = {
                let mut state = self.state();
                // Another task may have written this item meanwhile.
                match result.try_recv() {
                    Ok(delivered) => return Some(delivered),
                    Err(oneshot::error::TryRecvError::Closed) => return None,
                    Err(oneshot::error::TryRecvError::Empty) => {}
                }
                state.turn(&self.limits, Instant::now())
            };
            match turn {
                Turn::Write(batch) => self.write(batch, write).await,
                Turn::Wait(until) => {
                    let deadline = async {
                        match until {
                            Some(until) => tokio::time::sleep_until(until).await,
                            None => std::future::pending().await,
                        }
                    };
                    // `biased`: a result that has arrived wins, so a task whose item was written by
                    // another does not look for a write to start for nothing.
                    tokio::select! {
                        biased;
                        delivered = &mut result => return delivered.ok(),
                        () = &mut write_ended => {}
                        () = deadline => {}
                    }
                }
            }
        }
    }

    /// Writes `batch` and hands each task its result. The write counts as under way until its results
    /// are delivered, or until this future is dropped midway (its items then get no result).
    async fn write<W, F>(&self, batch: Vec<Waiting<T, R>>, write: &W)
    where
        W: Fn(Vec<T>) -> F,
        F: Future<Output = Vec<R>>,
    {
        let _under_way = UnderWay(self);
        let (items, senders): (Vec<T>, Vec<oneshot::Sender<R>>) = batch.into_iter().map(|w| (w.item, w.result)).unzip();
        let results = write(items).await;
        // A waiting task that was cancelled has dropped its receiver: its result goes nowhere.
        for (sender, delivered) in senders.into_iter().zip(results) {
            let _ = sender.send(delivered);
        }
    }

    fn state(&self) -> MutexGuard<'_, State<T, R>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T, R> State<T, R> {
    /// A write to start now, or how long to wait: a write starts when none is under way, when enough
    /// items wait to fill one, or when the item that has waited longest has waited `max_wait`.
    fn turn(&mut self, limits: &Limits, now: Instant) -> Turn<T, R> {
        let Some(oldest) = self.waiting.front() else {
            // Every item is being written: this task's result is on its way.
            return Turn::Wait(None);
        };
        let due = limits.max_wait.map(|wait| oldest.since + wait);
        if self.writes == 0 || self.waiting.len() >= limits.max_items || due.is_some_and(|due| due <= now) {
            self.writes += 1;
            let taken = self.waiting.len().min(limits.max_items);
            Turn::Write(self.waiting.drain(..taken).collect())
        } else {
            Turn::Wait(due)
        }
    }
}

/// A write under way; when it ends (or is dropped midway), the waiting tasks look again.
struct UnderWay<'a, T, R>(&'a GroupCommit<T, R>);

impl<T, R> Drop for UnderWay<'_, T, R> {
    fn drop(&mut self) {
        self.0.state().writes -= 1;
        self.0.write_ended.notify_waiters();
    }
}

/// One [`GroupCommit`] per key, each with the same [`Limits`]. A key's group exists while some task is
/// submitting to it, so the map holds no more groups than there are keys in use.
pub struct GroupCommits<K, T, R> {
    limits: Limits,
    // A std mutex: held only to find, add or drop a group, never across an `.await`.
    groups: Mutex<HashMap<K, Arc<GroupCommit<T, R>>>>,
}

impl<K, T, R> Default for GroupCommits<K, T, R> {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

impl<K, T, R> GroupCommits<K, T, R> {
    /// No groups yet; each key's will have `limits`.
    pub fn new(limits: Limits) -> Self {
        Self { limits, groups: Mutex::new(HashMap::new()) }
    }
}

impl<K: Eq + Hash + Clone, T, R> GroupCommits<K, T, R> {
    /// [`GroupCommit::submit`] to `key`'s group: `item` is written together with the items of the
    /// same key waiting at that moment, and with no other key's.
    pub async fn submit<W, F>(&self, key: K, item: T, write: W) -> Option<R>
    where
        W: Fn(Vec<T>) -> F,
        F: Future<Output = Vec<R>>,
    {
        self.queue(key, item).written(write).await
    }

    /// [`GroupCommits::submit`] in two steps: `item` is queued in `key`'s group now, and
    /// [`Queued::written`] waits for its result.
    pub fn queue(&self, key: K, item: T) -> Queued<'_, K, T, R> {
        let member = Member::join(self, key);
        let result = GroupCommit::queue(&mut member.group.state(), item);
        Queued { member, result }
    }

    /// [`GroupCommits::queue`], unless a write of `key` is under way and no item of `key` that
    /// `matches` waits for it: then `item` is handed back unqueued, and the caller can do something
    /// else meanwhile. The check and the queueing are one step.
    pub fn queue_unless_writing(
        &self,
        key: K,
        item: T,
        matches: impl Fn(&T) -> bool,
    ) -> Result<Queued<'_, K, T, R>, T> {
        let member = Member::join(self, key);
        let result = member.group.queue_unless_writing(item, matches)?;
        Ok(Queued { member, result })
    }

    /// Whether a write of `key` is under way now.
    pub fn writing(&self, key: &K) -> bool {
        let groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        groups.get(key).is_some_and(|group| group.state().writes > 0)
    }

    #[cfg(test)]
    fn groups(&self) -> usize {
        self.groups.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// A task's hold on its key's group. The last one to leave, finished or cancelled, drops the group.
struct Member<'a, K: Eq + Hash + Clone, T, R> {
    commits: &'a GroupCommits<K, T, R>,
    key: K,
    group: Arc<GroupCommit<T, R>>,
}

impl<'a, K: Eq + Hash + Clone, T, R> Member<'a, K, T, R> {
    fn join(commits: &'a GroupCommits<K, T, R>, key: K) -> Self {
        let mut groups = commits.groups.lock().unwrap_or_else(PoisonError::into_inner);
        let group = Arc::clone(groups.entry(key.clone()).or_insert_with(|| Arc::new(GroupCommit::new(commits.limits))));
        Self { commits, key, group }
    }
}

impl<K: Eq + Hash + Clone, T, R> Drop for Member<'_, K, T, R> {
    fn drop(&mut self) {
        let mut groups = self.commits.groups.lock().unwrap_or_else(PoisonError::into_inner);
        // Two holders, the map and this task, means this task is the last: members are only added
        // under this lock.
        if groups.get(&self.key).is_some_and(|group| Arc::strong_count(group) == 2) {
            groups.remove(&self.key);
        }
    }
}

/// An item queued in its key's group, until its result is taken.
pub struct Queued<'a, K: Eq + Hash + Clone, T, R> {
    member: Member<'a, K, T, R>,
    result: oneshot::Receiver<R>,
}

impl<K: Eq + Hash + Clone, T, R> Queued<'_, K, T, R> {
    /// The item's result, as [`GroupCommit::submit`] returns it: this task writes the items waiting
    /// when it is its turn. Dropped unawaited, the item stays queued: it is written only if another
    /// task of its key writes while it is there, and its result goes nowhere.
    pub async fn written<W, F>(self, write: W) -> Option<R>
    where
        W: Fn(Vec<T>) -> F,
        F: Future<Output = Vec<R>>,
    {
        self.member.group.written(self.result, &write).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::Notify;

    use super::*;

    #[tokio::test]
    async fn a_lone_item_is_written_at_once_by_its_own_task() {
        let group = GroupCommit::default();
        let batches = Mutex::new(Vec::new());

        let result = group
            .submit(7, |items: Vec<i32>| {
                batches.lock().unwrap().push(items.clone());
                async move { items.into_iter().map(|i| i * 10).collect() }
            })
            .await;

        assert_eq!(result, Some(70));
        assert_eq!(*batches.lock().unwrap(), vec![vec![7]]);
    }

    // One thread, so that a task seen to have queued its item has also queued for the turn.
    #[tokio::test(flavor = "current_thread")]
    async fn items_queued_during_a_write_are_written_together_in_order_and_each_task_gets_its_own_result() {
        let group = Arc::new(GroupCommit::default());
        let batches = Arc::new(Mutex::new(Vec::<Vec<u32>>::new()));
        let (release, writing) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let first = tokio::spawn({
            let (group, write) = (group.clone(), echo_after(release.clone(), writing.clone()));
            async move { group.submit(0, write).await }
        });
        writing.notified().await;
        let rest: Vec<_> = (1..=20)
            .map(|i| {
                let (group, batches) = (group.clone(), batches.clone());
                tokio::spawn(async move {
                    let write = |items: Vec<u32>| {
                        batches.lock().unwrap().push(items.clone());
                        async move { items.into_iter().map(|i| i + 1000).collect() }
                    };
                    group.submit(i, write).await
                })
            })
            .collect();
        queued(&group, 20).await;

        release.notify_one();

        assert_eq!(first.await.unwrap(), Some(0));
        for (i, task) in (1..=20).zip(rest) {
            assert_eq!(task.await.unwrap(), Some(i + 1000), "item {i} got another's result");
        }
        assert_eq!(*batches.lock().unwrap(), vec![(1..=20).collect::<Vec<_>>()], "one write, in queue order");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_item_of_many_concurrent_tasks_is_written_exactly_once() {
        let group = Arc::new(GroupCommit::default());
        let written = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..500u32)
            .map(|i| {
                let (group, written) = (group.clone(), written.clone());
                tokio::spawn(async move {
                    group
                        .submit(i, |items: Vec<u32>| {
                            written.fetch_add(items.len(), Ordering::SeqCst);
                            async move {
                                tokio::task::yield_now().await;
                                items
                            }
                        })
                        .await
                })
            })
            .collect();

        for (i, task) in (0..500u32).zip(tasks) {
            assert_eq!(task.await.unwrap(), Some(i));
        }
        assert_eq!(written.load(Ordering::SeqCst), 500);
    }

    /// A write that says it is `writing`, waits for `release`, then returns its items.
    fn echo_after(release: Arc<Notify>, writing: Arc<Notify>) -> impl Fn(Vec<u32>) -> BoxFuture {
        move |items: Vec<u32>| {
            let (release, writing) = (release.clone(), writing.clone());
            Box::pin(async move {
                writing.notify_one();
                release.notified().await;
                items
            })
        }
    }

    type BoxFuture = std::pin::Pin<Box<dyn Future<Output = Vec<u32>> + Send>>;

    async fn queued(group: &GroupCommit<u32, u32>, count: usize) {
        while group.state().waiting.len() != count {
            tokio::task::yield_now().await;
        }
    }

    async fn queued_for(commits: &GroupCommits<&str, u32, u32>, key: &str, count: usize) {
        let group = Arc::clone(&commits.groups.lock().unwrap()[key]);
        queued(&group, count).await;
    }

    // One thread, so that a task seen to have queued its item has also queued for the turn.
    #[tokio::test(flavor = "current_thread")]
    async fn the_items_of_a_writer_that_stops_midway_get_no_result_and_later_items_are_still_written() {
        let group = Arc::new(GroupCommit::default());
        let (release, writing) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let first = tokio::spawn({
            let (group, write) = (group.clone(), echo_after(release.clone(), writing.clone()));
            async move { group.submit(0, write).await }
        });
        writing.notified().await;
        // Queued behind the first write: the writer of the next batch never finishes.
        let stalling = tokio::spawn({
            let group = group.clone();
            async move { group.submit(1, |_: Vec<u32>| std::future::pending::<Vec<u32>>()).await }
        });
        queued(&group, 1).await;
        let passenger = tokio::spawn({
            let group = group.clone();
            async move { group.submit(2, |items: Vec<u32>| async move { items }).await }
        });
        queued(&group, 2).await;
        release.notify_one();
        assert_eq!(first.await.unwrap(), Some(0));
        queued(&group, 0).await;

        stalling.abort();

        assert!(stalling.await.unwrap_err().is_cancelled());
        assert_eq!(passenger.await.unwrap(), None, "its batch was never written to the end");
        let later = group.submit(3, |items: Vec<u32>| async move { items }).await;
        assert_eq!(later, Some(3));
    }

    /// Records each write's items, then returns them.
    fn recording(batches: &Mutex<Vec<Vec<u32>>>) -> impl Fn(Vec<u32>) -> std::future::Ready<Vec<u32>> + '_ {
        move |items: Vec<u32>| {
            batches.lock().unwrap().push(items.clone());
            std::future::ready(items)
        }
    }

    // One thread, so that a task seen to have queued its item has also looked for a write to start.
    #[tokio::test(flavor = "current_thread")]
    async fn enough_waiting_items_to_fill_a_write_start_one_beside_the_write_under_way() {
        let limits = Limits { max_items: 2, max_wait: None };
        let group = Arc::new(GroupCommit::new(limits));
        let (release, writing) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let held = tokio::spawn({
            let (group, write) = (group.clone(), echo_after(release.clone(), writing.clone()));
            async move { group.submit(0, write).await }
        });
        writing.notified().await;
        let batches = Arc::new(Mutex::new(Vec::new()));

        let mut rest: Vec<_> = (1..=5)
            .map(|i| {
                let (group, batches) = (group.clone(), batches.clone());
                tokio::spawn(async move { group.submit(i, recording(&batches)).await })
            })
            .collect();
        for (i, task) in (1..=4).zip(rest.iter_mut()) {
            assert_eq!(task.await.unwrap(), Some(i), "written while the first write is under way");
        }

        assert_eq!(*batches.lock().unwrap(), vec![vec![1, 2], vec![3, 4]]);
        assert_eq!(group.state().waiting.len(), 1, "one item is not enough to fill a write: it waits");
        release.notify_one();
        assert_eq!(held.await.unwrap(), Some(0));
        assert_eq!(rest.into_iter().last().unwrap().await.unwrap(), Some(5));
        assert_eq!(*batches.lock().unwrap(), vec![vec![1, 2], vec![3, 4], vec![5]]);
    }

    // Paused time: the clock moves only when every task waits, straight to the next timer.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn an_item_that_has_waited_max_wait_starts_a_write_beside_the_write_under_way() {
        let max_wait = Duration::from_millis(20);
        let group = Arc::new(GroupCommit::new(Limits { max_items: 64, max_wait: Some(max_wait) }));
        let (release, writing) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let held = tokio::spawn({
            let (group, write) = (group.clone(), echo_after(release.clone(), writing.clone()));
            async move { group.submit(0, write).await }
        });
        writing.notified().await;
        let batches = Mutex::new(Vec::new());
        let queued_at = Instant::now();

        let result = tokio::time::timeout(max_wait * 10, group.submit(1, recording(&batches))).await;

        assert_eq!(result, Ok(Some(1)), "written while the first write is under way");
        assert_eq!(queued_at.elapsed(), max_wait, "it waited max_wait for the write under way, and no longer");
        assert_eq!(*batches.lock().unwrap(), vec![vec![1]]);
        assert!(!held.is_finished(), "the first write is still under way");
        release.notify_one();
        assert_eq!(held.await.unwrap(), Some(0));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn with_no_write_under_way_an_item_is_written_at_once_whatever_the_limits() {
        let group = GroupCommit::new(Limits { max_items: 64, max_wait: Some(Duration::from_secs(1)) });
        let batches = Mutex::new(Vec::new());
        let started = Instant::now();

        let result = group.submit(7, recording(&batches)).await;

        assert_eq!(result, Some(7));
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(*batches.lock().unwrap(), vec![vec![7]]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn items_of_different_keys_are_never_written_together_and_one_keys_write_does_not_wait_for_anothers() {
        let commits = Arc::new(GroupCommits::<&str, u32, u32>::default());
        let (release, writing) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let held = tokio::spawn({
            let (commits, write) = (commits.clone(), echo_after(release.clone(), writing.clone()));
            async move { commits.submit("a", 1, write).await }
        });
        writing.notified().await;
        let batches = Mutex::new(Vec::new());

        // Key "a" is still being written: key "b" is written at once, alone.
        let other = commits
            .submit("b", 2, |items: Vec<u32>| {
                batches.lock().unwrap().push(items.clone());
                async move { items }
            })
            .await;

        assert_eq!(other, Some(2));
        assert_eq!(*batches.lock().unwrap(), vec![vec![2]]);
        assert_eq!(commits.groups(), 1, "b's group went when its last item was written");
        release.notify_one();
        assert_eq!(held.await.unwrap(), Some(1));
        assert_eq!(commits.groups(), 0);
    }

    // One thread, so that a task seen to have queued its item has also looked for a write to start.
    #[tokio::test(flavor = "current_thread")]
    async fn an_item_comes_back_instead_of_waiting_for_a_write_under_way_unless_a_waiting_item_matches() {
        let commits = Arc::new(GroupCommits::<&str, u32, u32>::default());
        let (release, writing) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let even = |item: &u32| item.is_multiple_of(2);
        let batches = Arc::new(Mutex::new(Vec::new()));
        let echo = {
            let batches = batches.clone();
            move |items: Vec<u32>| {
                batches.lock().unwrap().push(items.clone());
                std::future::ready(items)
            }
        };
        let queued = commits.queue_unless_writing("a", 1, even).expect("nothing under way");
        assert_eq!(queued.written(echo.clone()).await, Some(1));
        let held = tokio::spawn({
            let (commits, write) = (commits.clone(), echo_after(release.clone(), writing.clone()));
            async move { commits.submit("a", 2, write).await }
        });
        writing.notified().await;
        assert_eq!(commits.queue_unless_writing("a", 3, even).err(), Some(3), "a write is under way");
        let other_key = commits.queue_unless_writing("b", 5, even).expect("another key's");
        assert_eq!(other_key.written(echo.clone()).await, Some(5));

        let odd = tokio::spawn({
            let (commits, echo) = (commits.clone(), echo.clone());
            async move { commits.submit("a", 7, echo).await }
        });
        queued_for(&commits, "a", 1).await;
        assert_eq!(commits.queue_unless_writing("a", 9, even).err(), Some(9), "the item waiting does not match");
        let matching = tokio::spawn({
            let (commits, echo) = (commits.clone(), echo.clone());
            async move { commits.submit("a", 4, echo).await }
        });
        queued_for(&commits, "a", 2).await;
        let joined = commits.queue_unless_writing("a", 11, even).expect("queued with the matching item");

        release.notify_one();
        assert_eq!(held.await.unwrap(), Some(2));
        assert_eq!((odd.await.unwrap(), matching.await.unwrap()), (Some(7), Some(4)));
        assert_eq!(joined.written(echo).await, Some(11), "written by the task that wrote the others");
        assert_eq!(*batches.lock().unwrap(), vec![vec![1], vec![5], vec![7, 4, 11]], "nothing handed back was written");
        assert_eq!(commits.groups(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_cancelled_submission_leaves_no_group_behind() {
        let commits = Arc::new(GroupCommits::<&str, u32, u32>::default());
        let stalled = tokio::spawn({
            let commits = commits.clone();
            async move { commits.submit("a", 1, |_: Vec<u32>| std::future::pending::<Vec<u32>>()).await }
        });
        while commits.groups() == 0 {
            tokio::task::yield_now().await;
        }

        stalled.abort();

        assert!(stalled.await.unwrap_err().is_cancelled());
        assert_eq!(commits.groups(), 0);
    }
}
