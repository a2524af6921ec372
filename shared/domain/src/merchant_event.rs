//! The events oncepay sends merchants (issue 49): which changes of a payment or a refund make one,
//! what each is called, and what its `data` holds.
//!
//! An event is written in the transaction of the change it tells of, so there is no change without
//! its event and no event of a change that rolled back. Its `data` is the resource as `GET` returned
//! it right after the change, with the change's place in the resource's history (`sequence`) and
//! the status before it (`previous_status`): a receiver that has seen a higher `sequence` drops the
//! event as stale.

use std::fmt;

use serde::Serialize;

use crate::payment::PaymentResource;
use crate::refund::RefundResource;
use crate::refund_status::RefundStatus;
use crate::status::PaymentStatus;

/// What an event tells of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// A payment was charged: by the worker, or settled so by the reconciler.
    PaymentSucceeded,
    /// A payment failed: no money moved.
    PaymentFailed,
    /// Automation gave up on a payment: an operator decides what happened.
    PaymentDeadLettered,
    /// An operator settled a dead-lettered payment; its `status` says how.
    PaymentResolved,
    /// An operator sent a dead-lettered payment again: it is `pending`.
    PaymentRetried,
    /// A refund gave the money back.
    RefundSucceeded,
    /// A refund failed: no money moved.
    RefundFailed,
    /// Automation gave up on a refund: an operator decides what happened.
    RefundDeadLettered,
    /// An operator settled a dead-lettered refund; its `status` says how.
    RefundResolved,
    /// An operator sent a dead-lettered refund again: it is `pending`.
    RefundRetried,
    /// oncepay stopped delivering to one of the tenant's endpoints (sent to its others).
    EndpointDisabled,
    /// A test the merchant asked for (`POST /v1/webhook-endpoints/{id}/test`).
    EndpointTest,
}

impl EventType {
    /// Every type, in the order the README lists them.
    pub const ALL: [Self; 12] = [
        Self::PaymentSucceeded,
        Self::PaymentFailed,
        Self::PaymentDeadLettered,
        Self::PaymentResolved,
        Self::PaymentRetried,
        Self::RefundSucceeded,
        Self::RefundFailed,
        Self::RefundDeadLettered,
        Self::RefundResolved,
        Self::RefundRetried,
        Self::EndpointDisabled,
        Self::EndpointTest,
    ];

    /// The name on the wire, in the body's `type` and in an endpoint's `event_types`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::PaymentSucceeded => "payment.succeeded",
            Self::PaymentFailed => "payment.failed",
            Self::PaymentDeadLettered => "payment.dead_lettered",
            Self::PaymentResolved => "payment.resolved",
            Self::PaymentRetried => "payment.retried",
            Self::RefundSucceeded => "refund.succeeded",
            Self::RefundFailed => "refund.failed",
            Self::RefundDeadLettered => "refund.dead_lettered",
            Self::RefundResolved => "refund.resolved",
            Self::RefundRetried => "refund.retried",
            Self::EndpointDisabled => "endpoint.disabled",
            Self::EndpointTest => "endpoint.test",
        }
    }

    /// The type named `name`, if there is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// The event a payment's move from `from` to `to` makes, if any. Moves that only the worker and
    /// the reconciler care about (a claim, a resend, an uncertain send) make none.
    pub const fn of_payment_change(from: PaymentStatus, to: PaymentStatus) -> Option<Self> {
        use PaymentStatus as S;
        Some(match (from, to) {
            (S::DeadLettered, S::Succeeded | S::Failed) => Self::PaymentResolved,
            (S::DeadLettered, S::Pending) => Self::PaymentRetried,
            (_, S::Succeeded) => Self::PaymentSucceeded,
            (_, S::Failed) => Self::PaymentFailed,
            (_, S::DeadLettered) => Self::PaymentDeadLettered,
            _ => return None,
        })
    }

    /// The event a refund's move from `from` to `to` makes, if any, as [`Self::of_payment_change`].
    pub const fn of_refund_change(from: RefundStatus, to: RefundStatus) -> Option<Self> {
        use RefundStatus as S;
        Some(match (from, to) {
            (S::DeadLettered, S::Succeeded | S::Failed) => Self::RefundResolved,
            (S::DeadLettered, S::Pending) => Self::RefundRetried,
            (_, S::Succeeded) => Self::RefundSucceeded,
            (_, S::Failed) => Self::RefundFailed,
            (_, S::DeadLettered) => Self::RefundDeadLettered,
            _ => return None,
        })
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An event's `data`: the resource after the change, its place in the resource's history and the
/// status before it.
#[derive(Debug, Clone, Serialize)]
pub struct ChangeData<R, S> {
    /// The resource as `GET` returns it right after the change.
    #[serde(flatten)]
    pub resource: R,
    /// The change's place in the resource's history, from 1; a later change has a higher one.
    pub sequence: i32,
    /// The status the change moved the resource from.
    pub previous_status: S,
}

/// The `data` of a payment's event.
pub type PaymentChangeData = ChangeData<PaymentResource, PaymentStatus>;

/// The `data` of a refund's event.
pub type RefundChangeData = ChangeData<RefundResource, RefundStatus>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_parses_back_from_its_name() {
        for event_type in EventType::ALL {
            assert_eq!(EventType::parse(event_type.as_str()), Some(event_type));
        }
        assert_eq!(EventType::parse("payment.charged"), None);
    }

    #[test]
    fn only_final_and_operator_moves_make_payment_events() {
        use PaymentStatus as S;
        let made: Vec<_> = S::ALL
            .into_iter()
            .flat_map(|from| S::ALL.into_iter().map(move |to| (from, to)))
            .filter_map(|(from, to)| EventType::of_payment_change(from, to).map(|t| (from, to, t)))
            .collect();
        for (from, to, event_type) in made {
            match to {
                S::Succeeded | S::Failed if from == S::DeadLettered => {
                    assert_eq!(event_type, EventType::PaymentResolved)
                }
                S::Succeeded => assert_eq!(event_type, EventType::PaymentSucceeded),
                S::Failed => assert_eq!(event_type, EventType::PaymentFailed),
                S::DeadLettered => assert_eq!(event_type, EventType::PaymentDeadLettered),
                S::Pending => assert_eq!((from, event_type), (S::DeadLettered, EventType::PaymentRetried)),
                S::Processing | S::Unknown => panic!("{from:?} to {to:?} made {event_type}"),
            }
        }
        assert_eq!(EventType::of_payment_change(S::Pending, S::Processing), None);
        assert_eq!(EventType::of_payment_change(S::Processing, S::Unknown), None);
        assert_eq!(EventType::of_payment_change(S::Processing, S::Pending), None);
    }

    #[test]
    fn refunds_make_the_same_events_as_payments() {
        use RefundStatus as R;
        assert_eq!(EventType::of_refund_change(R::Processing, R::Succeeded), Some(EventType::RefundSucceeded));
        assert_eq!(EventType::of_refund_change(R::Unknown, R::Failed), Some(EventType::RefundFailed));
        assert_eq!(EventType::of_refund_change(R::Unknown, R::DeadLettered), Some(EventType::RefundDeadLettered));
        assert_eq!(EventType::of_refund_change(R::DeadLettered, R::Succeeded), Some(EventType::RefundResolved));
        assert_eq!(EventType::of_refund_change(R::DeadLettered, R::Pending), Some(EventType::RefundRetried));
        assert_eq!(EventType::of_refund_change(R::Processing, R::Pending), None);
    }
}
