//! What the reconciler does with a payment or a refund whose outcome is `unknown`: claims those
//! due for a lookup, counts an inconclusive one, and takes each out of `unknown` by one of four
//! ways (settled, sent again, dead-lettered as given up on, dead-lettered as contradicting what it
//! asked for).
//!
//! The two kinds keep their own tables and rules ([`payments`], [`refunds`]); what they share is
//! here: who moved them and why ([`Why`]), a piece of evidence ([`evidence`]), and how the tenants
//! with due rows share a claim's batch ([`claim_in_shares`]). The poller drives both the same way
//! (`crate::poller`).

pub mod payments;
pub mod refunds;

use futures::future::BoxFuture;
use oncepay_domain::ids::TenantId;
use oncepay_store::StoreError;
use serde_json::{Value, json};
use sqlx::PgConnection;
use time::OffsetDateTime;

/// Who and why, for the audit trail.
#[derive(Debug, Clone, Copy)]
pub struct Why<'a> {
    /// `webhook`, `reconciler:poller`.
    pub actor: &'a str,
    /// In words.
    pub reason: &'a str,
}

/// A piece of evidence: what was learned, from where, when.
pub fn evidence(source: &str, fields: Value) -> Value {
    let mut entry = json!({ "at": oncepay_ops::render::timestamp(OffsetDateTime::now_utc()), "source": source });
    if let (Some(entry), Value::Object(fields)) = (entry.as_object_mut(), fields) {
        entry.extend(fields);
    }
    entry
}

/// One tenant's claim of at most `limit` due rows, given the claim's other arguments.
pub(crate) type ClaimOf<T, A> =
    for<'c> fn(&'c mut PgConnection, TenantId, u32, A) -> BoxFuture<'c, Result<Vec<T>, StoreError>>;

/// Fills a batch of `batch_size` from the `waiting` tenants by `claim`: each gets an equal share of
/// what is left of the batch in turn; what a tenant leaves of its share goes to the tenants after it,
/// and to those that filled theirs in a further round, until the batch is full or no tenant has more.
/// Payments and refunds are claimed this way.
pub(crate) async fn claim_in_shares<T, A: Copy>(
    conn: &mut PgConnection,
    mut waiting: Vec<TenantId>,
    batch_size: u32,
    args: A,
    claim: ClaimOf<T, A>,
) -> Result<Vec<T>, StoreError> {
    let mut claimed = Vec::new();
    let mut remaining = batch_size;
    // Rounds: a tenant that filled its share may have more, and gets a share of what the others
    // left in the next round.
    while remaining > 0 && !waiting.is_empty() {
        let mut filled = Vec::new();
        let count = waiting.len();
        for (index, tenant_id) in waiting.into_iter().enumerate() {
            if remaining == 0 {
                break;
            }
            let share = remaining.div_ceil(u32::try_from(count - index).unwrap_or(u32::MAX));
            let rows = claim(&mut *conn, tenant_id, share, args).await?;
            let taken = u32::try_from(rows.len()).unwrap_or(u32::MAX);
            if taken == share {
                filled.push(tenant_id);
            }
            remaining = remaining.saturating_sub(taken);
            claimed.extend(rows);
        }
        waiting = filled;
    }
    Ok(claimed)
}
