//! Shared arrangements for the worker's tests: payments and refunds created exactly as the api
//! creates them, a drainer pointed at a wiremock provider, a provider that charges like the real one
//! and counts requests per downstream key, and readers for the rows the tests assert on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_provider::KeyWindow;
use oncepay_provider::ProviderSettings;
use oncepay_provider::http::HttpProvider;
use oncepay_provider::wire::CreateCharge;
use oncepay_service::backoff::Backoff;
use oncepay_service::telemetry::TraceContext;
use oncepay_store::fixtures;
use oncepay_store::fixtures::RefundSubmission;
use oncepay_store::payments;
use oncepay_store::payments::Payment;
use oncepay_store::refunds::Refund;
use oncepay_store::refunds::intake::{self, RefundIntake};
use oncepay_store::transitions::{self, Change, Settlement};
use oncepay_worker::{Drainer, DrainerConfig};
use serde_json::json;
use sqlx::PgPool;
use time::OffsetDateTime;
use tokio::sync::Notify;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// A payment the api accepted.
#[derive(Debug, Clone, Copy)]
pub struct Accepted {
    pub tenant_id: TenantId,
    pub payment_id: PaymentId,
}

/// Accepts a refund of `amount` of `payment`, as `POST /v1/payments/{id}/refunds` would.
pub async fn refund(pool: &PgPool, payment: Accepted, amount: i64) -> Refund {
    refund_traced(pool, payment, amount, None).await
}

/// Accepts a refund as [`refund`] does, inside the request's `trace`.
pub async fn refund_traced(pool: &PgPool, payment: Accepted, amount: i64, trace: Option<TraceContext>) -> Refund {
    let key = RefundId::generate().to_string();
    let submission = RefundSubmission::new(&key, payment.payment_id, &json!({"amount": amount}));
    let new = submission.for_payment(payment.tenant_id, payment.payment_id, trace);
    let mut conn = pool.acquire().await.unwrap();
    match intake::accept(&mut conn, &new).await.unwrap() {
        RefundIntake::Created { refund, .. } => *refund,
        other => panic!("the refund was not accepted: {other:?}"),
    }
}

/// Creates a tenant with a fresh name.
pub async fn tenant(pool: &PgPool) -> TenantId {
    fixtures::tenant(pool, &format!("t{}", &uuid_suffix()[..12])).await
}

fn uuid_suffix() -> String {
    PaymentId::generate().to_string().replace('-', "")[20..].to_owned()
}

/// Accepts a payment of `amount` EUR cents, as `POST /v1/payments` would.
pub async fn accept(pool: &PgPool, tenant_id: TenantId, amount: i64) -> Accepted {
    accept_traced(pool, tenant_id, amount, None).await
}

/// Accepts a payment as [`accept`] does, inside the request's `trace`.
pub async fn accept_traced(pool: &PgPool, tenant_id: TenantId, amount: i64, trace: Option<&TraceContext>) -> Accepted {
    let key = PaymentId::generate().to_string();
    let created = fixtures::accept(pool, tenant_id, &key, &fixtures::body(amount), trace).await.unwrap();
    Accepted { tenant_id, payment_id: created.payment.payment_id }
}

/// Accepts a payment as [`accept`] does, charging the provider's payment method `method`.
pub async fn accept_paying_with(pool: &PgPool, tenant_id: TenantId, amount: i64, method: &str) -> Accepted {
    let key = PaymentId::generate().to_string();
    let mut body = fixtures::body(amount);
    body["payment_method"] = json!(method);
    let created = fixtures::accept(pool, tenant_id, &key, &body, None).await.unwrap();
    Accepted { tenant_id, payment_id: created.payment.payment_id }
}

/// A drainer configuration for tests: small batches, quick polls, three attempts with no backoff.
pub fn config(worker_id: &str) -> DrainerConfig {
    DrainerConfig {
        worker_id: worker_id.to_owned(),
        batch_size: 16,
        max_in_flight: 16,
        lease: Duration::from_secs(60),
        poll_interval: Duration::from_millis(50),
        max_attempts: 3,
        backoff: Backoff { base: Duration::ZERO, max: Duration::ZERO },
        key_window: KeyWindow { window: Duration::from_secs(86_400), safety_margin: Duration::from_secs(3_600) },
        shutdown_grace: Duration::from_secs(10),
    }
}

/// Settings for a provider at `base_url` that gives up on an answer after a second.
pub fn provider_settings(base_url: &str) -> ProviderSettings {
    ProviderSettings { request_timeout_ms: 1_000, ..fixtures::provider_settings(base_url) }
}

pub fn drainer(pool: &PgPool, base_url: &str, config: DrainerConfig) -> Drainer<HttpProvider> {
    Drainer::new(pool.clone(), HttpProvider::new(&provider_settings(base_url)).unwrap(), config)
}

/// A base URL nobody listens on: connections are refused.
pub fn refusing_url() -> String {
    let port = oncepay_devkit::ports::reserve().unwrap();
    format!("http://127.0.0.1:{port}")
}

/// A provider that charges what it is asked, once per key (a repeated key gets the first charge
/// back, as the protocol says), and counts the requests for each key.
#[derive(Clone, Default)]
pub struct Charges {
    requests: Arc<Mutex<HashMap<String, u32>>>,
    charges: Arc<Mutex<HashMap<String, serde_json::Value>>>,
    arrived: Arc<Notify>,
    delay: Duration,
}

impl Charges {
    pub fn new() -> Self {
        Self::default()
    }

    /// Answers only after `delay`.
    pub fn with_delay(delay: Duration) -> Self {
        Self { delay, ..Self::default() }
    }

    pub async fn mount(&self, server: &MockServer) {
        Mock::given(wiremock::matchers::method("POST"))
            .and(wiremock::matchers::path("/v1/charges"))
            .respond_with(self.clone())
            .mount(server)
            .await;
    }

    /// Requests per downstream key.
    pub fn requests(&self) -> HashMap<String, u32> {
        self.requests.lock().unwrap().clone()
    }

    /// Resolves once a request has arrived (at once if one arrived since the last call).
    pub async fn arrived(&self) {
        self.arrived.notified().await;
    }
}

impl Respond for Charges {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let key = request.headers.get("Idempotency-Key").unwrap().to_str().unwrap().to_owned();
        let body: CreateCharge = request.body_json().unwrap();
        *self.requests.lock().unwrap().entry(key.clone()).or_default() += 1;
        let charge = self
            .charges
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_insert_with(|| {
                json!({
                    "id": format!("ch_{}", &key[key.len() - 12..]),
                    "status": "succeeded",
                    "amount": body.amount,
                    "currency": body.currency,
                    "customer": body.customer,
                    "idempotency_key": key,
                    "created": OffsetDateTime::now_utc().unix_timestamp(),
                    "metadata": body.metadata,
                })
            })
            .clone();
        self.arrived.notify_one();
        ResponseTemplate::new(201).set_body_json(charge).set_delay(self.delay)
    }
}

pub async fn payment(pool: &PgPool, accepted: Accepted) -> Payment {
    let mut conn = pool.acquire().await.unwrap();
    payments::fetch(&mut conn, accepted.tenant_id, accepted.payment_id).await.unwrap().unwrap()
}

pub async fn status(pool: &PgPool, accepted: Accepted) -> PaymentStatus {
    payment(pool, accepted).await.status
}

/// Settles a `processing` payment the way the reconciler does when the provider's webhook reports
/// `settlement` before the worker has recorded its answer.
pub async fn settle_by_webhook(pool: &PgPool, accepted: Accepted, settlement: &Settlement) {
    let (transition, reason) = match settlement {
        Settlement::Succeeded { .. } => (Transition::Charged, "charge.succeeded"),
        Settlement::Failed { .. } => (Transition::Declined, "charge.failed"),
    };
    let change = Change {
        tenant_id: accepted.tenant_id,
        payment_id: accepted.payment_id,
        from: PaymentStatus::Processing,
        transition,
        actor: "webhook",
        reason,
        detail: None,
    };
    let mut conn = pool.acquire().await.unwrap();
    transitions::settle(&mut conn, &change, settlement).await.unwrap();
}

/// An outbox row as the tests look at it.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub available_at: OffsetDateTime,
    pub locked_by: Option<String>,
    pub locked_until: Option<OffsetDateTime>,
    pub fencing_token: Option<i64>,
    pub attempts: i32,
    pub lease_expirations: i32,
}

pub async fn outbox_row(pool: &PgPool, accepted: Accepted) -> Option<OutboxRow> {
    sqlx::query_as!(
        OutboxRow,
        "SELECT available_at, locked_by, locked_until, fencing_token, attempts, lease_expirations
         FROM outbox WHERE tenant_id = $1 AND payment_id = $2",
        accepted.tenant_id.as_uuid(),
        accepted.payment_id.as_uuid(),
    )
    .fetch_optional(pool)
    .await
    .unwrap()
}

/// The payment's audit trail: (from, to, actor, reason), oldest first.
pub async fn events(pool: &PgPool, accepted: Accepted) -> Vec<(Option<PaymentStatus>, PaymentStatus, String, String)> {
    let rows = sqlx::query!(
        r#"SELECT from_status AS "from_status: PaymentStatus", to_status AS "to_status: PaymentStatus", actor, reason
           FROM payment_events WHERE tenant_id = $1 AND payment_id = $2 ORDER BY seq"#,
        accepted.tenant_id.as_uuid(),
        accepted.payment_id.as_uuid(),
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter().map(|row| (row.from_status, row.to_status, row.actor, row.reason)).collect()
}

/// The reconciler's queue entry: (reason, evidence).
pub async fn unknown_entry(pool: &PgPool, accepted: Accepted) -> Option<(String, serde_json::Value)> {
    let row = sqlx::query!(
        "SELECT reason, evidence FROM unknown_payments WHERE tenant_id = $1 AND payment_id = $2",
        accepted.tenant_id.as_uuid(),
        accepted.payment_id.as_uuid(),
    )
    .fetch_optional(pool)
    .await
    .unwrap();
    row.map(|row| (row.reason, row.evidence))
}

/// The ledger entry: (charge id, amount, currency).
pub async fn ledger_entry(pool: &PgPool, accepted: Accepted) -> Option<(String, i64, String)> {
    let row = sqlx::query!(
        "SELECT provider_charge_id, amount, currency FROM ledger_entries WHERE tenant_id = $1 AND payment_id = $2",
        accepted.tenant_id.as_uuid(),
        accepted.payment_id.as_uuid(),
    )
    .fetch_optional(pool)
    .await
    .unwrap();
    row.map(|row| (row.provider_charge_id, row.amount, row.currency))
}

/// The response stored on the payment's idempotency key: (status, body).
pub async fn stored_response(pool: &PgPool, accepted: Accepted) -> Option<(i16, serde_json::Value)> {
    let row = sqlx::query!(
        r#"SELECT response_status AS "response_status!", response_body AS "response_body!: serde_json::Value"
           FROM idempotency_keys WHERE tenant_id = $1 AND payment_id = $2 AND response_status IS NOT NULL"#,
        accepted.tenant_id.as_uuid(),
        accepted.payment_id.as_uuid(),
    )
    .fetch_optional(pool)
    .await
    .unwrap();
    row.map(|row| (row.response_status, row.response_body))
}

/// Who holds the leased outbox rows.
pub async fn lease_holders(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar!(
        r#"SELECT locked_by AS "locked_by!" FROM outbox WHERE locked_until IS NOT NULL ORDER BY locked_by"#
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The URL of this test's database as the worker's own role (migration 0380), for a worker of its own.
pub async fn database_url(pool: &PgPool) -> String {
    let database = sqlx::query_scalar!(r#"SELECT current_database() AS "name!""#).fetch_one(pool).await.unwrap();
    let options = pool.connect_options();
    format!("postgres://oncepay_worker@{}:{}/{database}", options.get_host(), options.get_port())
}

pub async fn db_now(pool: &PgPool) -> OffsetDateTime {
    sqlx::query_scalar!(r#"SELECT now() AS "now!""#).fetch_one(pool).await.unwrap()
}

/// Makes every lease look expired, as if its worker had stalled past it.
pub async fn expire_leases(pool: &PgPool) {
    sqlx::query!("UPDATE outbox SET locked_until = now() - interval '1 second' WHERE locked_until IS NOT NULL")
        .execute(pool)
        .await
        .unwrap();
}

/// Moves the payment's first send `age` into the past, as if the provider's key window had run on.
pub async fn age_first_send(pool: &PgPool, accepted: Accepted, age: Duration) {
    sqlx::query!("UPDATE payments SET first_sent_at = now() - make_interval(secs => $3) WHERE tenant_id = $1 AND payment_id = $2", accepted.tenant_id.as_uuid(), accepted.payment_id.as_uuid(), age.as_secs_f64())
        .execute(pool)
        .await
        .unwrap();
}

/// The requests the provider received for one payment's downstream key.
pub async fn requests_for(server: &MockServer, accepted: Accepted) -> Vec<Request> {
    let key = accepted.payment_id.downstream_key();
    server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.headers.get("Idempotency-Key").is_some_and(|v| v.as_bytes() == key.as_str().as_bytes()))
        .collect()
}

/// Sends an `unknown` payment back to the outbox the way the reconciler does when the provider
/// holds no charge for its key: `pending`, out of the reconciler's queue, due now.
pub async fn requeue_unknown(pool: &PgPool, accepted: Accepted) {
    let mut tx = pool.begin().await.unwrap();
    let change = Change {
        tenant_id: accepted.tenant_id,
        payment_id: accepted.payment_id,
        from: PaymentStatus::Unknown,
        transition: Transition::ProviderHasNoCharge,
        actor: "reconciler:poller",
        reason: "the provider holds no charge for the payment's key",
        detail: None,
    };
    assert!(matches!(transitions::apply(&mut tx, &change).await.unwrap(), transitions::Recorded::Moved(_)));
    sqlx::query!(
        "DELETE FROM unknown_payments WHERE tenant_id = $1 AND payment_id = $2",
        accepted.tenant_id.as_uuid(),
        accepted.payment_id.as_uuid()
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    oncepay_store::outbox::enqueue(&mut tx, accepted.tenant_id, accepted.payment_id, OffsetDateTime::now_utc())
        .await
        .unwrap();
    tx.commit().await.unwrap();
}
