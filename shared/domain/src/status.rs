//! The payment state machine: the statuses a payment can be in, and the one function that decides
//! which moves between them are legal.
//!
//! ```text
//! pending ──claim──▶ processing ──provider says charged──▶ succeeded
//!    ▲                   │ ──provider says declined───▶ failed
//!    │ not sent, retry   │ ──not sent, attempts spent─▶ failed
//!    └───────────────────┤ ──outcome uncertain────────▶ unknown ──webhook / poll──▶ succeeded | failed
//!    ▲                   │ ──lease expired in window──▶ pending
//!    │                   │ ──lease expired past it───▶ unknown
//!    │                                                    │ ──provider has no charge, in window──▶ pending
//!    │                                                    └──attempts or age spent,──▶ dead_lettered
//!    │                                                       or a charge not as asked
//!    └────────────────────────────────────────── operator retry ◀──┘      └──operator──▶ succeeded | failed
//! ```
//!
//! Pure: no I/O. The store persists each legal move as a compare-and-set
//! (`UPDATE … WHERE status = <from>`) plus an audit row; losing that race is a normal outcome. A
//! terminal status (`succeeded`, `failed`) never changes again, whatever evidence arrives later.

use serde::{Deserialize, Serialize};

/// Where a payment stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(type_name = "payment_status", rename_all = "snake_case"))]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    /// Waiting for a worker. In: the api (accepted), the worker (not sent, will retry), the sweeper
    /// (a dead worker's lease, still inside the provider's key window), the reconciler (the provider
    /// provably has no charge), an operator (retry). Out: a worker's claim.
    Pending,
    /// A worker holds the lease and is talking to the provider. In: a worker's claim. Out: the
    /// worker (an outcome) or the sweeper (the lease expired).
    Processing,
    /// The provider charged the customer; the ledger has the entry. Terminal. In: the worker, the
    /// reconciler (webhook or poll), an operator.
    Succeeded,
    /// The provider declined, or the charge provably never happened. Terminal. In: the worker, the
    /// reconciler, an operator.
    Failed,
    /// The provider may or may not have charged. In: the worker (timeout, reset after sending, 5xx),
    /// the sweeper (a dead worker's lease past the key window). Out: only the reconciler, never a
    /// client retry.
    Unknown,
    /// Automation gave up, or the provider reported a charge that is not what the payment asked for;
    /// an operator decides. In: the reconciler. Out: an operator.
    DeadLettered,
}

/// What a payment's and a refund's statuses share, for code that follows either: some are final.
pub trait Status: Copy + Eq {
    /// Whether it is final: nothing moves it again.
    fn is_terminal(self) -> bool;
}

/// `ALL`, `is_terminal`, `as_str` and [`Status`] of a status with the six states a payment and a
/// refund share (their meanings are each kind's own), `what` naming its kind in the docs.
macro_rules! six_states {
    ($status:ident, $what:literal) => {
        impl $status {
            /// Every status, in declaration order.
            pub const ALL: [Self; 6] =
                [Self::Pending, Self::Processing, Self::Succeeded, Self::Failed, Self::Unknown, Self::DeadLettered];

            #[doc = concat!("Whether the ", $what, " has reached its final state.")]
            pub const fn is_terminal(self) -> bool {
                matches!(self, Self::Succeeded | Self::Failed)
            }

            /// The name used on the wire and in PostgreSQL.
            pub const fn as_str(self) -> &'static str {
                match self {
                    Self::Pending => "pending",
                    Self::Processing => "processing",
                    Self::Succeeded => "succeeded",
                    Self::Failed => "failed",
                    Self::Unknown => "unknown",
                    Self::DeadLettered => "dead_lettered",
                }
            }
        }

        impl $crate::status::Status for $status {
            fn is_terminal(self) -> bool {
                Self::is_terminal(self)
            }
        }
    };
}
pub(crate) use six_states;

six_states!(PaymentStatus, "payment");

/// Something that happened to a payment and may move it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transition {
    /// A worker took the lease to send it.
    Claim,
    /// The provider charged the customer (a 201, a poll, a webhook, an operator's finding).
    Charged,
    /// The provider declined, or rejected the request without charging.
    Declined,
    /// The request provably never reached the provider, and attempts remain.
    NotSentRetry,
    /// The request provably never reached the provider, and the attempts are spent.
    NotSentExhausted,
    /// The request may have reached the provider and the response was lost.
    Uncertain,
    /// The worker's lease expired inside the provider's key window: resend with the same key.
    LeaseExpiredResend,
    /// The worker's lease expired past the provider's key window: a resend could charge twice.
    LeaseExpiredUncertain,
    /// The provider provably has no charge for the key, inside its window: safe to resend.
    ProviderHasNoCharge,
    /// The reconciler spent its attempts or the payment is too old to settle automatically.
    Exhausted,
    /// The provider reported a charge for the payment that is not what it asked for (another amount,
    /// currency or key): only an operator may decide what it means.
    ChargeMismatch,
    /// An operator sends a dead-lettered payment again.
    OperatorRetry,
    /// An operator settles a dead-lettered payment as succeeded.
    OperatorSucceeded,
    /// An operator settles a dead-lettered payment as failed.
    OperatorFailed,
}

impl Transition {
    /// Whether this move means a send may have reached the provider: its response was lost, or its
    /// worker stopped before recording one. The payment keeps this for good
    /// (`payments.may_be_charged`), across every later resend.
    pub const fn send_may_have_reached_provider(self) -> bool {
        matches!(self, Self::Uncertain | Self::LeaseExpiredResend | Self::LeaseExpiredUncertain)
    }
}

/// A transition that the state machine does not allow from the payment's current status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a payment in `{}` cannot take `{transition:?}`", from.as_str())]
pub struct IllegalTransition {
    /// The status the payment was in.
    pub from: PaymentStatus,
    /// What was attempted.
    pub transition: Transition,
}

/// Decides where `transition` takes a payment that is in `from`.
pub const fn next(from: PaymentStatus, transition: Transition) -> Result<PaymentStatus, IllegalTransition> {
    use PaymentStatus as S;
    use Transition as T;

    let to = match (from, transition) {
        (S::Pending, T::Claim) => S::Processing,

        (S::Processing, T::Charged) => S::Succeeded,
        (S::Processing, T::Declined) => S::Failed,
        (S::Processing, T::NotSentRetry) => S::Pending,
        (S::Processing, T::NotSentExhausted) => S::Failed,
        (S::Processing, T::Uncertain) => S::Unknown,
        (S::Processing, T::LeaseExpiredResend) => S::Pending,
        (S::Processing, T::LeaseExpiredUncertain) => S::Unknown,

        (S::Unknown, T::Charged) => S::Succeeded,
        (S::Unknown, T::Declined) => S::Failed,
        (S::Unknown, T::ProviderHasNoCharge) => S::Pending,
        (S::Unknown, T::Exhausted | T::ChargeMismatch) => S::DeadLettered,

        (S::DeadLettered, T::OperatorRetry) => S::Pending,
        (S::DeadLettered, T::OperatorSucceeded) => S::Succeeded,
        (S::DeadLettered, T::OperatorFailed) => S::Failed,

        (
            S::Pending | S::Processing | S::Succeeded | S::Failed | S::Unknown | S::DeadLettered,
            T::Claim
            | T::Charged
            | T::Declined
            | T::NotSentRetry
            | T::NotSentExhausted
            | T::Uncertain
            | T::LeaseExpiredResend
            | T::LeaseExpiredUncertain
            | T::ProviderHasNoCharge
            | T::Exhausted
            | T::ChargeMismatch
            | T::OperatorRetry
            | T::OperatorSucceeded
            | T::OperatorFailed,
        ) => return Err(IllegalTransition { from, transition }),
    };
    Ok(to)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const ALL_TRANSITIONS: [Transition; 14] = [
        Transition::Claim,
        Transition::Charged,
        Transition::Declined,
        Transition::NotSentRetry,
        Transition::NotSentExhausted,
        Transition::Uncertain,
        Transition::LeaseExpiredResend,
        Transition::LeaseExpiredUncertain,
        Transition::ProviderHasNoCharge,
        Transition::Exhausted,
        Transition::ChargeMismatch,
        Transition::OperatorRetry,
        Transition::OperatorSucceeded,
        Transition::OperatorFailed,
    ];

    #[test]
    fn every_move_into_unknown_marks_a_send_that_may_have_reached_the_provider() {
        for from in PaymentStatus::ALL {
            for transition in ALL_TRANSITIONS {
                if next(from, transition) == Ok(PaymentStatus::Unknown) {
                    assert!(transition.send_may_have_reached_provider(), "{transition:?}");
                }
            }
        }
    }

    #[test]
    fn the_legal_moves_are_exactly_the_documented_ones() {
        use PaymentStatus as S;
        use Transition as T;
        let legal = [
            (S::Pending, T::Claim, S::Processing),
            (S::Processing, T::Charged, S::Succeeded),
            (S::Processing, T::Declined, S::Failed),
            (S::Processing, T::NotSentRetry, S::Pending),
            (S::Processing, T::NotSentExhausted, S::Failed),
            (S::Processing, T::Uncertain, S::Unknown),
            (S::Processing, T::LeaseExpiredResend, S::Pending),
            (S::Processing, T::LeaseExpiredUncertain, S::Unknown),
            (S::Unknown, T::Charged, S::Succeeded),
            (S::Unknown, T::Declined, S::Failed),
            (S::Unknown, T::ProviderHasNoCharge, S::Pending),
            (S::Unknown, T::Exhausted, S::DeadLettered),
            (S::Unknown, T::ChargeMismatch, S::DeadLettered),
            (S::DeadLettered, T::OperatorRetry, S::Pending),
            (S::DeadLettered, T::OperatorSucceeded, S::Succeeded),
            (S::DeadLettered, T::OperatorFailed, S::Failed),
        ];

        for from in PaymentStatus::ALL {
            for transition in ALL_TRANSITIONS {
                let expected = legal.iter().find(|(f, t, _)| *f == from && *t == transition).map(|(_, _, to)| *to);
                assert_eq!(next(from, transition).ok(), expected, "{from:?} + {transition:?}");
            }
        }
    }

    #[test]
    fn only_succeeded_and_failed_are_terminal() {
        let terminal: Vec<_> = PaymentStatus::ALL.into_iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal, [PaymentStatus::Succeeded, PaymentStatus::Failed]);
    }

    #[test]
    fn a_client_retry_has_no_transition_out_of_unknown() {
        // Only the reconciler's findings or its giving up move an unknown payment.
        let out_of_unknown: Vec<_> =
            ALL_TRANSITIONS.into_iter().filter(|t| next(PaymentStatus::Unknown, *t).is_ok()).collect();
        assert_eq!(
            out_of_unknown,
            [
                Transition::Charged,
                Transition::Declined,
                Transition::ProviderHasNoCharge,
                Transition::Exhausted,
                Transition::ChargeMismatch
            ]
        );
    }

    proptest! {
        #[test]
        fn no_sequence_of_events_moves_a_terminal_payment(
            events in proptest::collection::vec(0..ALL_TRANSITIONS.len(), 0..40)
        ) {
            let mut status = PaymentStatus::Pending;
            let mut reached_terminal: Option<PaymentStatus> = None;
            for index in events {
                if let Ok(to) = next(status, ALL_TRANSITIONS[index]) {
                    if let Some(terminal) = reached_terminal {
                        prop_assert!(false, "{terminal:?} moved to {to:?}");
                    }
                    status = to;
                    if status.is_terminal() {
                        reached_terminal = Some(status);
                    }
                }
            }
        }
    }
}
