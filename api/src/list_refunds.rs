//! `GET /v1/payments/{id}/refunds`: a payment's refunds, oldest first, scoped to the caller's
//! tenant.
//!
//! A payment the tenant does not have (another tenant's, or an id that is not a UUID) is 404; a
//! payment without refunds has an empty list. Both reads are on one connection, in one request.

use actix_web::{HttpRequest, HttpResponse, web};
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::refund::RefundResource;
use oncepay_http::problem::Problem;
use oncepay_store::refunds::{self, Refund};
use oncepay_store::{StoreError, payments};
use serde::Serialize;
use utoipa::IntoResponses;

use crate::endpoints::{Admission, PaymentPath, path_payment_id};
use crate::errors::ApiError;
use crate::request_span;
use crate::state::AppState;

/// The body of the list: `{"data": [refund, ...]}`, room left beside `data` for paging later.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RefundList {
    /// The payment's refunds, oldest first.
    pub data: Vec<RefundResource>,
}

/// The payment's refunds.
#[utoipa::path(
    get,
    path = "/v1/payments/{id}/refunds",
    tag = "refunds",
    operation_id = "list_refunds",
    security(("api_key" = [])),
    params(PaymentPath),
    responses(ListRefundsResponses, Admission),
)]
pub async fn list_refunds(request: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let span = request_span::of(&request);
    let caller = state.admit(&request).await?;
    span.record("tenant.id", tracing::field::display(caller.tenant_id));
    let payment_id = path_payment_id(&request)?;
    span.record("payment.id", tracing::field::display(payment_id));

    let mut conn = state.connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
    let found = read(&mut conn, caller.tenant_id, payment_id).await.map_err(ApiError::from_store)?;
    conn.release();
    let refunds = found.ok_or(ApiError::NotFound)?;
    let data = refunds.iter().map(RefundResource::from).collect();
    Ok(HttpResponse::Ok().json(RefundList { data }))
}

/// The payment's refunds, or `None` if the tenant has no such payment.
async fn read(
    conn: &mut sqlx::PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<Option<Vec<Refund>>, StoreError> {
    if payments::fetch(conn, tenant_id, payment_id).await?.is_none() {
        return Ok(None);
    }
    refunds::of_payment(conn, tenant_id, payment_id).await.map(Some)
}

/// The responses of `GET /v1/payments/{id}/refunds`, besides those of [`Admission`].
#[derive(IntoResponses)]
pub enum ListRefundsResponses {
    #[response(status = 200, description = "The payment's refunds, oldest first (an empty list if it has none).")]
    Refunds(RefundList),
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
