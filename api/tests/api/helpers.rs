//! Spawning the api on port 0 against a real PostgreSQL database, and talking to it over HTTP.

use std::time::Duration;

use oncepay_api::{Application, Settings};
use oncepay_devkit::wait::wait_until;
use oncepay_domain::api_key;
use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::refund_status::{RefundStatus, RefundTransition};
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_provider::KeyWindow;
use oncepay_store::notify::{Notifier, PAYMENT_CHANNEL, Wakeups};
use oncepay_store::payments::Payment;
use oncepay_store::refunds::settling::{self, RefundChange, RefundSettlement};
use oncepay_store::refunds::{self, Refund};
use oncepay_store::sending::{self, ClaimRequest};
use oncepay_store::tenants::{self, TenantName};
use oncepay_store::transitions::{self, Change, Recorded, Settlement};
use reqwest::header::HeaderMap;
use reqwest::{RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use time::OffsetDateTime;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The settings tests run with: the defaults, on a free port.
pub fn settings() -> Settings {
    let mut settings = Settings::load(None).expect("the embedded defaults load");
    settings.http.listen.host = "127.0.0.1".into();
    settings.http.listen.port = 0;
    settings.http.shutdown_grace_secs = 5;
    settings
}

/// `options` as the api's own database role (migration 0380), as a deployment connects it: the
/// tests' pool stays the superuser's.
pub fn as_api(options: PgConnectOptions) -> PgConnectOptions {
    options.username("oncepay_api")
}

/// A running api, a pool of the test's own on the same database, and a tenant with an API key.
pub struct TestApp {
    pub address: String,
    pub db: PgPool,
    pub client: reqwest::Client,
    pub tenant: Tenant,
    shutdown: CancellationToken,
    server: JoinHandle<anyhow::Result<()>>,
}

/// A tenant and its API key.
#[derive(Clone)]
pub struct Tenant {
    pub id: TenantId,
    pub token: String,
}

impl TestApp {
    /// The api with default settings on the database `options` names.
    pub async fn spawn(options: PgConnectOptions) -> Self {
        Self::spawn_with(options, |_| {}).await
    }

    /// The api with settings adjusted by `configure`.
    pub async fn spawn_with(options: PgConnectOptions, configure: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = settings();
        configure(&mut settings);
        let db = PgPoolOptions::new().max_connections(4).connect_with(options.clone()).await.expect("test pool");
        let application = Application::build_with(settings, as_api(options)).expect("the api builds");
        Self::start(application, db).await
    }

    /// Runs a built api; `db` is the test's own pool on its database.
    pub async fn start(application: Application, db: PgPool) -> Self {
        let tenant = create_tenant(&db, "acme", None).await;
        Self::run(application, db, tenant)
    }

    /// A second api on the same database, with settings adjusted by `configure`, for the same tenant:
    /// as after a configuration change, or beside an api configured otherwise.
    pub async fn spawn_beside(&self, options: PgConnectOptions, configure: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = settings();
        configure(&mut settings);
        let application = Application::build_with(settings, as_api(options)).expect("the api builds");
        Self::run(application, self.db.clone(), self.tenant.clone())
    }

    fn run(application: Application, db: PgPool, tenant: Tenant) -> Self {
        oncepay_service::tls::install_provider();
        let address = format!("http://127.0.0.1:{}", application.port());
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(application.run_until_stopped(shutdown.clone()));
        let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("http client");
        Self { address, db, client, tenant, shutdown, server }
    }

    /// Stops the api gracefully and closes the test's pool (so the test database can be dropped).
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.server.await.expect("the server task").expect("the api stops cleanly");
        self.db.close().await;
    }

    /// `POST /v1/payments` as the default tenant with `key` and `body`.
    pub fn post_payment(&self, key: &str, body: &Value) -> RequestBuilder {
        self.post_payment_as(&self.tenant, key, body)
    }

    /// `POST /v1/payments` as `tenant`.
    pub fn post_payment_as(&self, tenant: &Tenant, key: &str, body: &Value) -> RequestBuilder {
        self.client
            .post(format!("{}/v1/payments", self.address))
            .bearer_auth(&tenant.token)
            .header("Idempotency-Key", key)
            .json(body)
    }

    /// `POST /v1/payments` as the default tenant with `key`, a raw body and an optional content type.
    pub fn post_raw(&self, key: &str, content_type: Option<&str>, body: impl Into<reqwest::Body>) -> RequestBuilder {
        let request = self
            .client
            .post(format!("{}/v1/payments", self.address))
            .bearer_auth(&self.tenant.token)
            .header("Idempotency-Key", key)
            .body(body);
        match content_type {
            Some(content_type) => request.header("Content-Type", content_type),
            None => request,
        }
    }

    /// `GET /v1/payments/{id}` as the default tenant.
    pub fn get_payment(&self, id: &str) -> RequestBuilder {
        self.get_payment_as(&self.tenant, id)
    }

    /// `GET /v1/payments/{id}` as `tenant`.
    pub fn get_payment_as(&self, tenant: &Tenant, id: &str) -> RequestBuilder {
        self.client.get(format!("{}/v1/payments/{id}", self.address)).bearer_auth(&tenant.token)
    }

    /// `POST /v1/payments/{payment_id}/refunds` as the default tenant with `key` and `body`.
    pub fn post_refund(&self, payment_id: &str, key: &str, body: &Value) -> RequestBuilder {
        self.post_refund_as(&self.tenant, payment_id, key, body)
    }

    /// `POST /v1/payments/{payment_id}/refunds` as `tenant`.
    pub fn post_refund_as(&self, tenant: &Tenant, payment_id: &str, key: &str, body: &Value) -> RequestBuilder {
        self.client
            .post(format!("{}/v1/payments/{payment_id}/refunds", self.address))
            .bearer_auth(&tenant.token)
            .header("Idempotency-Key", key)
            .json(body)
    }

    /// `GET /v1/refunds/{id}` as `tenant`.
    pub fn get_refund_as(&self, tenant: &Tenant, id: &str) -> RequestBuilder {
        self.client.get(format!("{}/v1/refunds/{id}", self.address)).bearer_auth(&tenant.token)
    }

    /// `GET /v1/payments/{payment_id}/refunds` as `tenant`.
    pub fn list_refunds_as(&self, tenant: &Tenant, payment_id: &str) -> RequestBuilder {
        self.client.get(format!("{}/v1/payments/{payment_id}/refunds", self.address)).bearer_auth(&tenant.token)
    }

    /// A payment of the default tenant (1999 EUR cents, [`body`]) accepted under `key` and settled as
    /// charged, with a charge id of its own.
    pub async fn succeeded_payment(&self, key: &str) -> PaymentId {
        let payment_id = Self::payment_id(self.post_payment(key, &body()).send().await.unwrap()).await;
        settle_succeeded_as(&self.db, self.tenant.id, payment_id, &format!("ch_test_{payment_id}")).await;
        payment_id
    }

    /// A request to `path` with any method, without credentials.
    pub fn request(&self, method: reqwest::Method, path: &str) -> RequestBuilder {
        self.client.request(method, format!("{}{path}", self.address))
    }

    /// Rows of every table intake writes: payments, keys, outbox, audit events.
    /// Asserts that `payment_id`'s outbox row carries a trace context in the trace `trace_id`, whose
    /// span is the api's own, not the caller's `caller_span`.
    pub async fn assert_outbox_continues(&self, payment_id: PaymentId, trace_id: &str, caller_span: &str) {
        let traceparent = sqlx::query_scalar!(
            "SELECT traceparent FROM outbox WHERE tenant_id = $1 AND payment_id = $2",
            self.tenant.id.as_uuid(),
            payment_id.as_uuid(),
        )
        .fetch_one(&self.db)
        .await
        .unwrap()
        .expect("the outbox row carries a trace context");
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(parts[1], trace_id, "{traceparent}");
        assert_ne!(parts[2], caller_span, "the api's own span is the parent of what follows");
    }

    pub async fn rows(&self) -> Rows {
        rows(&self.db).await
    }

    /// The current Prometheus text.
    pub async fn metrics(&self) -> String {
        self.request(reqwest::Method::GET, "/metrics").send().await.unwrap().text().await.unwrap()
    }

    /// Waits until the api reports `count` long polls waiting (its gauge on `/metrics`): each has
    /// read its payment, so a change made now is one it has yet to see.
    pub async fn until_long_polls_waiting(&self, count: usize) {
        self.until_gauge("oncepay_api_long_polls_waiting", count).await;
    }

    /// Waits until the api reports the gauge `name` at `value` on `/metrics`.
    pub async fn until_gauge(&self, name: &str, value: usize) {
        let line = format!("{name} {value}");
        wait_until(&format!("the api to report {line}"), Duration::from_secs(10), || async {
            self.metrics().await.lines().any(|l| l == line).then_some(())
        })
        .await
        .unwrap();
    }

    /// The payment id in a payment answer's body.
    pub async fn payment_id(response: Response) -> PaymentId {
        let body: Value = response.json().await.unwrap();
        body["id"].as_str().unwrap().parse().unwrap()
    }
}

/// Claims a pending payment with the worker's own claim (lease, fencing token, `processing`, an
/// audit row), from another connection than the api's, and announces the move to long polls as the
/// worker announces what it records.
pub async fn claim(db: &PgPool, tenant_id: TenantId, payment_id: PaymentId) {
    let request = ClaimRequest {
        tenant_id,
        limit: 1,
        worker_id: "test",
        actor: "worker:test",
        lease: Duration::from_secs(60),
        resend_horizon: Duration::from_secs(3_600),
    };
    let claimed = sending::claim(&mut db.acquire().await.unwrap(), &request).await.unwrap();
    let ids: Vec<PaymentId> = claimed.iter().map(|claimed| claimed.payment_id).collect();
    assert_eq!(ids, [payment_id], "the claim takes the tenant's oldest due payment: claim that one first");
    let wakeups = Wakeups::default();
    wakeups.announce(payment_id);
    Notifier::new(db.clone(), PAYMENT_CHANNEL, wakeups).flush().await.unwrap();
}

/// Claims a payment and settles it as charged by the provider (`store::transitions::settle`).
pub async fn settle_succeeded(db: &PgPool, tenant_id: TenantId, payment_id: PaymentId) -> Payment {
    settle_succeeded_as(db, tenant_id, payment_id, "ch_test_1").await
}

/// [`settle_succeeded`] with the provider's charge `charge_id` (one charge is never booked to two
/// payments).
pub async fn settle_succeeded_as(db: &PgPool, tenant_id: TenantId, payment_id: PaymentId, charge_id: &str) -> Payment {
    claim(db, tenant_id, payment_id).await;
    let change = Change {
        tenant_id,
        payment_id,
        from: PaymentStatus::Processing,
        transition: Transition::Charged,
        actor: "worker:test",
        reason: "the provider charged",
        detail: None,
    };
    let settlement = Settlement::Succeeded {
        charge_id: charge_id.into(),
        amount: Amount::new(1999).unwrap(),
        currency: Currency::parse("EUR").unwrap(),
        charged_at: OffsetDateTime::now_utc(),
    };
    let mut tx = db.begin().await.unwrap();
    let Recorded::Moved(payment) = transitions::settle(&mut tx, &change, &settlement).await.unwrap() else {
        panic!("the payment was not processing");
    };
    tx.commit().await.unwrap();
    payment
}

/// Claims the tenant's due refunds with the worker's own claim (lease, fencing token, `processing`,
/// an audit row), from another connection than the api's; asserts that `refund_id` is among them.
pub async fn claim_refund(db: &PgPool, tenant_id: TenantId, refund_id: RefundId) {
    let window = KeyWindow { window: Duration::from_secs(86_400), safety_margin: Duration::from_secs(3_600) };
    let mut conn = db.acquire().await.unwrap();
    let claimed =
        refunds::sending::claim(&mut conn, tenant_id, 100, "test", Duration::from_secs(60), window).await.unwrap();
    assert!(claimed.iter().any(|claimed| claimed.refund_id == refund_id), "the refund was not due");
}

/// Settles a `processing` refund as the worker would on the provider's response: refunded, or
/// failed (`store::refunds::settling::settle`, which wakes its long polls).
pub async fn settle_refund(db: &PgPool, tenant_id: TenantId, refund_id: RefundId, refunded: bool) -> Refund {
    let (transition, settlement) = if refunded {
        let provider_refund_id = format!("re_test_{refund_id}");
        (
            RefundTransition::Refunded,
            RefundSettlement::Succeeded { provider_refund_id, refunded_at: OffsetDateTime::now_utc() },
        )
    } else {
        let failed = RefundSettlement::Failed {
            code: "refund_failed".into(),
            message: "The provider failed the refund.".into(),
            provider_refund_id: None,
        };
        (RefundTransition::Refused, failed)
    };
    let change = RefundChange {
        tenant_id,
        refund_id,
        from: RefundStatus::Processing,
        transition,
        actor: "worker:test",
        reason: "the provider responded",
        detail: None,
    };
    let mut tx = db.begin().await.unwrap();
    let Recorded::Moved(refund) = settling::settle(&mut tx, &change, &settlement).await.unwrap() else {
        panic!("the refund was not processing");
    };
    tx.commit().await.unwrap();
    refund
}

/// How many rows refund intake wrote: refunds, keys, outbox, audit events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefundRows {
    pub refunds: i64,
    pub keys: i64,
    pub outbox: i64,
    pub events: i64,
}

pub async fn refund_rows(db: &PgPool) -> RefundRows {
    let counts = sqlx::query!(
        r#"SELECT (SELECT count(*) FROM refunds) AS "refunds!",
                  (SELECT count(*) FROM refund_keys) AS "keys!",
                  (SELECT count(*) FROM refund_outbox) AS "outbox!",
                  (SELECT count(*) FROM refund_events) AS "events!""#
    )
    .fetch_one(db)
    .await
    .unwrap();
    RefundRows { refunds: counts.refunds, keys: counts.keys, outbox: counts.outbox, events: counts.events }
}

/// What a payment has promised back (`refunds_reserved`) and given back (`refunded`).
pub async fn refunded(db: &PgPool, payment_id: PaymentId) -> (i64, i64) {
    let row =
        sqlx::query!("SELECT refunds_reserved, refunded FROM payments WHERE payment_id = $1", payment_id.as_uuid())
            .fetch_one(db)
            .await
            .unwrap();
    (row.refunds_reserved, row.refunded)
}

/// A new tenant with an API key.
pub async fn create_tenant(db: &PgPool, name: &str, rate_limit_per_second: Option<i32>) -> Tenant {
    let mut conn = db.acquire().await.unwrap();
    let tenant = tenants::create(
        &mut conn,
        TenantId::generate(),
        &TenantName::parse(name).unwrap(),
        rate_limit_per_second,
        None,
    )
    .await
    .unwrap();
    let key = tenants::issue_api_key(&mut conn, tenant.tenant_id, Some("tests")).await.unwrap();
    Tenant { id: tenant.tenant_id, token: api_key::reveal(&key).to_owned() }
}

/// How many rows intake wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    pub payments: i64,
    pub keys: i64,
    pub outbox: i64,
    pub events: i64,
}

pub async fn rows(db: &PgPool) -> Rows {
    let counts = sqlx::query!(
        r#"SELECT (SELECT count(*) FROM payments) AS "payments!",
                  (SELECT count(*) FROM idempotency_keys) AS "keys!",
                  (SELECT count(*) FROM outbox) AS "outbox!",
                  (SELECT count(*) FROM payment_events) AS "events!""#
    )
    .fetch_one(db)
    .await
    .unwrap();
    Rows { payments: counts.payments, keys: counts.keys, outbox: counts.outbox, events: counts.events }
}

/// A valid payment request body.
pub fn body() -> Value {
    json!({"amount": 1999, "currency": "EUR", "customer_id": "cus_42", "description": "Order #42", "metadata": {"order": "42"}})
}

/// Asserts that `response` is a problem document of `status` and `slug`; returns the document.
pub async fn assert_problem(response: Response, status: StatusCode, slug: &str) -> (HeaderMap, Value) {
    assert_eq!(response.status(), status);
    let headers = response.headers().clone();
    assert_eq!(headers.get("content-type").unwrap(), "application/problem+json");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], format!("https://oncepay.dev/problems/{slug}"), "{problem}");
    assert_eq!(problem["status"], status.as_u16());
    assert!(problem["title"].is_string() && problem["detail"].is_string(), "{problem}");
    (headers, problem)
}

/// A header as text.
pub fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|value| value.to_str().unwrap())
}
