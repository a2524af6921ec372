//! The data a run works on: the tenant and its API key, the request bodies (a payment's and a
//! refund's), the key and payment-id schemes both load generators (pgbench and HTTP) draw from, and
//! the bulk loaders that write history, backlogs and refundable payments with `generate_series`.
//! The loaders are for benchmark databases only.

use std::ops::RangeInclusive;

use anyhow::Context;
use oncepay_domain::api_key;
use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::ids::TenantId;
use oncepay_domain::payment_request::PaymentRequest;
use oncepay_domain::refund::RefundRequest;
use oncepay_store::tenants::{self, TenantName};
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

/// The body of every request: a small, ordinary payment.
pub const BODY: &str = r#"{"amount":1999,"currency":"EUR","customer_id":"cus_bench","metadata":{"source":"bench"}}"#;

/// The method and path every request uses, part of the fingerprint.
pub const METHOD: &str = "POST";
/// See [`METHOD`].
pub const PATH: &str = "/v1/payments";

/// The body of every refund: one minor unit of the payment, so that a payment of [`Refundable`] can
/// be refunded as many times as its amount in minor units (1,999) before it runs out.
pub const REFUND_BODY: &str = r#"{"amount":1,"reason":"requested_by_customer","metadata":{"source":"bench"}}"#;

/// The path of a refund of `payment_id`, part of the refund's fingerprint.
pub fn refund_path(payment_id: Uuid) -> String {
    format!("/v1/payments/{payment_id}/refunds")
}

/// A valid W3C trace context, written on raw outbox rows as the api writes its request's.
pub const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Where fresh (never used) keys come from: above every stored key, below `i64::MAX` (pgbench's
/// integers are signed 64-bit). An accept draws a random one, so it lands at a random place in the
/// key index, as real clients' random keys do.
pub const FRESH_KEYS: RangeInclusive<u64> = (1 << 32)..=(i64::MAX as u64 - 1);

/// The multiplier of the key scramble: odd, so `i ↦ i * M mod 2^32` is a bijection.
pub const SCRAMBLE: u64 = 2_654_435_761;

/// The `i`-th stored key (`i < 2^32`). SQL: `((i * 2654435761) % 4294967296)::text`.
///
/// A bijective scramble of `i`, below 2^32 so it never meets a fresh key, and computed the same way
/// in SQL and here, so both load generators can pick a random stored key without reading the table.
pub fn replay_key(i: u64) -> String {
    replay_key_number(i).to_string()
}

/// [`replay_key`] as the number it spells, for a writer that formats it into its own buffer.
pub fn replay_key_number(i: u64) -> u64 {
    i.wrapping_mul(SCRAMBLE) % (1 << 32)
}

/// The stored keys replays pick from, each equally often: `replay_key(i * stride)` for
/// `i < keys`. With a stride above 1 the keys are spread evenly over the loaded history (the `i`-th
/// loaded key was stored `i`-th), so a long history can be replayed with the same number of
/// distinct keys as a short one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplaySet {
    /// How many distinct keys.
    pub keys: u64,
    /// The distance between them, in load order.
    pub stride: u64,
}

impl ReplaySet {
    /// Every one of `stored` keys.
    pub fn all(stored: u64) -> Self {
        Self { keys: stored.max(1), stride: 1 }
    }

    /// `keys` keys spread evenly over `stored` (every key if there are no more than `keys`).
    pub fn spread(keys: u64, stored: u64) -> Self {
        let keys = keys.clamp(1, stored.max(1));
        Self { keys, stride: (stored / keys).max(1) }
    }

    /// The `n`-th of them (`n < keys`), as the number its key spells.
    pub fn key_number(self, n: u64) -> u64 {
        replay_key_number(n * self.stride)
    }
}

/// The body, parsed as the api parses it.
pub fn request() -> anyhow::Result<PaymentRequest> {
    let json: serde_json::Value = serde_json::from_str(BODY)?;
    PaymentRequest::from_json(&json).map_err(|errors| anyhow::anyhow!("the benchmark body is invalid: {errors:?}"))
}

/// The fingerprint the api computes for the body.
pub fn fingerprint() -> anyhow::Result<Fingerprint> {
    Ok(Fingerprint::of(METHOD, PATH, &serde_json::from_str(BODY)?))
}

/// The refund body, parsed as the api parses it.
pub fn refund_request() -> anyhow::Result<RefundRequest> {
    let json: serde_json::Value = serde_json::from_str(REFUND_BODY)?;
    RefundRequest::from_json(&json)
        .map_err(|errors| anyhow::anyhow!("the benchmark refund body is invalid: {errors:?}"))
}

/// The fingerprint the api computes for a refund of `payment_id`: its path is part of it.
pub fn refund_fingerprint(payment_id: Uuid) -> anyhow::Result<Fingerprint> {
    Ok(Fingerprint::of(METHOD, &refund_path(payment_id), &serde_json::from_str(REFUND_BODY)?))
}

/// Succeeded payments refunds are taken from: those numbered `first..first + count`. Payment `n`
/// has the id [`Refundable::payment_id`], which SQL spells `prefix || lpad(to_hex(n), 12, '0')`
/// (with [`Refundable::id_prefix`]), so both load generators can pick a random one without reading
/// the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refundable {
    /// The Unix millisecond in the ids' first 48 bits, as in a UUIDv7 made then.
    pub millis: u64,
    /// The first payment's number.
    pub first: u64,
    /// How many payments.
    pub count: u64,
}

impl Refundable {
    /// The id of payment `n`: the millisecond, version 7, the RFC 4122 variant, and `n` in the last
    /// 48 bits.
    pub fn payment_id(self, n: u64) -> Uuid {
        Uuid::from_u128((u128::from(self.millis) << 80) | (0x7000_8000 << 48) | u128::from(n))
    }

    /// The 20 hex digits every id begins with.
    pub fn id_prefix(self) -> String {
        format!("{:012x}70008000", self.millis)
    }

    /// The payments' numbers.
    pub fn numbers(self) -> std::ops::Range<u64> {
        self.first..self.first + self.count
    }

    /// The `n`-th of `parts` equal parts of these payments (`n < parts`; a remainder is left out).
    pub fn part(self, n: u64, parts: u64) -> Self {
        let count = self.count / parts.max(1);
        Self { millis: self.millis, first: self.first + n * count, count }
    }
}

/// The tenant every request comes from.
pub struct Tenant {
    /// Its id.
    pub id: TenantId,
    /// Its API key, for `Authorization: Bearer`.
    pub token: String,
}

impl Tenant {
    /// Creates the tenant `name` and one API key for it.
    pub async fn create(conn: &mut PgConnection, name: &str) -> anyhow::Result<Self> {
        let name = TenantName::parse(name)?;
        let tenant = tenants::create(conn, TenantId::generate(), &name, None, None).await?;
        let key = tenants::issue_api_key(conn, tenant.tenant_id, Some("benchmark")).await?;
        Ok(Self { id: tenant.tenant_id, token: api_key::reveal(&key).to_owned() })
    }
}

/// The payments of `tenant`: an index-only count of its rows, cheap for the broker phase's tenant.
pub async fn payments_of(conn: &mut PgConnection, tenant: TenantId) -> anyhow::Result<u64> {
    let count =
        sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM payments WHERE tenant_id = $1"#, tenant.as_uuid())
            .fetch_one(conn)
            .await?;
    Ok(u64::try_from(count)?)
}

/// The idempotency keys of `tenant`. Each names a payment of its own (`UNIQUE (tenant_id,
/// payment_id)`), so as many keys as payments is one key per payment.
pub async fn keys_of(conn: &mut PgConnection, tenant: TenantId) -> anyhow::Result<u64> {
    let count = sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM idempotency_keys WHERE tenant_id = $1"#,
        tenant.as_uuid()
    )
    .fetch_one(conn)
    .await?;
    Ok(u64::try_from(count)?)
}

/// Payments per loader statement: big enough to be quick, small enough for the foreign-key checks that
/// run at the end of each statement to stay in memory.
pub const BATCH: u64 = 200_000;

/// The millisecond clock that loaded payment ids start from: `count` ms before now, so the ids the
/// api generates later sort after them.
fn base_millis(count: u64) -> i64 {
    let now = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
    i64::try_from(now).unwrap_or(i64::MAX) - i64::try_from(count).unwrap_or(0) - 60_000
}

/// Writes settled (succeeded) payments for stored keys `replay_key(first..first + count)`, each with
/// the stored 200 response a replay returns. `salt` keeps payment ids of different loads apart.
///
/// The rows are what the api and the worker would write (the same columns, a payment id ordered by
/// time like a UUIDv7), except that a payment carries only its creation audit row and no ledger
/// entry: neither is read by an accept or a replay.
pub async fn load_settled(
    conn: &mut PgConnection,
    tenant: TenantId,
    first: u64,
    count: u64,
    salt: &str,
) -> anyhow::Result<u64> {
    let request = request()?;
    let fingerprint = fingerprint()?;
    let base = base_millis(first + count);
    let mut loaded = 0;
    let mut start = first;
    while start < first + count {
        let end = (start + BATCH).min(first + count) - 1;
        let rows = sqlx::query_scalar!(
            r#"
            WITH ids AS (
                SELECT i, (lpad(to_hex($4::bigint + i), 12, '0') || '7' || substr(h, 1, 3) || '8'
                           || substr(h, 4, 15))::uuid AS payment_id
                FROM generate_series($2::bigint, $3::bigint) AS i, md5($5::text || i::text) AS h
            ), paid AS (
                INSERT INTO payments (tenant_id, payment_id, status, amount, currency, customer_id, metadata,
                                      provider_charge_id, send_attempts, first_sent_at)
                SELECT $1, payment_id, 'succeeded', $7, $8, $9, $10,
                       'ch_' || substr(md5(payment_id::text), 1, 24), 1, now()
                FROM ids
                RETURNING payment_id, provider_charge_id, created_at, updated_at
            ), keyed AS (
                INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, payment_id, expires_at,
                                              response_status, response_body)
                SELECT $1, ((ids.i * 2654435761) % 4294967296)::text, $6, payment_id, now() + interval '1 day',
                       200,
                       jsonb_build_object(
                           'id', payment_id, 'status', 'succeeded', 'amount', $7::bigint, 'currency', $8::text,
                           'customer_id', $9::text, 'metadata', $10::jsonb,
                           'created_at', to_char(paid.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                           'updated_at', to_char(paid.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                           'provider_charge_id', paid.provider_charge_id)
                FROM ids JOIN paid USING (payment_id)
            ), audit AS (
                INSERT INTO payment_events (tenant_id, payment_id, from_status, to_status, actor, reason)
                SELECT $1, payment_id, NULL, 'pending', 'api', 'accepted' FROM paid
            )
            SELECT count(*) AS "loaded!" FROM paid
            "#,
            tenant.as_uuid(),
            i64::try_from(start)?,
            i64::try_from(end)?,
            base,
            salt,
            fingerprint.as_bytes().as_slice(),
            request.amount.minor_units(),
            request.currency.as_str(),
            request.customer_id,
            Json(&request.metadata) as _,
        )
        .fetch_one(&mut *conn)
        .await
        .context("loading settled payments")?;
        loaded += u64::try_from(rows)?;
        start = end + 1;
    }
    Ok(loaded)
}

/// Queues `count` pending payments for the worker, as accepted requests leave them (key, payment,
/// outbox row with a trace context, audit row). `salt` keeps their keys and ids apart from other
/// loads'.
pub async fn load_backlog(conn: &mut PgConnection, tenant: TenantId, count: u64, salt: &str) -> anyhow::Result<u64> {
    let request = request()?;
    let fingerprint = fingerprint()?;
    let base = base_millis(count);
    let mut loaded = 0;
    let mut start = 0;
    while start < count {
        let end = (start + BATCH).min(count) - 1;
        let rows = sqlx::query_scalar!(
            r#"
            WITH ids AS (
                SELECT i, (lpad(to_hex($4::bigint + i), 12, '0') || '7' || substr(h, 1, 3) || '8'
                           || substr(h, 4, 15))::uuid AS payment_id
                FROM generate_series($2::bigint, $3::bigint) AS i, md5($5::text || i::text) AS h
            ), paid AS (
                INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id, metadata)
                SELECT $1, payment_id, $7, $8, $9, $10 FROM ids
                RETURNING payment_id
            ), keyed AS (
                INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, payment_id, expires_at)
                SELECT $1, 'backlog-' || $5::text || '-' || ids.i, $6, payment_id, now() + interval '1 day'
                FROM ids JOIN paid USING (payment_id)
            ), queued AS (
                INSERT INTO outbox (tenant_id, payment_id, traceparent)
                SELECT $1, payment_id, $11 FROM paid
            ), audit AS (
                INSERT INTO payment_events (tenant_id, payment_id, from_status, to_status, actor, reason)
                SELECT $1, payment_id, NULL, 'pending', 'api', 'accepted' FROM paid
            )
            SELECT count(*) AS "loaded!" FROM paid
            "#,
            tenant.as_uuid(),
            i64::try_from(start)?,
            i64::try_from(end)?,
            base,
            salt,
            fingerprint.as_bytes().as_slice(),
            request.amount.minor_units(),
            request.currency.as_str(),
            request.customer_id,
            Json(&request.metadata) as _,
            TRACEPARENT,
        )
        .fetch_one(&mut *conn)
        .await
        .context("loading a backlog of pending payments")?;
        loaded += u64::try_from(rows)?;
        start = end + 1;
    }
    Ok(loaded)
}

/// Writes `count` succeeded payments for refunds to draw from, numbered from 0, as [`Refundable`]
/// names them.
///
/// Each is what the worker leaves when the provider charged: status `succeeded`, a charge id, one
/// send. As in [`load_settled`], a payment carries only its creation audit row and no ledger entry,
/// and here no idempotency key either (refunds usually come after the payment's key has expired):
/// refund intake reads none of them, only the payment's row, whose status, amount and
/// `refunds_reserved` (0) it checks.
pub async fn load_refundable(conn: &mut PgConnection, tenant: TenantId, count: u64) -> anyhow::Result<Refundable> {
    anyhow::ensure!(count < 1 << 48, "{count} refundable payments do not fit in the ids' last 48 bits");
    let request = request()?;
    let refundable = Refundable { millis: u64::try_from(base_millis(0))?, first: 0, count };
    let mut start = 0;
    while start < count {
        let end = (start + BATCH).min(count) - 1;
        let rows = sqlx::query_scalar!(
            r#"
            WITH paid AS (
                INSERT INTO payments (tenant_id, payment_id, status, amount, currency, customer_id, metadata,
                                      provider_charge_id, send_attempts, first_sent_at)
                SELECT $1, ($4::text || lpad(to_hex(i), 12, '0'))::uuid, 'succeeded', $5, $6, $7, $8,
                       'ch_' || substr(md5($4::text || i::text), 1, 24), 1, now()
                FROM generate_series($2::bigint, $3::bigint) AS i
                RETURNING payment_id
            ), audit AS (
                INSERT INTO payment_events (tenant_id, payment_id, from_status, to_status, actor, reason)
                SELECT $1, payment_id, NULL, 'pending', 'api', 'accepted' FROM paid
            )
            SELECT count(*) AS "loaded!" FROM paid
            "#,
            tenant.as_uuid(),
            i64::try_from(start)?,
            i64::try_from(end)?,
            refundable.id_prefix(),
            request.amount.minor_units(),
            request.currency.as_str(),
            request.customer_id,
            Json(&request.metadata) as _,
        )
        .fetch_one(&mut *conn)
        .await
        .context("loading refundable payments")?;
        anyhow::ensure!(
            u64::try_from(rows)? == end - start + 1,
            "loaded {rows} refundable payments of {}",
            end - start + 1
        );
        start = end + 1;
    }
    Ok(refundable)
}

/// Writes `count` succeeded payments that were refunded in full before the run, each by one
/// succeeded refund with its key (and the key's stored response) and its creation audit row: what
/// the refund tables of a service that has been refunding for a while hold. `salt` keeps their ids
/// and keys apart from other loads'.
///
/// Without them refund intake would start on empty tables, and a connection that prepares its
/// statements then keeps plans that scan them whole (the foreign-key checks of a refund's rows
/// included) until autovacuum next analyzes them. As in [`load_settled`], a payment or refund
/// carries only its creation audit row and no ledger entry: refund intake reads neither.
pub async fn load_refunded(conn: &mut PgConnection, tenant: TenantId, count: u64, salt: &str) -> anyhow::Result<u64> {
    let request = request()?;
    let refund = refund_request()?;
    let reason = refund.reason.context("the benchmark's refund body names no reason")?;
    let fingerprint = refund_fingerprint(Uuid::nil())?;
    let base = base_millis(count);
    let mut loaded = 0;
    let mut start = 0;
    while start < count {
        let end = (start + BATCH).min(count) - 1;
        let rows = sqlx::query_scalar!(
            r#"
            WITH ids AS (
                SELECT i,
                       (lpad(to_hex($4::bigint + i), 12, '0') || '7' || substr(h, 1, 3) || '8'
                        || substr(h, 4, 15))::uuid AS payment_id,
                       (lpad(to_hex($4::bigint + i), 12, '0') || '7' || substr(r, 1, 3) || '8'
                        || substr(r, 4, 15))::uuid AS refund_id
                FROM generate_series($2::bigint, $3::bigint) AS i, md5($5::text || i::text) AS h,
                     md5('refund-' || $5::text || i::text) AS r
            ), paid AS (
                INSERT INTO payments (tenant_id, payment_id, status, amount, currency, customer_id, metadata,
                                      provider_charge_id, send_attempts, first_sent_at, refunds_reserved, refunded)
                SELECT $1, payment_id, 'succeeded', $6, $7, $8, $9,
                       'ch_' || substr(md5(payment_id::text), 1, 24), 1, now(), $6, $6
                FROM ids
                RETURNING payment_id
            ), audit AS (
                INSERT INTO payment_events (tenant_id, payment_id, from_status, to_status, actor, reason)
                SELECT $1, payment_id, NULL, 'pending', 'api', 'accepted' FROM paid
            ), refunded AS (
                INSERT INTO refunds (tenant_id, refund_id, payment_id, status, amount, currency, reason, metadata,
                                     provider_refund_id, send_attempts, first_sent_at, may_have_moved, requested_by)
                SELECT $1, refund_id, payment_id, 'succeeded', $6, $7, $10, $11,
                       're_' || substr(md5(refund_id::text), 1, 24), 1, now(), true, 'api'
                FROM ids JOIN paid USING (payment_id)
                RETURNING refund_id, payment_id, provider_refund_id
            ), refund_audit AS (
                INSERT INTO refund_events (tenant_id, refund_id, seq, from_status, to_status, actor, reason, detail)
                SELECT $1, refund_id, 1, NULL, 'pending', 'api', 'accepted', jsonb_build_object('amount', $6::bigint)
                FROM refunded
            ), keyed AS (
                INSERT INTO refund_keys (tenant_id, idempotency_key, fingerprint, refund_id, expires_at,
                                         response_status, response_body)
                SELECT $1, 'refund-' || $5::text || '-' || ids.i, $12, refund_id, now() + interval '1 day', 200,
                       jsonb_build_object(
                           'id', refund_id, 'payment_id', refunded.payment_id, 'status', 'succeeded',
                           'amount', $6::bigint, 'currency', $7::text, 'reason', $10::text, 'metadata', $11::jsonb,
                           'provider_refund_id', refunded.provider_refund_id)
                FROM ids JOIN refunded USING (refund_id)
            )
            SELECT count(*) AS "loaded!" FROM refunded
            "#,
            tenant.as_uuid(),
            i64::try_from(start)?,
            i64::try_from(end)?,
            base,
            salt,
            request.amount.minor_units(),
            request.currency.as_str(),
            request.customer_id,
            Json(&request.metadata) as _,
            reason.as_str(),
            Json(&refund.metadata) as _,
            fingerprint.as_bytes().as_slice(),
        )
        .fetch_one(&mut *conn)
        .await
        .context("loading refunded payments")?;
        loaded += u64::try_from(rows)?;
        start = end + 1;
    }
    Ok(loaded)
}

/// Rows in the outbox: the worker's queue.
pub async fn outbox_depth(conn: &mut PgConnection) -> anyhow::Result<u64> {
    let depth = sqlx::query_scalar!(r#"SELECT count(*) AS "depth!" FROM outbox"#).fetch_one(conn).await?;
    Ok(u64::try_from(depth)?)
}

/// Payments that reached a final status from `from` until `until`. A runtime-checked query: the
/// offline query data is the workspace's, which this crate does not change.
pub async fn finished_between(
    conn: &mut PgConnection,
    (from, until): (time::OffsetDateTime, time::OffsetDateTime),
) -> anyhow::Result<u64> {
    let count: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM payments
         WHERE updated_at >= $1 AND updated_at < $2 AND status IN ('succeeded', 'failed')",
    )
    .bind(from)
    .bind(until)
    .fetch_one(conn)
    .await?;
    Ok(u64::try_from(count)?)
}

/// Event deliveries not yet delivered nor dead-lettered. Runtime-checked, as [`finished_between`].
pub async fn pending_deliveries(conn: &mut PgConnection) -> anyhow::Result<u64> {
    let count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM merchant_deliveries WHERE state = 'pending'").fetch_one(conn).await?;
    Ok(u64::try_from(count)?)
}

/// Makes a freshly loaded database look like one that has been running: statistics for the
/// planner, hint bits and the visibility map set (so the first reads do not write), and a
/// checkpoint, so no phase starts with a backlog of dirty pages to flush.
pub async fn settle_database(conn: &mut PgConnection) -> anyhow::Result<()> {
    sqlx::raw_sql("VACUUM (ANALYZE)").execute(&mut *conn).await.context("VACUUM ANALYZE")?;
    checkpoint(conn).await
}

/// `CHECKPOINT`: starts a phase with no dirty pages from the one before. Under Citus, on every
/// worker node too (a `CHECKPOINT` on the coordinator is the coordinator's alone).
pub async fn checkpoint(conn: &mut PgConnection) -> anyhow::Result<()> {
    sqlx::raw_sql("CHECKPOINT").execute(&mut *conn).await.context("CHECKPOINT")?;
    sqlx::raw_sql(
        "DO $$ BEGIN
             -- Nested: PL/pgSQL plans the inner test only where Citus's function exists.
             IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
                 IF EXISTS (SELECT FROM run_command_on_workers('CHECKPOINT') WHERE NOT success) THEN
                     RAISE EXCEPTION 'CHECKPOINT failed on a worker node';
                 END IF;
             END IF;
         END $$",
    )
    .execute(conn)
    .await
    .context("CHECKPOINT on the worker nodes")?;
    Ok(())
}

/// The PostgreSQL server's main process, whose children are every other PostgreSQL process.
pub async fn postmaster_pid(conn: &mut PgConnection) -> anyhow::Result<i32> {
    let backend = sqlx::query_scalar!(r#"SELECT pg_backend_pid() AS "pid!""#).fetch_one(conn).await?;
    let stat = std::fs::read_to_string(format!("/proc/{backend}/stat"))
        .with_context(|| format!("cannot read /proc/{backend}/stat (is PostgreSQL on this machine?)"))?;
    let stat = crate::cpu::parse_stat(&stat).context("cannot parse a PostgreSQL backend's /proc stat")?;
    Ok(stat.ppid)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn stored_keys_are_distinct_and_below_every_fresh_key() {
        let keys: HashSet<String> = (0..100_000).map(replay_key).collect();

        assert_eq!(keys.len(), 100_000);
        assert!(keys.iter().all(|k| k.parse::<u64>().unwrap() < *FRESH_KEYS.start()));
        assert_eq!(replay_key(0), "0");
        assert_eq!(replay_key(1), "2654435761");
        assert_eq!(replay_key(2), (2 * 2_654_435_761u64 - (1 << 32)).to_string());
    }

    #[test]
    fn a_spread_replay_set_covers_the_whole_history_with_as_many_keys_as_asked() {
        let spread = ReplaySet::spread(10_000, 10_000_000);
        let all = ReplaySet::all(10_000);

        assert_eq!(spread, ReplaySet { keys: 10_000, stride: 1_000 });
        assert_eq!(spread.key_number(9_999), replay_key_number(9_999_000), "the last is near the end");
        assert_eq!(ReplaySet::spread(10_000, 10_000), all, "a short history is replayed whole");
        assert_eq!(ReplaySet::spread(10_000, 500), ReplaySet { keys: 500, stride: 1 });
        assert_eq!(all.key_number(2).to_string(), replay_key(2));
    }

    #[test]
    fn refundable_ids_are_the_prefix_and_the_number_in_hex_as_sql_spells_them() {
        let refundable = Refundable { millis: 0x0192_f0c4_7a3e, first: 0, count: 100 };

        let id = refundable.payment_id(0x2a);

        assert_eq!(id.to_string(), "0192f0c4-7a3e-7000-8000-00000000002a");
        assert_eq!(id.simple().to_string(), format!("{}{:012x}", refundable.id_prefix(), 0x2a));
        assert_eq!(id.get_version_num(), 7);
        assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
        assert!(refundable.payment_id(1) < refundable.payment_id(2));
    }

    #[test]
    fn the_parts_of_refundable_payments_are_disjoint_and_as_large_as_each_other() {
        let refundable = Refundable { millis: 7, first: 0, count: 10 };

        let parts: Vec<Refundable> = (0..3).map(|n| refundable.part(n, 3)).collect();

        let numbers: Vec<std::ops::Range<u64>> = parts.iter().map(|part| part.numbers()).collect();
        assert_eq!(numbers, [0..3, 3..6, 6..9]);
        assert!(parts.iter().all(|part| part.millis == 7));
        assert_eq!(parts[1].part(1, 3).numbers(), 4..5, "a part of a part");
    }

    #[test]
    fn the_refund_body_is_a_valid_refund_of_one_minor_unit() {
        let refund = refund_request().unwrap();
        let payment = Uuid::from_u128(1);

        assert_eq!(refund.amount.map(|amount| amount.minor_units()), Some(1));
        assert_ne!(refund_fingerprint(payment).unwrap(), refund_fingerprint(Uuid::from_u128(2)).unwrap());
    }

    #[test]
    fn the_body_is_a_valid_payment_request() {
        let request = request().unwrap();

        assert_eq!(request.amount.minor_units(), 1999);
        assert_eq!(request.currency.as_str(), "EUR");
        assert_eq!(fingerprint().unwrap(), fingerprint().unwrap());
    }
}
