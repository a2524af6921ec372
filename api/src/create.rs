//! The shell every create endpoint shares (`POST /v1/payments`, `POST /v1/payments/{id}/refunds`):
//! admission, the path, the idempotent request and its body, the `outcome` label of its metric, and
//! the responses to a new key and to a known one. Each endpoint says only what is its own
//! ([`Create`]): what its path names, how its body is read, and its part in the store.
//!
//! Every check of the request itself runs before the store is touched, in the order both endpoints
//! promise: API key (401), rate limit (429), the path (404, a refund's payment), `Idempotency-Key`
//! (400), `Content-Type` (415), body size (413), JSON (400), fields (400, listing every invalid
//! field). Nothing here logs the key or the body.

use std::borrow::Cow;

use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use anyhow::anyhow;
use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::idempotency_key::IdempotencyKey;
use oncepay_domain::payment_request::FieldError;
use oncepay_store::StoreError;
use oncepay_store::connections::Checkout;
use serde_json::Value;
use time::OffsetDateTime;
use tracing::Span;

use crate::auth::Caller;
use crate::errors::ApiError;
use crate::idempotent_request::{self, IdempotentRequest};
use crate::request_span;
use crate::resource_response::{self, Followed, KeyInfo};
use crate::state::AppState;

/// What one create endpoint says of its own; [`respond`] does the rest.
pub trait Create {
    /// The counter of its requests, by `outcome` label.
    const METRIC: &'static str;
    /// What its path names, read before the body (a refund's payment).
    type Target;
    /// Its body, validated.
    type Body;

    /// Reads what the path names, recording it on the request's `span`; 404 if it names nothing.
    fn target(request: &HttpRequest, span: &Span) -> Result<Self::Target, ApiError>;

    /// Validates the body, naming every invalid field.
    fn parse(json: &Value) -> Result<Self::Body, Vec<FieldError>>;

    /// The path a fingerprint covers.
    fn path(target: &Self::Target) -> Cow<'static, str>;

    /// The store's part, for a request that passed every check of its own, with its `body`: replays a
    /// known key (or refuses another request with it, 422), creates the resource, or refuses it.
    fn store(
        state: &AppState,
        request: Checked<Self>,
        body: Self::Body,
    ) -> impl Future<Output = Result<Responded, ApiError>>;
}

/// A create request that passed every check before the store: all of it but its body, which
/// [`Create::store`] takes on its own.
pub struct Checked<E: Create + ?Sized> {
    /// The request's span, for the ids the store's part learns.
    pub span: Span,
    /// Who sent it.
    pub caller: Caller,
    /// The client's key.
    pub key: IdempotencyKey,
    /// The fingerprint of its method, path and body.
    pub fingerprint: Fingerprint,
    /// What its path names.
    pub target: E::Target,
}

/// A response, and whether it repeats an earlier request's outcome.
pub struct Responded {
    response: HttpResponse,
    replayed: bool,
}

impl Responded {
    /// Whether it repeats an earlier request's outcome.
    pub fn replayed(&self) -> bool {
        self.replayed
    }

    /// The HTTP response.
    pub fn into_response(self) -> HttpResponse {
        self.response
    }

    /// The 202 for a resource just created, whose key may be forgotten after `key_expires_at`.
    pub fn created(resource: &impl Followed, key_expires_at: OffsetDateTime, retry_after_secs: u64) -> Self {
        let key = KeyInfo { expires_at: key_expires_at, replayed: false };
        Self { response: resource_response::accepted(resource, retry_after_secs, key), replayed: false }
    }
}

/// A key the store holds: the fingerprint of the request that created it, and when it may be
/// forgotten.
pub struct KnownKey {
    /// The fingerprint of the request that created it.
    pub created_by: Fingerprint,
    /// When it may be forgotten.
    pub expires_at: OffsetDateTime,
}

/// Serves a create request and counts it by how it ended.
pub async fn respond<E: Create>(
    request: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<HttpResponse, ApiError> {
    let result = take::<E>(request, payload, state).await;
    let label = match &result {
        Ok(responded) if responded.replayed => "replayed",
        Ok(_) => "created",
        Err(error) => error.outcome(),
    };
    metrics::counter!(E::METRIC, "outcome" => label).increment(1);
    result.map(|responded| responded.response)
}

/// Checks the request in the order the module's doc says, then hands it to the endpoint's store.
async fn take<E: Create>(
    request: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<Responded, ApiError> {
    let span = request_span::of(request);
    let caller = state.admit(request).await?;
    span.record("tenant.id", tracing::field::display(caller.tenant_id));
    let target = E::target(request, &span)?;

    let idempotent = IdempotentRequest::read(request.headers(), payload, state.intake.max_body_bytes).await?;
    take_read::<E>(state, span, caller, target, idempotent).await
}

/// The rest of a request that a front door (HTTP, a broker's message) admitted and read: its fields
/// (400), then the endpoint's store.
pub async fn take_read<E: Create>(
    state: &AppState,
    span: Span,
    caller: Caller,
    target: E::Target,
    idempotent: IdempotentRequest,
) -> Result<Responded, ApiError> {
    let body = E::parse(&idempotent.json).map_err(ApiError::InvalidFields)?;
    let fingerprint = idempotent.fingerprint(&E::path(&target));
    E::store(state, Checked { span, caller, key: idempotent.key, fingerprint, target }, body).await
}

impl<E: Create> Checked<E> {
    /// The response for a known key whose resource is final: the response stored on the key when it
    /// became final (`status` and `body`), or 422 for another request.
    pub fn replay_stored(&self, known: KnownKey, status: u16, body: Bytes) -> Result<Responded, ApiError> {
        let key = idempotent_request::replay(&known.created_by, known.expires_at, &self.fingerprint)?;
        Ok(Responded { response: resource_response::stored(status, body, key), replayed: true })
    }

    /// The response for a known key whose resource was not final when the key was read: the row
    /// `reread` reads once more, as the resource `R` (a 202 tells the client to poll after
    /// `retry_after_secs`), or 422 for another request, without reading.
    pub async fn replay_in_progress<R, Row>(
        &self,
        known: KnownKey,
        reread: impl Future<Output = Result<Option<Row>, StoreError>>,
        retry_after_secs: u64,
    ) -> Result<Responded, ApiError>
    where
        R: Followed + for<'row> From<&'row Row>,
    {
        let key = idempotent_request::replay(&known.created_by, known.expires_at, &self.fingerprint)?;
        let row = reread
            .await
            .map_err(ApiError::from_store)?
            .ok_or_else(|| ApiError::Internal(anyhow!("an idempotency key names a {} that does not exist", R::NAME)))?;
        // Final between the two reads: the transaction that made it final stored exactly this 200
        // and resource on the key.
        Ok(Responded { response: resource_response::replayed(&R::from(&row), retry_after_secs, key), replayed: true })
    }
}

/// Returns a connection for the next request, unless `result` failed in a way that leaves it in
/// doubt (the store unavailable, or a bug): it is then closed. A refusal PostgreSQL decided (a lock
/// wait past `lock_timeout`) leaves it healthy, its transaction rolled back.
pub fn release_unless_in_doubt<T>(conn: Checkout<'_>, result: &Result<T, ApiError>) {
    if !matches!(result, Err(ApiError::Unavailable(_) | ApiError::Internal(_))) {
        conn.release();
    }
}
