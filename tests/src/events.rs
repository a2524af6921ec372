//! Events to merchants in a chaos run: the endpoints the harness subscribes for its tenants
//! (through the api, as a merchant does) at the receiver, the worker's delivery settings, waiting
//! until no delivery is owed to an enabled endpoint, and the judgement of invariant 11 against the
//! database and the receiver's log ([`EventsVerdict`]).
//!
//! The judgement only reads; it never queues, replays or repairs a delivery.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context;
use oncepay_devkit::process::setting_variable;
use oncepay_domain::merchant_event::EventType;
use oncepay_domain::refund_status::RefundStatus;
use oncepay_domain::status::PaymentStatus;
use serde::Deserialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::checker::Violation;
use crate::receiver::{Behaviour, Logged, Plan, Receiver, Refused};
use crate::system::{Processes, Role, System, Tenant};

/// Invariant 11 (CONTRACT.md): every committed change that has an event type has exactly one event;
/// each event reaches each subscribed endpoint (a 2xx seen) or is dead-lettered with its attempts; a
/// receiver never sees a payment's event n+1 before its event n.
const INVARIANT: u8 = 11;

/// The worker's retry schedule in the run: short, so that a delivery is delivered or dead-lettered
/// within seconds.
pub const RETRY_SCHEDULE_SECS: [f64; 4] = [0.2, 0.5, 1.0, 2.0];

/// How long the worker waits for an endpoint's response.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The worker's lease on a delivery: longer than [`TIMEOUT`], as the worker requires, and shorter
/// than a paused worker stays paused, so that another worker takes its deliveries over.
const LEASE_SECS: u64 = 3;

/// How long the receiver takes over a response that comes too late: a second past the timeout.
pub const TOO_LATE: Duration = TIMEOUT.saturating_add(Duration::from_secs(1));

/// How many requests the endpoint that goes away takes before it responds 410 for good.
const GONE_AFTER: usize = 10;

/// The settings the run's processes need: the worker's short schedule and timeout, and plain `http`
/// to the receiver on 127.0.0.1 for the worker and the api (which checks an endpoint's URL).
pub fn settings() -> Vec<(Processes, String, String)> {
    let schedule = serde_json::to_string(&RETRY_SCHEDULE_SECS).unwrap_or_else(|_| unreachable!("numbers are JSON"));
    let worker = [
        ("events.retry_schedule_secs", schedule),
        ("events.timeout_ms", TIMEOUT.as_millis().to_string()),
        ("events.lease_secs", LEASE_SECS.to_string()),
        ("events.poll_interval_ms", "100".to_owned()),
    ];
    let both = [("events.allow_http", "true".to_owned()), ("events.allow_private_addresses", "true".to_owned())];
    let mut settings: Vec<_> =
        worker.into_iter().map(|(key, value)| (Processes::Only(Role::Worker), setting_variable(key), value)).collect();
    for role in [Role::Worker, Role::Api] {
        settings.extend(both.iter().map(|(key, value)| (Processes::Only(role), setting_variable(key), value.clone())));
    }
    settings
}

/// Mostly 2xx, with every kind of failure now and then: a delivery is dead-lettered about once in a
/// hundred.
const MIXED: [(Behaviour, u32); 6] = [
    (Behaviour::Accept, 60),
    (Behaviour::ServerError, 10),
    (Behaviour::RateLimited, 10),
    (Behaviour::TooLate, 5),
    (Behaviour::Hang, 5),
    (Behaviour::DropConnection, 10),
];

/// Mostly failures, few of them slow: a delivery is dead-lettered about once in nine.
const FLAKY: [(Behaviour, u32); 6] = [
    (Behaviour::Accept, 35),
    (Behaviour::ServerError, 25),
    (Behaviour::RateLimited, 15),
    (Behaviour::TooLate, 5),
    (Behaviour::Hang, 5),
    (Behaviour::DropConnection, 15),
];

/// The types the picky endpoint takes.
const PICKY_TYPES: [EventType; 5] = [
    EventType::PaymentSucceeded,
    EventType::PaymentDeadLettered,
    EventType::PaymentResolved,
    EventType::RefundSucceeded,
    EventType::RefundFailed,
];

/// An endpoint the harness subscribed.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// Its name at the receiver.
    pub name: String,
    /// Its id in oncepay.
    pub endpoint_id: Uuid,
}

/// What `POST /v1/webhook-endpoints` returns, of what the harness reads.
#[derive(Deserialize)]
struct Created {
    id: Uuid,
    secret: String,
}

/// Subscribes the run's endpoints and serves each at the receiver: for every tenant `main-<i>`
/// (every type, mostly 2xx); for the first, `picky-0` too (a few types, mostly failures); for the
/// last, `gone-<i>` (every type, 410 for good after its first requests).
pub async fn subscribe(system: &System, receiver: &Receiver) -> anyhow::Result<Vec<Subscription>> {
    let last = system.tenants().len().saturating_sub(1);
    let mut subscriptions = Vec::new();
    for (index, tenant) in system.tenants().iter().enumerate() {
        let mixed = || Plan { mix: MIXED.to_vec(), gone_after: None };
        let mut wanted = vec![(format!("main-{index}"), &[][..], mixed())];
        if index == 0 {
            wanted.push((format!("picky-{index}"), &PICKY_TYPES[..], Plan { mix: FLAKY.to_vec(), gone_after: None }));
        }
        if index == last {
            wanted.push((format!("gone-{index}"), &[][..], Plan { gone_after: Some(GONE_AFTER), ..mixed() }));
        }
        for (name, event_types, plan) in wanted {
            subscriptions.push(subscribe_endpoint(system, tenant, receiver, &name, event_types, plan).await?);
        }
    }
    Ok(subscriptions)
}

/// Subscribes endpoint `name` of `tenant` through the api, as a merchant does, for `event_types`
/// (every type if none), and serves it at the receiver as `plan` draws.
pub async fn subscribe_endpoint(
    system: &System,
    tenant: &Tenant,
    receiver: &Receiver,
    name: &str,
    event_types: &[EventType],
    plan: Plan,
) -> anyhow::Result<Subscription> {
    let api = system.api_urls().into_iter().next().context("no api process")?;
    let body = serde_json::json!({
        "url": receiver.url(name),
        "description": format!("chaos: {name}"),
        "event_types": event_types.iter().map(|t| t.as_str()).collect::<Vec<_>>(),
    });
    let created: Created = reqwest::Client::new()
        .post(format!("{api}/v1/webhook-endpoints"))
        .bearer_auth(&tenant.api_key)
        .timeout(Duration::from_secs(10))
        .json(&body)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("cannot subscribe {name} for {}", tenant.name))?
        .json()
        .await
        .with_context(|| format!("reading the endpoint made for {name}"))?;
    receiver.register(name, &created.secret, plan)?;
    Ok(Subscription { name: name.to_owned(), endpoint_id: created.id })
}

/// Waits up to `bound` until no delivery is pending at an enabled endpoint (the judgement counts
/// those still pending).
pub async fn settle(pool: &PgPool, bound: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let owed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM merchant_deliveries d
               JOIN merchant_endpoints p ON p.tenant_id = d.tenant_id AND p.endpoint_id = d.endpoint_id
              WHERE d.state = 'pending' AND p.enabled",
        )
        .fetch_one(pool)
        .await
        .context("cannot count the deliveries still owed")?;
        if owed == 0 || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A payment's or a refund's change of status (`payment_events`, `refund_events`).
#[derive(Debug, Clone, sqlx::FromRow)]
struct Change {
    /// The payment (a refund's payment for a refund's change).
    payment_id: Uuid,
    /// The refund, for a refund's change.
    refund_id: Option<Uuid>,
    /// Its place in its resource's history.
    seq: i32,
    from_status: Option<String>,
    to_status: String,
}

/// A row of `merchant_events`.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Event {
    event_id: Uuid,
    event_order: i64,
    event_type: String,
    payment_id: Option<Uuid>,
    refund_id: Option<Uuid>,
    sequence: Option<i32>,
}

/// A row of `merchant_deliveries`, with its attempts counted.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Delivery {
    endpoint_id: Uuid,
    event_id: Uuid,
    state: String,
    attempts: i32,
    fencing_token: i64,
    attempt_rows: i64,
}

/// A row of `merchant_endpoints`, of what the judgement reads.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Endpoint {
    endpoint_id: Uuid,
    enabled: bool,
    disabled_reason: Option<String>,
}

/// Everything the judgement reads from the database.
#[derive(Debug, Clone, Default)]
struct Stored {
    changes: Vec<Change>,
    events: Vec<Event>,
    deliveries: Vec<Delivery>,
    endpoints: Vec<Endpoint>,
}

impl Stored {
    async fn read(pool: &PgPool) -> anyhow::Result<Self> {
        // Unchecked queries: the harness's checks read what oncepay's own statements wrote, and need
        // no offline query data of their own.
        let changes = sqlx::query_as(
            "SELECT payment_id, NULL::uuid AS refund_id, seq, from_status::text AS from_status,
                    to_status::text AS to_status
               FROM payment_events
             UNION ALL
             SELECT r.payment_id, e.refund_id, e.seq, e.from_status::text, e.to_status::text
               FROM refund_events e JOIN refunds r ON r.tenant_id = e.tenant_id AND r.refund_id = e.refund_id",
        )
        .fetch_all(pool)
        .await
        .context("cannot read the payments' and refunds' changes")?;
        let events = sqlx::query_as(
            "SELECT event_id, event_order, type AS event_type, payment_id, refund_id, sequence
               FROM merchant_events ORDER BY event_order",
        )
        .fetch_all(pool)
        .await
        .context("cannot read the events")?;
        let deliveries = sqlx::query_as(
            "SELECT d.endpoint_id, d.event_id, d.state, d.attempts, d.fencing_token,
                    (SELECT count(*) FROM merchant_delivery_all_attempts a
                      WHERE a.tenant_id = d.tenant_id AND a.endpoint_id = d.endpoint_id AND a.event_id = d.event_id)
                      AS attempt_rows
               FROM merchant_deliveries d",
        )
        .fetch_all(pool)
        .await
        .context("cannot read the deliveries")?;
        let endpoints = sqlx::query_as("SELECT endpoint_id, enabled, disabled_reason FROM merchant_endpoints")
            .fetch_all(pool)
            .await
            .context("cannot read the endpoints")?;
        Ok(Self { changes, events, deliveries, endpoints })
    }
}

/// What an event is about: the key its change is found by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Subject {
    Payment(Uuid),
    Refund(Uuid),
}

impl Subject {
    fn of(payment_id: Option<Uuid>, refund_id: Option<Uuid>) -> Option<Self> {
        refund_id.map(Self::Refund).or(payment_id.map(Self::Payment))
    }
}

/// What the events' part of a run came to.
#[derive(Debug, Clone, Default)]
pub struct EventsVerdict {
    /// Events written, by kind (`payment`, `refund`, `endpoint`).
    pub events: BTreeMap<String, usize>,
    /// Deliveries an endpoint took.
    pub delivered: usize,
    /// Deliveries that ran out of attempts.
    pub dead_lettered: usize,
    /// Deliveries left pending at an endpoint that was disabled.
    pub pending_at_disabled: usize,
    /// Deliveries left pending at an enabled endpoint after settling (must be 0).
    pub owed: usize,
    /// Claims that ended without a recorded attempt: the worker was killed, paused past its lease
    /// or crashed, or could not reach the database to record.
    pub interrupted: i64,
    /// Requests for an event an endpoint had already responded 2xx to.
    pub repeated: usize,
    /// Endpoints that were disabled, with why.
    pub disabled: Vec<(String, String)>,
    /// Verified requests, by how the receiver responded.
    pub requests: BTreeMap<Behaviour, usize>,
    /// Requests the receiver could not verify (must be 0).
    pub refused: usize,
    /// Broken promises (moved into the run's verdict).
    pub violations: Vec<Violation>,
}

impl EventsVerdict {
    /// Judges the run's events and deliveries against the receiver's log.
    pub async fn judge(pool: &PgPool, subscriptions: &[Subscription], receiver: &Receiver) -> anyhow::Result<Self> {
        let stored = Stored::read(pool).await?;
        Ok(Self::from_rows(&stored, subscriptions, &receiver.log(), &receiver.refused()))
    }

    fn from_rows(stored: &Stored, subscriptions: &[Subscription], log: &[Logged], refused: &[Refused]) -> Self {
        let mut verdict = Self { refused: refused.len(), ..Self::default() };
        for refusal in refused {
            verdict.violation("the receiver got a delivery it could not verify", format!("{refusal:?}"));
        }
        for logged in log {
            *verdict.requests.entry(logged.behaviour).or_default() += 1;
        }
        let names: BTreeMap<Uuid, &str> = subscriptions.iter().map(|s| (s.endpoint_id, s.name.as_str())).collect();
        let events: BTreeMap<Uuid, &Event> = stored.events.iter().map(|e| (e.event_id, e)).collect();
        verdict.check_changes(stored);
        verdict.check_deliveries(stored, &names, log);
        verdict.check_order(&events, log);
        verdict.check_bodies(&events, log);
        verdict.violations.sort();
        verdict
    }

    /// Every request the receiver logged carries its event's type, subject and sequence.
    fn check_bodies(&mut self, events: &BTreeMap<Uuid, &Event>, log: &[Logged]) {
        for logged in log {
            let Some(event) = events.get(&logged.webhook_id) else { continue };
            if event.event_type != logged.event_type
                || event.sequence.map(i64::from) != logged.sequence
                || Subject::of(event.payment_id, event.refund_id) != Subject::of(logged.payment_id, logged.refund_id)
            {
                self.violation("a delivery's body does not match its event", format!("{event:?}; received {logged:?}"));
            }
        }
    }

    /// (a) Every change that makes an event has exactly one, of the type it makes; every event of a
    /// payment or refund has its change; and a payment's events are queued in the order of its
    /// changes (and its refunds' changes).
    fn check_changes(&mut self, stored: &Stored) {
        let mut made: BTreeMap<(Subject, i32), EventType> = BTreeMap::new();
        let mut refunded: BTreeMap<Uuid, Uuid> = BTreeMap::new();
        for change in &stored.changes {
            let subject = Subject::of(Some(change.payment_id), change.refund_id);
            if let Some(refund_id) = change.refund_id {
                refunded.insert(refund_id, change.payment_id);
            }
            if let (Some(subject), Some(event_type)) = (subject, event_of(change)) {
                made.insert((subject, change.seq), event_type);
            }
        }
        let mut written: BTreeMap<(Subject, i32), Vec<&Event>> = BTreeMap::new();
        for event in &stored.events {
            let kind = event.event_type.split('.').next().unwrap_or_default().to_owned();
            *self.events.entry(kind).or_default() += 1;
            match (Subject::of(event.payment_id, event.refund_id), event.sequence) {
                (Some(subject), Some(sequence)) => written.entry((subject, sequence)).or_default().push(event),
                (None, None) if event.event_type.starts_with("endpoint.") => {}
                _ => self.violation("an event names no change", format!("{event:?}")),
            }
            if let Some(refund_id) = event.refund_id
                && refunded.get(&refund_id).is_some_and(|payment| event.payment_id != Some(*payment))
            {
                self.violation("a refund's event names another payment", format!("{event:?}"));
            }
        }
        for ((subject, seq), event_type) in &made {
            match written.get(&(*subject, *seq)).map(Vec::as_slice).unwrap_or_default() {
                [] => self.violation(
                    "a committed change that makes an event has none",
                    format!("{subject:?} change {seq} makes {event_type}"),
                ),
                [event] if event.event_type == event_type.as_str() => {}
                events => self.violation(
                    "a change does not have exactly one event of its type",
                    format!("{subject:?} change {seq} makes {event_type}; events: {events:?}"),
                ),
            }
        }
        for (key, events) in &written {
            if !made.contains_key(key) {
                self.violation("an event has no committed change that makes it", format!("{events:?}"));
            }
        }
        // Within a payment, in the order the events were queued, each resource's sequence rises.
        let mut last: BTreeMap<Subject, &Event> = BTreeMap::new();
        for event in &stored.events {
            let (Some(subject), Some(sequence)) = (Subject::of(event.payment_id, event.refund_id), event.sequence)
            else {
                continue;
            };
            if let Some(before) = last.insert(subject, event)
                && before.sequence >= Some(sequence)
            {
                self.violation(
                    "a payment's events are queued out of the order of its changes",
                    format!("{before:?} is queued before {event:?}"),
                );
            }
        }
    }

    /// (b) Every delivery was taken (and the receiver responded 2xx to it), was dead-lettered after
    /// every attempt the schedule allows, or waits at an endpoint that was disabled; the receiver got
    /// nothing that was not queued for its endpoint; an endpoint that responded 410 is disabled.
    fn check_deliveries(&mut self, stored: &Stored, names: &BTreeMap<Uuid, &str>, log: &[Logged]) {
        let name =
            |endpoint_id: &Uuid| names.get(endpoint_id).map_or_else(|| endpoint_id.to_string(), |n| (*n).to_owned());
        let endpoints: BTreeMap<Uuid, &Endpoint> = stored.endpoints.iter().map(|e| (e.endpoint_id, e)).collect();
        let mut accepted: BTreeSet<(&str, Uuid)> = BTreeSet::new();
        for logged in log {
            if accepted.contains(&(logged.endpoint.as_str(), logged.webhook_id)) {
                self.repeated += 1;
            }
            if logged.behaviour.is_2xx() {
                accepted.insert((logged.endpoint.as_str(), logged.webhook_id));
            }
        }
        let allowed = i64::try_from(RETRY_SCHEDULE_SECS.len()).unwrap_or(i64::MAX) + 1;
        let mut queued: BTreeSet<(String, Uuid)> = BTreeSet::new();
        for delivery in &stored.deliveries {
            let endpoint = name(&delivery.endpoint_id);
            let describe = || {
                format!(
                    "event {} at {endpoint}: {}, {} attempt(s), {} attempt row(s)",
                    delivery.event_id, delivery.state, delivery.attempts, delivery.attempt_rows
                )
            };
            self.interrupted += delivery.fencing_token - i64::from(delivery.attempts);
            if i64::from(delivery.attempts) != delivery.attempt_rows {
                self.violation("a delivery's attempts disagree with the attempts kept", describe());
            }
            match delivery.state.as_str() {
                "delivered" => {
                    self.delivered += 1;
                    if !accepted.contains(&(endpoint.as_str(), delivery.event_id)) {
                        self.violation("a delivery is delivered although its endpoint never responded 2xx", describe());
                    }
                }
                "dead_lettered" => {
                    self.dead_lettered += 1;
                    if delivery.attempt_rows != allowed {
                        self.violation(
                            "a dead-lettered delivery does not keep every attempt the schedule allows",
                            format!("{}; the schedule allows {allowed}", describe()),
                        );
                    }
                }
                _ if endpoints.get(&delivery.endpoint_id).is_some_and(|e| !e.enabled) => self.pending_at_disabled += 1,
                _ => {
                    self.owed += 1;
                    self.violation("a delivery is still owed to an enabled endpoint after settling", describe());
                }
            }
            queued.insert((endpoint, delivery.event_id));
        }
        for logged in log {
            if !queued.contains(&(logged.endpoint.clone(), logged.webhook_id)) {
                self.violation("an endpoint received an event never queued for it", format!("{logged:?}"));
            }
        }
        for endpoint in &stored.endpoints {
            let endpoint_name = name(&endpoint.endpoint_id);
            if let Some(reason) = &endpoint.disabled_reason {
                self.disabled.push((endpoint_name.clone(), reason.clone()));
            }
            let gone = log.iter().any(|l| l.endpoint == endpoint_name && l.behaviour == Behaviour::Gone);
            if gone && endpoint.disabled_reason.as_deref() != Some("gone") {
                self.violation(
                    "an endpoint that responded 410 is not disabled as gone",
                    format!("{endpoint_name}: enabled {}, reason {:?}", endpoint.enabled, endpoint.disabled_reason),
                );
            }
        }
    }

    /// (c) Per endpoint and payment, the receiver never got an event of the payment (or of one of its
    /// refunds) after a later one: not for the first time, and not again.
    fn check_order(&mut self, events: &BTreeMap<Uuid, &Event>, log: &[Logged]) {
        let mut latest: BTreeMap<(&str, Uuid), &Event> = BTreeMap::new();
        let mut seen: BTreeSet<(&str, Uuid)> = BTreeSet::new();
        for logged in log {
            let Some(event) = events.get(&logged.webhook_id) else { continue };
            let endpoint = logged.endpoint.as_str();
            let again = !seen.insert((endpoint, event.event_id));
            let Some(payment_id) = event.payment_id else { continue };
            let newest = latest.entry((endpoint, payment_id)).or_insert(event);
            if event.event_order < newest.event_order {
                let what = if again {
                    "an endpoint got a payment's event again after a later one"
                } else {
                    "an endpoint got a payment's event after a later one"
                };
                self.violation(
                    what,
                    format!(
                        "{endpoint}, payment {payment_id}: {} {} (sequence {:?}) after {} {} (sequence {:?})",
                        event.event_type,
                        event.event_id,
                        event.sequence,
                        newest.event_type,
                        newest.event_id,
                        newest.sequence
                    ),
                );
            } else {
                *newest = event;
            }
        }
    }

    fn violation(&mut self, what: &str, evidence: String) {
        self.violations.push(Violation { invariant: INVARIANT, what: what.to_owned(), evidence });
    }
}

/// The event a change makes, if any.
fn event_of(change: &Change) -> Option<EventType> {
    if change.refund_id.is_some() {
        let status = |name: &str| RefundStatus::ALL.into_iter().find(|s| s.as_str() == name);
        EventType::of_refund_change(status(change.from_status.as_deref()?)?, status(&change.to_status)?)
    } else {
        let status = |name: &str| PaymentStatus::ALL.into_iter().find(|s| s.as_str() == name);
        EventType::of_payment_change(status(change.from_status.as_deref()?)?, status(&change.to_status)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payment and its history of changes, each from the status before.
    fn history(payment_id: Uuid, statuses: &[&str]) -> Vec<Change> {
        let mut from = None;
        let mut changes = Vec::new();
        for (seq, to) in (1..).zip(statuses) {
            changes.push(Change {
                payment_id,
                refund_id: None,
                seq,
                from_status: from.map(str::to_owned),
                to_status: (*to).to_owned(),
            });
            from = Some(*to);
        }
        changes
    }

    fn event(order: i64, event_type: &str, payment_id: Uuid, sequence: i32) -> Event {
        Event {
            event_id: Uuid::now_v7(),
            event_order: order,
            event_type: event_type.to_owned(),
            payment_id: Some(payment_id),
            refund_id: None,
            sequence: Some(sequence),
        }
    }

    fn delivery(endpoint_id: Uuid, event: &Event, state: &str, attempts: i32) -> Delivery {
        Delivery {
            endpoint_id,
            event_id: event.event_id,
            state: state.to_owned(),
            attempts,
            fencing_token: i64::from(attempts),
            attempt_rows: i64::from(attempts),
        }
    }

    fn logged(event: &Event, behaviour: Behaviour) -> Logged {
        Logged {
            endpoint: "main-0".to_owned(),
            webhook_id: event.event_id,
            event_type: event.event_type.clone(),
            payment_id: event.payment_id,
            refund_id: event.refund_id,
            sequence: event.sequence.map(i64::from),
            behaviour,
        }
    }

    fn subscription(endpoint_id: Uuid) -> Vec<Subscription> {
        vec![Subscription { name: "main-0".to_owned(), endpoint_id }]
    }

    fn whats(stored: &Stored, endpoint_id: Uuid, log: &[Logged]) -> Vec<String> {
        EventsVerdict::from_rows(stored, &subscription(endpoint_id), log, &[])
            .violations
            .into_iter()
            .map(|v| v.what)
            .collect()
    }

    #[test]
    fn a_change_without_its_event_and_an_event_without_its_change_are_violations_of_invariant_eleven() {
        let payment = Uuid::now_v7();
        let changes = history(payment, &["pending", "processing", "unknown", "dead_lettered", "pending"]);
        let dead = event(1, "payment.dead_lettered", payment, 4);
        let retried = event(2, "payment.retried", payment, 5);
        let rolled_back = event(3, "payment.succeeded", payment, 6);
        let twice = event(4, "payment.retried", payment, 5);
        let stored = |events: Vec<Event>| Stored { changes: changes.clone(), events, ..Stored::default() };

        let whole = whats(&stored(vec![dead.clone(), retried.clone()]), Uuid::nil(), &[]);
        let missing = whats(&stored(vec![dead.clone()]), Uuid::nil(), &[]);
        let orphan = whats(&stored(vec![dead.clone(), retried.clone(), rolled_back]), Uuid::nil(), &[]);
        let duplicated = whats(&stored(vec![dead, retried, twice]), Uuid::nil(), &[]);

        assert!(whole.is_empty(), "{whole:?}");
        assert_eq!(missing, ["a committed change that makes an event has none"]);
        assert_eq!(orphan, ["an event has no committed change that makes it"]);
        assert_eq!(
            duplicated,
            [
                "a change does not have exactly one event of its type",
                "a payment's events are queued out of the order of its changes"
            ]
        );
    }

    #[test]
    fn a_delivery_is_taken_with_a_2xx_dead_lettered_with_every_attempt_or_waits_at_a_disabled_endpoint() {
        let (payment, endpoint_id) = (Uuid::now_v7(), Uuid::now_v7());
        let changes = history(payment, &["pending", "processing", "succeeded"]);
        let succeeded = event(1, "payment.succeeded", payment, 3);
        let allowed = i32::try_from(RETRY_SCHEDULE_SECS.len()).unwrap() + 1;
        let judge = |state: &str, attempts: i32, enabled: bool, log: &[Logged]| {
            let stored = Stored {
                changes: changes.clone(),
                events: vec![succeeded.clone()],
                deliveries: vec![delivery(endpoint_id, &succeeded, state, attempts)],
                endpoints: vec![Endpoint {
                    endpoint_id,
                    enabled,
                    disabled_reason: (!enabled).then(|| "gone".to_owned()),
                }],
            };
            whats(&stored, endpoint_id, log)
        };
        let taken = [logged(&succeeded, Behaviour::ServerError), logged(&succeeded, Behaviour::Accept)];
        let refused = [logged(&succeeded, Behaviour::ServerError)];

        assert!(judge("delivered", 2, true, &taken).is_empty());
        assert!(judge("dead_lettered", allowed, true, &refused).is_empty());
        assert!(judge("pending", 0, false, &[]).is_empty());
        assert_eq!(
            judge("delivered", 1, true, &refused),
            ["a delivery is delivered although its endpoint never responded 2xx"]
        );
        assert_eq!(
            judge("dead_lettered", allowed - 1, true, &refused),
            ["a dead-lettered delivery does not keep every attempt the schedule allows"]
        );
        assert_eq!(
            judge("pending", 1, true, &refused),
            ["a delivery is still owed to an enabled endpoint after settling"]
        );
    }

    #[test]
    fn an_older_event_of_a_payment_after_a_newer_one_is_a_violation_even_when_it_is_a_repeat() {
        let (payment, endpoint_id) = (Uuid::now_v7(), Uuid::now_v7());
        let changes = history(payment, &["pending", "processing", "unknown", "dead_lettered", "pending"]);
        let dead = event(1, "payment.dead_lettered", payment, 4);
        let retried = event(2, "payment.retried", payment, 5);
        let stored = Stored {
            changes,
            events: vec![dead.clone(), retried.clone()],
            deliveries: vec![
                delivery(endpoint_id, &dead, "delivered", 1),
                delivery(endpoint_id, &retried, "delivered", 1),
            ],
            endpoints: vec![Endpoint { endpoint_id, enabled: true, disabled_reason: None }],
        };
        let accept = |event: &Event| logged(event, Behaviour::Accept);

        let in_order = whats(&stored, endpoint_id, &[accept(&dead), accept(&dead), accept(&retried)]);
        let reversed = whats(&stored, endpoint_id, &[accept(&retried), accept(&dead)]);
        let stale = whats(&stored, endpoint_id, &[accept(&dead), accept(&retried), accept(&dead)]);

        assert!(in_order.is_empty(), "{in_order:?}");
        assert_eq!(reversed, ["an endpoint got a payment's event after a later one"]);
        assert_eq!(stale, ["an endpoint got a payment's event again after a later one"]);
    }
}
