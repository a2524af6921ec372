//! `POST /webhooks/provider`: signed provider events, applied at most once and monotonically.
//!
//! A delivery that is recorded gets a 2xx, so the provider stops retrying; one that cannot be
//! recorded because the database is unavailable gets a 503, so the provider retries later. Bodies and
//! secrets are never logged. What a charge event means for its payment is decided by
//! [`crate::verdict::judge`], not here; refund events are applied by [`crate::refund_webhooks`].

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use futures::StreamExt;
use oncepay_domain::ids::{DownstreamKey, PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_domain::strict_json;
use oncepay_http::problem::{Problem, ProblemType};
use oncepay_provider::ChargeStatus;
use oncepay_provider::stripe::signature::StripeWebhookSecret;
use oncepay_provider::wire::{EventType, RefundEvent, WebhookEvent};
use oncepay_service::telemetry;
use oncepay_store::StoreError;
use oncepay_store::settlement::Asked;
use oncepay_store::transitions::Recorded;
use oncepay_webhook_signature::{self as webhook_signature, SignedHeaders, WebhookSecret};
use serde_json::{Value, json};
use sqlx::types::Json;
use sqlx::{Acquire, PgConnection, PgPool};
use time::OffsetDateTime;
use tracing::{Instrument, Span};

use crate::webhook_outcome::respond_to;
pub use crate::webhook_outcome::{ApplyError, Handled};

use crate::unknown::payments as unknown;
use crate::unknown::{Why, evidence};
use crate::verdict::{self, Booked, ChargeVerdict, Stored};
use oncepay_ops::dead_letters::{self, Kind};

/// The path the provider delivers to.
pub const PATH: &str = "/webhooks/provider";

const ACTOR: &str = "webhook";

/// What the endpoint needs.
#[derive(Clone)]
pub struct WebhookState {
    /// The database.
    pub pool: PgPool,
    /// Every secret a delivery may be signed with.
    pub secrets: Vec<WebhookSecret>,
    /// Every secret a Stripe delivery may be signed with ([`crate::stripe_webhooks`]).
    pub stripe_secrets: Vec<StripeWebhookSecret>,
    /// Largest distance of `webhook-timestamp` from now, either way, in seconds.
    pub tolerance_secs: i64,
    /// Largest accepted body.
    pub max_body_bytes: usize,
}

/// Mounts the endpoint; the app must hold `web::Data<WebhookState>`.
pub fn configure(config: &mut web::ServiceConfig) {
    config.service(web::resource(PATH).route(web::post().to(receive)).default_service(web::to(method_not_allowed)));
}

pub(crate) async fn method_not_allowed() -> HttpResponse {
    let mut response = Problem::new(ProblemType::MethodNotAllowed, "webhooks are delivered with POST").to_response();
    response.headers_mut().insert(header::ALLOW, header::HeaderValue::from_static("POST"));
    response
}

#[tracing::instrument(name = "webhook.receive", skip_all, fields(webhook.id, webhook.verdict))]
async fn receive(request: HttpRequest, payload: web::Payload, state: web::Data<WebhookState>) -> HttpResponse {
    // The field and the metric label keep the name `verdict` they were published with: dashboards read
    // them. The value says how the delivery went, from a bad signature to the event recorded.
    let (label, response) = respond(&request, payload, &state).await;
    tracing::Span::current().record("webhook.verdict", label);
    metrics::counter!(crate::metrics::WEBHOOKS, "verdict" => label).increment(1);
    response
}

async fn respond(request: &HttpRequest, payload: web::Payload, state: &WebhookState) -> (&'static str, HttpResponse) {
    let body = match read_body(payload, state.max_body_bytes).await {
        Ok(body) => body,
        Err(problem) => return ("invalid_body", problem.to_response()),
    };
    let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
    let headers = SignedHeaders {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
    };
    // Checked as bytes, before anything is parsed: the Standard Webhooks signature over the raw body,
    // against every configured secret (so secrets can be rotated), with the timestamp within the
    // tolerance either way. A delivery that fails is a 401 and touches nothing.
    let now = OffsetDateTime::now_utc().unix_timestamp();
    if let Err(error) = webhook_signature::verify(&state.secrets, headers, &body, now, state.tolerance_secs) {
        tracing::warn!(error = %error, "rejected a webhook delivery");
        return ("invalid_signature", Problem::new(ProblemType::InvalidSignature, error.to_string()).to_response());
    }
    // `verify` succeeded, so the id is present and not empty.
    let webhook_id = headers.id.unwrap_or_default();
    tracing::Span::current().record("webhook.id", webhook_id);

    // A verified body that is not a charge or refund event is a 400, and so is one that names a
    // member twice: readers disagree on which of the two counts.
    match read_event(&body) {
        Ok(Delivered::Charge(event)) => apply_and_respond(&state.pool, webhook_id, &event).await,
        Ok(Delivered::Refund(event)) => {
            crate::refund_webhooks::apply_and_respond(&state.pool, webhook_id, &event).await
        }
        Err(detail) => ("invalid_body", Problem::new(ProblemType::InvalidWebhook, detail).to_response()),
    }
}

/// A verified delivery's event.
enum Delivered {
    Charge(WebhookEvent),
    Refund(RefundEvent),
}

/// Reads a body strictly, then as the kind of event its `type` names (`refund.…` or a charge's), so
/// that a body that is not an event is refused with what is wrong with it.
fn read_event(body: &[u8]) -> Result<Delivered, String> {
    let unreadable = |error: &dyn std::fmt::Display| format!("the body is not a charge or refund event: {error}");
    let value = strict_json::parse(body).map_err(|e| unreadable(&e))?;
    let refund = value.get("type").and_then(Value::as_str).is_some_and(|kind| kind.starts_with("refund."));
    if refund {
        serde_json::from_value(value).map(Delivered::Refund).map_err(|e| unreadable(&e))
    } else {
        serde_json::from_value(value).map(Delivered::Charge).map_err(|e| unreadable(&e))
    }
}

/// Applies a verified event and says how it went, as a metrics label and a response: 2xx once the
/// event is recorded (the provider stops retrying), 503 while the database is unavailable (it retries
/// later). Shared by every provider's endpoint.
pub(crate) async fn apply_and_respond(
    pool: &PgPool,
    webhook_id: &str,
    event: &WebhookEvent,
) -> (&'static str, HttpResponse) {
    let applied = apply(pool, webhook_id, event).await;
    if let Ok(handled) = &applied {
        tracing::info!(charge.id = %event.data.id, outcome = handled.label(), "webhook applied");
    }
    respond_to(applied)
}

pub(crate) async fn read_body(mut payload: web::Payload, limit: usize) -> Result<web::Bytes, Problem> {
    let too_large = || Problem::new(ProblemType::PayloadTooLarge, format!("a webhook body is at most {limit} bytes"));
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|_| Problem::new(ProblemType::InvalidWebhook, "the body could not be read"))?;
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Applies a verified event in one transaction: locks the payment row, records the `webhook-id`, and
/// judges the charge against the payment ([`verdict::judge`]):
/// - `unknown`: settled from the charge, exactly as the worker would, and its poll queue row removed,
///   if the charge is what the payment asked for. A charge for another amount, currency or key
///   dead-letters it as a `conflict` for an operator. A charge that cannot be booked as reported is
///   kept as evidence and counts as an inconclusive lookup (`unbookable`).
/// - `pending` or `processing`: only recorded, with the charge.
/// - `dead_lettered`: the charge is added to the open dead letter, for the operator.
/// - terminal and agreeing: nothing. Terminal and contradicting: a `conflict` dead letter, and the
///   terminal state is untouched. Terminal and unreadable as reported: only recorded (`unbookable`).
///
/// A charge held by another provider account than the payment's, whatever the payment's status,
/// changes nothing and is not recorded: it is counted and logged (`other_account`).
#[tracing::instrument(name = "webhook.apply", skip_all, fields(payment.id))]
pub async fn apply(pool: &PgPool, webhook_id: &str, event: &WebhookEvent) -> Result<Handled, ApplyError> {
    let charge = &event.data;
    let consistent = matches!(
        (event.event_type, charge.status),
        (EventType::ChargeSucceeded, ChargeStatus::Succeeded) | (EventType::ChargeFailed, ChargeStatus::Failed)
    );
    if !consistent {
        return Err(ApplyError::Invalid(format!("the event type does not match the status of charge {}", charge.id)));
    }
    let mut conn = pool.acquire().await.map_err(StoreError::from)?;
    let Some((tenant_id, payment_id)) = locate(&mut conn, event).await? else {
        tracing::warn!(charge.id = %charge.id, "a webhook for a charge that names no payment of ours");
        return Ok(Handled::NotOurs);
    };
    tracing::Span::current().record("payment.id", tracing::field::display(payment_id));

    let mut tx = conn.begin().await.map_err(StoreError::from)?;
    let Some(stored) = lock_payment(&mut tx, tenant_id, payment_id).await? else {
        return Ok(Handled::NotOurs);
    };
    let charge_verdict = verdict::judge(&stored, charge);
    if let ChargeVerdict::OtherAccount(why) = &charge_verdict {
        // Dropping the transaction releases the lock: nothing about the payment was written.
        crate::metrics::other_account("webhook", "charge", why);
        return Ok(Handled::OtherAccount);
    }
    if !record_delivery(&mut tx, tenant_id, payment_id, webhook_id, event, charge_verdict.label()).await? {
        // A redelivery: dropping the transaction rolls everything back, so it changes nothing.
        return Ok(Handled::Duplicate);
    }
    act_on(&mut tx, tenant_id, payment_id, webhook_id, event, &charge_verdict).await?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(Handled::Recorded(charge_verdict.label()))
}

/// Records a delivery's `webhook-id` with its charge and the verdict's label (the `outcome` column);
/// false when that id was recorded before.
async fn record_delivery(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    webhook_id: &str,
    event: &WebhookEvent,
    label: &str,
) -> Result<bool, StoreError> {
    let inserted = sqlx::query_scalar!(
        r#"
        INSERT INTO webhook_events (tenant_id, webhook_id, event_type, payment_id, provider_charge_id, outcome, charge)
        VALUES ($1, $2, $3, $4, $5, $6, $7)
        ON CONFLICT (tenant_id, webhook_id) DO NOTHING
        RETURNING true AS "inserted!"
        "#,
        tenant_id.as_uuid(),
        webhook_id,
        event.event_type.as_str(),
        payment_id.as_uuid(),
        event.data.id,
        label,
        Json(&event.data) as _,
    )
    .fetch_optional(conn)
    .await?;
    Ok(inserted.is_some())
}

/// Does what a first delivery's verdict asks, in the delivery's transaction with the payment locked.
async fn act_on(
    tx: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    webhook_id: &str,
    event: &WebhookEvent,
    charge_verdict: &ChargeVerdict,
) -> Result<(), ApplyError> {
    let event_type = event.event_type.as_str();
    let evidence = evidence("webhook", json!({ "webhook_id": webhook_id, "event": event_type, "charge": event.data }));
    match charge_verdict {
        ChargeVerdict::Settle(transition, settlement) => {
            let transition = *transition;
            let how = if transition == Transition::Charged { "webhook_charged" } else { "webhook_declined" };
            let resolution = resolution_span(tx, tenant_id, payment_id, how).await?;
            let reason = format!("provider webhook {event_type}");
            let why = Why { actor: ACTOR, reason: &reason };
            let recorded = unknown::settle(tx, tenant_id, payment_id, transition, settlement, why, evidence)
                .instrument(resolution)
                .await?;
            if matches!(recorded, Recorded::LostRace) {
                // The payment row is locked, so its status cannot have changed.
                return Err(ApplyError::MovedWhileLocked(payment_id));
            }
            metrics::counter!(crate::metrics::UNKNOWN_RESOLVED, "how" => how).increment(1);
        }
        ChargeVerdict::Mismatch(reason) => {
            let why = Why { actor: ACTOR, reason };
            if let Recorded::LostRace = unknown::mismatch(tx, tenant_id, payment_id, why, evidence).await? {
                return Err(ApplyError::MovedWhileLocked(payment_id));
            }
        }
        ChargeVerdict::Unbookable(why) => {
            // Proves nothing either way; it counts toward dead-lettering, and the poller keeps looking.
            let mut evidence = evidence;
            evidence["result"] = json!(why);
            unknown::note_inconclusive(tx, tenant_id, payment_id, evidence, None).await?;
        }
        // Recorded with the charge, and nothing more. A payment still being sent is left to its
        // worker, which learns the same outcome from the provider (its resend carries the same key);
        // if it cannot, the payment becomes `unknown` and the poller settles it from the charge
        // recorded here. The reconciler never races a worker that holds a lease.
        ChargeVerdict::LeaveToSender | ChargeVerdict::Agrees | ChargeVerdict::Unreadable(_) => {}
        // Never recorded: `apply` returns before.
        ChargeVerdict::OtherAccount(_) => {}
        ChargeVerdict::ForOperator => {
            if !dead_letters::attach_evidence(tx, tenant_id, payment_id, Value::Array(vec![evidence])).await? {
                tracing::warn!("a dead-lettered payment has no open dead letter to attach the webhook to");
            }
        }
        ChargeVerdict::Conflicts(why) => {
            dead_letters::record(tx, tenant_id, payment_id, Kind::Conflict, why, Value::Array(vec![evidence]), 0)
                .await?;
        }
    }
    Ok(())
}

/// The span of settling an `unknown` payment from a webhook (`webhook.resolve`). A delivery is a trace
/// of its own (`webhook.receive`); this span continues the payment's trace (stored with its queue row)
/// and links back to the delivery, so the resolution shows in the same trace as the request and the
/// send. Without a stored trace it stays in the delivery's trace.
async fn resolution_span(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    how: &'static str,
) -> Result<Span, StoreError> {
    let span =
        tracing::info_span!("webhook.resolve", payment.id = %payment_id, tenant.id = %tenant_id, resolution = how);
    if let Some(trace) = unknown::trace_of(conn, tenant_id, payment_id).await? {
        telemetry::continue_trace(&span, &trace);
        telemetry::link(&span, &Span::current());
    }
    Ok(span)
}

/// The payment a charge was made for: from the metadata oncepay puts on every charge, or else from
/// its downstream idempotency key (whose tenant is then looked up).
async fn locate(conn: &mut PgConnection, event: &WebhookEvent) -> Result<Option<(TenantId, PaymentId)>, ApplyError> {
    let charge = &event.data;
    let from_key = DownstreamKey::parse_payment_id(&charge.idempotency_key);
    match (charge.payment_ref(), from_key) {
        // A key naming another payment is judged with the charge: evidence for an operator.
        (Some(reference), _) => Ok(Some(reference)),
        (None, Some(payment_id)) => {
            // A provider that drops metadata: the tenant comes from the payment. Unknown payments (the
            // only ones a webhook settles) are found in their small queue first; the scan of
            // `payments` by id alone only runs for the rest.
            let tenant = sqlx::query_scalar!(
                r#"
                (SELECT tenant_id AS "tenant_id!: TenantId" FROM unknown_payments WHERE payment_id = $1)
                UNION ALL
                (SELECT tenant_id FROM payments WHERE payment_id = $1)
                LIMIT 1
                "#,
                payment_id.as_uuid(),
            )
            .fetch_optional(conn)
            .await
            .map_err(StoreError::from)?;
            Ok(tenant.map(|tenant_id| (tenant_id, payment_id)))
        }
        (None, None) => Ok(None),
    }
}

/// Locks the payment row for the rest of the transaction and reads what a charge is judged against.
///
/// The lock and the read are two statements. A statement that waits for the row lock (a worker is
/// settling the payment at that moment) then sees the row's new version, but keeps the snapshot it
/// started with for every other table. A join in the locking statement would miss the ledger entry
/// committed with that new version, and a payment that just succeeded would look like a success
/// without a ledger entry: a false conflict. The read after the lock sees both.
async fn lock_payment(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<Option<Stored>, StoreError> {
    let locked = sqlx::query_scalar!(
        r#"SELECT true AS "locked!" FROM payments WHERE tenant_id = $1 AND payment_id = $2 FOR UPDATE"#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_optional(&mut *conn)
    .await?;
    if locked.is_none() {
        return Ok(None);
    }
    let row = sqlx::query!(
        r#"
        SELECT p.status AS "status: PaymentStatus", p.provider_charge_id, p.amount AS "amount: Amount",
               p.currency AS "currency: Currency", p.provider_account AS "provider_account: ProviderAccount",
               l.amount AS "ledger_amount?: Amount", l.currency AS "ledger_currency?: Currency"
        FROM payments p LEFT JOIN ledger_entries l USING (tenant_id, payment_id)
        WHERE p.tenant_id = $1 AND p.payment_id = $2
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|row| Stored {
        asked: Asked { payment_id, account: row.provider_account, amount: row.amount, currency: row.currency },
        status: row.status,
        charge_id: row.provider_charge_id,
        ledger: match (row.ledger_amount, row.ledger_currency) {
            (Some(amount), Some(currency)) => Some(Booked { amount, currency }),
            _ => None,
        },
    }))
}
