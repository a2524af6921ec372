//! `GET /v1/payments/{id}`: the payment resource, scoped to the caller's tenant, optionally held as
//! a long poll (`Prefer: wait=N`, RFC 7240).
//!
//! Another tenant's payment, and an id that is not a UUID, get the same 404 as a payment that does
//! not exist. A long poll holds no database connection while it waits.

use std::str::FromStr;

use actix_web::{HttpRequest, HttpResponse, web};
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::payment::PaymentResource;
use oncepay_store::payments;
use oncepay_store::payments::Payment;

use crate::errors::ApiError;
use crate::long_poll;
use crate::openapi::{Admission, GetPaymentResponses, LongPollHeaders, PaymentPath};
use crate::request_span;
use crate::resource_response;
use crate::state::AppState;
use crate::watch::Watched;

/// The payment, as it stands or once it changes.
#[utoipa::path(
    get,
    path = "/v1/payments/{id}",
    tag = "payments",
    operation_id = "get_payment",
    security(("api_key" = [])),
    params(PaymentPath, LongPollHeaders),
    responses(GetPaymentResponses, Admission),
)]
pub async fn get_payment(request: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let span = request_span::of(&request);
    let caller = state.admit(&request).await?;
    span.record("tenant.id", tracing::field::display(caller.tenant_id));

    let payment_id = path_payment_id(&request)?;
    span.record("payment.id", tracing::field::display(payment_id));

    let tenant_id = caller.tenant_id;
    let (payment, waited_secs) = long_poll::hold(
        &state,
        request.headers(),
        tenant_id,
        Watched::Payment(payment_id),
        async || fetch(&state, tenant_id, payment_id).await,
        async || state.rereads.read(tenant_id, payment_id).await,
        |payment: &Payment| payment.status,
    )
    .await?;
    Ok(resource_response::current(&PaymentResource::from(&payment), state.intake.retry_after_secs, waited_secs))
}

/// The payment id in the path (`{id}`); an id that is not a UUID names no payment (404).
pub fn path_payment_id(request: &HttpRequest) -> Result<PaymentId, ApiError> {
    request.match_info().get("id").and_then(|raw| PaymentId::from_str(raw).ok()).ok_or(ApiError::NotFound)
}

/// The payment of `tenant_id`, read on one of the requests' connections; 404 if it has none.
pub async fn fetch(state: &AppState, tenant_id: TenantId, payment_id: PaymentId) -> Result<Payment, ApiError> {
    let mut conn = state.connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
    let payment = payments::fetch(&mut conn, tenant_id, payment_id).await.map_err(ApiError::from_store)?;
    conn.release();
    payment.ok_or(ApiError::NotFound)
}
