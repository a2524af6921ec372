//! `GET /v1/refunds/{id}`: the refund resource, scoped to the caller's tenant, optionally held as a
//! long poll (`Prefer: wait=N`, RFC 7240) exactly like `GET /v1/payments/{id}`.
//!
//! Another tenant's refund, and an id that is not a UUID, get the same 404 as a refund that does
//! not exist. A long poll holds no database connection while it waits.

use std::str::FromStr;

use actix_web::{HttpRequest, HttpResponse, web};
use oncepay_domain::ids::{RefundId, TenantId};
use oncepay_domain::refund::RefundResource;
use oncepay_http::problem::Problem;
use oncepay_store::refunds::{self, Refund};
use utoipa::{IntoParams, IntoResponses};

use crate::endpoints::{Admission, LongPollHeaders};
use crate::errors::ApiError;
use crate::long_poll;
use crate::request_span;
use crate::resource_response;
use crate::state::AppState;
use crate::watch::Watched;

/// The refund, as it stands or once it changes.
#[utoipa::path(
    get,
    path = "/v1/refunds/{id}",
    tag = "refunds",
    operation_id = "get_refund",
    security(("api_key" = [])),
    params(GetRefundPath, LongPollHeaders),
    responses(GetRefundResponses, Admission),
)]
pub async fn get_refund(request: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let span = request_span::of(&request);
    let caller = state.admit(&request).await?;
    span.record("tenant.id", tracing::field::display(caller.tenant_id));

    let refund_id =
        request.match_info().get("id").and_then(|raw| RefundId::from_str(raw).ok()).ok_or(ApiError::NotFound)?;
    span.record("refund.id", tracing::field::display(refund_id));

    let tenant_id = caller.tenant_id;
    let (refund, waited_secs) = long_poll::hold(
        &state,
        request.headers(),
        tenant_id,
        Watched::Refund(refund_id),
        async || fetch(&state, tenant_id, refund_id).await,
        async || state.rereads.read_refund(tenant_id, refund_id).await,
        |refund: &Refund| refund.status,
    )
    .await?;
    span.record("payment.id", tracing::field::display(refund.payment_id));
    Ok(resource_response::current(&RefundResource::from(&refund), state.intake.retry_after_secs, waited_secs))
}

async fn fetch(state: &AppState, tenant_id: TenantId, refund_id: RefundId) -> Result<Refund, ApiError> {
    let mut conn = state.connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
    let refund = refunds::find(&mut conn, tenant_id, refund_id).await.map_err(ApiError::from_store)?;
    conn.release();
    refund.ok_or(ApiError::NotFound)
}

/// The path of `GET /v1/refunds/{id}`.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct GetRefundPath {
    /// The refund's id, from `Location`
    #[param(format = Uuid)]
    pub id: String,
}

/// The responses of `GET /v1/refunds/{id}`, besides those of [`Admission`].
#[derive(IntoResponses)]
pub enum GetRefundResponses {
    #[response(status = 200, description = "The refund.",
        headers(
            ("Retry-After" = u64, description = "Present while the refund is not final: seconds before polling again"),
            ("Preference-Applied" = String, description = "`wait=N` when a long poll was honoured, N as applied"),
        ))]
    Refund(RefundResource),
    #[response(
        status = 404,
        description = "No such refund for this tenant.",
        content_type = "application/problem+json"
    )]
    NotFound(Problem),
    #[response(status = 503, description = "The store cannot be reached.",
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds before retrying")))]
    Unavailable(Problem),
}
