//! The invariant checker: the contract's invariants, judged against the database, the provider's
//! ground truth (`GET /_sim/charges`) and what the clients saw. One implementation, used by the
//! end-to-end tests and the chaos harness alike.
//!
//! [`settle`] waits until nothing is left in flight; [`check`] then reads everything once and
//! reports every violation with its evidence. It only reads; it never repairs or retries anything.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use anyhow::Context;
use oncepay_domain::ids::DownstreamKey;
use oncepay_provider::wire::{Charge, ChargeStatus, Refund};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use time::OffsetDateTime;
use tokio::time::Instant;
use uuid::Uuid;

use crate::refunds::{self, RefundFigures};
use crate::system::Tenant;
use crate::workload::{MisuseOutcome, Observations, ProbeOutcome};

/// One broken promise, with what proves it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    /// Which invariant of the contract (1–6, as the `check_*` functions number them; 8 for refunds,
    /// 10 for the broker, 11 for events to merchants).
    pub invariant: u8,
    /// What is wrong.
    pub what: String,
    /// The rows, charges or responses that show it.
    pub evidence: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[invariant {}] {}: {}", self.invariant, self.what, self.evidence)
    }
}

/// A payment still in flight when the settle bound ran out.
#[derive(Debug, Clone)]
pub struct Stuck {
    /// The payment.
    pub payment_id: Uuid,
    /// Its status.
    pub status: String,
    /// Its last audit row (actor, reason), its outbox row and its unknown-queue row, if any.
    pub detail: String,
}

/// How settling went.
#[derive(Debug, Clone)]
pub struct Settled {
    /// How long it took (or the bound).
    pub waited: Duration,
    /// The payments still in flight at the bound (empty when it settled).
    pub stuck: Vec<Stuck>,
}

/// Waits, at most `bound`, until nothing is in flight: no payment `pending`, `processing` or
/// `unknown`, an empty outbox and an empty unknown queue.
pub async fn settle(pool: &PgPool, bound: Duration) -> anyhow::Result<Settled> {
    let started = Instant::now();
    let deadline = started + bound;
    let mut listener = PgListener::connect_with(pool).await.context("cannot listen for payment changes")?;
    listener.listen("oncepay_payment").await?;
    loop {
        if in_flight(pool).await? == 0 {
            return Ok(Settled { waited: started.elapsed(), stuck: Vec::new() });
        }
        if Instant::now() >= deadline {
            return Ok(Settled { waited: bound, stuck: stuck(pool).await? });
        }
        // Woken by any status change; the timeout catches the outbox and queue rows that go away
        // without a notification of their own (and a listener that lost its connection).
        let _ = tokio::time::timeout(Duration::from_millis(500), listener.try_recv()).await;
    }
}

async fn in_flight(pool: &PgPool) -> anyhow::Result<i64> {
    let count = sqlx::query_scalar!(
        r#"SELECT (SELECT count(*) FROM payments WHERE status IN ('pending', 'processing', 'unknown'))
              + (SELECT count(*) FROM outbox) + (SELECT count(*) FROM unknown_payments) AS "count!""#
    )
    .fetch_one(pool)
    .await?;
    Ok(count + refunds::in_flight(pool).await?)
}

async fn stuck(pool: &PgPool) -> anyhow::Result<Vec<Stuck>> {
    let stuck = sqlx::query_as!(
        Stuck,
        r#"SELECT p.payment_id, p.status::text AS "status!",
                concat_ws('; ',
                  (SELECT format('last event %s→%s by %s: %s', e.from_status, e.to_status, e.actor, e.reason)
                     FROM payment_events e WHERE e.tenant_id = p.tenant_id AND e.payment_id = p.payment_id
                     ORDER BY e.seq DESC LIMIT 1),
                  (SELECT format('outbox: attempts %s, lease by %s until %s, expirations %s, due %s',
                                 o.attempts, o.locked_by, o.locked_until, o.lease_expirations, o.available_at)
                     FROM outbox o WHERE o.tenant_id = p.tenant_id AND o.payment_id = p.payment_id),
                  (SELECT format('unknown since %s: %s, %s polls, next %s', u.since, u.reason, u.poll_attempts, u.next_poll_at)
                     FROM unknown_payments u WHERE u.tenant_id = p.tenant_id AND u.payment_id = p.payment_id))
                  AS "detail!"
           FROM payments p
          WHERE p.status IN ('pending', 'processing', 'unknown')
             OR EXISTS (SELECT 1 FROM outbox o WHERE o.tenant_id = p.tenant_id AND o.payment_id = p.payment_id)
             OR EXISTS (SELECT 1 FROM unknown_payments u WHERE u.tenant_id = p.tenant_id AND u.payment_id = p.payment_id)
          ORDER BY p.created_at"#
    )
    .fetch_all(pool)
    .await?;
    Ok(stuck)
}

/// A payment as stored, with when it first became terminal or dead-lettered.
#[derive(Debug, Clone)]
struct PaymentRow {
    payment_id: Uuid,
    tenant_id: Uuid,
    status: String,
    amount: i64,
    currency: String,
    customer_id: String,
    provider_charge_id: Option<String>,
    created_at: OffsetDateTime,
    settled_at: Option<OffsetDateTime>,
}

/// What the check found, violations and figures both.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Every violation (expected: none).
    pub violations: Vec<Violation>,
    /// Things worth knowing that break no invariant (dead letters, intents without a response,
    /// ...).
    pub notes: Vec<String>,
    /// Conflict dead letters on payments that agree with the provider in every respect: false
    /// alarms for operators (payment id, the dead letter's reason).
    pub false_conflicts: Vec<(Uuid, String)>,
    /// Payments in the database.
    pub payments: usize,
    /// Payments by status.
    pub by_status: BTreeMap<String, usize>,
    /// Payments with 0, 1 and 2+ provider charges.
    pub charge_histogram: [usize; 3],
    /// Provider charges in all (failed ones included).
    pub provider_charges: usize,
    /// Time from acceptance to the terminal (or dead-lettered) status, sorted.
    pub time_to_terminal: Vec<Duration>,
    /// Payments accepted in a transaction together with others (the api's groups). Read from the
    /// payments' creation times, which are their transactions' start.
    pub accepted_together: usize,
    /// The most payments accepted in one transaction.
    pub largest_group: usize,
    /// Refunds, in the database and at the provider.
    pub refunds: RefundFigures,
    /// Resends the worker held back because they could have charged twice: the resend guard at
    /// work.
    pub held_back: i64,
}

/// The code of a send held back by a resend guard, in the payment's or refund's event
/// (`oncepay_worker::verdict::KEY_WINDOW_PASSED`; the harness talks to the system only from
/// outside).
pub const KEY_WINDOW_PASSED: &str = "key_window_passed";

impl Verdict {
    /// The `q`-quantile of the time to terminal.
    pub fn latency(&self, q: f64) -> Option<Duration> {
        let n = self.time_to_terminal.len();
        if n == 0 {
            return None;
        }
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        Some(self.time_to_terminal[rank - 1])
    }

    fn violation(&mut self, invariant: u8, what: &str, evidence: String) {
        self.violations.push(Violation { invariant, what: what.to_owned(), evidence });
    }
}

/// Reads the database and the provider's ground truth (its charges and its refunds) and judges
/// every invariant.
pub async fn check(
    pool: &PgPool,
    charges: &[Charge],
    provider_refunds: &[Refund],
    tenants: &[Tenant],
    observations: &Observations,
) -> anyhow::Result<Verdict> {
    let mut verdict = Verdict::default();

    let rows = sqlx::query_as!(
        PaymentRow,
        r#"SELECT p.tenant_id, p.payment_id, p.status::text AS "status!", p.amount, p.currency, p.customer_id,
                p.provider_charge_id, p.created_at,
                (SELECT min(e.created_at) FROM payment_events e
                  WHERE e.tenant_id = p.tenant_id AND e.payment_id = p.payment_id
                    AND e.to_status IN ('succeeded', 'failed', 'dead_lettered')) AS settled_at
           FROM payments p"#
    )
    .fetch_all(pool)
    .await?;
    let payments: BTreeMap<Uuid, PaymentRow> = rows.into_iter().map(|row| (row.payment_id, row)).collect();
    let keys: Vec<(Uuid, String, Uuid)> =
        sqlx::query!("SELECT tenant_id, idempotency_key, payment_id FROM idempotency_keys")
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(|key| (key.tenant_id, key.idempotency_key, key.payment_id))
            .collect();
    let ledger: Vec<(Uuid, Uuid, String, i64, String)> =
        sqlx::query!("SELECT tenant_id, payment_id, provider_charge_id, amount, currency FROM ledger_entries")
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(|entry| (entry.tenant_id, entry.payment_id, entry.provider_charge_id, entry.amount, entry.currency))
            .collect();
    // Of any kind: a charge for other money dead-letters its payment with an open conflict.
    let open_dead_letters: BTreeSet<Uuid> =
        sqlx::query_scalar!("SELECT payment_id FROM dead_letters WHERE resolved_at IS NULL")
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect();
    let conflicts: Vec<(Uuid, String)> =
        sqlx::query!("SELECT payment_id, reason FROM dead_letters WHERE kind = 'conflict'")
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(|conflict| (conflict.payment_id, conflict.reason))
            .collect();
    let history = sqlx::query_as!(
        HistoryRow,
        r#"SELECT payment_id, seq, from_status::text AS from_status, to_status::text AS "to_status!"
           FROM payment_events ORDER BY tenant_id, payment_id, seq"#
    )
    .fetch_all(pool)
    .await?;

    verdict.payments = payments.len();
    verdict.provider_charges = charges.len();
    for payment in payments.values() {
        *verdict.by_status.entry(payment.status.clone()).or_default() += 1;
        if let Some(settled_at) = payment.settled_at {
            verdict.time_to_terminal.push((settled_at - payment.created_at).try_into().unwrap_or_default());
        }
    }
    verdict.time_to_terminal.sort();
    let mut groups: BTreeMap<(Uuid, OffsetDateTime), usize> = BTreeMap::new();
    for payment in payments.values() {
        *groups.entry((payment.tenant_id, payment.created_at)).or_default() += 1;
    }
    verdict.accepted_together = groups.values().filter(|n| **n > 1).sum();
    verdict.largest_group = groups.values().copied().max().unwrap_or(0);
    let by_payment = charges_by_payment(&mut verdict, charges, &payments);
    note_conflicts(&mut verdict, &conflicts, &payments, &ledger, &by_payment);
    check_charges(&mut verdict, &payments, &by_payment);
    check_keys(&mut verdict, &payments, &keys, tenants, observations);
    check_accounted(&mut verdict, &payments, &open_dead_letters, tenants, observations);
    check_history(&mut verdict, &payments, &history);
    check_ledger(&mut verdict, &payments, &ledger, charges, &by_payment);
    check_money(&mut verdict, &payments, &ledger, &by_payment);
    check_tenancy(&mut verdict, &payments, tenants, observations);
    let (violations, figures) = refunds::check(pool, provider_refunds, charges, &observations.refunds).await?;
    verdict.violations.extend(violations);
    verdict.refunds = figures;
    verdict.held_back = sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM payment_events WHERE detail->>'reason' = $1"#,
        KEY_WINDOW_PASSED
    )
    .fetch_one(pool)
    .await?;
    verdict.violations.sort();
    Ok(verdict)
}

/// The provider's charges by the payment they were made for (its metadata, else its downstream
/// key); a charge that names no payment of ours is a violation of failing closed.
fn charges_by_payment<'c>(
    verdict: &mut Verdict,
    charges: &'c [Charge],
    payments: &BTreeMap<Uuid, PaymentRow>,
) -> BTreeMap<Uuid, Vec<&'c Charge>> {
    let mut by_payment: BTreeMap<Uuid, Vec<&Charge>> = BTreeMap::new();
    for charge in charges {
        let by_key = DownstreamKey::parse_payment_id(&charge.idempotency_key).map(|id| id.as_uuid());
        let by_metadata = charge.payment_ref().map(|(tenant, payment)| (tenant.as_uuid(), payment.as_uuid()));
        if let (Some(key), Some((_, meta))) = (by_key, by_metadata)
            && key != meta
        {
            verdict.violation(1, "a charge's key and metadata name different payments", describe_charge(charge));
        }
        match by_metadata.map(|(_, payment)| payment).or(by_key) {
            Some(payment_id) if payments.contains_key(&payment_id) => {
                if let Some((tenant, _)) = by_metadata
                    && payments.get(&payment_id).is_some_and(|p| p.tenant_id != tenant)
                {
                    verdict.violation(5, "a charge names the wrong tenant", describe_charge(charge));
                }
                by_payment.entry(payment_id).or_default().push(charge);
            }
            _ => verdict.violation(
                1,
                "the provider charged for a payment that was never accepted (not failing closed)",
                describe_charge(charge),
            ),
        }
    }
    by_payment
}

/// Invariant 1: at most one provider charge per payment, and for a succeeded payment exactly one,
/// succeeded, the one it records. (A charge for a payment that does not exist is found by
/// [`charges_by_payment`].)
fn check_charges(
    verdict: &mut Verdict,
    payments: &BTreeMap<Uuid, PaymentRow>,
    by_payment: &BTreeMap<Uuid, Vec<&Charge>>,
) {
    for (payment_id, payment) in payments {
        let charges = by_payment.get(payment_id).map_or(&[][..], Vec::as_slice);
        verdict.charge_histogram[charges.len().min(2)] += 1;
        if charges.len() > 1 {
            verdict.violation(
                1,
                "a payment was charged more than once",
                format!("payment {payment_id} ({}): {}", payment.status, describe_charges(charges)),
            );
        }
        if payment.status == "succeeded" {
            let succeeded: Vec<_> = charges.iter().filter(|c| c.status == ChargeStatus::Succeeded).collect();
            let recorded = payment.provider_charge_id.as_deref();
            if succeeded.len() != 1 || recorded != Some(succeeded[0].id.as_str()) {
                verdict.violation(
                    1,
                    "a succeeded payment does not have exactly the one provider charge it records",
                    format!("payment {payment_id} records {recorded:?}; provider: {}", describe_charges(charges)),
                );
            }
        }
    }
}

/// Invariant 2: one payment per (tenant, key). Every response for a key carried the same payment,
/// the one the key row names; no payment lacks its key row; a key misuse was refused (422).
fn check_keys(
    verdict: &mut Verdict,
    payments: &BTreeMap<Uuid, PaymentRow>,
    keys: &[(Uuid, String, Uuid)],
    tenants: &[Tenant],
    observations: &Observations,
) {
    let key_rows: BTreeMap<(Uuid, &str), Uuid> =
        keys.iter().map(|(tenant, key, payment)| ((*tenant, key.as_str()), *payment)).collect();
    let keyed: BTreeSet<Uuid> = keys.iter().map(|(_, _, payment)| *payment).collect();
    for (payment_id, payment) in payments {
        if !keyed.contains(payment_id) {
            verdict.violation(
                2,
                "a payment has no idempotency key row",
                format!("payment {payment_id} of tenant {}", payment.tenant_id),
            );
        }
    }
    let sent: BTreeSet<(Uuid, &str)> = observations
        .intents
        .values()
        .filter_map(|r| tenants.get(r.tenant).map(|t| (t.tenant_id, r.key.as_str())))
        .collect();
    for (tenant, key) in key_rows.keys() {
        if !sent.contains(&(*tenant, *key)) {
            verdict.violation(2, "a key row exists for a key no client sent", format!("tenant {tenant}, key {key:?}"));
        }
    }
    for record in observations.intents.values() {
        let Some(tenant) = tenants.get(record.tenant) else { continue };
        if record.payment_ids.len() > 1 {
            verdict.violation(
                2,
                "one key was answered with more than one payment",
                format!("tenant {}, key {:?}: {:?}", tenant.name, record.key, record.payment_ids),
            );
        }
        let stored = key_rows.get(&(tenant.tenant_id, record.key.as_str()));
        match (record.payment_ids.iter().next(), stored) {
            (Some(answered), Some(stored)) if answered != stored => verdict.violation(
                2,
                "a key row names another payment than the clients were answered with",
                format!("tenant {}, key {:?}: answered {answered}, stored {stored}", tenant.name, record.key),
            ),
            (Some(answered), None) => verdict.violation(
                2,
                "an answered key has no key row",
                format!("tenant {}, key {:?}, payment {answered}", tenant.name, record.key),
            ),
            _ => {}
        }
        if let Some(payment) = stored.and_then(|id| payments.get(id))
            && (payment.amount != record.amount || payment.currency != record.currency)
        {
            verdict.violation(
                2,
                "the stored payment is not what its key's first request asked for",
                format!(
                    "tenant {}, key {:?}: asked {} {}, stored {} {}",
                    tenant.name, record.key, record.amount, record.currency, payment.amount, payment.currency
                ),
            );
        }
        match &record.misuse {
            Some(MisuseOutcome::Accepted(id)) => verdict.violation(
                2,
                "the same key with another body was accepted instead of 422",
                format!("tenant {}, key {:?}: answered with payment {id}", tenant.name, record.key),
            ),
            Some(MisuseOutcome::Other(answer)) => verdict.notes.push(format!(
                "a key misuse got {answer} instead of 422 (tenant {}, key {:?})",
                tenant.name, record.key
            )),
            Some(MisuseOutcome::NoAnswer) => {
                verdict
                    .notes
                    .push(format!("a key misuse got no answer (tenant {}, key {:?})", tenant.name, record.key));
            }
            Some(MisuseOutcome::Rejected) | None => {}
        }
    }
}

/// One row of a payment's audit trail.
struct HistoryRow {
    payment_id: Uuid,
    seq: i32,
    from_status: Option<String>,
    to_status: String,
}

/// Invariant 3, explained: every payment's audit trail, in the order of its places (`seq`), is
/// numbered 1, 2, 3…, starts with its creation as `pending`, moves each time from where the row
/// before left it, and ends where the payment is. `rows` come ordered by payment and place.
fn check_history(verdict: &mut Verdict, payments: &BTreeMap<Uuid, PaymentRow>, rows: &[HistoryRow]) {
    let mut trails: BTreeMap<Uuid, Vec<&HistoryRow>> = BTreeMap::new();
    for row in rows {
        trails.entry(row.payment_id).or_default().push(row);
    }
    for payment in payments.values() {
        let trail = trails.get(&payment.payment_id).map(Vec::as_slice).unwrap_or_default();
        let describe = || {
            let steps: Vec<String> = trail
                .iter()
                .map(|r| format!("{}: {}→{}", r.seq, r.from_status.as_deref().unwrap_or("·"), r.to_status))
                .collect();
            format!("payment {} ({}): {}", payment.payment_id, payment.status, steps.join(", "))
        };
        let numbered = trail.iter().zip(1..).all(|(row, place)| row.seq == place);
        let created = trail.first().is_some_and(|r| r.from_status.is_none() && r.to_status == "pending");
        let chained = trail.windows(2).all(|w| w[1].from_status.as_deref() == Some(w[0].to_status.as_str()));
        let current = trail.last().is_some_and(|r| r.to_status == payment.status);
        if !(numbered && created && chained && current) {
            verdict.violation(3, "a payment's audit trail does not explain how it got where it is", describe());
        }
    }
}

/// Invariant 3: every accepted payment exists and is terminal, or dead-lettered with an open dead
/// letter.
fn check_accounted(
    verdict: &mut Verdict,
    payments: &BTreeMap<Uuid, PaymentRow>,
    open_dead_letters: &BTreeSet<Uuid>,
    tenants: &[Tenant],
    observations: &Observations,
) {
    for record in observations.intents.values() {
        for id in &record.payment_ids {
            if !payments.contains_key(id) {
                verdict.violation(
                    3,
                    "an accepted payment vanished",
                    format!("payment {id} (tenant #{}, key {:?})", record.tenant, record.key),
                );
            }
        }
        if !record.rejected.is_empty() {
            verdict.violation(
                3,
                "a valid payment request was rejected",
                format!("tenant #{}, key {:?}: {:?}", record.tenant, record.key, record.rejected),
            );
        }
    }
    for (payment_id, payment) in payments {
        match payment.status.as_str() {
            "succeeded" | "failed" => {}
            "dead_lettered" => {
                if !open_dead_letters.contains(payment_id) {
                    verdict.violation(
                        3,
                        "a dead-lettered payment has no open dead letter",
                        format!("payment {payment_id}"),
                    );
                }
            }
            other => verdict.violation(
                3,
                "a payment never reached a terminal state",
                format!("payment {payment_id} is {other}"),
            ),
        }
    }
    let unanswered = observations.unanswered();
    if !unanswered.is_empty() {
        let sample: Vec<_> =
            unanswered.iter().take(5).map(|r| format!("tenant #{} key {:?}", r.tenant, r.key)).collect();
        verdict.notes.push(format!("{} intent(s) never got an answer, e.g. {sample:?}", unanswered.len()));
    }
    let tenant_names: Vec<&str> = tenants.iter().map(|t| t.name.as_str()).collect();
    let dead: Vec<_> = payments.iter().filter(|(_, p)| p.status == "dead_lettered").map(|(id, _)| *id).collect();
    if !dead.is_empty() {
        verdict.notes.push(format!(
            "{} payment(s) dead-lettered for operators (tenants {tenant_names:?}), e.g. {:?}",
            dead.len(),
            &dead[..dead.len().min(5)]
        ));
    }
}

/// Invariant 4: the ledger books exactly the succeeded payments, with the provider's charge, amount
/// and currency. A succeeded provider charge outside the ledger is allowed only on a dead-lettered
/// payment, which an operator resolves.
fn check_ledger(
    verdict: &mut Verdict,
    payments: &BTreeMap<Uuid, PaymentRow>,
    ledger: &[(Uuid, Uuid, String, i64, String)],
    charges: &[Charge],
    by_payment: &BTreeMap<Uuid, Vec<&Charge>>,
) {
    let charge_by_id: BTreeMap<&str, &Charge> = charges.iter().map(|c| (c.id.as_str(), c)).collect();
    let mut booked = BTreeSet::new();
    for (tenant_id, payment_id, charge_id, amount, currency) in ledger {
        booked.insert(*payment_id);
        let entry = format!("entry of payment {payment_id}: {charge_id} {amount} {currency}");
        let Some(payment) = payments.get(payment_id) else {
            verdict.violation(4, "a ledger entry books no payment", entry);
            continue;
        };
        if payment.tenant_id != *tenant_id {
            verdict.violation(5, "a ledger entry is filed under another tenant", entry.clone());
        }
        if payment.status != "succeeded" {
            verdict.violation(
                4,
                "a ledger entry books a payment that did not succeed",
                format!("{entry}; payment is {}", payment.status),
            );
        }
        if payment.provider_charge_id.as_deref() != Some(charge_id.as_str()) {
            verdict.violation(
                4,
                "a ledger entry books another charge than its payment records",
                format!("{entry}; payment records {:?}", payment.provider_charge_id),
            );
        }
        match charge_by_id.get(charge_id.as_str()) {
            None => verdict.violation(4, "a ledger entry books a charge the provider never made", entry),
            Some(charge) => {
                if charge.status != ChargeStatus::Succeeded || charge.amount != *amount || charge.currency != *currency
                {
                    verdict.violation(
                        4,
                        "a ledger entry disagrees with the provider's charge",
                        format!("{entry}; provider: {}", describe_charge(charge)),
                    );
                }
            }
        }
    }
    for (payment_id, payment) in payments {
        if payment.status == "succeeded" && !booked.contains(payment_id) {
            verdict.violation(4, "a succeeded payment has no ledger entry", format!("payment {payment_id}"));
        }
        let taken: Vec<_> = by_payment
            .get(payment_id)
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .filter(|c| c.status == ChargeStatus::Succeeded)
            .collect();
        if !taken.is_empty() && !booked.contains(payment_id) {
            if payment.status == "dead_lettered" {
                verdict.notes.push(format!(
                    "payment {payment_id} is dead-lettered although the provider charged it ({}): an operator resolves it",
                    taken[0].id
                ));
            } else {
                verdict.violation(
                    4,
                    "the provider charged a payment the ledger does not book",
                    format!("payment {payment_id} is {}; provider: {}", payment.status, describe_charge(taken[0])),
                );
            }
        }
    }
}

/// Invariant 6: money is never booked wrong. A payment the provider charged is never `failed`; the
/// ledger books what the payment asked for (a charge of other money must go to an operator); one
/// provider charge is booked once.
fn check_money(
    verdict: &mut Verdict,
    payments: &BTreeMap<Uuid, PaymentRow>,
    ledger: &[(Uuid, Uuid, String, i64, String)],
    by_payment: &BTreeMap<Uuid, Vec<&Charge>>,
) {
    for (payment_id, payment) in payments {
        let charges = by_payment.get(payment_id).map_or(&[][..], Vec::as_slice);
        if payment.status == "failed"
            && let Some(charged) = charges.iter().find(|c| c.status == ChargeStatus::Succeeded)
        {
            verdict.violation(
                6,
                "a payment is failed while the provider holds a succeeded charge for it",
                format!("payment {payment_id}: {}", describe_charge(charged)),
            );
        }
    }
    let mut booked: BTreeMap<&str, Vec<Uuid>> = BTreeMap::new();
    for (_, payment_id, charge_id, amount, currency) in ledger {
        booked.entry(charge_id.as_str()).or_default().push(*payment_id);
        if let Some(payment) = payments.get(payment_id)
            && (payment.amount != *amount || payment.currency != *currency)
        {
            verdict.violation(
                6,
                "a ledger entry books other money than its payment asked for",
                format!(
                    "payment {payment_id} asked for {} {}; the ledger books {amount} {currency} ({charge_id})",
                    payment.amount, payment.currency
                ),
            );
        }
    }
    for (charge_id, booked_to) in booked {
        if booked_to.len() > 1 {
            verdict.violation(
                6,
                "one provider charge is booked to several payments",
                format!("{charge_id}: {booked_to:?}"),
            );
        }
    }
}

/// Invariant 5: no tenant saw another tenant's payment. Every id a tenant's client got belongs to
/// that tenant and shows what it asked for, and reading another tenant's payment is 404.
fn check_tenancy(
    verdict: &mut Verdict,
    payments: &BTreeMap<Uuid, PaymentRow>,
    tenants: &[Tenant],
    observations: &Observations,
) {
    for record in observations.intents.values() {
        let Some(tenant) = tenants.get(record.tenant) else { continue };
        for id in &record.payment_ids {
            if let Some(payment) = payments.get(id)
                && (payment.tenant_id != tenant.tenant_id || payment.customer_id != record.customer_id)
            {
                verdict.violation(
                    5,
                    "a tenant was answered with another tenant's payment",
                    format!(
                        "tenant {} key {:?} got payment {id} of tenant {}",
                        tenant.name, record.key, payment.tenant_id
                    ),
                );
            }
        }
        for mismatch in &record.mismatches {
            verdict.violation(
                5,
                "a tenant was shown a payment that is not the one it asked for",
                format!("tenant {} key {:?}: {mismatch}", tenant.name, record.key),
            );
        }
    }
    for probe in &observations.probes {
        let asker = tenants.get(probe.tenant).map_or("?", |t| t.name.as_str());
        let owner = tenants.get(probe.owner).map_or("?", |t| t.name.as_str());
        match &probe.outcome {
            ProbeOutcome::NotFound => {}
            ProbeOutcome::Shown(shown) => verdict.violation(
                5,
                "a tenant read another tenant's payment",
                format!("{asker} read {owner}'s payment {}: {shown}", probe.payment_id),
            ),
            ProbeOutcome::Inconclusive(answer) => {
                verdict.notes.push(format!("{asker}'s read of {owner}'s payment {} got {answer}", probe.payment_id))
            }
        }
    }
}

/// Conflict dead letters keep the state and break no invariant, but one whose payment agrees with
/// the provider in every respect is a false alarm for operators: said so, with the evidence.
fn note_conflicts(
    verdict: &mut Verdict,
    conflicts: &[(Uuid, String)],
    payments: &BTreeMap<Uuid, PaymentRow>,
    ledger: &[(Uuid, Uuid, String, i64, String)],
    by_payment: &BTreeMap<Uuid, Vec<&Charge>>,
) {
    for (payment_id, reason) in conflicts {
        let charges = by_payment.get(payment_id).map_or(&[][..], Vec::as_slice);
        let agrees = payments.get(payment_id).is_some_and(|payment| {
            let booked = ledger.iter().find(|(_, id, ..)| id == payment_id);
            match (payment.status.as_str(), charges) {
                ("succeeded", [charge]) => booked.is_some_and(|(_, _, charge_id, amount, currency)| {
                    charge.status == ChargeStatus::Succeeded
                        && *charge_id == charge.id
                        && charge.amount == *amount
                        && charge.currency == *currency
                }),
                ("failed", [charge]) => charge.status == ChargeStatus::Failed && booked.is_none(),
                _ => false,
            }
        });
        if agrees {
            verdict.false_conflicts.push((*payment_id, reason.clone()));
        } else {
            verdict.notes.push(format!("payment {payment_id} has a conflict dead letter: {reason}"));
        }
    }
}

fn describe_charge(charge: &Charge) -> String {
    format!(
        "{} {:?} {} {} key {} metadata {:?}",
        charge.id, charge.status, charge.amount, charge.currency, charge.idempotency_key, charge.metadata
    )
}

fn describe_charges(charges: &[&Charge]) -> String {
    if charges.is_empty() {
        return "no charge".to_owned();
    }
    charges.iter().map(|c| describe_charge(c)).collect::<Vec<_>>().join(" | ")
}

#[cfg(test)]
mod tests {
    use oncepay_domain::ids::PaymentId;
    use oncepay_provider::fixtures;

    use super::*;

    fn payment(status: &str, amount: i64) -> PaymentRow {
        PaymentRow {
            payment_id: Uuid::now_v7(),
            tenant_id: Uuid::now_v7(),
            status: status.to_owned(),
            amount,
            currency: "EUR".to_owned(),
            customer_id: "cus_1".to_owned(),
            provider_charge_id: None,
            created_at: OffsetDateTime::now_utc(),
            settled_at: None,
        }
    }

    fn charge(id: &str, status: ChargeStatus, amount: i64) -> Charge {
        fixtures::charge(PaymentId::generate(), id, status, amount)
    }

    fn money_violations(
        payments: &[PaymentRow],
        ledger: &[(usize, &str, i64)],
        charges: &[(usize, Charge)],
    ) -> Vec<String> {
        let by_id: BTreeMap<Uuid, PaymentRow> = payments.iter().map(|p| (p.payment_id, p.clone())).collect();
        let ledger: Vec<_> = ledger
            .iter()
            .map(|(i, id, amount)| {
                (payments[*i].tenant_id, payments[*i].payment_id, (*id).to_owned(), *amount, "EUR".to_owned())
            })
            .collect();
        let mut by_payment: BTreeMap<Uuid, Vec<&Charge>> = BTreeMap::new();
        for (i, charge) in charges {
            by_payment.entry(payments[*i].payment_id).or_default().push(charge);
        }
        let mut verdict = Verdict::default();
        check_money(&mut verdict, &by_id, &ledger, &by_payment);
        verdict.violations.into_iter().map(|v| v.what).collect()
    }

    #[test]
    fn wrong_money_is_a_violation_of_invariant_six() {
        let paid = [payment("succeeded", 1999), payment("succeeded", 500)];
        let failed = [payment("failed", 1999)];

        let agreeing = money_violations(&paid, &[(0, "ch_1", 1999), (1, "ch_2", 500)], &[]);
        let failed_but_charged = money_violations(&failed, &[], &[(0, charge("ch_1", ChargeStatus::Succeeded, 1999))]);
        let failed_and_declined = money_violations(&failed, &[], &[(0, charge("ch_1", ChargeStatus::Failed, 1999))]);
        let other_amount = money_violations(&paid, &[(0, "ch_1", 2000), (1, "ch_2", 500)], &[]);
        let booked_twice = money_violations(&paid, &[(0, "ch_1", 1999), (1, "ch_1", 500)], &[]);

        assert!(agreeing.is_empty(), "{agreeing:?}");
        assert!(failed_and_declined.is_empty(), "{failed_and_declined:?}");
        assert_eq!(failed_but_charged, ["a payment is failed while the provider holds a succeeded charge for it"]);
        assert_eq!(other_amount, ["a ledger entry books other money than its payment asked for"]);
        assert_eq!(booked_twice, ["one provider charge is booked to several payments"]);
    }

    fn history_violations(status: &str, trail: &[(i32, Option<&str>, &str)]) -> usize {
        let payment = payment(status, 1999);
        let rows: Vec<HistoryRow> = trail
            .iter()
            .map(|(seq, from, to)| HistoryRow {
                payment_id: payment.payment_id,
                seq: *seq,
                from_status: from.map(str::to_owned),
                to_status: (*to).to_owned(),
            })
            .collect();
        let mut verdict = Verdict::default();
        check_history(&mut verdict, &BTreeMap::from([(payment.payment_id, payment)]), &rows);
        verdict.violations.len()
    }

    #[test]
    fn an_audit_trail_out_of_order_with_a_gap_or_ending_elsewhere_is_a_violation_of_invariant_three() {
        let sent = [(1, None, "pending"), (2, Some("pending"), "processing"), (3, Some("processing"), "succeeded")];
        // The order a history had under Citus when it followed identity values drawn on two nodes.
        let shuffled = [sent[0], sent[2], sent[1]];
        let gap = [sent[0], sent[1], (4, Some("processing"), "succeeded")];

        assert_eq!(history_violations("succeeded", &sent), 0);
        assert_eq!(history_violations("succeeded", &shuffled), 1);
        assert_eq!(history_violations("succeeded", &gap), 1);
        assert_eq!(history_violations("failed", &sent), 1);
        assert_eq!(history_violations("pending", &[]), 1);
    }
}
