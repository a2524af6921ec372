//! What a lookup means for an `unknown` refund: the refunds the provider holds for the payment's
//! charge under the refund's downstream key.
//!
//! The refund lookup is a consistent source: an empty list proves that no refund was made under the
//! key so far. It proves that none ever will be only once no send can still land: a send whose
//! answer was lost may still be at the provider, and be made after the lookup. Every send of a
//! refund is made before it becomes `unknown`, and oncepay takes a provider to act on a request
//! within its key window. So a refund is failed as never made ([`NOT_MADE`]) only once it has been
//! `unknown` for the whole key window.
//!
//! A refund held by another provider account than the payment's is another merchant's: a lookup
//! that lists one is judged as if it did not, and the refund is only counted and logged.

use std::time::Duration;

use oncepay_ops::render;
use oncepay_provider::{LookupError, PaymentProvider, Refund as ProviderRefund, RefundLookup};
use oncepay_service::telemetry;
use oncepay_store::StoreError;
use oncepay_store::refunds::settling::{self, Finding, RefundSettlement};
use oncepay_store::transitions::{Recorded, TransitionError};
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use tracing::Span;

use super::{Poller, PollerConfig, Settled, Subject, Verdict};
use crate::unknown::Why;
use crate::unknown::refunds::{self as unknown, Claimed};

/// The failure code of a refund the provider provably never made: none under its key, and every send
/// of it older than the key window.
pub const NOT_MADE: &str = "refund_not_made";

/// The poller of `unknown` refunds, with the payments' poller's limits.
pub type RefundPoller<P> = Poller<Claimed, P>;

impl Subject for Claimed {
    type Settlement = RefundSettlement;

    const LOOP: &'static str = "refund_poller";
    const NOUN: &'static str = "refund";
    const RESOLVED_METRIC: &'static str = crate::metrics::UNKNOWN_REFUNDS_RESOLVED;

    async fn claim_due(
        conn: &mut PgConnection,
        batch_size: u32,
        lease: Duration,
        resend_horizon: Duration,
    ) -> Result<Vec<Self>, StoreError> {
        unknown::claim_due(conn, batch_size, lease, resend_horizon).await
    }

    fn span(&self) -> Span {
        let span = tracing::info_span!(
            "refund_poller.poll",
            refund.id = %self.refund_id(),
            tenant.id = %self.tenant_id(),
            poll.attempt = self.lookups.saturating_add(1),
            poll.outcome = tracing::field::Empty,
        );
        if let Some(trace) = &self.trace {
            telemetry::continue_trace(&span, trace);
        }
        span
    }

    fn lookups(&self) -> u32 {
        u32::try_from(self.lookups).unwrap_or(0)
    }

    fn age(&self) -> Duration {
        self.age
    }

    async fn look_up<P: PaymentProvider>(
        &self,
        _pool: &PgPool,
        provider: &P,
        config: &PollerConfig,
    ) -> anyhow::Result<Verdict<RefundSettlement>> {
        let lookup = RefundLookup {
            key: self.refund_id().downstream_key(),
            charge_id: self.asked.charge_id.clone(),
            account: self.asked.account.clone(),
        };
        let found = provider.find_refunds(&lookup).await;
        if let Ok(listed) = &found {
            for other in listed.iter().filter(|listed| !settling::same_account(&self.asked, listed)) {
                let why = format!(
                    "a lookup of refund {} listed refund {} of account {}",
                    self.refund_id(),
                    other.id,
                    other.account.as_deref().unwrap_or("(oncepay's own)")
                );
                crate::metrics::other_account("lookup", "refund", &why);
            }
        }
        Ok(decide(self, &found, config))
    }

    fn names(settled: Settled) -> (&'static str, &'static str) {
        match settled {
            Settled::Succeeded => ("refunded", "poll_refunded"),
            Settled::Failed => ("failed", "poll_failed"),
            Settled::NotMade => ("not_made", "poll_not_made"),
        }
    }

    async fn settle(
        &self,
        conn: &mut PgConnection,
        settlement: &RefundSettlement,
        why: Why<'_>,
        evidence: Value,
    ) -> Result<bool, TransitionError> {
        let recorded = unknown::settle(conn, self.tenant_id(), self.refund_id(), settlement, why, evidence).await?;
        Ok(matches!(recorded, Recorded::Moved(_)))
    }

    async fn resend(&self, conn: &mut PgConnection, why: Why<'_>, evidence: Value) -> Result<bool, TransitionError> {
        let recorded = unknown::resend(conn, self.tenant_id(), self.refund_id(), why, evidence).await?;
        Ok(matches!(recorded, Recorded::Moved(_)))
    }

    async fn exhaust(&self, conn: &mut PgConnection, why: Why<'_>, evidence: Value) -> Result<bool, TransitionError> {
        let recorded = unknown::exhaust(conn, self.tenant_id(), self.refund_id(), why, evidence).await?;
        Ok(matches!(recorded, Recorded::Moved(_)))
    }

    async fn mismatch(&self, conn: &mut PgConnection, why: Why<'_>, evidence: Value) -> Result<bool, TransitionError> {
        let recorded = unknown::mismatch(conn, self.tenant_id(), self.refund_id(), why, evidence).await?;
        Ok(matches!(recorded, Recorded::Moved(_)))
    }

    /// The evidence is kept on the refund, and goes into its audit row if it is dead-lettered.
    async fn note_inconclusive(
        &self,
        conn: &mut PgConnection,
        evidence: Value,
        wait: Duration,
    ) -> Result<bool, StoreError> {
        unknown::note_inconclusive(conn, self.tenant_id(), self.refund_id(), evidence, wait).await
    }
}

/// How long `refund` has been `unknown`, for people.
fn age(refund: &Claimed) -> String {
    render::age(time::Duration::try_from(refund.age).unwrap_or(time::Duration::MAX))
}

/// Decides what the refunds `lookup` found mean for `refund`. Pure.
fn decide(
    refund: &Claimed,
    lookup: &Result<Vec<ProviderRefund>, LookupError>,
    config: &PollerConfig,
) -> Verdict<RefundSettlement> {
    let detail = match lookup {
        Ok(listed) => {
            // Another account's refunds say nothing about this refund, whatever they name.
            let found: Vec<&ProviderRefund> =
                listed.iter().filter(|listed| settling::same_account(&refund.asked, listed)).collect();
            let others = listed.len() - found.len();
            match found.as_slice() {
                [] if others > 0 => format!(
                    "the provider listed {others} refund(s) of another provider account and none of the payment's \
                     account: that proves nothing"
                ),
                [] if refund.in_key_window => {
                    return Verdict::Resend {
                        reason: "the provider holds no refund under the refund's key and still remembers the key",
                        result: "no_refund_in_key_window",
                    };
                }
                [] if refund.age >= config.key_window.window => return not_made(),
                [] => format!(
                    "no refund under the key yet, and a send may still land: unknown for {}, less than the key window",
                    age(refund),
                ),
                [one] => match settling::judge(&refund.asked, one) {
                    Finding::Settles(settlement) => return settles(settlement, one),
                    Finding::NotAsAsked(detail) => {
                        return Verdict::Mismatch { detail, source: "poll", found: json!({ "refunds": found }) };
                    }
                    Finding::Unfinished => format!("the provider has not finished refund {}", one.id),
                },
                many => {
                    let ids: Vec<&str> = many.iter().map(|r| r.id.as_str()).collect();
                    let detail = format!(
                        "The provider holds {} refunds under the refund's key ({}): a key names one refund.",
                        many.len(),
                        ids.join(", "),
                    );
                    return Verdict::Mismatch { detail, source: "poll", found: json!({ "refunds": found }) };
                }
            }
        }
        Err(error) => format!("lookup failed: {error}"),
    };
    Verdict::inconclusive(refund, detail, config)
}

/// The provider's one refund under the key settles the refund.
fn settles(settlement: RefundSettlement, found: &ProviderRefund) -> Verdict<RefundSettlement> {
    let (settled, reason) = match settlement {
        RefundSettlement::Succeeded { .. } => {
            (Settled::Succeeded, "the provider holds a succeeded refund under the refund's key")
        }
        RefundSettlement::Failed { .. } => {
            (Settled::Failed, "the provider holds a failed refund under the refund's key")
        }
    };
    Verdict::Settle { settlement, settled, reason: reason.into(), source: "poll", found: json!({ "refund": found }) }
}

/// No refund under the key, past the resend horizon, and every send older than the key window:
/// `failed` with [`NOT_MADE`]. No money moved.
fn not_made() -> Verdict<RefundSettlement> {
    Verdict::Settle {
        settlement: RefundSettlement::Failed {
            code: NOT_MADE.to_owned(),
            message: "The provider holds no refund under this refund's key: no money went back.".to_owned(),
            provider_refund_id: None,
        },
        settled: Settled::NotMade,
        reason: "the provider holds no refund under the refund's key, and its key window has passed".into(),
        source: "poll",
        found: json!({ "result": "no_refund_past_key_window" }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
    use oncepay_domain::money::{Amount, Currency};
    use oncepay_provider::{RefundState, fixtures};
    use oncepay_store::refunds::settling::AskedRefund;

    use super::*;
    use crate::poller::tests::config;

    fn claimed(lookups: i32, age_secs: u64, in_key_window: bool) -> Claimed {
        Claimed {
            payment_id: PaymentId::generate(),
            asked: AskedRefund {
                tenant_id: TenantId::generate(),
                refund_id: RefundId::generate(),
                charge_id: "ch_1".to_owned(),
                account: None,
                amount: Amount::new(100).unwrap(),
                currency: Currency::parse("EUR").unwrap(),
            },
            lookups,
            age: Duration::from_secs(age_secs),
            in_key_window,
            trace: None,
        }
    }

    fn refund(claimed: &Claimed, id: &str, status: RefundState) -> ProviderRefund {
        fixtures::refund(claimed.refund_id(), id, "ch_1", status, 100)
    }

    fn label(verdict: &Verdict<RefundSettlement>) -> &'static str {
        match verdict {
            Verdict::Settle { settled: Settled::Succeeded, .. } => "refunded",
            Verdict::Settle { settled: Settled::Failed, .. } => "failed",
            Verdict::Settle { settled: Settled::NotMade, .. } => "not_made",
            Verdict::Mismatch { .. } => "mismatch",
            Verdict::Resend { .. } => "resend",
            Verdict::Inconclusive { .. } => "inconclusive",
            Verdict::Exhaust { .. } => "exhaust",
        }
    }

    #[test]
    fn each_lookup_result_gets_the_right_verdict() {
        let ok = |refunds: Vec<ProviderRefund>| -> Result<Vec<ProviderRefund>, LookupError> { Ok(refunds) };
        let failed = || -> Result<Vec<ProviderRefund>, LookupError> { Err(LookupError::Status(503)) };
        let fresh = claimed(0, 10, true);
        let old = claimed(0, 10, false);
        let long_unknown = claimed(0, 86_400, false);
        let last_try = claimed(4, 10, false);
        let too_old = claimed(0, 3600, true);
        let found = |c: &Claimed, status| ok(vec![refund(c, "re_1", status)]);
        let elsewhere = |refund: ProviderRefund| ProviderRefund { account: Some("acct_other".into()), ..refund };
        let cases = [
            ("refunded", &fresh, found(&fresh, RefundState::Succeeded), "refunded"),
            ("failed", &fresh, found(&fresh, RefundState::Failed), "failed"),
            ("canceled", &fresh, found(&fresh, RefundState::Canceled), "failed"),
            ("refunded, past the window", &old, found(&old, RefundState::Succeeded), "refunded"),
            ("found even on the last attempt", &last_try, found(&last_try, RefundState::Succeeded), "refunded"),
            ("unfinished", &fresh, found(&fresh, RefundState::Pending), "inconclusive"),
            ("unfinished, attempts spent", &last_try, found(&last_try, RefundState::Pending), "exhaust"),
            ("unfinished, too old", &too_old, found(&too_old, RefundState::Pending), "exhaust"),
            (
                "another amount",
                &fresh,
                ok(vec![ProviderRefund { amount: 90, ..refund(&fresh, "re_1", RefundState::Succeeded) }]),
                "mismatch",
            ),
            (
                "another charge",
                &fresh,
                ok(vec![ProviderRefund { charge: "ch_2".into(), ..refund(&fresh, "re_1", RefundState::Succeeded) }]),
                "mismatch",
            ),
            (
                "two refunds under one key",
                &fresh,
                ok(vec![refund(&fresh, "re_1", RefundState::Failed), refund(&fresh, "re_2", RefundState::Succeeded)]),
                "mismatch",
            ),
            ("nothing, inside the window", &fresh, ok(vec![]), "resend"),
            ("nothing, past the window, a send maybe still landing", &old, ok(vec![]), "inconclusive"),
            ("nothing, past the window, attempts spent", &last_try, ok(vec![]), "exhaust"),
            ("nothing, unknown for the whole key window", &long_unknown, ok(vec![]), "not_made"),
            ("lookup failed", &fresh, failed(), "inconclusive"),
            ("lookup failed, attempts spent", &last_try, failed(), "exhaust"),
            ("lookup failed, too old", &too_old, failed(), "exhaust"),
            (
                "only another account's refund",
                &fresh,
                ok(vec![elsewhere(refund(&fresh, "re_1", RefundState::Succeeded))]),
                "inconclusive",
            ),
            (
                "another account's refund beside the refund's own",
                &fresh,
                ok(vec![
                    elsewhere(refund(&fresh, "re_9", RefundState::Failed)),
                    refund(&fresh, "re_1", RefundState::Succeeded),
                ]),
                "refunded",
            ),
        ];
        for (name, claimed, lookup, expected) in cases {
            assert_eq!(label(&decide(claimed, &lookup, &config())), expected, "{name}");
        }
    }

    #[test]
    fn a_refund_found_succeeded_settles_with_the_providers_refund() {
        let fresh = claimed(0, 10, true);
        let found = refund(&fresh, "re_1", RefundState::Succeeded);

        let verdict = decide(&fresh, &Ok(vec![found.clone()]), &config());

        let Verdict::Settle {
            settlement: RefundSettlement::Succeeded { provider_refund_id, .. }, found: evidence, ..
        } = verdict
        else {
            panic!("not settled: {verdict:?}");
        };
        assert_eq!((provider_refund_id.as_str(), evidence), ("re_1", json!({ "refund": found })));
    }
}
