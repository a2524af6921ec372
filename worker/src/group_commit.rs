//! Group commit: concurrent tasks each hand over one item to write, and whichever of them finds no
//! write under way writes every item waiting at that moment in one go, then hands each task its own
//! result.
//!
//! Invariants: at most one write is under way at a time; every item is written at most once, by one
//! writer, in the order it was queued; a task gets the result of its own item and no other. This
//! module knows nothing about payments or databases: the caller passes the writer in.
//!
//! [`GroupCommits`] keeps one group per key (the worker's: per tenant), so that items of different
//! keys are never written together and one key's write never waits for another's.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

/// Items waiting to be written, and the turn to write them.
///
/// The drainer's sends finish at different moments, each with one payment to record. A transaction
/// per payment costs a commit (a WAL flush) and several round trips each, which on a busy database is
/// most of what draining a payment costs (see BENCHMARKS.md). Here the first send to finish writes
/// its payment at once; the sends that finish during that write queue up, and the next of them to
/// get the turn writes them all together. No timer: under light load every batch is one item and
/// nothing waits; under heavy load batches grow by themselves.
pub struct GroupCommit<T, R> {
    // A std mutex: held only to push or take, never across an `.await`.
    waiting: Mutex<Vec<(T, oneshot::Sender<R>)>>,
    // Tokio's mutex: the writer holds the turn across the write, which awaits.
    turn: tokio::sync::Mutex<()>,
}

impl<T, R> Default for GroupCommit<T, R> {
    fn default() -> Self {
        Self { waiting: Mutex::new(Vec::new()), turn: tokio::sync::Mutex::new(()) }
    }
}

impl<T, R> GroupCommit<T, R> {
    /// Queues `item` and returns its result: written by this task, together with everything else
    /// waiting when it gets the turn, or by another task that got the turn first. `write` gets the
    /// items in queue order and must return exactly one result per item, in the same order. `None`:
    /// the task writing this item stopped before it delivered the result (its future was dropped, as
    /// when the worker's shutdown grace runs out); treat the item's fate as unknown.
    pub async fn submit<W, F>(&self, item: T, write: W) -> Option<R>
    where
        W: Fn(Vec<T>) -> F,
        F: Future<Output = Vec<R>>,
    {
        let (sender, mut result) = oneshot::channel();
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner).push((item, sender));
        loop {
            // `biased`: a result that has arrived wins over the turn, so a task whose item was
            // written by another does not take the turn for nothing.
            let turn = tokio::select! {
                biased;
                delivered = &mut result => return delivered.ok(),
                turn = self.turn.lock() => turn,
            };
            // While this task waited for the turn, the previous writer may have taken its item.
            match result.try_recv() {
                Ok(delivered) => return Some(delivered),
                Err(oneshot::error::TryRecvError::Closed) => return None,
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            let batch = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(PoisonError::into_inner));
            if batch.is_empty() {
                // Not reached: a writer holds the turn until it has delivered (or, stopped, has
                // dropped its senders). Waiting for the result is right either way.
                drop(turn);
                return result.await.ok();
            }
            let (items, senders): (Vec<T>, Vec<oneshot::Sender<R>>) = batch.into_iter().unzip();
            let results = write(items).await;
            // A waiting task that was cancelled has dropped its receiver: its result goes nowhere.
            for (sender, delivered) in senders.into_iter().zip(results) {
                let _ = sender.send(delivered);
            }
            drop(turn);
        }
    }
}

/// One [`GroupCommit`] per key. A key's group exists while some task is submitting to it, so the
/// map holds no more groups than there are keys in use.
pub struct GroupCommits<K, T, R> {
    // A std mutex: held only to find, add or drop a group, never across an `.await`.
    groups: Mutex<HashMap<K, Arc<GroupCommit<T, R>>>>,
}

impl<K, T, R> Default for GroupCommits<K, T, R> {
    fn default() -> Self {
        Self { groups: Mutex::new(HashMap::new()) }
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
        let member = Member::join(self, key);
        member.group.submit(item, write).await
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
        let group = Arc::clone(groups.entry(key.clone()).or_default());
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
        while group.waiting.lock().unwrap().len() != count {
            tokio::task::yield_now().await;
        }
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
