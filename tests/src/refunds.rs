//! Refunds in the workload and the checker: what merchants refund once a payment has succeeded,
//! what their clients saw, and invariant 8 of the contract judged against the database and the
//! provider's refunds.
//!
//! A job draws a [`RefundPlan`] from its own generator (the seed and its index), so plans without
//! refunds stay what they were. The plans: the whole payment back; a part, then the rest; a storm of
//! one refund sent at once through several api processes; two refunds at once that together ask for
//! more than the payment (one must be refused). [`check`] reads everything once and reports each
//! refund that moved money twice, refunds that add up to more than their charge, a refund not in an
//! explained state, a ledger that disagrees with the provider, and a provider refund nobody asked
//! for.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use oncepay_client::{Client, Error, IdempotencyKey, Payment, RefundIntent};
use oncepay_domain::ids::DownstreamKey;
use oncepay_provider::wire::{Charge, Refund, RefundState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;
use uuid::Uuid;

use crate::checker::Violation;

/// The contract's invariant about refunds.
const INVARIANT: u8 = 8;

/// What a job refunds once its payment has succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RefundPlan {
    /// Everything, with no amount.
    Full,
    /// A part, then the rest.
    Parts,
    /// One refund of a third, sent several times at once.
    Storm,
    /// Two refunds of two thirds each, at once: together more than the payment.
    TooMuch,
}

impl fmt::Display for RefundPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Full => "full",
            Self::Parts => "parts",
            Self::Storm => "storm",
            Self::TooMuch => "too much",
        })
    }
}

impl RefundPlan {
    /// The plan of job `index`, refunding at `rate`; drawn from a generator of its own.
    pub fn draw(seed: u64, index: usize, rate: f64) -> Option<Self> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5EF0_0000_0000_0000 ^ index as u64);
        rng.random_bool(rate.clamp(0.0, 1.0))
            .then(|| [Self::Full, Self::Parts, Self::Storm, Self::TooMuch][rng.random_range(0..4)])
    }
}

/// What the clients saw for one refund intent (one key).
#[derive(Debug, Clone)]
pub struct RefundRecord {
    /// The tenant that sent it.
    pub tenant: usize,
    /// Its idempotency key.
    pub key: String,
    /// The payment it refunds.
    pub payment_id: Uuid,
    /// The plan it is part of.
    pub plan: RefundPlan,
    /// What it asked for (`None`: all that is left).
    pub asked: Option<i64>,
    /// Every refund id any response to it carried.
    pub refund_ids: BTreeSet<Uuid>,
    /// Sends that got a 2xx response.
    pub answered: u32,
    /// Sends that got no response.
    pub gave_up: u32,
    /// Refusals (status and problem kind), e.g. `422 refund-exceeds-payment`.
    pub refused: Vec<String>,
    /// The status the client last saw while following it.
    pub last_status: Option<String>,
}

/// Which refunds one job sends: its plan, the keys of its parts, and where its amounts come from.
#[derive(Debug, Clone)]
pub struct RefundJob {
    /// What to refund.
    pub plan: RefundPlan,
    /// The job's own generator's seed (the run's seed and the job's index).
    seed: u64,
    /// The tenant whose payment it refunds.
    pub tenant: usize,
    /// The keys of the first and the second refund (the second is used by two-part plans).
    keys: [IdempotencyKey; 2],
}

impl RefundJob {
    /// The refunds of job `index` of `tenant`, refunding at `rate` ([`RefundPlan::draw`]).
    pub fn draw(seed: u64, index: usize, tenant: usize, rate: f64) -> anyhow::Result<Option<Self>> {
        let Some(plan) = RefundPlan::draw(seed, index, rate) else { return Ok(None) };
        let key = |part: usize| IdempotencyKey::new(format!("r-{seed:016x}-{index}-{part}"));
        Ok(Some(Self { plan, seed: seed ^ 0x5EF1_0000_0000_0000 ^ index as u64, tenant, keys: [key(0)?, key(1)?] }))
    }
}

/// Runs `job` for `payment` (succeeded), through `clients` (one per api process), following each
/// refund up to `follow`; returns what the clients saw.
pub async fn run(
    job: &RefundJob,
    payment: &Payment,
    clients: &[&Client],
    copies: usize,
    follow: Duration,
) -> Vec<RefundRecord> {
    let (plan, tenant) = (job.plan, job.tenant);
    let mut rng = StdRng::seed_from_u64(job.seed);
    let intent = |part: usize, amount: Option<i64>| {
        let mut builder = RefundIntent::builder(payment.id).metadata("part", part.to_string());
        if let Some(amount) = amount {
            builder = builder.amount(amount);
        }
        (builder.build_with_key(job.keys[part].clone()), amount)
    };
    let client = clients[0];
    let mut records = Vec::new();
    match plan {
        RefundPlan::Full => records.push(send(plan, tenant, intent(0, None), &[client], follow).await),
        RefundPlan::Parts => {
            let first = rng.random_range(1..=(payment.amount / 2).max(1));
            records.push(send(plan, tenant, intent(0, Some(first)), &[client], follow).await);
            records.push(send(plan, tenant, intent(1, None), &[client], follow).await);
        }
        RefundPlan::Storm => {
            let storm: Vec<&Client> = (0..copies.max(2)).map(|copy| clients[copy % clients.len()]).collect();
            records.push(send(plan, tenant, intent(0, Some((payment.amount / 3).max(1))), &storm, follow).await);
        }
        RefundPlan::TooMuch => {
            let each = payment.amount * 2 / 3 + 1;
            let (a, b) = (intent(0, Some(each)), intent(1, Some(each)));
            let (one, other) = ([client], [clients[1 % clients.len()]]);
            let (first, second) =
                futures::join!(send(plan, tenant, a, &one, follow), send(plan, tenant, b, &other, follow));
            records.extend([first, second]);
        }
    }
    records
}

/// Sends one refund intent through every client at once, then follows the refund.
async fn send(
    plan: RefundPlan,
    tenant: usize,
    (intent, asked): (RefundIntent, Option<i64>),
    clients: &[&Client],
    follow: Duration,
) -> RefundRecord {
    let mut record = RefundRecord {
        tenant,
        key: intent.key().as_str().to_owned(),
        payment_id: intent.payment_id().as_uuid(),
        plan,
        asked,
        refund_ids: BTreeSet::new(),
        answered: 0,
        gave_up: 0,
        refused: Vec::new(),
        last_status: None,
    };
    let answers = futures::future::join_all(clients.iter().map(|client| client.refund(&intent))).await;
    let mut accepted = None;
    for answer in answers {
        match answer {
            Ok(created) => {
                record.answered += 1;
                record.refund_ids.insert(created.refund.id.as_uuid());
                accepted = Some(created.refund);
            }
            Err(Error::GaveUp { .. }) => record.gave_up += 1,
            Err(error) => record.refused.push(describe(&error)),
        }
    }
    if let Some(refund) = accepted {
        record.last_status = Some(match clients[0].wait_for_refund(&refund.id, follow).await {
            Ok(last) => last.status.as_str().to_owned(),
            Err(error) => format!("unfollowed: {}", describe(&error)),
        });
    }
    record
}

fn describe(error: &Error) -> String {
    match (error.status(), error.problem()) {
        (Some(status), Some(problem)) => format!("{status} {}", problem.kind()),
        (Some(status), None) => format!("{status}"),
        _ => error.to_string(),
    }
}

/// Refunds not yet in an explained state, and their outbox rows: what settling waits for.
pub async fn in_flight(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar!(
        r#"SELECT (SELECT count(*) FROM refunds WHERE status IN ('pending', 'processing', 'unknown'))
              + (SELECT count(*) FROM refund_outbox) AS "count!""#
    )
    .fetch_one(pool)
    .await?)
}

/// What the checker found about refunds.
#[derive(Debug, Clone, Default)]
pub struct RefundFigures {
    /// Refunds in the database.
    pub refunds: usize,
    /// Refunds by status.
    pub by_status: BTreeMap<String, usize>,
    /// Refunds at the provider, failed ones included.
    pub provider_refunds: usize,
    /// Refund intents refused because they asked for more than was left.
    pub refused_too_much: usize,
    /// Conflicts opened on final refunds that a provider's report contradicted
    /// (`refund_dead_letters`).
    pub conflicts: usize,
    /// Of those, the ones whose refund agrees with the provider's record in every respect: false
    /// alarms for operators (refund id, the conflict's reason).
    pub false_conflicts: Vec<(Uuid, String)>,
    /// Resends the worker held back because they could have refunded twice: the resend guard at
    /// work.
    pub held_back: i64,
}

struct RefundRow {
    tenant_id: Uuid,
    refund_id: Uuid,
    payment_id: Uuid,
    status: String,
    amount: i64,
    currency: String,
    provider_refund_id: Option<String>,
}

struct PaymentMoney {
    tenant_id: Uuid,
    payment_id: Uuid,
    amount: i64,
    provider_charge_id: Option<String>,
    refunds_reserved: i64,
    refunded: i64,
}

/// Judges invariant 8 against the database, the provider's refunds and charges, and what the
/// clients saw; returns the violations and the figures.
pub async fn check(
    pool: &PgPool,
    provider: &[Refund],
    charges: &[Charge],
    seen: &BTreeMap<(usize, String), RefundRecord>,
) -> anyhow::Result<(Vec<Violation>, RefundFigures)> {
    let rows = sqlx::query_as!(
        RefundRow,
        r#"SELECT tenant_id, refund_id, payment_id, status::text AS "status!", amount, currency, provider_refund_id
           FROM refunds"#
    )
    .fetch_all(pool)
    .await?;
    let refunds: BTreeMap<Uuid, RefundRow> = rows.into_iter().map(|row| (row.refund_id, row)).collect();
    let payments: BTreeMap<Uuid, PaymentMoney> = sqlx::query_as!(
        PaymentMoney,
        "SELECT tenant_id, payment_id, amount, provider_charge_id, refunds_reserved, refunded FROM payments"
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|payment| (payment.payment_id, payment))
    .collect();
    let ledger: BTreeMap<Uuid, (String, i64)> =
        sqlx::query!("SELECT refund_id, provider_refund_id, amount FROM refund_ledger_entries")
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(|entry| (entry.refund_id, (entry.provider_refund_id, entry.amount)))
            .collect();

    let conflicts: Vec<(Uuid, String)> = sqlx::query!("SELECT refund_id, reason FROM refund_dead_letters")
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|conflict| (conflict.refund_id, conflict.reason))
        .collect();

    let mut violations = Vec::new();
    let mut violation = |what: &str, evidence: String| {
        violations.push(Violation { invariant: INVARIANT, what: what.to_owned(), evidence });
    };
    let held_back = sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM refund_events WHERE detail->>'reason' = $1"#,
        crate::checker::KEY_WINDOW_PASSED
    )
    .fetch_one(pool)
    .await?;
    let mut figures = RefundFigures {
        refunds: refunds.len(),
        held_back,
        provider_refunds: provider.len(),
        refused_too_much: seen
            .values()
            .filter(|record| {
                record.refused.iter().any(|r| r.ends_with("refund-exceeds-payment") || r.ends_with("nothing-to-refund"))
            })
            .count(),
        ..RefundFigures::default()
    };

    // The provider's refunds by the oncepay refund they were made for.
    let mut by_refund: BTreeMap<Uuid, Vec<&Refund>> = BTreeMap::new();
    for refund in provider {
        let by_key = refund.idempotency_key.as_deref().and_then(DownstreamKey::parse_refund_id).map(|id| id.as_uuid());
        let by_metadata = refund.refund_ref().map(|(_, refund_id)| refund_id.as_uuid());
        match by_metadata.or(by_key) {
            Some(refund_id) if refunds.contains_key(&refund_id) => by_refund.entry(refund_id).or_default().push(refund),
            _ => violation("the provider made a refund nobody asked for (not failing closed)", describe_refund(refund)),
        }
    }
    // Invariant 8: the refunds the provider holds for a charge never exceed it.
    let mut held: BTreeMap<&str, i64> = BTreeMap::new();
    for refund in provider.iter().filter(|r| matches!(r.status, RefundState::Succeeded | RefundState::Pending)) {
        *held.entry(refund.charge.as_str()).or_default() += refund.amount;
    }
    for (charge_id, total) in &held {
        if let Some(charge) = charges.iter().find(|charge| charge.id == *charge_id)
            && *total > charge.amount
        {
            violation(
                "the provider holds refunds of more than the charge",
                format!("charge {charge_id} of {}: refunded {total}", charge.amount),
            );
        }
    }

    let mut refunded: BTreeMap<Uuid, (i64, i64)> = BTreeMap::new();
    for refund in refunds.values() {
        *figures.by_status.entry(refund.status.clone()).or_default() += 1;
        let made: &[&Refund] = by_refund.get(&refund.refund_id).map_or(&[], Vec::as_slice);
        let moved: Vec<&&Refund> = made.iter().filter(|r| r.status == RefundState::Succeeded).collect();
        let evidence = || {
            format!(
                "refund {} ({} {}, {}): {}",
                refund.refund_id,
                refund.amount,
                refund.currency,
                refund.status,
                describe_all(made)
            )
        };
        if made.len() > 1 {
            violation("a refund moved money more than once", evidence());
        }
        let totals = refunded.entry(refund.payment_id).or_default();
        match refund.status.as_str() {
            "succeeded" => {
                totals.0 += refund.amount;
                totals.1 += refund.amount;
                match moved.as_slice() {
                    [one]
                        if one.amount == refund.amount
                            && refund.provider_refund_id.as_deref() == Some(one.id.as_str()) => {}
                    _ => violation("a succeeded refund is not the provider's one refund of its amount", evidence()),
                }
                match ledger.get(&refund.refund_id) {
                    Some((id, amount))
                        if Some(id) == refund.provider_refund_id.as_ref() && *amount == refund.amount => {}
                    _ => violation("a succeeded refund has no ledger entry of the provider's amount", evidence()),
                }
            }
            "failed" => {
                if !moved.is_empty() {
                    violation("a refund is failed while the provider refunded it", evidence());
                }
                if ledger.contains_key(&refund.refund_id) {
                    violation("a failed refund has a ledger entry", evidence());
                }
            }
            "dead_lettered" => totals.0 += refund.amount,
            _ => {
                totals.0 += refund.amount;
                violation("a refund is not in an explained state", evidence());
            }
        }
        if let Some(payment) = payments.get(&refund.payment_id) {
            if payment.tenant_id != refund.tenant_id {
                violation("a refund belongs to another tenant's payment", evidence());
            }
            if let (Some(charge), Some(provider_refund)) = (payment.provider_charge_id.as_deref(), made.first())
                && provider_refund.charge != charge
            {
                violation("the provider refunded another charge than the payment's", evidence());
            }
        }
    }
    // The payment's books: what it promised back and what went back are its refunds' sums, and
    // never more than it charged.
    for payment in payments.values() {
        let (reserved, back) = refunded.get(&payment.payment_id).copied().unwrap_or_default();
        if payment.refunds_reserved != reserved || payment.refunded != back || reserved > payment.amount {
            violation(
                "a payment's refunded amounts disagree with its refunds",
                format!(
                    "payment {} of {}: reserved {} (refunds say {reserved}), refunded {} (refunds say {back})",
                    payment.payment_id, payment.amount, payment.refunds_reserved, payment.refunded
                ),
            );
        }
    }
    // A conflict keeps the refund's final status and breaks no invariant, but it must be on a final
    // refund, and one whose refund agrees with the provider's record is a false alarm.
    figures.conflicts = conflicts.len();
    for (refund_id, reason) in conflicts {
        let made: &[&Refund] = by_refund.get(&refund_id).map_or(&[], Vec::as_slice);
        let moved: Vec<&&Refund> = made.iter().filter(|r| r.status == RefundState::Succeeded).collect();
        let agrees = match refunds.get(&refund_id) {
            Some(refund) if refund.status == "succeeded" => matches!(
                moved.as_slice(),
                [one] if made.len() == 1 && one.amount == refund.amount
                    && refund.provider_refund_id.as_deref() == Some(one.id.as_str())
            ),
            Some(refund) if refund.status == "failed" => moved.is_empty(),
            Some(refund) => {
                violation(
                    "a refund conflict is open on a refund that is not final",
                    format!("refund {refund_id} ({}): {reason}", refund.status),
                );
                false
            }
            None => false,
        };
        if agrees {
            figures.false_conflicts.push((refund_id, reason));
        }
    }
    // What the clients saw: one refund per key, of the payment they named, of their tenant.
    for record in seen.values() {
        if record.refund_ids.len() > 1 {
            violation(
                "one refund key was answered with several refunds",
                format!("key {}: {:?}", record.key, record.refund_ids),
            );
        }
        for id in &record.refund_ids {
            match refunds.get(id) {
                Some(refund) if refund.payment_id == record.payment_id => {}
                _ => violation(
                    "a refund answer names a refund that is not the one asked for",
                    format!("key {} got {id}", record.key),
                ),
            }
        }
    }
    Ok((violations, figures))
}

fn describe_refund(refund: &Refund) -> String {
    format!(
        "{} {:?} {} {} of {} (key {:?})",
        refund.id, refund.status, refund.amount, refund.currency, refund.charge, refund.idempotency_key
    )
}

fn describe_all(refunds: &[&Refund]) -> String {
    if refunds.is_empty() {
        return "none at the provider".to_owned();
    }
    refunds.iter().map(|refund| describe_refund(refund)).collect::<Vec<_>>().join("; ")
}
