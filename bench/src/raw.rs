//! The raw-SQL baselines: pgbench scripts of the project's own statements, plus the reference shape
//! of issue #8 (three plain inserts in one transaction), with the variables they need.
//!
//! The statements are embedded from the files the binaries are built from (`shared/store/sql` and
//! the query macros of `shared/store/src/refunds/intake.rs`), so a baseline
//! cannot drift from the code it measures. Where pgbench cannot pass a value as a bind parameter
//! the way the binaries do, SQL stands in, and each such difference is noted where it is made.

use anyhow::{Context, ensure};
use oncepay_store::refunds::REFUND_OUTBOX_CHANNEL;

use crate::dataset::{self, Refundable, ReplaySet};
use crate::pgbench_script::{Arg, Script, command, macro_statements};

const ACCEPT_SQL: &str = include_str!("../../shared/store/sql/accept.sql");
const ACCEPT_GROUP_SQL: &str = include_str!("../../shared/store/sql/accept_group.sql");
const REPLAY_SQL: &str = include_str!("../../shared/store/sql/replay.sql");
const SETTLE_SQL: &str = include_str!("../../shared/store/sql/settle.sql");
const STORE_RESPONSE_SQL: &str = include_str!("../../shared/store/sql/store_response.sql");
const CLAIM_SQL: &str = include_str!("../../shared/store/sql/claim.sql");
const TAKE_SQL: &str = include_str!("../../shared/store/sql/take.sql");
const REFUND_INTAKE_RS: &str = include_str!("../../shared/store/src/refunds/intake.rs");

/// Who asks for a refund made through the api, as the api writes it (`api/src/create_refund.rs`).
const REQUESTED_BY: &str = "api";

/// A UUID made in SQL that sorts by creation time like a UUIDv7: the current Unix millisecond in the
/// first 48 bits of a random UUID. The api makes a UUIDv7 in Rust; pgbench has no UUIDs.
pub const TIME_ORDERED_UUID: &str = "encode(overlay(uuid_send(gen_random_uuid()) placing \
     substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3) FROM 1 FOR 6), 'hex')::uuid";

/// `\set key` for a fresh key.
fn fresh_key(script: Script) -> Script {
    let range = dataset::FRESH_KEYS;
    script.set("key", &format!("random({}, {})", range.start(), range.end()))
}

/// Which baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// Issue #8's reference: key, payment and outbox row as three plain inserts in one transaction.
    ThreeInserts,
    /// `shared/store/sql/accept.sql` as the api runs it, with a fresh key: the `intake` function's key read
    /// and four inserts, the workers' wake-up left to a coalesced NOTIFY after commit.
    Accept,
    /// `shared/store/sql/accept.sql` with its in-statement NOTIFY, as the api ran it before: shows what a
    /// NOTIFY in every accept costs.
    AcceptWithNotify,
    /// `shared/store/sql/accept_group.sql` as the api runs it for a group of this many requests with fresh
    /// keys: one statement, one transaction (issue 20).
    AcceptGroup(u32),
    /// `shared/store/sql/replay.sql`: the replay read on its own (the `intake` function's first statement),
    /// of a random stored key.
    Replay,
    /// The worker's claim (`shared/store/sql/claim.sql`, one row) and its finish of a success in one
    /// transaction (`take.sql`, `settle.sql`, `store_response.sql`, each for one payment).
    ClaimFinish,
    /// Refund intake (`shared/store/src/refunds/intake.rs`) as the api runs it for a new key and a
    /// payment with money left: every statement of `intake::accept`, in its order, in one
    /// transaction, of a random one of the refundable payments.
    Refund,
}

impl Baseline {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::ThreeInserts => "three_inserts",
            Self::Accept => "accept_sql",
            Self::AcceptWithNotify => "accept_sql_notify",
            Self::AcceptGroup(_) => "accept_group_sql",
            Self::Replay => "replay_sql",
            Self::ClaimFinish => "claim_finish_sql",
            Self::Refund => "refund_sql",
        }
    }

    /// How it is run, for the report.
    pub fn setup(self) -> String {
        match self {
            Self::ThreeInserts => "pgbench: BEGIN; 3 INSERT; COMMIT".into(),
            Self::Accept => "pgbench: accept.sql".into(),
            Self::AcceptWithNotify => "pgbench: accept.sql + NOTIFY".into(),
            Self::AcceptGroup(size) => format!("pgbench: accept_group.sql of {size}"),
            Self::Replay => "pgbench: replay.sql".into(),
            Self::ClaimFinish => "pgbench: claim.sql(1) + finish tx".into(),
            Self::Refund => "pgbench: refunds/intake.rs".into(),
        }
    }

    /// The operations one pgbench transaction of it counts for: the payments of a group, else one.
    pub fn operations_per_transaction(self) -> u64 {
        match self {
            Self::AcceptGroup(size) => u64::from(size),
            _ => 1,
        }
    }

    /// The pgbench script: one transaction of this baseline.
    pub fn script(self) -> anyhow::Result<Script> {
        match self {
            Self::ThreeInserts => three_inserts(),
            Self::Accept => Ok(fresh_key(Script::new()).sql(accept("false")?)),
            Self::AcceptWithNotify => Ok(fresh_key(Script::new()).sql(accept("true")?)),
            Self::AcceptGroup(size) => Ok(fresh_key(Script::new()).sql(accept_group(size)?)),
            Self::Replay => Ok(Script::new()
                .set("i", "random(0, :keys - 1) * :stride")
                .set("key", &format!("(:i * {}) % 4294967296", dataset::SCRAMBLE))
                .sql(command(REPLAY_SQL, &[Arg::Var("tenant"), Arg::Var("key")]).context("replay.sql")?)),
            Self::ClaimFinish => claim_finish(),
            Self::Refund => refund(),
        }
    }
}

/// The accept statement, of the key in `:key`; `notify` names the variable (`false` or `true`)
/// bound to the wake-up flag.
fn accept(notify: &str) -> anyhow::Result<String> {
    let args = [
        Arg::Var("tenant"),
        Arg::Var("key"),
        Arg::Var("fingerprint"),
        Arg::Sql(TIME_ORDERED_UUID),
        Arg::Var("retention"),
        Arg::Var("amount"),
        Arg::Var("currency"),
        Arg::Var("customer"),
        // The description and the trace state: a pgbench variable cannot be NULL.
        Arg::Sql("NULL"),
        Arg::Var("metadata"),
        Arg::Var("traceparent"),
        Arg::Sql("NULL"),
        Arg::Var(notify),
        // The benchmark's body (`dataset::request`) names no payment method and no provider customer,
        // and its tenant charges through oncepay's own account.
        Arg::Sql("NULL"),
        Arg::Sql("NULL"),
        Arg::Sql("NULL"),
        Arg::Var("lock_wait"),
    ];
    command(ACCEPT_SQL, &args).context("accept.sql")
}

/// The group statement for `size` requests: keys `<:key>-1` to `<:key>-<size>`, every other value the
/// single accept's, repeated. The arrays are made in SQL, since a pgbench variable holds no array.
fn accept_group(size: u32) -> anyhow::Result<String> {
    let keys = format!("ARRAY(SELECT CAST(:key AS text) || '-' || g FROM generate_series(1, {size}) g)");
    let ids = format!("ARRAY(SELECT {TIME_ORDERED_UUID} FROM generate_series(1, {size}))");
    let repeat = |value: &str, type_name: &str| format!("array_fill(CAST({value} AS {type_name}), ARRAY[{size}])");
    let (fingerprints, amounts) = (repeat(":fingerprint", "bytea"), repeat(":amount", "bigint"));
    let (currencies, customers) = (repeat(":currency", "text"), repeat(":customer", "text"));
    let (metadata, traceparents) = (repeat(":metadata", "jsonb"), repeat(":traceparent", "text"));
    // The descriptions, payment methods, trace states, provider customers and accounts: none, as in
    // the single accept.
    let none = repeat("NULL", "text");
    let args = [
        Arg::Var("tenant"),
        Arg::Sql(&keys),
        Arg::Sql(&fingerprints),
        Arg::Sql(&ids),
        Arg::Var("retention"),
        Arg::Sql(&amounts),
        Arg::Sql(&currencies),
        Arg::Sql(&customers),
        Arg::Sql(&none),
        Arg::Sql(&metadata),
        Arg::Sql(&none),
        Arg::Sql(&traceparents),
        Arg::Sql(&none),
        Arg::Sql(&none),
        Arg::Sql(&none),
        Arg::Var("lock_wait"),
    ];
    command(ACCEPT_GROUP_SQL, &args).context("accept_group.sql")
}

fn three_inserts() -> anyhow::Result<Script> {
    let payment = command(
        "INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id, description, metadata)
         VALUES ($1, $2, $3, $4, $5, NULL, $6) RETURNING payment_id",
        &[
            Arg::Var("tenant"),
            Arg::Sql(TIME_ORDERED_UUID),
            Arg::Var("amount"),
            Arg::Var("currency"),
            Arg::Var("customer"),
            Arg::Var("metadata"),
        ],
    )?;
    let key = command(
        "INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, payment_id, expires_at)
         VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))",
        &[Arg::Var("tenant"), Arg::Var("key"), Arg::Var("fingerprint"), Arg::Var("payment_id"), Arg::Var("retention")],
    )?;
    let outbox = command(
        "INSERT INTO outbox (tenant_id, payment_id, traceparent, tracestate) VALUES ($1, $2, $3, NULL)",
        &[Arg::Var("tenant"), Arg::Var("payment_id"), Arg::Var("traceparent")],
    )?;
    // Payment first: the key and the outbox row reference it, and plain statements check their
    // foreign keys at once.
    Ok(fresh_key(Script::new()).sql("BEGIN".into()).sql_gset(payment).sql(key).sql(outbox).sql("COMMIT".into()))
}

/// Claims one row per transaction and finishes it in another, as a success: pgbench's `\gset` keeps
/// one row. (The worker claims a batch of rows in one statement and finishes whatever sends ended
/// together in one transaction.)
fn claim_finish() -> anyhow::Result<Script> {
    let claim = command(
        CLAIM_SQL,
        &[
            Arg::Var("batch"),
            Arg::Var("worker"),
            Arg::Var("lease"),
            Arg::Var("actor"),
            Arg::Var("horizon"),
            Arg::Var("tenant"),
        ],
    )
    .context("claim.sql")?;
    // The finish statements take arrays (the worker finishes many sends at once); here, of one.
    let take =
        command(TAKE_SQL, &[Arg::Var("tenant_id"), Arg::Sql("ARRAY[:payment_id]"), Arg::Sql("ARRAY[:fencing_token]")])
            .context("take.sql")?;
    let settle = command(
        SETTLE_SQL,
        &[
            Arg::Var("tenant_id"),
            Arg::Sql("ARRAY[:payment_id]"),
            Arg::Sql("ARRAY[:to_status]"),
            Arg::Sql("ARRAY[:from_status]"),
            // The provider's charge id is the payment id's text; a success has no failure code or
            // message, and a pgbench variable cannot be NULL.
            Arg::Sql("ARRAY[:payment_id]"),
            Arg::Sql("ARRAY[NULL]"),
            Arg::Sql("ARRAY[NULL]"),
            Arg::Sql("ARRAY[:actor]"),
            Arg::Sql("ARRAY[:reason]"),
            Arg::Sql("ARRAY[:detail]"),
            Arg::Sql("ARRAY[:amount]"),
            Arg::Sql("ARRAY[:currency]"),
            Arg::Sql("ARRAY[:charged_at]"),
        ],
    )
    .context("settle.sql")?;
    let store = command(
        STORE_RESPONSE_SQL,
        &[Arg::Var("tenant_id"), Arg::Sql("ARRAY[:payment_id]"), Arg::Sql("ARRAY[:response]")],
    )
    .context("store_response.sql")?;
    Ok(Script::new().sql_gset(claim).sql("BEGIN".into()).sql(take).sql(settle).sql(store).sql("COMMIT".into()))
}

/// `refunds::intake::accept` for a new key of a payment with money left, statement by statement as
/// it runs them: BEGIN, the key read, the payment's row locked, its reserve raised, the refund, its
/// key, its audit row, its outbox row, the workers' wake-up, COMMIT.
///
/// The statements are read from the query macros of `intake.rs`, each found by its first words, and
/// every statement there must be run here: one added, removed or changed in its parameters breaks
/// the benchmark. What differs, since pgbench has no UUIDs and no branches: the refund id is made
/// in the refund's INSERT (as a time-ordered UUID, like the api's UUIDv7) and read back with
/// `\gset` for the statements after it; the payment id is made in SQL from a random number
/// ([`Refundable`]'s scheme) in each of the three statements that name it; the checks between the
/// payment's read and its update (status, money left) are Rust in the api and left out here, the
/// dataset making them pass; and one fingerprint serves every refund (the api's covers the
/// payment's path; it has the same size).
fn refund() -> anyhow::Result<Script> {
    let statements = macro_statements(REFUND_INTAKE_RS).context("refunds/intake.rs")?;
    let payment = "CAST(CAST(:refundable_prefix AS text) || lpad(to_hex(CAST(:p AS bigint)), 12, '0') AS uuid)";
    let runs = [
        ("SELECT fingerprint,", vec![Arg::Var("tenant"), Arg::Var("key")]),
        ("SELECT status", vec![Arg::Var("tenant"), Arg::Sql(payment)]),
        (
            "UPDATE payments SET refunds_reserved",
            vec![Arg::Var("tenant"), Arg::Sql(payment), Arg::Var("refund_amount")],
        ),
        // No trace state, here and on the outbox row: a pgbench variable cannot be NULL.
        (
            "INSERT INTO refunds ",
            vec![
                Arg::Var("tenant"),
                Arg::Sql(TIME_ORDERED_UUID),
                Arg::Sql(payment),
                Arg::Var("refund_amount"),
                Arg::Var("refund_reason"),
                Arg::Var("refund_metadata"),
                Arg::Var("requested_by"),
                Arg::Var("currency"),
                Arg::Var("traceparent"),
                Arg::Sql("NULL"),
            ],
        ),
        (
            "INSERT INTO refund_keys ",
            vec![
                Arg::Var("tenant"),
                Arg::Var("key"),
                Arg::Var("refund_fingerprint"),
                Arg::Var("refund_id"),
                Arg::Var("retention"),
            ],
        ),
        (
            "INSERT INTO refund_events ",
            vec![Arg::Var("tenant"), Arg::Var("refund_id"), Arg::Var("requested_by"), Arg::Var("refund_amount")],
        ),
        (
            "INSERT INTO refund_outbox ",
            vec![Arg::Var("tenant"), Arg::Var("refund_id"), Arg::Var("traceparent"), Arg::Sql("NULL")],
        ),
        ("SELECT pg_notify(", vec![Arg::Var("refund_channel"), Arg::Var("tenant")]),
    ];
    ensure!(
        runs.len() == statements.len(),
        "refunds/intake.rs has {} statements and the refund baseline runs {}",
        statements.len(),
        runs.len()
    );
    let mut script =
        fresh_key(Script::new()).set("p", "random(:refundable_first, :refundable_last)").sql("BEGIN".into());
    for (start, args) in runs {
        let mut found =
            statements.iter().filter(|sql| sql.split_whitespace().collect::<Vec<_>>().join(" ").starts_with(start));
        let (Some(sql), None) = (found.next(), found.next()) else {
            anyhow::bail!("refunds/intake.rs has no one statement that starts with {start:?}");
        };
        let converted = command(sql, &args).with_context(|| format!("refunds/intake.rs: {start}…"))?;
        // The refund's columns, its id among them, become variables for the statements after it.
        script =
            if start.starts_with("INSERT INTO refunds ") { script.sql_gset(converted) } else { script.sql(converted) };
    }
    Ok(script.sql("COMMIT".into()))
}

/// The values the refund baseline's variables take, on top of [`variables`]: refunds of
/// `refundable`'s payments, with the benchmark's refund body.
pub fn refund_variables(refundable: Refundable) -> anyhow::Result<Vec<(String, String)>> {
    let request = dataset::refund_request()?;
    let amount = request.amount.context("the benchmark's refund body names no amount")?;
    let fingerprint = dataset::refund_fingerprint(refundable.payment_id(refundable.first))?;
    let numbers = refundable.numbers();
    ensure!(!numbers.is_empty(), "no refundable payments");
    let pairs: [(&str, String); 9] = [
        ("refundable_first", numbers.start.to_string()),
        ("refundable_last", (numbers.end - 1).to_string()),
        ("refundable_prefix", refundable.id_prefix()),
        ("refund_amount", amount.minor_units().to_string()),
        ("refund_reason", request.reason.context("the benchmark's refund body names no reason")?.as_str().into()),
        ("refund_metadata", serde_json::to_string(&request.metadata)?),
        ("refund_fingerprint", format!("\\x{}", hex_bytes(fingerprint.as_bytes()))),
        ("requested_by", REQUESTED_BY.into()),
        ("refund_channel", REFUND_OUTBOX_CHANNEL.into()),
    ];
    Ok(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

/// The values every script's variables take (`pgbench -D name=value`); replays pick from `replays`.
pub fn variables(tenant: &dataset::Tenant, replays: ReplaySet) -> anyhow::Result<Vec<(String, String)>> {
    let request = dataset::request()?;
    let fingerprint = dataset::fingerprint()?;
    let now = time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339)?;
    let metadata = serde_json::to_string(&request.metadata)?;
    let response = serde_json::json!({
        "id": "0190f5d2-6f2a-7c1e-8a3b-4c5d6e7f8091", "status": "succeeded", "amount": request.amount.minor_units(),
        "currency": request.currency.as_str(), "customer_id": request.customer_id, "metadata": request.metadata,
        "created_at": now, "updated_at": now, "provider_charge_id": "ch_0123456789abcdefghijklmn",
    });
    let pairs: [(&str, String); 23] = [
        ("tenant", tenant.id.to_string()),
        ("fingerprint", format!("\\x{}", hex_bytes(fingerprint.as_bytes()))),
        ("retention", "86400".into()),
        // The api's default `intake.key_lock_wait_ms`, which it passes to intake.
        ("lock_wait", "500".into()),
        ("amount", request.amount.minor_units().to_string()),
        ("currency", request.currency.as_str().into()),
        ("customer", request.customer_id.clone()),
        ("metadata", metadata),
        ("traceparent", dataset::TRACEPARENT.into()),
        ("false", "false".into()),
        ("true", "true".into()),
        ("keys", replays.keys.max(1).to_string()),
        ("stride", replays.stride.max(1).to_string()),
        ("batch", "1".into()),
        ("worker", "bench-raw".into()),
        ("actor", "worker:bench-raw".into()),
        ("lease", "60".into()),
        // The worker's default key window (24 h) minus its safety margin (1 h).
        ("horizon", "82800".into()),
        ("to_status", "succeeded".into()),
        ("from_status", "processing".into()),
        ("reason", "the provider charged the customer (ch_0123456789abcdefghijklmn)".into()),
        ("detail", r#"{"attempt": 1, "fencing_token": 1}"#.into()),
        ("charged_at", now.clone()),
    ];
    let mut variables: Vec<(String, String)> = pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    variables.push(("response".into(), response.to_string()));
    Ok(variables)
}

fn hex_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Baseline; 7] = [
        Baseline::ThreeInserts,
        Baseline::Accept,
        Baseline::AcceptWithNotify,
        Baseline::AcceptGroup(3),
        Baseline::Replay,
        Baseline::ClaimFinish,
        Baseline::Refund,
    ];

    #[test]
    fn every_baseline_converts_the_current_sql_files() {
        for baseline in ALL {
            let text = baseline.script().unwrap().text();

            assert!(!text.contains('$'), "{}: {text}", baseline.name());
            assert!(!text.contains("--"), "{}: {text}", baseline.name());
        }
    }

    #[test]
    fn the_accept_baselines_differ_only_in_the_wakeup_flag() {
        let quiet = Baseline::Accept.script().unwrap().text();
        let notifying = Baseline::AcceptWithNotify.script().unwrap().text();

        assert!(
            quiet.contains("FROM intake(:tenant, :key,")
                && quiet.contains(", :false, (NULL), (NULL), (NULL), :lock_wait);"),
            "{quiet}"
        );
        assert_eq!(quiet.replace(":false", ":true"), notifying);
    }

    #[test]
    fn a_group_is_one_statement_of_the_groups_size_with_a_fresh_key_each() {
        let group = Baseline::AcceptGroup(3).script().unwrap().text();

        assert_eq!(group.lines().filter(|line| line.contains("intake_group(")).count(), 1, "{group}");
        assert!(group.contains("generate_series(1, 3)") && group.contains("ARRAY[3]"), "{group}");
        assert!(!group.contains("BEGIN"), "one statement is one transaction: {group}");
        assert_eq!(Baseline::AcceptGroup(3).operations_per_transaction(), 3);
    }

    #[test]
    fn the_claim_finish_baseline_claims_one_row_and_finishes_it_in_one_transaction() {
        let text = Baseline::ClaimFinish.script().unwrap().text();
        let lines: Vec<&str> = text.lines().collect();

        assert_eq!(lines.len(), 6, "{text}");
        assert!(
            lines[0].contains("FROM claim_sends(:tenant, :batch, :worker, :lease, :actor)")
                && lines[0].ends_with("\\gset"),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains(r#"fencing_token AS "fencing_token""#), "{}", lines[0]);
        assert_eq!((lines[1], lines[5]), ("BEGIN;", "COMMIT;"));
        assert!(lines[2].starts_with("DELETE FROM outbox"), "{}", lines[2]);
        assert!(
            lines[2].contains("unnest((ARRAY[:payment_id])::uuid[], (ARRAY[:fencing_token])::bigint[])"),
            "{}",
            lines[2]
        );
        assert!(lines[2].contains("o.tenant_id = :tenant_id"), "{}", lines[2]);
        assert!(
            lines[3].contains("FROM settle_payments(:tenant_id::uuid,") && !lines[3].contains("pg_notify"),
            "{}",
            lines[3]
        );
        assert!(lines[4].contains("UPDATE idempotency_keys k") && lines[4].contains("response_body"), "{}", lines[4]);
    }

    #[test]
    fn the_refund_baseline_runs_every_intake_statement_in_its_order_in_one_transaction() {
        let text = Baseline::Refund.script().unwrap().text();
        let lines: Vec<&str> = text.lines().collect();
        let payment = "(CAST(CAST(:refundable_prefix AS text) || lpad(to_hex(CAST(:p AS bigint)), 12, '0') AS uuid))";

        assert_eq!(lines.len(), 12, "{text}");
        assert_eq!(
            (lines[1], lines[2], lines[11]),
            ("\\set p random(:refundable_first, :refundable_last)", "BEGIN;", "COMMIT;")
        );
        assert!(
            lines[3].contains("FROM refund_keys WHERE tenant_id = :tenant AND idempotency_key = :key;"),
            "{}",
            lines[3]
        );
        assert!(lines[4].contains(&format!("payment_id = {payment} FOR UPDATE;")), "{}", lines[4]);
        assert!(
            lines[5].starts_with("UPDATE payments SET refunds_reserved = refunds_reserved + :refund_amount"),
            "{}",
            lines[5]
        );
        assert!(lines[6].starts_with("INSERT INTO refunds ") && lines[6].ends_with("\\gset"), "{}", lines[6]);
        assert!(lines[6].contains(r#"refund_id AS "refund_id""#) && lines[6].contains(payment), "{}", lines[6]);
        assert!(lines[7].starts_with("INSERT INTO refund_keys ") && lines[7].contains(":refund_id"), "{}", lines[7]);
        assert!(
            lines[8].starts_with("INSERT INTO refund_events ") && lines[8].contains(":refund_amount::bigint"),
            "{}",
            lines[8]
        );
        assert!(lines[9].starts_with("INSERT INTO refund_outbox ") && lines[9].ends_with(", (NULL));"), "{}", lines[9]);
        assert_eq!(lines[10], "SELECT pg_notify(:refund_channel, :tenant);");
    }

    #[test]
    fn replays_pick_stored_keys_with_the_scramble_of_the_loader() {
        let text = Baseline::Replay.script().unwrap().text();

        assert!(
            text.starts_with("\\set i random(0, :keys - 1) * :stride\n\\set key (:i * 2654435761) % 4294967296\n"),
            "{text}"
        );
        assert!(text.contains("WHERE tenant_id = :tenant AND idempotency_key = :key;"), "{text}");
    }

    #[test]
    fn every_variable_a_script_uses_is_defined_or_set_by_the_script() {
        let tenant = dataset::Tenant { id: oncepay_domain::ids::TenantId::generate(), token: String::new() };
        let refundable = Refundable { millis: 1, first: 10, count: 10 };
        let defined: Vec<String> =
            [variables(&tenant, ReplaySet::all(10)).unwrap(), refund_variables(refundable).unwrap()]
                .concat()
                .into_iter()
                .map(|(name, _)| name)
                .collect();
        // Set by the scripts themselves: \set, and \gset from the claim, the payment insert and the
        // refund insert.
        let set_in_script = ["key", "i", "p", "tenant_id", "payment_id", "fencing_token", "refund_id"];
        for baseline in ALL {
            let text = baseline.script().unwrap().text();
            for used in variables_used(&text) {
                assert!(
                    defined.contains(&used) || set_in_script.contains(&used.as_str()),
                    "{}: :{used} is never set",
                    baseline.name()
                );
            }
        }
    }

    /// `:name` occurrences outside string literals (`::type` casts excluded).
    fn variables_used(text: &str) -> Vec<String> {
        let mut used = Vec::new();
        let mut in_literal = false;
        let chars: Vec<char> = text.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '\'' => in_literal = !in_literal,
                ':' if !in_literal && chars.get(i + 1) == Some(&':') => i += 1,
                ':' if !in_literal => {
                    let name: String =
                        chars[i + 1..].iter().take_while(|c| c.is_ascii_alphanumeric() || **c == '_').collect();
                    if !name.is_empty() {
                        used.push(name);
                    }
                }
                _ => {}
            }
            i += 1;
        }
        used
    }
}
