//! `GET /v1/payments/{id}`: the payment resource, scoped to the caller's tenant, optionally held as
//! a long poll (`Prefer: wait=N`, RFC 7240).
//!
//! Another tenant's payment, and an id that is not a UUID, get the same 404 as a payment that does
//! not exist. A long poll holds no database connection while it waits.

use actix_web::{HttpRequest, HttpResponse, web};
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::payment::PaymentResource;
use oncepay_http::problem::Problem;
use oncepay_store::payments;
use oncepay_store::payments::Payment;
use utoipa::IntoResponses;

use crate::endpoints::{Admission, LongPollHeaders, PaymentPath, path_payment_id};
use crate::errors::ApiError;
use crate::long_poll;
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

/// The payment of `tenant_id`, read on one of the requests' connections; 404 if it has none.
pub async fn fetch(state: &AppState, tenant_id: TenantId, payment_id: PaymentId) -> Result<Payment, ApiError> {
    let mut conn = state.connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
    let payment = payments::fetch(&mut conn, tenant_id, payment_id).await.map_err(ApiError::from_store)?;
    conn.release();
    payment.ok_or(ApiError::NotFound)
}

/// The responses of `GET /v1/payments/{id}`, besides those of [`Admission`].
#[derive(IntoResponses)]
pub enum GetPaymentResponses {
    #[response(status = 200, description = "The payment.",
        headers(
            ("Retry-After" = u64, description = "Present while the payment is not final: seconds before polling again"),
            ("Preference-Applied" = String, description = "`wait=N` when a long poll was honoured, N as applied"),
        ))]
    Payment(PaymentResource),
    #[response(
        status = 404,
        description = "No such payment for this tenant.",
        content_type = "application/problem+json"
    )]
    NotFound(Problem),
    #[response(status = 503, description = "The store cannot be reached.",
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds before retrying")))]
    Unavailable(Problem),
}
