//! How operators prove who they are, through the operations API's real routes against a real
//! PostgreSQL: the code a new operator sets their own password with, changing it, the tokens a
//! session issues and what ends them, the limits on sign-ins (per source, per name, and on how many
//! password hashes run at once), and the one break-glass account when an OpenID provider is set.

use futures::future::join_all;
use oncepay_ops::operators::oidc::OidcSettings;
use oncepay_store::fixtures::tenant;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::support::Ops;

/// The problem's detail.
fn detail(body: &Value) -> &str {
    body["detail"].as_str().unwrap_or_default()
}

/// Refused sign-ins of `name` in the audit trail, by what the refusal says.
async fn refusals(pool: &PgPool, name: &str, refusal: &str) -> i64 {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM operator_audit
           WHERE action = 'session.sign_in' AND outcome = 'refused' AND operator_name = $1 AND detail->>'refusal' = $2"#,
        name,
        refusal
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Issues `name` a token with the session `cookie`; the status and the token, if one was issued.
async fn issue_with_session(ops: &Ops, cookie: &str, name: &str) -> (StatusCode, Option<String>, Value) {
    let body = json!({ "label": "laptop", "reason": "my own" });
    let (status, issued) =
        ops.as_session(cookie, Method::POST, &format!("/v1/operators/{name}/tokens"), Some(body)).await;
    (status, issued["token"].as_str().map(str::to_owned), issued)
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_session_older_than_the_fresh_sign_in_time_issues_no_token(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let password = ops.person("alice", "operator", None).await;
    let (_, stale) = ops.sign_in("alice", &password).await;
    sqlx::query!("UPDATE operator_sessions SET signed_in_at = now() - interval '10 minutes'")
        .execute(&pool)
        .await
        .unwrap();

    let (refused, none, why) = issue_with_session(&ops, stale.as_deref().unwrap(), "alice").await;
    let (_, fresh) = ops.sign_in("alice", &password).await;
    let (issued, token, _) = issue_with_session(&ops, fresh.as_deref().unwrap(), "alice").await;

    assert_eq!((refused, none), (StatusCode::FORBIDDEN, None), "{why}");
    assert!(detail(&why).contains("fresh sign-in"), "{why}");
    assert_eq!(issued, StatusCode::CREATED);
    assert_eq!(ops.get(&token.unwrap(), "/v1/me").await.0, StatusCode::OK);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn signing_out_everywhere_changing_the_password_and_disabling_end_the_operators_tokens(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let password = ops.person("alice", "operator", None).await;
    let new_password = "alice's second long password";
    let token_of = |password: &'static str| {
        let ops = &ops;
        async move {
            let (_, cookie) = ops.sign_in("alice", password).await;
            let cookie = cookie.unwrap();
            (issue_with_session(ops, &cookie, "alice").await.1.unwrap(), cookie)
        }
    };
    let password: &'static str = Box::leak(password.into_boxed_str());

    let (first, cookie) = token_of(password).await;
    let (everywhere, _) = ops.as_session(&cookie, Method::DELETE, "/v1/session/everywhere", None).await;
    let after_sign_out = ops.get(&first, "/v1/me").await.0;
    let (second, cookie) = token_of(password).await;
    let change = json!({ "old_password": password, "password": new_password, "reason": "rotating" });
    let (changed, why) = ops.as_session(&cookie, Method::PUT, "/v1/operators/alice/password", Some(change)).await;
    let after_change = ops.get(&second, "/v1/me").await.0;
    let (third, _) = token_of(new_password).await;
    let (disabled, _) =
        ops.call(&ops.admin, Method::DELETE, "/v1/operators/alice", Some(json!({"reason": "left"}))).await;
    let after_disable = ops.get(&third, "/v1/me").await.0;

    assert_eq!(everywhere, StatusCode::NO_CONTENT);
    assert_eq!(after_sign_out, StatusCode::UNAUTHORIZED, "signing out everywhere revokes the tokens too");
    assert_eq!(changed, StatusCode::NO_CONTENT, "{why}");
    assert_eq!(after_change, StatusCode::UNAUTHORIZED, "a new password revokes the tokens too");
    assert_eq!(disabled, StatusCode::NO_CONTENT);
    assert_eq!(after_disable, StatusCode::UNAUTHORIZED);
    let revoked: i64 = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM operator_tokens t JOIN operators o USING (operator_id)
           WHERE o.name = 'alice' AND t.revoked_at IS NOT NULL"#
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(revoked, 3);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn changing_ones_own_password_takes_the_old_one_and_a_fresh_sign_in(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let password = ops.person("alice", "operator", None).await;
    ops.person("bob", "operator", None).await;
    let new = "alice's second long password";
    let change = |old: &str| Some(json!({ "old_password": old, "password": new, "reason": "rotating" }));
    let path = "/v1/operators/alice/password";
    let (_, stale) = ops.sign_in("alice", &password).await;
    sqlx::query!("UPDATE operator_sessions SET signed_in_at = now() - interval '10 minutes'")
        .execute(&pool)
        .await
        .unwrap();
    let (_, fresh) = ops.sign_in("alice", &password).await;
    let (stale, fresh) = (stale.unwrap(), fresh.unwrap());
    let (_, own_token, _) = issue_with_session(&ops, &fresh, "alice").await;

    let (wrong_old, why_wrong) = ops.as_session(&fresh, Method::PUT, path, change("not the old password")).await;
    let (no_old, _) =
        ops.as_session(&fresh, Method::PUT, path, Some(json!({ "password": new, "reason": "rotating" }))).await;
    let (from_stale, why_stale) = ops.as_session(&stale, Method::PUT, path, change(&password)).await;
    let (with_token, _) = ops.call(&own_token.unwrap(), Method::PUT, path, change(&password)).await;
    let (by_admin, _) = ops.call(&ops.admin, Method::PUT, path, change(&password)).await;
    let unchanged = ops.sign_in("alice", new).await.0;
    let (changed, why) = ops.as_session(&fresh, Method::PUT, path, change(&password)).await;
    let (old_again, _) = ops.sign_in("alice", &password).await;
    let (new_works, _) = ops.sign_in("alice", new).await;

    assert_eq!(wrong_old, StatusCode::FORBIDDEN, "{why_wrong}");
    assert!(detail(&why_wrong).contains("old password"), "{why_wrong}");
    assert_eq!(no_old, StatusCode::BAD_REQUEST);
    assert_eq!(from_stale, StatusCode::FORBIDDEN, "{why_stale}");
    assert!(detail(&why_stale).contains("fresh sign-in"), "{why_stale}");
    assert_eq!(with_token, StatusCode::FORBIDDEN, "a token is no sign-in");
    assert_eq!(by_admin, StatusCode::FORBIDDEN, "nobody sets another operator's password");
    assert_eq!(unchanged, StatusCode::UNAUTHORIZED);
    assert_eq!(changed, StatusCode::NO_CONTENT, "{why}");
    assert_eq!(old_again, StatusCode::UNAUTHORIZED);
    assert_eq!(new_works, StatusCode::CREATED);
}

/// Creates `name` as the admin; the enrollment code the response carries.
async fn create(ops: &Ops, body: Value) -> (StatusCode, Value) {
    ops.post(&ops.admin, "/v1/operators", body).await
}

async fn enroll(ops: &Ops, name: &str, code: &str, password: &str) -> (StatusCode, Value) {
    let body = json!({ "name": name, "code": code, "password": password });
    let response = reqwest::Client::new().post(format!("{}/v1/enrollment", ops.url)).json(&body).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_new_operator_sets_their_own_password_with_a_code_that_works_once(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let password = "bob's own long password";

    let (created, bob) = create(&ops, json!({ "name": "bob", "role": "approver", "reason": "joined" })).await;
    let code = bob["enrollment"]["code"].as_str().unwrap_or_default().to_owned();
    let stored: i64 =
        sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM operator_enrollments"#).fetch_one(&pool).await.unwrap();
    let (wrong, _) = enroll(&ops, "bob", "oec_not-the-code", password).await;
    let (short, _) = enroll(&ops, "bob", &code, "short").await;
    let (enrolled, why) = enroll(&ops, "bob", &code, password).await;
    let (again, _) = enroll(&ops, "bob", &code, "someone else's password").await;
    let (signed_in, _) = ops.sign_in("bob", password).await;
    let (_, oidc_only) =
        create(&ops, json!({ "name": "olga", "role": "viewer", "oidc_subject": "olga", "reason": "joined" })).await;
    let (_, carol) = create(&ops, json!({ "name": "carol", "role": "viewer", "reason": "joined" })).await;
    sqlx::query!("UPDATE operator_enrollments SET issued_at = now() - interval '3 days', expires_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let (expired, _) = enroll(&ops, "carol", carol["enrollment"]["code"].as_str().unwrap_or_default(), password).await;

    assert_eq!(created, StatusCode::CREATED, "{bob}");
    assert!(code.starts_with("oec_"), "{bob}");
    assert!(bob["enrollment"]["notice"].as_str().unwrap().contains("once"), "{bob}");
    assert_eq!(stored, 1);
    assert_eq!(wrong, StatusCode::UNAUTHORIZED);
    assert_eq!(short, StatusCode::BAD_REQUEST, "a refused password leaves the code usable");
    assert_eq!(enrolled, StatusCode::NO_CONTENT, "{why}");
    assert_eq!(again, StatusCode::UNAUTHORIZED, "a code works once");
    assert_eq!(signed_in, StatusCode::CREATED);
    assert_eq!(oidc_only["enrollment"], Value::Null, "an operator of the OpenID provider needs no code");
    assert_eq!(expired, StatusCode::UNAUTHORIZED);
    let made_by_self: bool =
        sqlx::query_scalar!(r#"SELECT password_set_by = operator_id AS "same!" FROM operators WHERE name = 'bob'"#)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(made_by_self, "bob made his password himself");
    let stored_codes: Vec<Vec<u8>> =
        sqlx::query_scalar!("SELECT code_sha256 FROM operator_enrollments").fetch_all(&pool).await.unwrap();
    assert!(stored_codes.iter().all(|hash| hash.len() == 32), "codes are kept as hashes only");
    let trail: Vec<(String, String, String)> = sqlx::query!(
        "SELECT operator_name, action, outcome FROM operator_audit
         WHERE action IN ('operator.create', 'operator.enroll') ORDER BY audit_id"
    )
    .map(|r| (r.operator_name, r.action, r.outcome))
    .fetch_all(&pool)
    .await
    .unwrap();
    let row = |who: &str, action: &str, outcome: &str| (who.to_owned(), action.to_owned(), outcome.to_owned());
    assert_eq!(
        trail,
        [
            row("root", "operator.create", "done"),
            row("bob", "operator.enroll", "refused"),
            row("bob", "operator.enroll", "done"),
            row("bob", "operator.enroll", "refused"),
            row("root", "operator.create", "done"),
            row("root", "operator.create", "done"),
            row("carol", "operator.enroll", "refused"),
        ]
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_fresh_code_replaces_a_lost_password_and_ends_what_the_old_one_made(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let password = ops.person("bob", "approver", None).await;
    let (_, cookie) = ops.sign_in("bob", &password).await;
    let (_, token, _) = issue_with_session(&ops, cookie.as_deref().unwrap(), "bob").await;

    let reset = json!({ "reason": "lost his password" });
    let (own, _) = ops.post(&ops.admin, "/v1/operators/root/enrollment", reset.clone()).await;
    let (issued, fresh) = ops.post(&ops.admin, "/v1/operators/bob/enrollment", reset).await;
    let (old_password, _) = ops.sign_in("bob", &password).await;
    let (session_after, _) = ops.as_session(cookie.as_deref().unwrap(), Method::GET, "/v1/me", None).await;
    let token_after = ops.get(&token.unwrap(), "/v1/me").await.0;
    let (enrolled, _) =
        enroll(&ops, "bob", fresh["code"].as_str().unwrap_or_default(), "bob's new long password").await;
    let (signed_in, _) = ops.sign_in("bob", "bob's new long password").await;

    assert_eq!(own, StatusCode::FORBIDDEN, "nobody resets their own password");
    assert_eq!(issued, StatusCode::CREATED, "{fresh}");
    assert_eq!(old_password, StatusCode::UNAUTHORIZED);
    assert_eq!(session_after, StatusCode::UNAUTHORIZED);
    assert_eq!(token_after, StatusCode::UNAUTHORIZED);
    assert_eq!(enrolled, StatusCode::NO_CONTENT);
    assert_eq!(signed_in, StatusCode::CREATED);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_admin_of_some_tenants_neither_revokes_nor_lists_another_operators_tokens(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    tenant(&pool, "acme").await;
    let lim = ops.operator("lim", "admin", Some(&["acme"])).await;
    let (_, roots) = ops.get(&ops.admin, "/v1/operators/root/tokens").await;
    let root_token = roots[0]["token_id"].as_str().unwrap().to_owned();

    let (revoked, why) =
        ops.call(&lim, Method::DELETE, &format!("/v1/tokens/{root_token}"), Some(json!({"reason": "x"}))).await;
    let (listed, _) = ops.get(&lim, "/v1/operators/root/tokens").await;
    let (_, own) = ops.get(&lim, "/v1/operators/lim/tokens").await;
    let own_id = own[0]["token_id"].as_str().unwrap().to_owned();
    let (own_revoked, _) =
        ops.call(&lim, Method::DELETE, &format!("/v1/tokens/{own_id}"), Some(json!({"reason": "mine"}))).await;

    assert_eq!(revoked, StatusCode::FORBIDDEN, "{why}");
    assert!(detail(&why).contains("only an admin of every tenant"), "{why}");
    assert_eq!(ops.get(&ops.admin, "/v1/me").await.0, StatusCode::OK, "root's token still works");
    assert_eq!(listed, StatusCode::FORBIDDEN);
    assert_eq!(own_revoked, StatusCode::NO_CONTENT, "one's own token, always");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn sign_ins_are_limited_per_source_and_a_refusal_records_nothing_typed(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let password = ops.person("alice", "operator", None).await;
    // Refusals already in the audit trail do not lock a name: the lock has counters of its own.
    for _ in 0..10 {
        sqlx::query!(
            "INSERT INTO operator_audit (operator_name, action, outcome, detail)
             VALUES ('alice', 'session.sign_in', 'refused', '{\"refusal\": \"wrong name or password\"}')"
        )
        .execute(&pool)
        .await
        .unwrap();
    }
    let (alice, _) = ops.sign_in("alice", &password).await;
    let before: i64 =
        sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM operator_audit"#).fetch_one(&pool).await.unwrap();

    let mut statuses = Vec::new();
    for guess in 0..40 {
        statuses.push(ops.sign_in(&format!("nobody-{guess}-with-a-made-up-name"), "a guessed password").await.0);
    }
    let after: i64 =
        sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM operator_audit"#).fetch_one(&pool).await.unwrap();
    let typed: i64 = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM operator_audit WHERE operator_name LIKE 'nobody-%' OR detail::text LIKE '%nobody-%'"#
    )
    .fetch_one(&pool)
    .await
    .unwrap();

    assert_eq!(alice, StatusCode::CREATED, "audit rows do not lock a name");
    let limited = statuses.iter().filter(|s| **s == StatusCode::TOO_MANY_REQUESTS).count();
    assert!(limited >= 15, "the source is limited: {statuses:?}");
    assert!(after - before <= 21, "at most the source's attempts and one row for its lock: {}", after - before);
    assert_eq!(typed, 0, "a name that does not exist is not recorded");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn refused_callbacks_from_the_openid_provider_are_limited_and_record_none_of_its_words(pool: PgPool) {
    let ops = Ops::start_on(&pool, 0, |url| {
        Some(OidcSettings {
            issuer: "http://127.0.0.1:9".into(),
            client_id: "oncepay".into(),
            client_secret: "a-secret".to_owned().into(),
            redirect_uri: format!("{url}/v1/session/oidc/callback"),
        })
    })
    .await;
    let http = reqwest::Client::new();

    let mut statuses = Vec::new();
    for _ in 0..30 {
        let url = format!("{}/v1/session/oidc/callback?error=attacker-chosen-words&error_description=more", ops.url);
        statuses.push(http.get(url).send().await.unwrap().status());
    }
    let rows: Vec<String> = sqlx::query_scalar!(
        r#"SELECT operator_name || ' ' || coalesce(detail::text, '') AS "row!" FROM operator_audit
           WHERE action = 'session.sign_in'"#
    )
    .fetch_all(&pool)
    .await
    .unwrap();

    assert!(statuses[0] == StatusCode::UNAUTHORIZED, "{statuses:?}");
    assert!(statuses.contains(&StatusCode::TOO_MANY_REQUESTS), "{statuses:?}");
    assert!(rows.len() <= 21, "{rows:?}");
    assert!(rows.iter().all(|row| !row.contains("attacker-chosen")), "{rows:?}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn parallel_wrong_guesses_get_no_more_checks_than_the_limit_and_hashing_stays_bounded(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let password = ops.person("alice", "operator", None).await;

    let guesses = (0..40).map(|i| {
        let ops = &ops;
        async move { ops.sign_in("alice", &format!("wrong guess number {i}")).await.0 }
    });
    let statuses = join_all(guesses).await;
    let checked = refusals(&pool, "alice", "wrong name or password").await;
    let all_rows: i64 = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM operator_audit WHERE action = 'session.sign_in' AND outcome = 'refused'"#
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let (right, _) = ops.sign_in("alice", &password).await;

    assert!(checked <= 5, "{checked} refusals were checked and recorded: {statuses:?}");
    assert!(all_rows <= 7, "{all_rows} rows: the checks, the name's lock and the source's, once each");
    let busy = statuses.iter().filter(|s| [StatusCode::SERVICE_UNAVAILABLE, StatusCode::TOO_MANY_REQUESTS].contains(s));
    assert!(busy.count() >= 30, "{statuses:?}");
    assert_eq!(right, StatusCode::TOO_MANY_REQUESTS, "the name is locked, for the right password too");
    let hashing = &ops.state.hashing;
    assert!(
        (1..=hashing.bound()).contains(&hashing.peak()),
        "{} hashes ran at once, bound {}",
        hashing.peak(),
        hashing.bound()
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn hashes_beyond_the_bound_are_refused_at_once_with_a_retry_after(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let password = ops.person("alice", "operator", None).await;
    let hashing = &ops.state.hashing;
    // Every permit taken, as by sign-ins in flight.
    let held: Vec<_> = (0..hashing.bound()).map(|_| hashing.try_start().unwrap()).collect();

    let response = reqwest::Client::new()
        .post(format!("{}/v1/session", ops.url))
        .json(&json!({ "name": "alice", "password": password }))
        .send()
        .await
        .unwrap();
    let (busy, retry_after) = (response.status(), response.headers().get("retry-after").cloned());
    drop(held);
    let (after, _) = ops.sign_in("alice", &password).await;

    assert_eq!(busy, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after.unwrap(), "1");
    assert_eq!(after, StatusCode::CREATED);
    assert_eq!(refusals(&pool, "alice", "wrong name or password").await, 0, "a sign-in not checked is no refusal");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn with_an_openid_provider_only_the_break_glass_account_signs_in_with_a_password(pool: PgPool) {
    let ops = Ops::start_on(&pool, 0, |url| {
        Some(OidcSettings {
            issuer: "http://127.0.0.1:9".into(),
            client_id: "oncepay".into(),
            client_secret: "a-secret".to_owned().into(),
            redirect_uri: format!("{url}/v1/session/oidc/callback"),
        })
    })
    .await;
    let (created, alice) = create(&ops, json!({ "name": "alice", "role": "admin", "reason": "joined" })).await;
    // A password alice had before the provider was set: root's, copied.
    sqlx::query!("UPDATE operators SET password_hash = (SELECT password_hash FROM operators WHERE name = 'root')")
        .execute(&pool)
        .await
        .unwrap();

    let (alice_signs_in, _) = ops.sign_in("alice", &ops.admin_password).await;
    let (root_signs_in, cookie) = ops.sign_in("root", &ops.admin_password).await;
    let (me, _) = ops.as_session(cookie.as_deref().unwrap(), Method::GET, "/v1/me", None).await;
    let (reset, _) = ops.post(&ops.admin, "/v1/operators/alice/enrollment", json!({ "reason": "x" })).await;
    let overview = reqwest::Client::new()
        .get(format!("{}/console/", ops.url))
        .header("cookie", format!("oncepay_session={}", cookie.as_deref().unwrap()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();

    assert_eq!(created, StatusCode::CREATED);
    assert_eq!(alice["enrollment"], Value::Null, "no code for a password that would not work");
    assert_eq!(alice_signs_in, StatusCode::UNAUTHORIZED, "local passwords are off but for the break-glass account");
    assert_eq!(refusals(&pool, "alice", "local passwords are off for this account").await, 1);
    assert_eq!(root_signs_in, StatusCode::CREATED, "root is the break-glass account");
    assert_eq!(me, StatusCode::OK);
    assert_eq!(reset, StatusCode::CONFLICT, "no code for alice either");
    let uses: Vec<(String, Option<String>)> = sqlx::query!(
        "SELECT action, detail->>'break_glass' AS break_glass FROM operator_audit
         WHERE operator_name = 'root' AND action IN ('session.sign_in', 'break_glass.use') ORDER BY audit_id"
    )
    .map(|r| (r.action, r.break_glass))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(uses.contains(&("session.sign_in".to_owned(), Some("true".to_owned()))), "{uses:?}");
    assert!(uses.iter().filter(|(action, _)| action == "break_glass.use").count() >= 3, "{uses:?}");
    assert!(overview.contains("The break-glass account") && overview.contains("GET /v1/me"), "{overview}");
}

/// Runs the real CLI against `ops` with `stdin` as its standard input (and `token`, if any).
async fn cli_with(ops: &Ops, pool: &PgPool, token: Option<&str>, args: &[&str], stdin: &str) -> std::process::Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut command = crate::cli::command(&crate::support::reconciler_url_of(pool), args);
    command.env("ONCEPAY_OPS_URL", &ops.url).env_remove("ONCEPAY_OPS_TOKEN");
    if let Some(token) = token {
        command.env("ONCEPAY_OPS_TOKEN", token);
    }
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let stdin = stdin.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn at_the_command_line_an_operator_enrolls_signs_in_and_gets_a_token_of_their_own(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let password = "dave's own long password";

    let created = cli_with(
        &ops,
        &pool,
        Some(&ops.admin),
        &["operators", "create", "dave", "--role", "approver", "--reason", "joined", "--json"],
        "",
    )
    .await;
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let created: Value = serde_json::from_slice(&created.stdout).unwrap();
    let code = created["enrollment"]["code"].as_str().unwrap();
    let differ = cli_with(
        &ops,
        &pool,
        None,
        &["operators", "enroll", "dave"],
        &format!("{code}\n{password}\nanother one entirely\n"),
    )
    .await;
    let enrolled =
        cli_with(&ops, &pool, None, &["operators", "enroll", "dave"], &format!("{code}\n{password}\n{password}\n"))
            .await;
    let wrong = cli_with(&ops, &pool, None, &["sign-in", "--name", "dave", "--json"], "not the password\n").await;
    let signed_in = cli_with(
        &ops,
        &pool,
        None,
        &["sign-in", "--name", "dave", "--label", "laptop", "--json"],
        &format!("{password}\n"),
    )
    .await;

    assert_eq!(differ.status.code(), Some(2), "{}", String::from_utf8_lossy(&differ.stderr));
    assert!(enrolled.status.success(), "{}", String::from_utf8_lossy(&enrolled.stderr));
    assert_eq!(wrong.status.code(), Some(5), "{}", String::from_utf8_lossy(&wrong.stderr));
    assert!(signed_in.status.success(), "{}", String::from_utf8_lossy(&signed_in.stderr));
    let issued: Value = serde_json::from_slice(&signed_in.stdout).unwrap();
    let token = issued["token"].as_str().unwrap();
    let (me, who) = ops.get(token, "/v1/me").await;
    assert_eq!((me, who["name"].as_str()), (StatusCode::OK, Some("dave")));
    let made_by_self: bool = sqlx::query_scalar!(
        r#"SELECT t.issued_by = t.operator_id AS "same!" FROM operator_tokens t JOIN operators o USING (operator_id)
           WHERE o.name = 'dave'"#
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(made_by_self, "dave made his token himself");
    let open: i64 = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM operator_sessions WHERE ended_at IS NULL"#)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(open, 0, "the CLI's session ends once the token is issued");
}
