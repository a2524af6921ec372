//! What the reconciler's tests share on top of `oncepay_store::fixtures`: payments and refunds
//! accepted as the api accepts them, moved with the shared transition functions, and tables read
//! back.

use std::net::TcpListener;
use std::time::Duration;

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::refund_status::{RefundStatus, RefundTransition};
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_ops::operators::accounts;
use oncepay_ops::operators::api::OperatorsState;
use oncepay_ops::operators::oidc::OidcSettings;
use oncepay_provider::KeyWindow;
use oncepay_reconciler::poller::PollerConfig;
use oncepay_reconciler::reaper::{Reaper, ReaperConfig};
use oncepay_reconciler::settings::Settings;
use oncepay_reconciler::startup::operators_state;
use oncepay_reconciler::unknown::{self, payments};
use oncepay_service::backoff::Backoff;
use oncepay_service::telemetry::TraceContext;
use oncepay_store::fixtures;
use oncepay_store::refunds::sending::{self, ClaimedRefund, Release};
use oncepay_store::refunds::settling::{self, RefundChange, RefundSettlement};
use oncepay_store::transitions::{self, Change, Recorded};
use oncepay_store::unknown_queue;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

/// Accepts a payment of `amount` EUR cents under `key`, as the api would: `pending`, with its key and
/// outbox row.
pub async fn accept(pool: &PgPool, tenant_id: TenantId, key: &str, amount: i64) -> PaymentId {
    fixtures::accept(pool, tenant_id, key, &fixtures::body(amount), None).await.unwrap().payment.payment_id
}

/// Claims a pending payment for sending as a worker would (first sent `sent_secs_ago` seconds ago),
/// removing its outbox row as a worker does once the send has an outcome.
pub async fn claim(pool: &PgPool, tenant_id: TenantId, payment_id: PaymentId, sent_secs_ago: i64) {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query!(
        "UPDATE payments SET send_attempts = send_attempts + 1,
                first_sent_at = COALESCE(first_sent_at, now() - make_interval(secs => $3))
         WHERE tenant_id = $1 AND payment_id = $2",
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
        sent_secs_ago as f64
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    moved(transitions::apply(&mut tx, &change(tenant_id, payment_id, PaymentStatus::Pending, Transition::Claim)).await);
    sqlx::query!(
        "DELETE FROM outbox WHERE tenant_id = $1 AND payment_id = $2",
        tenant_id.as_uuid(),
        payment_id.as_uuid()
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

/// A payment the worker sent `sent_secs_ago` seconds ago and whose outcome it could not learn:
/// `unknown`, queued for the reconciler.
pub async fn unknown_payment(
    pool: &PgPool,
    tenant_id: TenantId,
    key: &str,
    amount: i64,
    sent_secs_ago: i64,
) -> PaymentId {
    let payment_id = accept(pool, tenant_id, key, amount).await;
    claim(pool, tenant_id, payment_id, sent_secs_ago).await;
    uncertain(pool, tenant_id, payment_id).await;
    payment_id
}

/// Moves a `processing` payment to `unknown` as the worker does when its send ends uncertain.
pub async fn uncertain(pool: &PgPool, tenant_id: TenantId, payment_id: PaymentId) {
    let mut tx = pool.begin().await.unwrap();
    moved(
        transitions::apply(&mut tx, &change(tenant_id, payment_id, PaymentStatus::Processing, Transition::Uncertain))
            .await,
    );
    let evidence = json!({"source": "worker", "reason": "timeout"});
    unknown_queue::enqueue(&mut tx, tenant_id, payment_id, "timeout", evidence, None, None).await.unwrap();
    tx.commit().await.unwrap();
}

/// A change by the test harness.
pub fn change(
    tenant_id: TenantId,
    payment_id: PaymentId,
    from: PaymentStatus,
    transition: Transition,
) -> Change<'static> {
    Change { tenant_id, payment_id, from, transition, actor: "test", reason: "test setup", detail: None }
}

fn moved<T: std::fmt::Debug, E: std::fmt::Debug>(result: Result<Recorded<T>, E>) {
    assert!(matches!(result, Ok(Recorded::Moved(_))), "{result:?}");
}

/// The payment's status.
pub async fn status(pool: &PgPool, tenant_id: TenantId, payment_id: PaymentId) -> PaymentStatus {
    sqlx::query_scalar!(
        r#"SELECT status AS "status: PaymentStatus" FROM payments WHERE tenant_id = $1 AND payment_id = $2"#,
        tenant_id.as_uuid(),
        payment_id.as_uuid()
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Rows in `table` for one payment.
pub async fn count_for(pool: &PgPool, table: &str, payment_id: PaymentId) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table} WHERE payment_id = $1")))
        .bind(payment_id.as_uuid())
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The payment's ledger entry: (provider charge id, amount).
pub async fn ledger_entry(pool: &PgPool, payment_id: PaymentId) -> (String, i64) {
    sqlx::query!("SELECT provider_charge_id, amount FROM ledger_entries WHERE payment_id = $1", payment_id.as_uuid())
        .map(|row| (row.provider_charge_id, row.amount))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The payment's entry in the reconciler's queue: (lookups so far, evidence).
pub async fn queue_entry(pool: &PgPool, payment_id: PaymentId) -> (i32, serde_json::Value) {
    sqlx::query!("SELECT poll_attempts, evidence FROM unknown_payments WHERE payment_id = $1", payment_id.as_uuid())
        .map(|row| (row.poll_attempts, row.evidence))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A `postgres://` URL for the database behind a `#[sqlx::test]` pool, for a child process.
pub fn url_of(pool: &PgPool) -> String {
    url_as(pool, pool.connect_options().get_username())
}

/// A URL for `pool`'s database as the reconciler's own role (migration 0380), as a deployment
/// connects it.
pub fn reconciler_url_of(pool: &PgPool) -> String {
    url_as(pool, "oncepay_reconciler")
}

fn url_as(pool: &PgPool, user: &str) -> String {
    let options: &PgConnectOptions = &pool.connect_options();
    let host = options.get_host();
    let port = options.get_port();
    let database = options.get_database().unwrap_or("postgres");
    format!("postgres://{user}@{host}:{port}/{database}")
}

/// A charge as the provider reports it, for the payment it names in its metadata and key.
pub fn charge(
    tenant_id: TenantId,
    payment_id: PaymentId,
    id: &str,
    status: oncepay_provider::ChargeStatus,
    amount: i64,
) -> oncepay_provider::Charge {
    use oncepay_provider::fixtures;
    oncepay_provider::Charge {
        created: time::OffsetDateTime::now_utc().unix_timestamp(),
        metadata: fixtures::metadata(tenant_id, payment_id),
        ..fixtures::charge(payment_id, id, status, amount)
    }
}

/// Waits until the payment reaches `expected`, woken by the notification the store sends on every
/// status change (`listener` must already listen on `oncepay_payment`).
pub async fn reaches(
    listener: &mut sqlx::postgres::PgListener,
    pool: &PgPool,
    tenant_id: TenantId,
    payment_id: PaymentId,
    expected: PaymentStatus,
    timeout: Duration,
) -> bool {
    let wait = async {
        while status(pool, tenant_id, payment_id).await != expected {
            while listener.recv().await.unwrap().payload() != payment_id.to_string() {}
        }
    };
    tokio::time::timeout(timeout, wait).await.is_ok()
}

/// A payment the poller gave up on, first sent `sent_secs_ago`: dead-lettered with an open entry.
pub async fn dead_lettered(pool: &PgPool, tenant_id: TenantId, key: &str, sent_secs_ago: i64) -> PaymentId {
    let payment_id = unknown_payment(pool, tenant_id, key, 1999, sent_secs_ago).await;
    let mut tx = pool.begin().await.unwrap();
    let why = unknown::Why {
        actor: "reconciler:poller",
        reason: "no conclusive response from the provider after 30 lookups",
    };
    let result = json!({"attempt": 30, "result": "lookup failed: the provider responded with HTTP 503"});
    let evidence = unknown::evidence("poll", result);
    payments::exhaust(&mut tx, tenant_id, payment_id, why, evidence).await.unwrap();
    tx.commit().await.unwrap();
    payment_id
}

/// A day, in seconds.
const DAY: u64 = 86_400;

/// The operations API in the test's process, on a free port, with a first admin.
pub struct Ops {
    /// Its base URL.
    pub url: String,
    http: reqwest::Client,
    /// The first admin's token.
    pub admin: String,
    /// The first admin's local password.
    pub admin_password: String,
    /// What its handlers share, for a test that works bulk retries as the service would.
    pub state: OperatorsState,
}

impl Ops {
    pub async fn start(pool: &PgPool) -> Self {
        Self::start_on(pool, 0, |_| None).await
    }

    /// The same on `port` (0: any), signing in at the OpenID provider `oidc` makes from the API's URL.
    pub async fn start_on(pool: &PgPool, port: u16, oidc: impl FnOnce(&str) -> Option<OidcSettings>) -> Self {
        oncepay_service::tls::install_provider();
        let mut settings = Settings::load(None).unwrap();
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        settings.operators.oidc = oidc(&url);
        if settings.operators.oidc.is_some() {
            // The first admin is the break-glass account.
            settings.operators.break_glass = Some("root".into());
        }
        let state = operators_state(&settings, pool.clone()).unwrap();
        tokio::spawn(oncepay_reconciler::http::operator_api(listener, state.clone(), 1).unwrap());
        let mut conn = pool.acquire().await.unwrap();
        let first = accounts::bootstrap(&mut conn, "root", Duration::from_secs(DAY)).await.unwrap();
        let (admin, admin_password) = (first.token, first.password.unwrap());
        Self { url, http: reqwest::Client::new(), admin, admin_password, state }
    }

    pub async fn call(&self, token: &str, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.url)).bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub async fn get(&self, token: &str, path: &str) -> (StatusCode, Value) {
        self.call(token, Method::GET, path, None).await
    }

    pub async fn post(&self, token: &str, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(token, Method::POST, path, Some(body)).await
    }

    /// Creates operator `name` with `role` for every tenant and issues them a token, both as the first
    /// admin: the admin holds that token too.
    pub async fn operator_given_by_admin(&self, name: &str, role: &str) -> String {
        let body = json!({ "name": name, "role": role, "reason": "joined the team" });
        let (created, problem) = self.post(&self.admin, "/v1/operators", body).await;
        assert_eq!(created, StatusCode::CREATED, "{problem}");
        let body = json!({ "label": "laptop", "reason": "first token" });
        let (issued, token) = self.post(&self.admin, &format!("/v1/operators/{name}/tokens"), body).await;
        assert_eq!(issued, StatusCode::CREATED, "{token}");
        token["token"].as_str().unwrap().to_owned()
    }

    /// Creates operator `name` with `role` (limited to `tenants`, if given), who sets their own
    /// password with the enrollment code; returns it.
    pub async fn person(&self, name: &str, role: &str, tenants: Option<&[&str]>) -> String {
        let body = json!({ "name": name, "role": role, "tenants": tenants, "reason": "joined the team" });
        let (created, answer) = self.post(&self.admin, "/v1/operators", body).await;
        assert_eq!(created, StatusCode::CREATED, "{answer}");
        let code = answer["enrollment"]["code"].as_str().unwrap();
        let password = format!("{name}'s own long password");
        let body = json!({ "name": name, "code": code, "password": password });
        let response = self.http.post(format!("{}/v1/enrollment", self.url)).json(&body).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::NO_CONTENT, "{}", response.text().await.unwrap());
        password
    }

    /// Signs `name` in with `password`, as a page of the API's origin would: the status, and the
    /// session cookie's value if one was set.
    pub async fn sign_in(&self, name: &str, password: &str) -> (StatusCode, Option<String>) {
        let response = self
            .http
            .post(format!("{}/v1/session", self.url))
            .header("sec-fetch-site", "same-origin")
            .json(&json!({ "name": name, "password": password }))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let cookie = response
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().unwrap().strip_prefix("oncepay_session="))
            .map(|v| v.split(';').next().unwrap().to_owned())
            .find(|v| !v.is_empty());
        (status, cookie)
    }

    /// A request with session `cookie`, from a page of the API's origin.
    pub async fn as_session(
        &self,
        cookie: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.url))
            .header("cookie", format!("oncepay_session={cookie}"))
            .header("sec-fetch-site", "same-origin");
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Creates operator `name` with `role` (limited to `tenants`, if given) and returns a token they
    /// made themselves: they enroll with their code, sign in, and issue it with their session.
    pub async fn operator(&self, name: &str, role: &str, tenants: Option<&[&str]>) -> String {
        let password = self.person(name, role, tenants).await;
        let (signed_in, cookie) = self.sign_in(name, &password).await;
        assert_eq!(signed_in, StatusCode::CREATED);
        let cookie = cookie.unwrap();
        let body = json!({ "label": "laptop", "reason": "first token" });
        let path = format!("/v1/operators/{name}/tokens");
        let (issued, token) = self.as_session(&cookie, Method::POST, &path, Some(body)).await;
        assert_eq!(issued, StatusCode::CREATED, "{token}");
        self.as_session(&cookie, Method::DELETE, "/v1/session", None).await;
        token["token"].as_str().unwrap().to_owned()
    }
}

/// A payment of `amount` EUR cents accepted under `key` and charged as `ch_<key>`: `succeeded`,
/// with its ledger entry, so that it can be refunded.
pub async fn succeeded_payment(pool: &PgPool, tenant_id: TenantId, key: &str, amount: i64) -> PaymentId {
    use oncepay_domain::money::{Amount, Currency};
    use oncepay_store::transitions::Settlement;

    let payment_id = accept(pool, tenant_id, key, amount).await;
    claim(pool, tenant_id, payment_id, 1).await;
    let settlement = Settlement::Succeeded {
        charge_id: format!("ch_{key}"),
        amount: Amount::new(amount).unwrap(),
        currency: Currency::parse("EUR").unwrap(),
        charged_at: time::OffsetDateTime::now_utc(),
    };
    let change = change(tenant_id, payment_id, PaymentStatus::Processing, Transition::Charged);
    moved(transitions::settle(&mut pool.acquire().await.unwrap(), &change, &settlement).await);
    payment_id
}

/// Accepts a refund of `amount` of `payment_id` under `key`, as `POST /v1/payments/{id}/refunds`
/// would: `pending`, with its key and refund outbox row, the amount reserved on the payment.
pub async fn refund(pool: &PgPool, tenant_id: TenantId, payment_id: PaymentId, key: &str, amount: i64) -> RefundId {
    refund_in_trace(pool, tenant_id, payment_id, key, amount, None).await
}

/// [`refund`], asked by a request in `trace`.
pub async fn refund_in_trace(
    pool: &PgPool,
    tenant_id: TenantId,
    payment_id: PaymentId,
    key: &str,
    amount: i64,
    trace: Option<TraceContext>,
) -> RefundId {
    use oncepay_store::fixtures::RefundSubmission;
    use oncepay_store::refunds::intake::{self, RefundIntake};

    let body = json!({ "amount": amount, "reason": "requested_by_customer" });
    let submission = RefundSubmission::new(key, payment_id, &body);
    let new = submission.for_payment(tenant_id, payment_id, trace);
    match intake::accept(&mut pool.acquire().await.unwrap(), &new).await.unwrap() {
        RefundIntake::Created { refund, .. } => refund.refund_id,
        other => panic!("the refund was not accepted: {other:?}"),
    }
}

/// The key window the refund tests send under: a day, with an hour's margin.
pub const REFUND_KEY_WINDOW: KeyWindow =
    KeyWindow { window: Duration::from_secs(86_400), safety_margin: Duration::from_secs(3_600) };

/// Claims the tenant's due refunds as `worker-1` would (a minute's lease), then makes their first
/// send `sent_secs_ago` seconds old.
pub async fn claim_refunds(pool: &PgPool, tenant_id: TenantId, sent_secs_ago: i64) -> Vec<ClaimedRefund> {
    let mut conn = pool.acquire().await.unwrap();
    let claimed =
        sending::claim(&mut conn, tenant_id, 10, "worker-1", Duration::from_secs(60), REFUND_KEY_WINDOW).await.unwrap();
    for refund in &claimed {
        sqlx::query!(
            "UPDATE refunds SET first_sent_at = now() - make_interval(secs => $2) WHERE refund_id = $1",
            refund.refund_id.as_uuid(),
            sent_secs_ago as f64
        )
        .execute(&mut *conn)
        .await
        .unwrap();
    }
    claimed
}

/// A refund of `amount` of a succeeded payment that a worker sent `sent_secs_ago` seconds ago and
/// whose outcome it could not learn: `unknown`, due for a lookup, its outbox row gone.
pub async fn unknown_refund(
    pool: &PgPool,
    tenant_id: TenantId,
    payment_id: PaymentId,
    key: &str,
    amount: i64,
    sent_secs_ago: i64,
) -> RefundId {
    let refund_id = refund(pool, tenant_id, payment_id, key, amount).await;
    lose_answer(pool, tenant_id, refund_id, sent_secs_ago).await;
    refund_id
}

/// Claims the `pending` refund `refund_id` as a worker would, makes its send `sent_secs_ago` seconds
/// old and records that its outcome was lost: `unknown`, due for a lookup, its outbox row gone.
pub async fn lose_answer(pool: &PgPool, tenant_id: TenantId, refund_id: RefundId, sent_secs_ago: i64) {
    let claimed = claim_refunds(pool, tenant_id, sent_secs_ago).await;
    let claimed = claimed.iter().find(|c| c.refund_id == refund_id).unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(sending::release(&mut tx, claimed, Release::Done).await.unwrap());
    let change = RefundChange {
        tenant_id,
        refund_id,
        from: RefundStatus::Processing,
        transition: RefundTransition::Uncertain,
        actor: "worker:worker-1",
        reason: "the provider's response was lost",
        detail: None,
    };
    moved(settling::apply(&mut tx, &change, None, time::OffsetDateTime::now_utc()).await);
    tx.commit().await.unwrap();
}

/// Settles an `unknown` refund as succeeded with the provider's refund `provider_refund_id`, made at
/// `refunded_at`, as the reconciler does: its ledger entry is written.
pub async fn settle_succeeded(
    pool: &PgPool,
    tenant_id: TenantId,
    refund_id: RefundId,
    provider_refund_id: &str,
    refunded_at: time::OffsetDateTime,
) {
    let change = RefundChange {
        tenant_id,
        refund_id,
        from: RefundStatus::Unknown,
        transition: RefundTransition::Refunded,
        actor: "test",
        reason: "test setup",
        detail: None,
    };
    let settlement = RefundSettlement::Succeeded { provider_refund_id: provider_refund_id.to_owned(), refunded_at };
    let settled = settling::settle(&mut pool.acquire().await.unwrap(), &change, &settlement).await;
    assert!(matches!(settled, Ok(Recorded::Moved(_))), "{settled:?}");
}

/// The refund's status.
pub async fn refund_status(pool: &PgPool, refund_id: RefundId) -> RefundStatus {
    sqlx::query_scalar!(
        r#"SELECT status AS "status: RefundStatus" FROM refunds WHERE refund_id = $1"#,
        refund_id.as_uuid()
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Rows in `table` for one refund.
pub async fn count_for_refund(pool: &PgPool, table: &str, refund_id: RefundId) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table} WHERE refund_id = $1")))
        .bind(refund_id.as_uuid())
        .fetch_one(pool)
        .await
        .unwrap()
}

/// What the payment has promised back and what it gave back: (refunds_reserved, refunded).
pub async fn refunded(pool: &PgPool, payment_id: PaymentId) -> (i64, i64) {
    sqlx::query!("SELECT refunds_reserved, refunded FROM payments WHERE payment_id = $1", payment_id.as_uuid())
        .map(|row| (row.refunds_reserved, row.refunded))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The poller's limits in these tests: no wait between lookups, so each pass finds a payment or
/// refund due again; a day's key window with an hour's margin; three days before dead-lettering.
pub fn poller_config(max_attempts: u32) -> PollerConfig {
    PollerConfig {
        interval: Duration::from_millis(10),
        batch_size: 10,
        concurrency: 4,
        lease: Duration::from_secs(60),
        backoff: Backoff { base: Duration::ZERO, max: Duration::ZERO },
        max_attempts,
        max_age: Duration::from_secs(3 * DAY),
        key_window: KeyWindow { window: Duration::from_secs(DAY), safety_margin: Duration::from_secs(3600) },
    }
}

/// A reaper over `pool` that deletes up to `batch_size` rows of each kind a pass.
pub fn reaper(pool: &PgPool, batch_size: u32) -> Reaper {
    let config = ReaperConfig {
        interval: Duration::from_secs(60),
        batch_size,
        webhook_retention: Duration::from_secs(7 * DAY),
        event_retention: Duration::from_secs(30 * DAY),
    };
    Reaper::new(pool.clone(), config)
}

/// The problem's `type` slug and detail.
pub fn problem(body: &Value) -> (&str, &str) {
    let slug = body["type"].as_str().unwrap().trim_start_matches("https://oncepay.dev/problems/");
    (slug, body["detail"].as_str().unwrap())
}

/// The operator audit rows of a payment, oldest first: (operator, action, outcome).
pub async fn audit_of(pool: &PgPool, payment_id: PaymentId) -> Vec<(String, String, String)> {
    sqlx::query!(
        "SELECT operator_name, action, outcome FROM operator_audit WHERE payment_id = $1 ORDER BY audit_id",
        payment_id.as_uuid()
    )
    .map(|r| (r.operator_name, r.action, r.outcome))
    .fetch_all(pool)
    .await
    .unwrap()
}

/// `expected` as [`audit_of`] reads it.
pub fn rows(expected: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    expected.iter().map(|(a, b, c)| ((*a).to_owned(), (*b).to_owned(), (*c).to_owned())).collect()
}

/// An audit row as [`audit_of_actions`] reads it: (operator, action, outcome, reason).
pub type ReasonedRow = (String, String, String, Option<String>);

/// The operator audit rows whose action is like one of `patterns` (SQL `LIKE`), oldest first.
pub async fn audit_of_actions(pool: &PgPool, patterns: &[&str]) -> Vec<ReasonedRow> {
    let patterns: Vec<String> = patterns.iter().map(|p| (*p).to_owned()).collect();
    sqlx::query_as(
        "SELECT operator_name, action, outcome, reason FROM operator_audit
         WHERE action LIKE ANY($1) ORDER BY audit_id",
    )
    .bind(patterns)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// One row as [`audit_of_actions`] reads it.
pub fn reasoned(who: &str, action: &str, outcome: &str, reason: Option<&str>) -> ReasonedRow {
    (who.to_owned(), action.to_owned(), outcome.to_owned(), reason.map(str::to_owned))
}
