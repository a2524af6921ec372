//! The refund state machine: the statuses a refund can be in, and the one function that decides
//! which moves between them are legal.
//!
//! ```text
//! pending ──claim──▶ processing ──provider refunded──────▶ succeeded
//!    ▲                   │ ──provider refused──────────▶ failed
//!    │ not sent, retry   │ ──not sent, attempts spent─▶ failed
//!    └───────────────────┤ ──outcome uncertain────────▶ unknown ──webhook / poll──▶ succeeded | failed
//!    ▲                   │ ──lease expired in window──▶ pending
//!    │                   │ ──lease expired past it───▶ unknown
//!    │                                                    │ ──provider has no refund, in window──▶ pending
//!    │                                                    └──attempts or age spent,──▶ dead_lettered
//!    │                                                       or a refund not as asked
//!    └────────────────────────────────────────── operator retry ◀──┘      └──operator──▶ succeeded | failed
//! ```
//!
//! The states are a payment's ([`crate::status`]), and so are the shapes of the moves: a refund is
//! a second kind of send. What differs is what they mean (`succeeded` is money given back), which
//! is why a refund has a status of its own: code that holds a refund cannot take a payment's move
//! by mistake. In PostgreSQL both columns share the `payment_status` enum type, whose values are
//! the same.
//!
//! Pure: no I/O. The store persists each legal move as a compare-and-set
//! (`UPDATE refunds … WHERE status = <from>`) plus an audit row (`refund_events`). A terminal
//! status never changes again.

use serde::{Deserialize, Serialize};

use crate::status::six_states;

/// Where a refund stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(type_name = "payment_status", rename_all = "snake_case"))]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    /// Waiting for a worker. In: the api (accepted), the worker (not sent, will retry), the sweeper
    /// (a dead worker's lease, still inside the provider's key window), the reconciler (the provider
    /// provably has no refund), an operator (retry). Out: a worker's claim.
    Pending,
    /// A worker holds the lease and is asking the provider. In: a worker's claim. Out: the worker
    /// (an outcome) or the sweeper (the lease expired).
    Processing,
    /// The provider gave the money back; the ledger has the entry. Terminal. In: the worker, the
    /// reconciler (webhook or poll), an operator.
    Succeeded,
    /// The provider refused or failed the refund, or it provably never happened: no money moved.
    /// Terminal. In: the worker, the reconciler, an operator.
    Failed,
    /// The provider may or may not have given the money back. In: the worker, the sweeper. Out:
    /// only the reconciler, never a client retry.
    Unknown,
    /// Automation gave up, or the provider reported a refund that is not what was asked; an
    /// operator decides. In: the reconciler. Out: an operator.
    DeadLettered,
}

six_states!(RefundStatus, "refund");

/// Something that happened to a refund and may move it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefundTransition {
    /// A worker took the lease to send it.
    Claim,
    /// The provider gave the money back (a response, a poll, a webhook, an operator's finding).
    Refunded,
    /// The provider refused or failed the refund: no money moved.
    Refused,
    /// The request provably never reached the provider, and attempts remain.
    NotSentRetry,
    /// The request provably never reached the provider, and the attempts are spent.
    NotSentExhausted,
    /// The request may have reached the provider and the response was lost.
    Uncertain,
    /// The worker's lease expired inside the provider's key window: resend with the same key.
    LeaseExpiredResend,
    /// The worker's lease expired past the provider's key window: a resend could refund twice.
    LeaseExpiredUncertain,
    /// The provider provably has no refund for the key, inside its window: safe to resend.
    ProviderHasNoRefund,
    /// The reconciler spent its attempts or the refund is too old to settle automatically.
    Exhausted,
    /// The provider reported a refund that is not what was asked (another amount, currency or
    /// charge): only an operator may decide what it means.
    RefundMismatch,
    /// An operator sends a dead-lettered refund again.
    OperatorRetry,
    /// An operator settles a dead-lettered refund as succeeded.
    OperatorSucceeded,
    /// An operator settles a dead-lettered refund as failed.
    OperatorFailed,
}

impl RefundTransition {
    /// Whether this move means a send may have reached the provider: its response was lost, or its
    /// worker stopped before recording one. The refund keeps this for good
    /// (`refunds.may_have_moved`), across every later resend.
    pub const fn send_may_have_reached_provider(self) -> bool {
        matches!(self, Self::Uncertain | Self::LeaseExpiredResend | Self::LeaseExpiredUncertain)
    }
}

/// A transition that the state machine does not allow from the refund's current status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a refund in `{}` cannot take `{transition:?}`", from.as_str())]
pub struct IllegalRefundTransition {
    /// The status the refund was in.
    pub from: RefundStatus,
    /// What was attempted.
    pub transition: RefundTransition,
}

/// Decides where `transition` takes a refund that is in `from`.
pub const fn next(from: RefundStatus, transition: RefundTransition) -> Result<RefundStatus, IllegalRefundTransition> {
    use RefundStatus as S;
    use RefundTransition as T;

    let to = match (from, transition) {
        (S::Pending, T::Claim) => S::Processing,

        (S::Processing, T::Refunded) => S::Succeeded,
        (S::Processing, T::Refused | T::NotSentExhausted) => S::Failed,
        (S::Processing, T::NotSentRetry | T::LeaseExpiredResend) => S::Pending,
        (S::Processing, T::Uncertain | T::LeaseExpiredUncertain) => S::Unknown,

        (S::Unknown, T::Refunded) => S::Succeeded,
        (S::Unknown, T::Refused) => S::Failed,
        (S::Unknown, T::ProviderHasNoRefund) => S::Pending,
        (S::Unknown, T::Exhausted | T::RefundMismatch) => S::DeadLettered,

        (S::DeadLettered, T::OperatorRetry) => S::Pending,
        (S::DeadLettered, T::OperatorSucceeded) => S::Succeeded,
        (S::DeadLettered, T::OperatorFailed) => S::Failed,

        (
            S::Pending | S::Processing | S::Succeeded | S::Failed | S::Unknown | S::DeadLettered,
            T::Claim
            | T::Refunded
            | T::Refused
            | T::NotSentRetry
            | T::NotSentExhausted
            | T::Uncertain
            | T::LeaseExpiredResend
            | T::LeaseExpiredUncertain
            | T::ProviderHasNoRefund
            | T::Exhausted
            | T::RefundMismatch
            | T::OperatorRetry
            | T::OperatorSucceeded
            | T::OperatorFailed,
        ) => return Err(IllegalRefundTransition { from, transition }),
    };
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{self, PaymentStatus, Transition};

    const ALL_TRANSITIONS: [RefundTransition; 14] = [
        RefundTransition::Claim,
        RefundTransition::Refunded,
        RefundTransition::Refused,
        RefundTransition::NotSentRetry,
        RefundTransition::NotSentExhausted,
        RefundTransition::Uncertain,
        RefundTransition::LeaseExpiredResend,
        RefundTransition::LeaseExpiredUncertain,
        RefundTransition::ProviderHasNoRefund,
        RefundTransition::Exhausted,
        RefundTransition::RefundMismatch,
        RefundTransition::OperatorRetry,
        RefundTransition::OperatorSucceeded,
        RefundTransition::OperatorFailed,
    ];

    /// The payment move each refund move is the second kind of.
    const fn payment_move(transition: RefundTransition) -> Transition {
        match transition {
            RefundTransition::Claim => Transition::Claim,
            RefundTransition::Refunded => Transition::Charged,
            RefundTransition::Refused => Transition::Declined,
            RefundTransition::NotSentRetry => Transition::NotSentRetry,
            RefundTransition::NotSentExhausted => Transition::NotSentExhausted,
            RefundTransition::Uncertain => Transition::Uncertain,
            RefundTransition::LeaseExpiredResend => Transition::LeaseExpiredResend,
            RefundTransition::LeaseExpiredUncertain => Transition::LeaseExpiredUncertain,
            RefundTransition::ProviderHasNoRefund => Transition::ProviderHasNoCharge,
            RefundTransition::Exhausted => Transition::Exhausted,
            RefundTransition::RefundMismatch => Transition::ChargeMismatch,
            RefundTransition::OperatorRetry => Transition::OperatorRetry,
            RefundTransition::OperatorSucceeded => Transition::OperatorSucceeded,
            RefundTransition::OperatorFailed => Transition::OperatorFailed,
        }
    }

    #[test]
    fn a_refund_moves_exactly_as_a_payment_does_under_its_own_names() {
        for (from, payment_from) in RefundStatus::ALL.into_iter().zip(PaymentStatus::ALL) {
            assert_eq!(from.as_str(), payment_from.as_str());
            for transition in ALL_TRANSITIONS {
                let refund_to = next(from, transition).ok().map(RefundStatus::as_str);
                let payment_to = status::next(payment_from, payment_move(transition)).ok().map(PaymentStatus::as_str);
                assert_eq!(refund_to, payment_to, "{from:?} + {transition:?}");
                assert_eq!(
                    transition.send_may_have_reached_provider(),
                    payment_move(transition).send_may_have_reached_provider(),
                    "{transition:?}"
                );
            }
        }
    }

    #[test]
    fn only_succeeded_and_failed_are_terminal() {
        let terminal: Vec<_> = RefundStatus::ALL.into_iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal, [RefundStatus::Succeeded, RefundStatus::Failed]);
    }

    #[test]
    fn a_succeeded_refund_takes_no_move() {
        for transition in ALL_TRANSITIONS {
            assert!(next(RefundStatus::Succeeded, transition).is_err(), "{transition:?}");
            assert!(next(RefundStatus::Failed, transition).is_err(), "{transition:?}");
        }
    }
}
