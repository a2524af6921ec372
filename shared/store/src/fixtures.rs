//! Test arrangements for every crate that talks to the database: tenants, payments and refund
//! requests made exactly as the api makes them, provider settings for a test server, and row counts.
//!
//! Only dev-dependencies turn on the `fixtures` feature, so no binary carries this. It arranges and
//! reads; it never moves a payment, which each suite does as the process it stands in for would.

// Every function here panics on failure: in a test, an arrangement that fails is a failed test.
#![allow(clippy::expect_used)]

use std::time::Duration;

use serde_json::{Value, json};
use sqlx::PgPool;

use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::idempotency_key::IdempotencyKey;
use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::payment_request::PaymentRequest;
use oncepay_domain::refund::RefundRequest;
use oncepay_provider::http::HttpProvider;
use oncepay_provider::{ProviderKind, ProviderSettings};
use oncepay_service::telemetry::TraceContext;

use crate::intake::{self, Created, NewPayment};
use crate::refunds::intake::NewRefund;
use crate::settlement::Asked;
use crate::tenants::{self, TenantName};

/// How long the api keeps a key by default: a day.
const RETENTION: Duration = Duration::from_secs(86_400);

/// Creates a tenant named `name`.
pub async fn tenant(pool: &PgPool, name: &str) -> TenantId {
    let name = TenantName::parse(name).expect("a valid tenant name");
    let mut conn = pool.acquire().await.expect("a connection");
    tenants::create(&mut conn, TenantId::generate(), &name, None, None).await.expect("the tenant is created").tenant_id
}

/// What a new payment of `amount` EUR cents, charged on oncepay's own account, asked for.
pub fn asked(amount: i64) -> Asked {
    Asked {
        payment_id: PaymentId::generate(),
        account: None,
        amount: Amount::new(amount).expect("a valid amount"),
        currency: Currency::parse("EUR").expect("a valid currency"),
    }
}

/// A `POST /v1/payments` body for `amount` EUR cents.
pub fn body(amount: i64) -> Value {
    json!({"amount": amount, "currency": "EUR", "customer_id": "cus_1", "metadata": {"order": "42"}})
}

/// What the api makes of a request before it accepts it: the key, the validated body and its
/// fingerprint.
#[derive(Debug)]
pub struct Submission {
    key: IdempotencyKey,
    request: PaymentRequest,
    fingerprint: Fingerprint,
}

impl Submission {
    /// `body` posted under `key`.
    pub fn new(key: &str, body: &Value) -> Self {
        Self {
            key: IdempotencyKey::parse(key.as_bytes()).expect("a valid idempotency key"),
            request: PaymentRequest::from_json(body).expect("a valid payment request"),
            fingerprint: Fingerprint::of("POST", "/v1/payments", body),
        }
    }

    /// The submission as the store accepts it for `tenant_id`, keeping the key a day.
    pub fn for_tenant(&self, tenant_id: TenantId, trace: Option<&TraceContext>) -> NewPayment {
        NewPayment {
            tenant_id,
            key: self.key.clone(),
            fingerprint: self.fingerprint,
            request: self.request.clone(),
            provider_account: None,
            retention: RETENTION,
            lock_wait: None,
            trace: trace.cloned(),
        }
    }
}

/// What the api makes of a refund request before it accepts it: the key, the validated body and its
/// fingerprint (over the payment's refunds path, as the api's).
#[derive(Debug)]
pub struct RefundSubmission {
    key: IdempotencyKey,
    request: RefundRequest,
    fingerprint: Fingerprint,
}

impl RefundSubmission {
    /// `body` posted to `payment_id`'s refunds under `key`.
    pub fn new(key: &str, payment_id: PaymentId, body: &Value) -> Self {
        Self {
            key: IdempotencyKey::parse(key.as_bytes()).expect("a valid idempotency key"),
            request: RefundRequest::from_json(body).expect("a valid refund request"),
            fingerprint: Fingerprint::of("POST", &format!("/v1/payments/{payment_id}/refunds"), body),
        }
    }

    /// The request as the store accepts it from the api for `tenant_id`'s `payment_id`, with a new
    /// refund id, keeping the key a day.
    pub fn for_payment(
        &self,
        tenant_id: TenantId,
        payment_id: PaymentId,
        trace: Option<TraceContext>,
    ) -> NewRefund<'_> {
        NewRefund {
            tenant_id,
            payment_id,
            refund_id: RefundId::generate(),
            key: &self.key,
            fingerprint: self.fingerprint,
            request: &self.request,
            requested_by: "api",
            retention: RETENTION,
            trace,
        }
    }
}

/// Accepts `body` under `key` as `POST /v1/payments` would, in `trace` if given: `None` if the key
/// exists already.
pub async fn accept(
    pool: &PgPool,
    tenant_id: TenantId,
    key: &str,
    body: &Value,
    trace: Option<&TraceContext>,
) -> Option<Created> {
    let submission = Submission::new(key, body);
    let mut conn = pool.acquire().await.expect("a connection");
    intake::accept(&mut conn, &submission.for_tenant(tenant_id, trace)).await.expect("the store accepts it").created()
}

/// Settings for a provider at `base_url` (a wiremock server): a day's key window with an hour's
/// margin, short timeouts.
pub fn provider_settings(base_url: &str) -> ProviderSettings {
    ProviderSettings {
        base_url: base_url.to_owned(),
        api_key: "sk_test".to_owned().into(),
        connect_timeout_ms: 500,
        request_timeout_ms: 2_000,
        key_window_secs: 86_400,
        key_window_margin_secs: 3_600,
        kind: ProviderKind::Simulator,
        stripe: None,
    }
}

/// The provider client for [`provider_settings`].
pub fn provider(base_url: &str) -> HttpProvider {
    HttpProvider::new(&provider_settings(base_url)).expect("a provider client")
}

/// Rows in `table`, which is one of ours and never input.
pub async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .expect("the table exists")
}
