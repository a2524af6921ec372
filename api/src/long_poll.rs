//! Long polling: holds `GET /v1/payments/{id}` and `GET /v1/refunds/{id}` requests
//! (`Prefer: wait=N`) until their payment or refund changes, woken through the process's
//! [`Watch`](crate::watch::Watch) rather than by sleeping in a loop ([`hold`]).
//!
//! A notification is only a hint: waiters re-read what they wait on (through
//! [`Rereads`](crate::rereads::Rereads)) and keep waiting if its status did not change. A change is
//! never missed, at worst noticed a reconnection later. Waiters hold no database connection while
//! they wait.

use std::time::Duration;

use actix_web::http::header::HeaderMap;
use oncepay_domain::ids::TenantId;
use oncepay_domain::status::Status;
use tokio::time::Instant;

use crate::errors::ApiError;
use crate::prefer;
use crate::state::AppState;
use crate::watch::Watched;

/// Serves a status request: `fetch` once, or, when the request asks to wait (`Prefer: wait=N`,
/// capped at `long_poll.max_wait_secs`), once `status` differs from the first read, after N seconds
/// or when the process begins to shut down. Returns what was read and the wait applied (for
/// `Preference-Applied`).
///
/// Subscribes before the first read: a change committed after that point wakes the waiter even
/// before it waits. Beyond the long-poll bounds (`max_waiting`, `max_waiting_per_tenant`) there is
/// no subscription: the request is served at once, without `Preference-Applied`. The wait is
/// declined; the request is not refused. `reread` is the read after a notification, `None` if it
/// failed (the waiter then keeps waiting).
pub async fn hold<T, S: Status>(
    state: &AppState,
    headers: &HeaderMap,
    tenant_id: TenantId,
    watched: Watched,
    fetch: impl AsyncFn() -> Result<T, ApiError>,
    reread: impl AsyncFn() -> Option<T>,
    status: impl Fn(&T) -> S,
) -> Result<(T, Option<u64>), ApiError> {
    let wait_secs = prefer::wait_secs(headers).map(|secs| secs.min(state.long_poll.max_wait_secs));
    let subscription = wait_secs.filter(|secs| *secs > 0).and_then(|_| state.watch.subscribe(tenant_id, watched));
    let (Some(mut subscription), Some(secs)) = (subscription, wait_secs) else {
        // No wait asked for, a wait of 0 (applied as asked), or one declined beyond the bounds.
        let applied = wait_secs.filter(|secs| *secs == 0);
        return Ok((fetch().await?, applied));
    };
    let first = fetch().await?;
    // A terminal payment or refund cannot change again: no wait.
    if status(&first).is_terminal() {
        return Ok((first, Some(secs)));
    }
    subscription.waiting();
    let deadline = tokio::time::sleep_until(Instant::now() + Duration::from_secs(secs));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = subscription.changed() => {}
            () = &mut deadline => break,
            () = state.draining.cancelled() => break,
        }
        // A notification is a hint: only a different status ends the wait.
        if let Some(now) = reread().await
            && status(&now) != status(&first)
        {
            return Ok((now, Some(secs)));
        }
    }
    // Read once more: the response shows it as it is now, even if a wake-up was lost.
    Ok((fetch().await?, Some(secs)))
}
