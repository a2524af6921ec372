//! Accepting a group of requests together (`intake::accept_group`) against a real PostgreSQL: each
//! request gets the result it would get alone, whatever else is in its group. Also the read of a
//! stored key (`intake::stored`) that the api makes instead of waiting for a group.

// The helpers below are test code too; clippy's test allowance only covers `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::time::Duration;

use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_store::fixtures::{Submission, body, count, tenant};
use oncepay_store::intake::{self, Intake, NewPayment};
use oncepay_store::{StoreError, payments};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use sqlx::PgPool;

/// The amount that the tests' extra CHECK constraint refuses (see [`refuse_amount`]).
const REFUSED_AMOUNT: i64 = 13;

/// Makes PostgreSQL refuse any payment of [`REFUSED_AMOUNT`], standing in for a row the database
/// refuses for one request alone.
async fn refuse_amount(pool: &PgPool) {
    let constraint = format!("ALTER TABLE payments ADD CONSTRAINT tests_refuse CHECK (amount <> {REFUSED_AMOUNT})");
    sqlx::raw_sql(sqlx::AssertSqlSafe(constraint)).execute(pool).await.unwrap();
}

fn new(tenant_id: TenantId, key: &str, body: &Value) -> NewPayment {
    Submission::new(key, body).for_tenant(tenant_id, None)
}

async fn accept_group(pool: &PgPool, group: &[NewPayment]) -> Vec<Result<Intake, StoreError>> {
    let mut conn = pool.acquire().await.unwrap();
    intake::accept_group(&mut conn, group).await
}

fn created(result: &Result<Intake, StoreError>) -> PaymentId {
    match result {
        Ok(Intake::Created(created)) => created.payment.payment_id,
        other => panic!("expected a new payment, got {other:?}"),
    }
}

fn existing(result: &Result<Intake, StoreError>) -> (PaymentId, Fingerprint) {
    match result {
        Ok(Intake::Existing(key)) => (key.payment_id, key.fingerprint),
        other => panic!("expected an existing key, got {other:?}"),
    }
}

fn sqlstate(result: &Result<Intake, StoreError>) -> String {
    match result {
        Err(error) => error.sqlstate().unwrap_or_else(|| panic!("no SQLSTATE: {error:?}")),
        Ok(intake) => panic!("expected an error, got {intake:?}"),
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_group_of_new_keys_is_written_in_one_transaction_each_with_its_own_payment(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let group: Vec<NewPayment> = (0..5).map(|i| new(tenant_id, &format!("order-{i}"), &body(100 + i))).collect();

    let results = accept_group(&pool, &group).await;

    let ids: Vec<PaymentId> = results.iter().map(created).collect();
    let mut conn = pool.acquire().await.unwrap();
    for (i, id) in ids.iter().enumerate() {
        let payment = payments::fetch(&mut conn, tenant_id, *id).await.unwrap().unwrap();
        assert_eq!(payment.amount.minor_units(), 100 + i as i64, "request {i} got another's payment");
    }
    for table in ["idempotency_keys", "payments", "outbox", "payment_events"] {
        assert_eq!(count(&pool, table).await, 5, "{table}");
    }
    // now() is the transaction's start: one value means one transaction.
    let starts = sqlx::query_scalar!(r#"SELECT count(DISTINCT created_at) AS "count!" FROM payments"#)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(starts, 1);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn each_payment_of_a_group_keeps_its_own_method_customer_and_account(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let group: Vec<NewPayment> = (0..3)
        .map(|i| {
            let mut paying = body(100 + i);
            paying["payment_method"] = json!(format!("pm_{i}"));
            paying["provider_customer"] = json!(format!("cus_{i}"));
            let account = ProviderAccount::parse(&format!("acct_{i}")).unwrap();
            NewPayment { provider_account: Some(account), ..new(tenant_id, &format!("order-{i}"), &paying) }
        })
        .collect();

    let ids: Vec<PaymentId> = accept_group(&pool, &group).await.iter().map(created).collect();

    let mut conn = pool.acquire().await.unwrap();
    for (i, id) in ids.iter().enumerate() {
        let payment = payments::fetch(&mut conn, tenant_id, *id).await.unwrap().unwrap();
        let stored = (
            payment.payment_method.as_ref().map(|m| m.as_str().to_owned()),
            payment.provider_customer.as_ref().map(|c| c.as_str().to_owned()),
            payment.provider_account.as_ref().map(|a| a.as_str().to_owned()),
        );
        assert_eq!(
            stored,
            (Some(format!("pm_{i}")), Some(format!("cus_{i}")), Some(format!("acct_{i}"))),
            "request {i}"
        );
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_stored_key_in_a_group_is_returned_as_stored_and_nothing_is_written_for_it(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let stored = created(&accept_group(&pool, &[new(tenant_id, "order-1", &body(100))]).await[0]);

    let results = accept_group(
        &pool,
        &[
            new(tenant_id, "order-0", &body(100)),
            new(tenant_id, "order-1", &body(5)),
            new(tenant_id, "order-2", &body(100)),
        ],
    )
    .await;

    created(&results[0]);
    assert_eq!(existing(&results[1]), (stored, Fingerprint::of("POST", "/v1/payments", &body(100))));
    created(&results[2]);
    assert_eq!(count(&pool, "payments").await, 3);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_stored_read_finds_a_key_as_a_group_answers_it_and_not_a_key_still_being_written(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let (first, written) = (new(tenant_id, "order-1", &body(100)), new(tenant_id, "order-2", &body(100)));
    created(&accept_group(&pool, std::slice::from_ref(&first)).await[0]);
    let mut holder = pool.begin().await.unwrap();
    intake::accept(&mut holder, &written).await.unwrap().created().expect("written by the holder");
    let mut conn = pool.acquire().await.unwrap();

    let read = intake::stored(&mut conn, tenant_id, &first.key).await.unwrap().expect("a stored key");
    let uncommitted = intake::stored(&mut conn, tenant_id, &written.key).await.unwrap();
    let unknown = intake::stored(&mut conn, tenant_id, &new(tenant_id, "order-3", &body(100)).key).await.unwrap();

    let Ok(Intake::Existing(answered)) = accept_group(&pool, &[first]).await.remove(0) else {
        panic!("the group did not find the stored key");
    };
    assert_eq!(
        (read.payment_id, read.fingerprint, read.expires_at, read.stored_response.is_none()),
        (answered.payment_id, answered.fingerprint, answered.expires_at, answered.stored_response.is_none())
    );
    assert!(uncommitted.is_none(), "another transaction's key is not seen before it commits");
    assert!(unknown.is_none());
    holder.rollback().await.unwrap();
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn keys_read_together_come_back_in_order_each_as_the_single_read_finds_it(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let other_tenant = tenant(&pool, "globex").await;
    let stored = [new(tenant_id, "order-1", &body(100)), new(tenant_id, "order-2", &body(200))];
    for result in accept_group(&pool, &stored).await {
        created(&result);
    }
    let theirs = new(other_tenant, "order-3", &body(300));
    created(&accept_group(&pool, std::slice::from_ref(&theirs)).await[0]);
    let unknown = new(tenant_id, "order-4", &body(100));
    let mut conn = pool.acquire().await.unwrap();

    let keys = [&stored[1].key, &unknown.key, &theirs.key, &stored[0].key, &stored[1].key];
    let read = intake::stored_many(&mut conn, tenant_id, &keys).await.unwrap();

    let one_by_one = [
        intake::stored(&mut conn, tenant_id, &stored[1].key).await.unwrap(),
        None,
        None,
        intake::stored(&mut conn, tenant_id, &stored[0].key).await.unwrap(),
        intake::stored(&mut conn, tenant_id, &stored[1].key).await.unwrap(),
    ];
    let ids = |keys: &[Option<intake::ExistingKey>]| {
        keys.iter().map(|k| k.as_ref().map(|k| k.payment_id)).collect::<Vec<_>>()
    };
    assert_eq!(ids(&read), ids(&one_by_one), "in order, another tenant's key not found");
    assert!(read[0].is_some() && read[3].is_some());
    assert_eq!(read[0].as_ref().unwrap().fingerprint, stored[1].fingerprint);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_lock_wait_given_with_the_call_holds_where_the_session_has_none(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let mut holder = pool.begin().await.unwrap();
    intake::accept(&mut holder, &new(tenant_id, "order-2", &body(100))).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    // The session would wait for ever, as a Citus node's session does for a delegated call.
    sqlx::raw_sql("SET lock_timeout = 0").execute(&mut *conn).await.unwrap();
    let waits =
        |key: &str| NewPayment { lock_wait: Some(Duration::from_millis(200)), ..new(tenant_id, key, &body(100)) };

    let alone = intake::accept_deferring_wakeup(&mut conn, &waits("order-2")).await;
    let together = intake::accept_group(&mut conn, &[waits("order-1"), waits("order-2")]).await;

    assert_eq!(sqlstate(&alone), "55P03", "lock_not_available: the api answers 409");
    created(&together[0]);
    assert_eq!(sqlstate(&together[1]), "55P03");
    holder.rollback().await.unwrap();
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_second_request_with_a_key_already_in_the_group_finds_the_first_ones_key(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let group = [
        new(tenant_id, "order-1", &body(100)),
        new(tenant_id, "order-1", &body(100)),
        new(tenant_id, "order-2", &body(100)),
        new(tenant_id, "order-1", &body(5)),
    ];

    let results = accept_group(&pool, &group).await;

    let first = created(&results[0]);
    let fingerprint = Fingerprint::of("POST", "/v1/payments", &body(100));
    assert_eq!(existing(&results[1]), (first, fingerprint), "a retry");
    created(&results[2]);
    assert_eq!(existing(&results[3]), (first, fingerprint), "a misuse, refused by the api with 422");
    assert_eq!(count(&pool, "payments").await, 2);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_request_whose_row_is_refused_fails_alone_and_a_later_one_with_its_key_is_accepted(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    refuse_amount(&pool).await;
    let group = [
        new(tenant_id, "order-1", &body(100)),
        new(tenant_id, "order-2", &body(REFUSED_AMOUNT)),
        new(tenant_id, "order-3", &body(100)),
        new(tenant_id, "order-2", &body(200)),
    ];

    let results = accept_group(&pool, &group).await;

    created(&results[0]);
    assert_eq!(sqlstate(&results[1]), "23514", "check_violation");
    created(&results[2]);
    created(&results[3]);
    for table in ["idempotency_keys", "payments", "outbox", "payment_events"] {
        assert_eq!(count(&pool, table).await, 3, "{table}");
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_key_another_transaction_holds_past_the_lock_wait_fails_alone(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let mut holder = pool.begin().await.unwrap();
    intake::accept(&mut holder, &new(tenant_id, "order-2", &body(100))).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query!("SET lock_timeout = '200ms'").execute(&mut *conn).await.unwrap();
    let group = [
        new(tenant_id, "order-1", &body(100)),
        new(tenant_id, "order-2", &body(100)),
        new(tenant_id, "order-3", &body(100)),
    ];

    let results = intake::accept_group(&mut conn, &group).await;

    created(&results[0]);
    assert_eq!(sqlstate(&results[1]), "55P03", "lock_not_available: the api answers 409");
    created(&results[2]);
    holder.rollback().await.unwrap();
    assert_eq!(count(&pool, "payments").await, 2);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_key_committed_by_another_transaction_while_the_group_waits_is_returned_as_stored(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    // Stored before: the function answers it in its first statement, and reads it again in its
    // second, which reads the keys committed while it waited.
    let before = intake::accept(&mut pool.acquire().await.unwrap(), &new(tenant_id, "order-0", &body(5))).await;
    let before = before.unwrap().created().unwrap().payment.payment_id;
    let mut holder = pool.begin().await.unwrap();
    let theirs = intake::accept(&mut holder, &new(tenant_id, "order-2", &body(100))).await.unwrap();
    let theirs = theirs.created().unwrap().payment.payment_id;
    let group = vec![
        new(tenant_id, "order-1", &body(100)),
        new(tenant_id, "order-2", &body(100)),
        new(tenant_id, "order-3", &body(100)),
        new(tenant_id, "order-0", &body(100)),
    ];
    let writing = tokio::spawn({
        let pool = pool.clone();
        async move { accept_group(&pool, &group).await }
    });
    support::blocks_another(&pool, &mut holder).await;

    holder.commit().await.unwrap();
    let results = writing.await.unwrap();

    created(&results[0]);
    assert_eq!(existing(&results[1]).0, theirs);
    created(&results[2]);
    assert_eq!(existing(&results[3]), (before, Fingerprint::of("POST", "/v1/payments", &body(5))));
    assert_eq!(count(&pool, "payments").await, 4);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_lost_connection_fails_every_request_of_the_group_and_writes_nothing(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let mut conn = pool.acquire().await.unwrap();
    let pid = sqlx::query_scalar!(r#"SELECT pg_backend_pid() AS "pid!""#).fetch_one(&mut *conn).await.unwrap();
    sqlx::query!("SELECT pg_terminate_backend($1)", pid).fetch_one(&pool).await.unwrap();
    let group = [
        new(tenant_id, "order-1", &body(100)),
        new(tenant_id, "order-1", &body(100)),
        new(tenant_id, "order-2", &body(100)),
    ];

    let results = intake::accept_group(&mut conn, &group).await;

    assert_eq!(results.len(), 3);
    for result in &results {
        assert!(matches!(result, Err(error) if error.is_unavailable()), "{result:?}");
    }
    assert_eq!(count(&pool, "idempotency_keys").await, 0);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn requests_of_other_tenants_in_a_group_are_written_under_their_own_tenant(pool: PgPool) {
    let acme = tenant(&pool, "acme").await;
    let globex = tenant(&pool, "globex").await;
    let group =
        [new(acme, "order-1", &body(100)), new(globex, "order-1", &body(200)), new(acme, "order-2", &body(300))];

    let results = accept_group(&pool, &group).await;

    let mut conn = pool.acquire().await.unwrap();
    for ((result, tenant_id), amount) in results.iter().zip([acme, globex, acme]).zip([100, 200, 300]) {
        let payment = payments::fetch(&mut conn, tenant_id, created(result)).await.unwrap().unwrap();
        assert_eq!(payment.amount.minor_units(), amount);
    }
}

/// One request of a generated group: its key, one of a few bodies (one of which the database
/// refuses), and whether its key was stored before the group, with which body.
#[derive(Debug, Clone)]
struct Case {
    stored: Vec<(usize, usize)>,
    requests: Vec<(usize, usize)>,
}

const BODIES: [i64; 3] = [100, 200, REFUSED_AMOUNT];

fn cases() -> impl Strategy<Value = Case> {
    let request = (0..4usize, 0..BODIES.len());
    let stored = prop::collection::vec((0..4usize, 0..2usize), 0..3);
    (stored, prop::collection::vec(request, 1..12)).prop_map(|(stored, requests)| {
        // One stored body per key at most, as a key has one payment.
        let mut seen = std::collections::HashSet::new();
        let stored = stored.into_iter().filter(|(key, _)| seen.insert(*key)).collect();
        Case { stored, requests }
    })
}

/// What a request's result says, in terms that do not depend on generated ids: a new payment (of
/// which amount), an existing key (whose payment was made by which earlier request, or stored before,
/// and with which body's fingerprint), or an error (its SQLSTATE).
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Created(i64),
    Existing { made_by: Option<usize>, body: usize },
    Refused(String),
}

fn seen(result: &Result<Intake, StoreError>, made: &mut HashMap<PaymentId, usize>, i: usize) -> Seen {
    let fingerprints: Vec<Fingerprint> =
        BODIES.iter().map(|amount| Fingerprint::of("POST", "/v1/payments", &body(*amount))).collect();
    match result {
        Ok(Intake::Created(created)) => {
            made.insert(created.payment.payment_id, i);
            Seen::Created(created.payment.amount.minor_units())
        }
        Ok(Intake::Existing(key)) => Seen::Existing {
            made_by: made.get(&key.payment_id).copied(),
            body: fingerprints.iter().position(|f| *f == key.fingerprint).expect("a known body"),
        },
        Err(error) => Seen::Refused(error.sqlstate().unwrap_or_else(|| format!("{error:?}"))),
    }
}

/// Runs `case` for a fresh tenant: each request alone, one after the other, then all in one group,
/// and compares what each request saw.
async fn check(pool: &PgPool, case: &Case, n: usize) -> Result<(), TestCaseError> {
    let alone = tenant(pool, &format!("alone-{n}")).await;
    let together = tenant(pool, &format!("together-{n}")).await;
    let requests = |tenant_id| -> Vec<NewPayment> {
        case.requests.iter().map(|(key, b)| new(tenant_id, &format!("key-{key}"), &body(BODIES[*b]))).collect()
    };
    let mut conn = pool.acquire().await.unwrap();
    for tenant_id in [alone, together] {
        for (key, b) in &case.stored {
            let stored = new(tenant_id, &format!("key-{key}"), &body(BODIES[*b]));
            intake::accept(&mut conn, &stored).await.unwrap();
        }
    }

    let mut expected = Vec::new();
    let mut made = HashMap::new();
    for (i, request) in requests(alone).iter().enumerate() {
        let result = intake::accept_deferring_wakeup(&mut conn, request).await;
        expected.push(seen(&result, &mut made, i));
    }
    let results = intake::accept_group(&mut conn, &requests(together)).await;
    let mut made = HashMap::new();
    let actual: Vec<Seen> = results.iter().enumerate().map(|(i, result)| seen(result, &mut made, i)).collect();

    prop_assert_eq!(actual, expected);
    Ok(())
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn any_group_of_duplicate_conflicting_and_refused_requests_gets_the_results_each_would_get_alone(pool: PgPool) {
    refuse_amount(&pool).await;
    let runtime = tokio::runtime::Handle::current();
    // proptest drives the cases synchronously; each case runs on the test's runtime.
    let outcome = tokio::task::spawn_blocking(move || {
        let mut runner = TestRunner::new(Config { cases: 64, ..Config::default() });
        let n = std::sync::atomic::AtomicUsize::new(0);
        runner.run(&cases(), |case| {
            let n = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            runtime.block_on(check(&pool, &case, n))
        })
    })
    .await
    .unwrap();

    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}
