//! Deliveries the drainer hands to the event sender without a claim.
//!
//! When the drainer settles payments, their events' deliveries are queued in the same transaction.
//! Each one that a claim could take at that moment is queued leased to this worker instead
//! (`oncepay_store::merchant_events::of_payments`), and once the transaction has committed the
//! drainer hands it here. The sender sends it as if it had claimed it. A claim walked the endpoint's
//! pending deliveries and wrote each one a second time; it was the largest cost a delivery added to
//! a payment (BENCHMARKS.md, "Events to merchants").
//!
//! Hand-offs run in slots of their own, half of the sender's `max_in_flight`, so that the claims of
//! everything else (retries, events the api and the reconciler write, deliveries whose lease ran
//! out) always have the other half. The drainer reserves slots before its transaction and leases at
//! most that many. A delivery handed after the sender has stopped is dropped: its lease runs out
//! and a claim takes it, as after a crash.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use oncepay_store::merchant_deliveries::{ClaimedDelivery, WriterLease};

/// A delivery handed over: sent as a claimed one, with its slot.
pub struct Handed {
    /// The delivery, leased to this worker.
    pub delivery: ClaimedDelivery,
    /// When its lease was asked for: before the transaction that queued it.
    pub asked_at: Instant,
    /// Its slot, free again when the delivery ends.
    pub slot: OwnedSemaphorePermit,
}

/// The drainer's end of the hand-off.
#[derive(Clone)]
pub struct HandOff {
    worker_id: String,
    lease: Duration,
    per_endpoint: u32,
    slots: Arc<Semaphore>,
    to_sender: mpsc::UnboundedSender<Handed>,
}

impl HandOff {
    /// A hand-off of at most `slots` deliveries in flight at once, leased to `worker_id` for
    /// `lease`, at most `per_endpoint` of one endpoint; and the sender's end.
    pub fn new(
        worker_id: String,
        lease: Duration,
        per_endpoint: u32,
        slots: u32,
    ) -> (Self, mpsc::UnboundedReceiver<Handed>) {
        let (to_sender, from_drainer) = mpsc::unbounded_channel();
        let slots = Arc::new(Semaphore::new(usize::try_from(slots).unwrap_or(0)));
        (Self { worker_id, lease, per_endpoint, slots, to_sender }, from_drainer)
    }

    /// Reserves up to `most` free slots for one transaction's deliveries; `None` when none is free.
    pub fn reserve(&self, most: usize) -> Option<Reserved<'_>> {
        let free = self.slots.available_permits().min(most);
        let slots = u32::try_from(free).ok().filter(|n| *n > 0)?;
        let slots = Arc::clone(&self.slots).try_acquire_many_owned(slots).ok()?;
        Some(Reserved { hand_off: self, slots, asked_at: Instant::now() })
    }
}

/// Slots reserved for one transaction: its lease, and the hand-off of what it leased.
pub struct Reserved<'a> {
    hand_off: &'a HandOff,
    slots: OwnedSemaphorePermit,
    asked_at: Instant,
}

impl Reserved<'_> {
    /// The lease to queue deliveries under: at most one per reserved slot.
    pub fn lease(&self) -> WriterLease<'_> {
        WriterLease {
            worker: &self.hand_off.worker_id,
            lease: self.hand_off.lease,
            per_endpoint: self.hand_off.per_endpoint,
            limit: u32::try_from(self.slots.num_permits()).unwrap_or(u32::MAX),
        }
    }

    /// Hands `leased`, queued under [`Reserved::lease`] by a transaction that has committed, to the
    /// sender, each with one of the slots; frees the slots left over.
    pub fn hand(mut self, leased: Vec<ClaimedDelivery>) {
        for delivery in leased {
            let Some(slot) = self.slots.split(1) else {
                tracing::error!(event.id = %delivery.event_id, "a delivery was leased beyond the slots reserved for it; its lease will run out and it is claimed then");
                continue;
            };
            let handed = Handed { delivery, asked_at: self.asked_at, slot };
            if self.hand_off.to_sender.send(handed).is_err() {
                // The sender has stopped: the lease runs out, and a claim takes the delivery.
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_takes_only_free_slots_and_frees_what_it_does_not_hand() {
        let (hand_off, _from_drainer) = HandOff::new("w".into(), Duration::from_secs(60), 4, 3);
        let first = hand_off.reserve(2).expect("two of three slots are free");
        assert_eq!(first.lease().limit, 2);
        let second = hand_off.reserve(5).expect("one slot is free");
        assert_eq!(second.lease().limit, 1);
        assert!(hand_off.reserve(1).is_none(), "no slot is free");
        first.hand(Vec::new());
        assert_eq!(
            hand_off.reserve(5).map(|r| r.lease().limit),
            Some(2),
            "the first reservation's slots are free again"
        );
    }
}
