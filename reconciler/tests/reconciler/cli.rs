//! The operator CLI: the command functions against a real PostgreSQL, and the real binary run as a
//! child process against a `#[sqlx::test]` database.

use std::process::{Command, Output};
use std::time::Duration;

use oncepay_domain::api_key;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::status::PaymentStatus;
use oncepay_ops::dead_letters::actions::{self, BookedCharge, Operator, Resolution, Retry};
use oncepay_ops::dead_letters::queries::{self, Filter};
use oncepay_ops::dead_letters::{self, Kind};
use oncepay_ops::operator_error::OperatorError;
use oncepay_ops::operators::{Role, tokens};
use oncepay_ops::render::Report;
use oncepay_ops::tenants;
use oncepay_provider::ChargeStatus;
use oncepay_provider::wire::{EventType, WebhookEvent};
use oncepay_reconciler::unknown::Why;
use oncepay_reconciler::unknown::payments as unknown;
use oncepay_reconciler::webhooks;
use oncepay_store::db;
use oncepay_store::fixtures::{self, count, tenant};
use oncepay_store::tenants::find_api_key;
use serde_json::json;
use sqlx::PgPool;
use time::OffsetDateTime;
use wiremock::matchers::{method, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, count_for, dead_lettered, status};

const DAY: i64 = 86_400;
const HORIZON: Duration = Duration::from_secs((DAY - 3600) as u64);

/// Whether `token` authenticates as the api checks it: parse, primary-key read, hash comparison.
async fn authenticates(pool: &PgPool, token: &str) -> bool {
    let Some(presented) = api_key::parse(token) else { return false };
    let mut conn = pool.acquire().await.unwrap();
    let stored = find_api_key(&mut conn, presented.tenant_id, &presented.key_id).await.unwrap();
    stored.is_some_and(|key| !key.revoked && presented.secret_hash.matches(&key.secret_sha256))
}

fn reconciler(database_url: &str, args: &[&str]) -> Output {
    command(database_url, args).env_remove("USER").output().unwrap()
}

pub(crate) fn command(database_url: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_oncepay-reconciler"));
    command.args(args).env("DATABASE_URL", database_url).env_remove("ONCEPAY_CONFIG");
    command
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_new_tenants_keys_authenticate_and_a_revoked_one_does_not(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let acme = TenantId::generate();

    let created = tenants::create(&mut conn, acme, "acme", Some(50), None).await.unwrap();
    let first = tenants::issue_key(&mut conn, acme).await.unwrap();
    let second = tenants::issue_key(&mut conn, acme).await.unwrap();
    tenants::revoke_key(&mut conn, "acme", &first.key_id).await.unwrap();

    assert_eq!(created.rate_limit_per_second, Some(50));
    assert_ne!(first.api_key, second.api_key);
    assert!(!authenticates(&pool, &first.api_key).await);
    assert!(authenticates(&pool, &second.api_key).await);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn tenant_commands_refuse_what_cannot_be_done_and_change_nothing(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    tenants::create(&mut conn, TenantId::generate(), "acme", None, Some("acct_1")).await.unwrap();

    let taken = tenants::create(&mut conn, TenantId::generate(), "acme", None, None).await;
    let account_taken = tenants::create(&mut conn, TenantId::generate(), "globex", None, Some("acct_1")).await;
    let bad_name = tenants::create(&mut conn, TenantId::generate(), "Acme Corp", None, None).await;
    let bad_limit = tenants::create(&mut conn, TenantId::generate(), "globex", Some(0), None).await;
    let no_tenant = tenants::issue_key(&mut conn, TenantId::generate()).await;
    let no_key = tenants::revoke_key(&mut conn, "acme", "0123456789abcdef").await;

    assert!(matches!(taken, Err(OperatorError::Refused(_))), "{taken:?}");
    assert!(
        matches!(&account_taken, Err(OperatorError::Refused(why)) if why.contains("belongs to another tenant")),
        "{account_taken:?}"
    );
    assert!(matches!(bad_name, Err(OperatorError::Invalid(_))), "{bad_name:?}");
    assert!(matches!(bad_limit, Err(OperatorError::Invalid(_))), "{bad_limit:?}");
    assert!(matches!(no_tenant, Err(OperatorError::NotFound(_))), "{no_tenant:?}");
    assert!(matches!(no_key, Err(OperatorError::NotFound(_))), "{no_key:?}");
    assert_eq!(count(&pool, "tenants").await, 1);
    assert_eq!(count(&pool, "api_keys").await, 0);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_operator_connects_a_tenant_to_its_provider_account_and_disconnects_it(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let acme = TenantId::generate();
    let created = tenants::create(&mut conn, acme, "acme", None, Some("acct_1")).await.unwrap();

    let moved = tenants::connect(&mut conn, acme, Some("acct_2")).await.unwrap();
    let listed = tenants::list(&mut conn).await.unwrap();
    let removed = tenants::connect(&mut conn, acme, None).await.unwrap();
    let malformed = tenants::connect(&mut conn, acme, Some("acct-2")).await;
    let nobody = tenants::connect(&mut conn, TenantId::generate(), Some("acct_3")).await;

    assert_eq!(created.provider_account.as_deref(), Some("acct_1"));
    assert_eq!(moved.provider_account.as_deref(), Some("acct_2"));
    assert_eq!(listed.0[0].provider_account.as_deref(), Some("acct_2"));
    assert_eq!(removed.provider_account, None);
    assert!(matches!(malformed, Err(OperatorError::Invalid(_))), "{malformed:?}");
    assert!(matches!(nobody, Err(OperatorError::NotFound(_))), "{nobody:?}");
    let stored: Option<String> =
        sqlx::query_scalar!("SELECT provider_account FROM tenants").fetch_one(&pool).await.unwrap();
    assert_eq!(stored, None, "a refused change changes nothing");
}

#[sqlx::test(migrations = false)]
async fn the_binary_migrates_an_empty_database_then_makes_its_first_admin_once(pool: PgPool) {
    let url = support::url_of(&pool);

    let migrated = reconciler(&url, &["migrate"]);
    let bootstrapped = reconciler(&url, &["operators", "bootstrap", "root", "--json"]);
    let again = reconciler(&url, &["operators", "bootstrap", "other"]);

    assert!(migrated.status.success(), "{}", String::from_utf8_lossy(&migrated.stderr));
    db::check_ready(&pool).await.unwrap();
    assert!(bootstrapped.status.success(), "{}", String::from_utf8_lossy(&bootstrapped.stderr));
    let json: serde_json::Value = serde_json::from_slice(&bootstrapped.stdout).unwrap();
    assert!(json["notice"].as_str().unwrap().contains("shown once"));
    assert!(json["password"].as_str().unwrap().len() >= 20);
    let mut conn = pool.acquire().await.unwrap();
    let admin = tokens::authenticate(&mut conn, json["token"].as_str().unwrap()).await.unwrap().unwrap();
    assert_eq!((admin.name.as_str(), admin.role), ("root", Role::Admin));
    assert_eq!(again.status.code(), Some(4));
    let stderr = String::from_utf8(again.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("has operators already"), "{stderr}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_command_waits_for_a_database_that_answers_late(pool: PgPool) {
    // The database answers on a port of its own only after 3 s, longer than the services' acquire
    // timeout (2 s): as a command run in a container just started on a busy machine may see it.
    let real = (pool.connect_options().get_host().to_owned(), pool.connect_options().get_port());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = support::url_of(&pool).replacen(&format!("{}:{}/", real.0, real.1), &format!("127.0.0.1:{port}/"), 1);
    assert!(url.contains(&format!(":{port}/")), "{url}");
    let mut bootstrap = command(&url, &["operators", "bootstrap", "root", "--json"]);
    bootstrap.env_remove("USER");
    let running = tokio::task::spawn_blocking(move || bootstrap.output().unwrap());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let late = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = late.accept().await {
            let real = real.clone();
            tokio::spawn(async move {
                let mut server = tokio::net::TcpStream::connect(real).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });

    let output = running.await.unwrap();

    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_command_gets_past_a_connection_attempt_that_hangs(pool: PgPool) {
    // The database's address takes the first connection and never answers on it, as a lost packet
    // or a name lookup that hangs leaves one attempt; the attempts after it reach the database.
    let real = (pool.connect_options().get_host().to_owned(), pool.connect_options().get_port());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let url = support::url_of(&pool).replacen(&format!("{}:{}/", real.0, real.1), &format!("127.0.0.1:{port}/"), 1);
    assert!(url.contains(&format!(":{port}/")), "{url}");
    tokio::spawn(async move {
        let (silent, _) = listener.accept().await.unwrap();
        while let Ok((mut client, _)) = listener.accept().await {
            let real = real.clone();
            tokio::spawn(async move {
                let mut server = tokio::net::TcpStream::connect(real).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
        drop(silent);
    });
    let mut bootstrap = command(&url, &["operators", "bootstrap", "root", "--json"]);
    bootstrap.env_remove("USER");

    let output = tokio::task::spawn_blocking(move || bootstrap.output().unwrap()).await.unwrap();

    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_database_that_refuses_the_connection_ends_the_wait_with_its_reason(pool: PgPool) {
    let url = support::url_of(&pool);
    let name = pool.connect_options().get_database().unwrap().to_owned();
    let url = url.replacen(&format!("/{name}"), "/no_such_database", 1);

    let output =
        tokio::task::spawn_blocking(move || reconciler(&url, &["operators", "bootstrap", "root"])).await.unwrap();

    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(r#"database "no_such_database" does not exist"#), "{stderr}");
    assert!(!stderr.contains("no connection within"), "{stderr}");
}

#[test]
fn an_unreachable_database_is_a_one_line_failure_with_exit_code_1() {
    let output = reconciler("postgres://postgres@127.0.0.1:1/nothing", &["operators", "bootstrap", "root"]);

    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot reach the database"), "{stderr}");
}

fn alice() -> Operator {
    Operator::parse("alice").unwrap()
}

/// The dead letter's resolution columns.
async fn resolution(pool: &PgPool, payment_id: PaymentId) -> (Option<String>, Option<String>, Option<String>) {
    sqlx::query!(
        "SELECT resolution, resolved_by, resolution_note FROM dead_letters WHERE payment_id = $1",
        payment_id.as_uuid()
    )
    .map(|row| (row.resolution, row.resolved_by, row.resolution_note))
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The last row of the payment's audit trail: actor, reason, to.
async fn last_audit(pool: &PgPool, payment_id: PaymentId) -> (String, String, PaymentStatus) {
    sqlx::query!(
        r#"SELECT actor, reason, to_status AS "to_status: PaymentStatus" FROM payment_events
           WHERE payment_id = $1 ORDER BY seq DESC LIMIT 1"#,
        payment_id.as_uuid()
    )
    .map(|row| (row.actor, row.reason, row.to_status))
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Whether the payment remembers that a send may have charged it.
async fn may_be_charged(pool: &PgPool, payment_id: PaymentId) -> bool {
    sqlx::query_scalar!("SELECT may_be_charged FROM payments WHERE payment_id = $1", payment_id.as_uuid())
        .fetch_one(pool)
        .await
        .unwrap()
}

fn human(report: &dyn Report) -> String {
    let mut out = Vec::new();
    report.human(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn list_and_show_give_why_evidence_attempts_age_and_the_audit_trail(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, tenant_id, "order-1", 60).await;
    let mut conn = pool.acquire().await.unwrap();

    let open = queries::list(&mut conn, Filter::Open, None).await.unwrap();
    let detail = queries::show(&mut conn, payment_id).await.unwrap();
    let missing = queries::show(&mut conn, PaymentId::generate()).await;

    assert_eq!(open.0.len(), 1);
    let entry = &open.0[0];
    assert_eq!((entry.payment_id, entry.kind.as_str(), entry.attempts), (payment_id, "unresolved", 1));
    assert_eq!(entry.tenant.as_deref(), Some("acme"));
    assert!(human(&open).contains(&payment_id.to_string()));
    let evidence: Vec<&str> =
        detail.entries[0].evidence.as_array().unwrap().iter().map(|e| e["source"].as_str().unwrap()).collect();
    assert_eq!(evidence, ["worker", "poll"]);
    let trail: Vec<(&str, PaymentStatus)> =
        detail.audit_trail.iter().map(|r| (r.actor.as_str(), r.to_status)).collect();
    assert_eq!(trail.first(), Some(&("api", PaymentStatus::Pending)));
    assert_eq!(trail.last(), Some(&("reconciler:poller", PaymentStatus::DeadLettered)));
    let text = human(&detail);
    for expected in ["why         no conclusive response", "attempts    1", "HTTP 503", "audit trail", "dead_lettered"]
    {
        assert!(text.contains(expected), "{expected} in\n{text}");
    }
    assert!(matches!(missing, Err(OperatorError::NotFound(_))), "{missing:?}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn retry_requeues_the_payment_and_records_the_operator_and_the_reason(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, tenant_id, "order-1", 60).await;
    let mut conn = pool.acquire().await.unwrap();
    let retry = Retry {
        payment_id,
        operator: &alice(),
        reason: "provider incident over, resend",
        resend_horizon: HORIZON,
        outside_key_window: false,
    };

    let done = actions::retry(&mut conn, &retry).await.unwrap();
    let again = actions::retry(&mut conn, &retry).await;

    assert_eq!((done.resolution.as_str(), done.payment_status), ("retried", PaymentStatus::Pending));
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Pending);
    assert_eq!(count_for(&pool, "outbox", payment_id).await, 1);
    assert!(may_be_charged(&pool, payment_id).await, "its first send may still have charged");
    assert_eq!(
        resolution(&pool, payment_id).await,
        (Some("retried".into()), Some("operator:alice".into()), Some("provider incident over, resend".into()))
    );
    assert_eq!(
        last_audit(&pool, payment_id).await,
        ("operator:alice".into(), "provider incident over, resend".into(), PaymentStatus::Pending)
    );
    assert!(matches!(again, Err(OperatorError::NotFound(_))), "nothing left to retry: {again:?}");
    assert_eq!(queries::list(&mut conn, Filter::Open, None).await.unwrap().0.len(), 0);
    assert_eq!(queries::list(&mut conn, Filter::All, None).await.unwrap().0.len(), 1);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_retry_past_the_providers_key_window_is_refused_unless_the_operator_insists(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, tenant_id, "order-1", 2 * DAY).await;
    let mut conn = pool.acquire().await.unwrap();
    let operator = alice();
    let retry = |outside_key_window| Retry {
        payment_id,
        operator: &operator,
        reason: "customer confirmed no charge on their statement",
        resend_horizon: HORIZON,
        outside_key_window,
    };

    let refused = actions::retry(&mut conn, &retry(false)).await;
    let unchanged = status(&pool, tenant_id, payment_id).await;
    let insisted = actions::retry(&mut conn, &retry(true)).await;

    assert!(
        matches!(&refused, Err(OperatorError::Refused(why)) if why.contains("--outside-key-window")),
        "{refused:?}"
    );
    assert_eq!(unchanged, PaymentStatus::DeadLettered);
    assert!(insisted.is_ok(), "{insisted:?}");
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Pending);
    assert!(!may_be_charged(&pool, payment_id).await, "the operator vouched that no charge was made");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn resolving_as_succeeded_books_the_providers_charge_with_an_audit_row_naming_the_operator(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, tenant_id, "order-1", 60).await;
    let provider = MockServer::start().await;
    let found = support::charge(tenant_id, payment_id, "ch_found", ChargeStatus::Succeeded, 1999);
    Mock::given(method("GET"))
        .and(query_param("idempotency_key", payment_id.downstream_key().as_str()))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [found], "has_more": false})))
        .mount(&provider)
        .await;
    let provider = fixtures::provider(&provider.uri());
    let mut conn = pool.acquire().await.unwrap();

    let unknown_charge = actions::find_charge(&mut conn, &provider, payment_id, "ch_other").await;
    let charge = actions::find_charge(&mut conn, &provider, payment_id, "ch_found").await.unwrap();
    let reason = "found in the provider dashboard";
    let done = actions::resolve(&mut conn, payment_id, &Resolution::Succeeded(charge), &alice(), reason).await.unwrap();

    assert!(matches!(unknown_charge, Err(OperatorError::Refused(_))), "{unknown_charge:?}");
    assert_eq!(done.payment_status, PaymentStatus::Succeeded);
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Succeeded);
    assert_eq!(support::ledger_entry(&pool, payment_id).await, ("ch_found".into(), 1999));
    assert_eq!(last_audit(&pool, payment_id).await, ("operator:alice".into(), reason.into(), PaymentStatus::Succeeded));
    assert_eq!(
        resolution(&pool, payment_id).await,
        (Some("succeeded".into()), Some("operator:alice".into()), Some(reason.into()))
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn resolving_as_succeeded_refuses_a_charge_for_another_amount_or_currency(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, tenant_id, "order-1", 60).await;
    let mut conn = pool.acquire().await.unwrap();
    let charge = |amount: i64, currency: &str| BookedCharge {
        charge_id: "ch_found".into(),
        amount: Amount::new(amount).unwrap(),
        currency: Currency::parse(currency).unwrap(),
        charged_at: OffsetDateTime::now_utc(),
    };

    for (amount, currency) in [(1500, "EUR"), (1999, "USD")] {
        let decision = Resolution::Succeeded(charge(amount, currency));
        let refused = actions::resolve(&mut conn, payment_id, &decision, &alice(), "found it").await;

        assert!(matches!(&refused, Err(OperatorError::Refused(why)) if why.contains("1999")), "{refused:?}");
    }
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::DeadLettered);
    assert_eq!(count(&pool, "ledger_entries").await, 0);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_conflict_on_a_terminal_payment_can_only_be_acknowledged(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, tenant_id, "order-1", 60).await;
    let mut conn = pool.acquire().await.unwrap();
    let acknowledge_unresolved =
        actions::resolve(&mut conn, payment_id, &Resolution::Acknowledge, &alice(), "seen").await;
    actions::resolve(
        &mut conn,
        payment_id,
        &Resolution::Failed { charge_id: None, force: false },
        &alice(),
        "card expired",
    )
    .await
    .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let evidence = json!([{"source": "webhook", "charge": {"id": "ch_late", "status": "succeeded"}}]);
    dead_letters::record(
        &mut tx,
        tenant_id,
        payment_id,
        Kind::Conflict,
        "a success after a recorded decline",
        evidence,
        0,
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let retry =
        Retry { payment_id, operator: &alice(), reason: "x", resend_horizon: HORIZON, outside_key_window: true };
    let charge = BookedCharge {
        charge_id: "ch_late".into(),
        amount: Amount::new(1999).unwrap(),
        currency: Currency::parse("EUR").unwrap(),
        charged_at: OffsetDateTime::now_utc(),
    };

    let retried = actions::retry(&mut conn, &retry).await;
    let resettled = actions::resolve(&mut conn, payment_id, &Resolution::Succeeded(charge), &alice(), "x").await;
    let acknowledged =
        actions::resolve(&mut conn, payment_id, &Resolution::Acknowledge, &alice(), "refunded ch_late by hand")
            .await
            .unwrap();

    assert!(matches!(acknowledge_unresolved, Err(OperatorError::Refused(_))), "{acknowledge_unresolved:?}");
    assert!(matches!(retried, Err(OperatorError::Refused(_))), "{retried:?}");
    assert!(matches!(resettled, Err(OperatorError::Refused(_))), "{resettled:?}");
    assert_eq!(
        (acknowledged.resolution.as_str(), acknowledged.payment_status),
        ("acknowledged", PaymentStatus::Failed)
    );
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Failed);
    let resolutions: Vec<(String, Option<String>, Option<String>)> = sqlx::query!(
        "SELECT kind, resolution, resolved_by FROM dead_letters WHERE payment_id = $1 ORDER BY dead_letter_id",
        payment_id.as_uuid()
    )
    .map(|row| (row.kind, row.resolution, row.resolved_by))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        resolutions,
        [
            ("unresolved".into(), Some("failed".into()), Some("operator:alice".into())),
            ("conflict".into(), Some("acknowledged".into()), Some("operator:alice".into())),
        ]
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn resolving_as_succeeded_can_rest_on_a_charge_a_signed_webhook_reported(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, tenant_id, "order-1", 2 * DAY).await;
    let data = support::charge(tenant_id, payment_id, "ch_hooked", ChargeStatus::Succeeded, 1999);
    let event = WebhookEvent { event_type: EventType::ChargeSucceeded, created: data.created, data };
    webhooks::apply(&pool, "msg_1", &event).await.unwrap();
    // Past its key window the provider no longer finds the charge by key.
    let provider = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [], "has_more": false})))
        .mount(&provider)
        .await;
    let provider = fixtures::provider(&provider.uri());
    let mut conn = pool.acquire().await.unwrap();

    let charge = actions::find_charge(&mut conn, &provider, payment_id, "ch_hooked").await.unwrap();
    let unheard_of = actions::find_charge(&mut conn, &provider, payment_id, "ch_other").await;

    assert_eq!((charge.charge_id.as_str(), charge.amount.minor_units()), ("ch_hooked", 1999));
    assert!(matches!(&unheard_of, Err(OperatorError::Refused(why)) if why.contains("--amount")), "{unheard_of:?}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_retry_past_the_key_window_is_refused_while_a_recorded_charge_says_it_succeeded(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, tenant_id, "order-1", 2 * DAY).await;
    let data = support::charge(tenant_id, payment_id, "ch_hooked", ChargeStatus::Succeeded, 1999);
    let event = WebhookEvent { event_type: EventType::ChargeSucceeded, created: data.created, data };
    webhooks::apply(&pool, "msg_1", &event).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let retry = Retry {
        payment_id,
        operator: &alice(),
        reason: "customer saw no charge",
        resend_horizon: HORIZON,
        outside_key_window: true,
    };

    let refused = actions::retry(&mut conn, &retry).await;

    assert!(matches!(&refused, Err(OperatorError::Refused(why)) if why.contains("ch_hooked")), "{refused:?}");
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::DeadLettered);
    assert!(may_be_charged(&pool, payment_id).await, "nobody vouched that no charge was made");
    assert_eq!(count_for(&pool, "outbox", payment_id).await, 0, "nothing is sent again");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn resolving_as_failed_is_refused_while_a_recorded_charge_says_it_succeeded(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, tenant_id, "order-1", 60).await;
    let data = support::charge(tenant_id, payment_id, "ch_hooked", ChargeStatus::Succeeded, 1999);
    let event = WebhookEvent { event_type: EventType::ChargeSucceeded, created: data.created, data };
    webhooks::apply(&pool, "msg_1", &event).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();

    let failed = |force| Resolution::Failed { charge_id: None, force };

    let refused = actions::resolve(&mut conn, payment_id, &failed(false), &alice(), "customer saw no charge").await;
    let unchanged = status(&pool, tenant_id, payment_id).await;
    let forced = actions::resolve(&mut conn, payment_id, &failed(true), &alice(), "refunded ch_hooked").await;

    assert!(matches!(&refused, Err(OperatorError::Refused(why)) if why.contains("ch_hooked")), "{refused:?}");
    assert_eq!(unchanged, PaymentStatus::DeadLettered);
    assert!(forced.is_ok(), "{forced:?}");
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Failed);
    assert_eq!(last_audit(&pool, payment_id).await.1, "refunded ch_hooked");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_succeeded_charge_in_an_earlier_dead_letters_evidence_still_refuses_settling_as_failed(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, tenant_id, "order-1", 60).await;
    let mut conn = pool.acquire().await.unwrap();
    // A lookup found the charge, after the entry was opened; an operator retried anyway.
    let evidence = json!([{"source": "poll", "charge": {"id": "ch_found", "status": "succeeded"}}]);
    assert!(dead_letters::attach_evidence(&mut conn, tenant_id, payment_id, evidence).await.unwrap());
    let retry = Retry {
        payment_id,
        operator: &alice(),
        reason: "provider back",
        resend_horizon: HORIZON,
        outside_key_window: false,
    };
    actions::retry(&mut conn, &retry).await.unwrap();
    // The resend ends uncertain again, and the poller gives up again: a second entry.
    support::claim(&pool, tenant_id, payment_id, 60).await;
    support::uncertain(&pool, tenant_id, payment_id).await;
    let mut tx = pool.begin().await.unwrap();
    let why = Why { actor: "reconciler:poller", reason: "no conclusive response" };
    unknown::exhaust(&mut tx, tenant_id, payment_id, why, json!({"source": "poll"})).await.unwrap();
    tx.commit().await.unwrap();

    let failed = Resolution::Failed { charge_id: None, force: false };
    let refused = actions::resolve(&mut conn, payment_id, &failed, &alice(), "customer saw no charge").await;

    assert!(matches!(&refused, Err(OperatorError::Refused(why)) if why.contains("ch_found")), "{refused:?}");
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::DeadLettered);
}
