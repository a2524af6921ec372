//! `GET /v1/payments/{id}`: the payment resource, scoped to the caller's tenant, optionally held as
//! a long poll (`Prefer: wait=N`, RFC 7240).
//!
//! Another tenant's payment, and an id that is not a UUID, get the same 404 as a payment that does
//! not exist. A long poll holds no database connection while it waits.

use std::str::FromStr;
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::payment::PaymentResource;
use oncepay_store::payments;
use oncepay_store::payments::Payment;
use tokio::time::Instant;

use crate::errors::ApiError;
use crate::long_poll::Subscription;
use crate::openapi::{Admission, GetPaymentHeaders, GetPaymentPath, GetPaymentResponses};
use crate::payment_response;
use crate::prefer;
use crate::request_span;
use crate::startup::AppState;

/// The payment, as it stands or once it changes.
#[utoipa::path(
    get,
    path = "/v1/payments/{id}",
    tag = "payments",
    operation_id = "get_payment",
    security(("api_key" = [])),
    params(GetPaymentPath, GetPaymentHeaders),
    responses(GetPaymentResponses, Admission),
)]
pub async fn get_payment(request: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let span = request_span::of(&request);
    let caller = state.admit(&request).await?;
    span.record("tenant.id", tracing::field::display(caller.tenant_id));

    let payment_id =
        request.match_info().get("id").and_then(|raw| PaymentId::from_str(raw).ok()).ok_or(ApiError::NotFound)?;
    span.record("payment.id", tracing::field::display(payment_id));

    let wait_secs = prefer::wait_secs(request.headers()).map(|secs| secs.min(state.long_poll.max_wait_secs));
    // Subscribe before the first read: a change committed after this point wakes us even before we
    // wait. Beyond the long-poll bounds (`max_waiting`, `max_waiting_per_tenant` in `[long_poll]`)
    // there is no subscription: the request is served at once, without `Preference-Applied`. The
    // wait is declined; the request is not refused.
    let subscription =
        wait_secs.filter(|secs| *secs > 0).and_then(|_| state.watch.subscribe(caller.tenant_id, payment_id));
    let (payment, waited_secs) = match (subscription, wait_secs) {
        (Some(subscription), Some(secs)) => {
            (hold(&state, caller.tenant_id, payment_id, subscription, Duration::from_secs(secs)).await?, wait_secs)
        }
        (None, Some(secs)) if secs > 0 => (fetch(&state, caller.tenant_id, payment_id).await?, None),
        _ => (fetch(&state, caller.tenant_id, payment_id).await?, wait_secs),
    };
    Ok(payment_response::current(&PaymentResource::from(&payment), state.intake.retry_after_secs, waited_secs))
}

/// The payment once its status differs from the first read, or as it stands once `wait` has passed
/// or the process begins to shut down, whichever comes first.
async fn hold(
    state: &AppState,
    tenant_id: TenantId,
    payment_id: PaymentId,
    mut subscription: Subscription,
    wait: Duration,
) -> Result<Payment, ApiError> {
    let first = fetch(state, tenant_id, payment_id).await?;
    // A terminal payment cannot change again: no wait.
    if first.status.is_terminal() {
        return Ok(first);
    }
    subscription.waiting();
    let deadline = tokio::time::sleep_until(Instant::now() + wait);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = subscription.changed() => {}
            () = &mut deadline => break,
            () = state.draining.cancelled() => break,
        }
        // A notification is a hint: only a different status ends the wait.
        if let Some(now) = state.rereads.read(tenant_id, payment_id).await
            && now.status != first.status
        {
            return Ok(now);
        }
    }
    // Read once more: the response shows the payment as it is now, even if a wake-up was lost.
    fetch(state, tenant_id, payment_id).await
}

async fn fetch(state: &AppState, tenant_id: TenantId, payment_id: PaymentId) -> Result<Payment, ApiError> {
    let mut conn = state.connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
    let payment = payments::fetch(&mut conn, tenant_id, payment_id).await.map_err(ApiError::from_store)?;
    conn.release();
    payment.ok_or(ApiError::NotFound)
}
