//! The format CHECKs of migration 0180 against the regular expressions they replaced: for any value,
//! a row is refused by the new constraint exactly when the old expression does not match it.

// The helpers below are test code too; clippy's test allowance only covers `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use oncepay_store::fixtures::tenant;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sqlx::{PgConnection, PgPool};

/// One format: the expression it replaced, the constraint that now checks it, and how to write a row
/// with a value in the checked column (`$1` the value, `$2` the tenant).
struct Format {
    regex: &'static str,
    constraint: &'static str,
    writes: &'static [&'static str],
}

/// The payment the rows of the other tables below belong to (`$2` the tenant; `$1` is not used).
const A_PAYMENT: &str = "INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id)
                         VALUES ($2, '00000000-0000-0000-0000-000000000001', 100, 'EUR', 'cus_1')";

const KEY: Format = Format {
    regex: "^[!-~]{1,255}$",
    constraint: "idempotency_keys_idempotency_key_check",
    writes: &["INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, payment_id, expires_at)
               VALUES ($2, $1, sha256(''), gen_random_uuid(), now() + interval '1 day')"],
};

const CURRENCY: Format = Format {
    regex: "^[A-Z]{3}$",
    constraint: "payments_currency_check",
    writes: &["INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id)
               VALUES ($2, gen_random_uuid(), 100, $1, 'cus_1')"],
};

const LEDGER_CURRENCY: Format = Format {
    regex: "^[A-Z]{3}$",
    constraint: "ledger_entries_currency_check",
    writes: &[
        A_PAYMENT,
        "INSERT INTO ledger_entries (tenant_id, payment_id, provider_charge_id, amount, currency, charged_at)
         VALUES ($2, '00000000-0000-0000-0000-000000000001', 'ch_1', 100, $1, now())",
    ],
};

const PAYMENT_METHOD: Format = Format {
    regex: "^[A-Za-z0-9_]{1,255}$",
    constraint: "payment_method_is_a_reference",
    writes: &["INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id, payment_method)
               VALUES ($2, gen_random_uuid(), 100, 'EUR', 'cus_1', $1)"],
};

const TRACEPARENT: Format = Format {
    regex: "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
    constraint: "outbox_traceparent_check",
    writes: &[
        A_PAYMENT,
        "INSERT INTO outbox (tenant_id, payment_id, traceparent) VALUES ($2, '00000000-0000-0000-0000-000000000001', $1)",
    ],
};

const UNKNOWN_TRACEPARENT: Format = Format {
    regex: TRACEPARENT.regex,
    constraint: "unknown_payments_traceparent_check",
    writes: &[
        A_PAYMENT,
        "INSERT INTO unknown_payments (tenant_id, payment_id, reason, traceparent)
         VALUES ($2, '00000000-0000-0000-0000-000000000001', 'a test', $1)",
    ],
};

/// Whether the old expression matches `value`, and whether the table takes a row with it (in a
/// savepoint, rolled back either way).
async fn compare(conn: &mut PgConnection, format: &Format, tenant: uuid::Uuid, value: &str) -> (bool, bool) {
    let matches = sqlx::query_scalar!(r#"SELECT $1 ~ $2 AS "matches!""#, value, format.regex)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    sqlx::raw_sql("SAVEPOINT format").execute(&mut *conn).await.unwrap();
    let mut taken = true;
    for write in format.writes {
        if let Err(error) = sqlx::query(*write).bind(value).bind(tenant).execute(&mut *conn).await {
            let refused = error.as_database_error().expect("a database error");
            assert_eq!(refused.code().as_deref(), Some("23514"), "{value:?}: {refused}");
            assert_eq!(refused.constraint(), Some(format.constraint), "{value:?}: {refused}");
            taken = false;
            break;
        }
    }
    sqlx::raw_sql("ROLLBACK TO SAVEPOINT format").execute(&mut *conn).await.unwrap();
    (matches, taken)
}

/// Values with lengths near the format's bounds: made only of `alphabet`, or of it and characters
/// around and outside it.
fn values(alphabet: &'static str, lengths: &'static [usize]) -> impl Strategy<Value = String> {
    let own: Vec<char> = alphabet.chars().collect();
    let others = vec![' ', '\t', '\n', '\u{7f}', '\u{1}', 'é', '€', '😀', 'G', 'g', '-', '_', '!', '~', 'A', 'z', '0'];
    let mixed = prop_oneof![8 => prop::sample::select(own.clone()), 1 => prop::sample::select(others)].sboxed();
    let character = prop_oneof![Just(prop::sample::select(own).sboxed()), Just(mixed)];
    let length = prop_oneof![prop::sample::select(lengths.to_vec()), 0..300usize];
    (character, length)
        .prop_flat_map(|(character, n)| prop::collection::vec(character, n))
        .prop_map(|c| c.into_iter().collect())
}

/// Valid traceparents with one character replaced, inserted or removed, or none.
fn traceparents() -> impl Strategy<Value = String> {
    let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let character = prop::sample::select(vec!['0', '9', 'a', 'f', 'g', 'A', 'F', '-', ' ', 'é']);
    (0..4u8, 0..=valid.len(), character).prop_map(move |(edit, at, c)| {
        let mut value: Vec<char> = valid.chars().collect();
        match edit {
            0 if at < value.len() => value[at] = c,
            1 => value.insert(at, c),
            2 if at < value.len() => {
                value.remove(at);
            }
            _ => {}
        }
        value.into_iter().collect()
    })
}

async fn check(pool: PgPool, format: &'static Format, values: impl Strategy<Value = String> + Send + 'static) {
    let tenant = tenant(&pool, "acme").await.as_uuid();
    let runtime = tokio::runtime::Handle::current();
    let outcome = tokio::task::spawn_blocking(move || {
        let tx = std::cell::RefCell::new(runtime.block_on(pool.begin()).unwrap());
        let mut runner = TestRunner::new(Config { cases: 512, ..Config::default() });
        runner.run(&values, |value| {
            let (matches, taken) = runtime.block_on(compare(&mut tx.borrow_mut(), format, tenant, &value));
            prop_assert_eq!(taken, matches, "{:?}", value);
            Ok(())
        })
    })
    .await
    .unwrap();
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}

const VISIBLE_ASCII: &str =
    "!\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~";
const REFERENCE: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_";

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_idempotency_key_is_refused_exactly_when_it_is_not_1_to_255_visible_ascii_characters(pool: PgPool) {
    check(pool, &KEY, values(VISIBLE_ASCII, &[0, 1, 2, 254, 255, 256])).await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_currency_is_refused_exactly_when_it_is_not_three_upper_case_letters(pool: PgPool) {
    check(pool, &CURRENCY, values("ABCDEFGHIJKLMNOPQRSTUVWXYZ", &[0, 2, 3, 3, 3, 4])).await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_ledger_currency_is_refused_exactly_when_it_is_not_three_upper_case_letters(pool: PgPool) {
    check(pool, &LEDGER_CURRENCY, values("ABCDEFGHIJKLMNOPQRSTUVWXYZ", &[0, 2, 3, 3, 3, 4])).await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_method_is_refused_exactly_when_it_is_not_1_to_255_letters_digits_and_underscores(pool: PgPool) {
    check(pool, &PAYMENT_METHOD, values(REFERENCE, &[0, 1, 2, 254, 255, 256])).await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_traceparent_is_refused_exactly_when_it_is_not_the_w3c_form(pool: PgPool) {
    check(pool, &TRACEPARENT, prop_oneof![3 => traceparents(), 1 => values("0123456789abcdef-", &[54, 55, 56])]).await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_queued_unknown_payments_traceparent_is_refused_exactly_when_it_is_not_the_w3c_form(pool: PgPool) {
    check(
        pool,
        &UNKNOWN_TRACEPARENT,
        prop_oneof![3 => traceparents(), 1 => values("0123456789abcdef-", &[54, 55, 56])],
    )
    .await;
}
