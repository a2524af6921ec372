//! The operations API against a real PostgreSQL: operators with tokens and roles, scoped to
//! tenants; four-eyes approval of what moves money; the append-only audit trail. The server runs in
//! the test's process on a port of its own; requests go over HTTP.

use std::process::Output;
use std::time::Duration;

use oncepay_domain::ids::PaymentId;
use oncepay_domain::status::PaymentStatus;
use oncepay_ops::dead_letters;
use oncepay_ops::operator_error::OperatorError;
use oncepay_ops::operators::accounts;
use oncepay_reconciler::recon::{ReconConfig, Reconciliation};
use oncepay_store::fixtures::{self, tenant};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::cli::command;
use crate::support::{self, Ops, audit_of, dead_lettered, problem, rows, status};

const DAY: u64 = 86_400;

fn failed(reason: &str) -> Value {
    json!({ "as": "failed", "reason": reason })
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_first_admin_is_made_once_and_tokens_that_are_wrong_revoked_or_expired_are_refused(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let mut conn = pool.acquire().await.unwrap();

    let second = accounts::bootstrap(&mut conn, "other", Duration::from_secs(DAY)).await;
    let (me, who) = ops.get(&ops.admin, "/v1/me").await;
    let alice = ops.operator("alice", "operator", None).await;
    let (_, tokens) = ops.get(&alice, "/v1/operators/alice/tokens").await;
    let token_id = tokens[0]["token_id"].as_str().unwrap().to_owned();
    let mut tampered = alice.clone();
    tampered.pop();
    tampered.push(if alice.ends_with('A') { 'B' } else { 'A' });
    let (wrong, refusal) = ops.get(&tampered, "/v1/me").await;
    let (none, _) = ops.get("", "/v1/me").await;
    let revoke = format!("/v1/tokens/{token_id}");
    let (revoked, _) = ops.call(&alice, Method::DELETE, &revoke, Some(json!({"reason": "lost laptop"}))).await;
    let (after_revoke, _) = ops.get(&alice, "/v1/me").await;
    let bob = ops.operator("bob", "approver", None).await;
    sqlx::query!(
        "UPDATE operator_tokens SET created_at = now() - interval '2 days', expires_at = now() - interval '1 second'"
    )
    .execute(&pool)
    .await
    .unwrap();
    let (expired, _) = ops.get(&bob, "/v1/me").await;

    assert!(matches!(second, Err(OperatorError::Refused(_))), "{second:?}");
    assert_eq!((me, who["name"].as_str(), who["role"].as_str()), (StatusCode::OK, Some("root"), Some("admin")));
    assert_eq!(wrong, StatusCode::UNAUTHORIZED);
    assert_eq!(problem(&refusal).0, "unauthorized");
    assert_eq!(none, StatusCode::UNAUTHORIZED);
    assert_eq!(revoked, StatusCode::NO_CONTENT);
    assert_eq!(after_revoke, StatusCode::UNAUTHORIZED);
    assert_eq!(expired, StatusCode::UNAUTHORIZED);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_resolution_is_done_only_when_a_second_operator_approves_it(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let alice = ops.operator("alice", "approver", None).await;
    let bob = ops.operator("bob", "approver", None).await;
    let vic = ops.operator("vic", "viewer", None).await;

    let path = format!("/v1/payments/{payment_id}/resolve");
    let (viewer_proposes, viewer_refusal) = ops.post(&vic, &path, failed("card expired")).await;
    let (proposed, proposal) = ops.post(&alice, &path, failed("the provider says it declined")).await;
    let proposal_id = proposal["proposal"]["proposal_id"].as_str().unwrap().to_owned();
    let approve = format!("/v1/proposals/{proposal_id}/approve");
    let (own, own_refusal) = ops.post(&alice, &approve, json!({"reason": "looks right"})).await;
    let (by_viewer, _) = ops.post(&vic, &approve, json!({"reason": "looks right"})).await;
    let still = status(&pool, acme, payment_id).await;
    let (approved, done) = ops.post(&bob, &approve, json!({"reason": "checked the dashboard"})).await;
    let (again, again_refusal) = ops.post(&bob, &approve, json!({"reason": "twice"})).await;

    assert_eq!(viewer_proposes, StatusCode::FORBIDDEN);
    assert_eq!(problem(&viewer_refusal).1, "vic is a viewer; to resolve a payment takes the operator role or above");
    assert_eq!(proposed, StatusCode::ACCEPTED, "{proposal}");
    assert_eq!(proposal["proposal"]["status"], "pending");
    assert_eq!(own, StatusCode::FORBIDDEN);
    assert!(problem(&own_refusal).1.contains("nobody approves their own"), "{own_refusal}");
    assert_eq!(by_viewer, StatusCode::FORBIDDEN);
    assert_eq!(still, PaymentStatus::DeadLettered, "nothing is done before the approval");
    assert_eq!(approved, StatusCode::OK, "{done}");
    assert_eq!(done["proposal"]["status"], "approved");
    assert_eq!(done["proposal"]["decided_by"], "bob");
    assert_eq!(done["result"]["payment_status"], "failed");
    assert_eq!(status(&pool, acme, payment_id).await, PaymentStatus::Failed);
    assert_eq!(again, StatusCode::CONFLICT);
    assert_eq!(problem(&again_refusal).1, format!("proposal {proposal_id} was already approved by bob"));
    let actor: String = sqlx::query_scalar!(
        "SELECT actor FROM payment_events WHERE payment_id = $1 ORDER BY seq DESC LIMIT 1",
        payment_id.as_uuid()
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(actor, "operator:alice, approved by bob");
    assert_eq!(
        audit_of(&pool, payment_id).await,
        rows(&[
            ("vic", "payment.resolve", "refused"),
            ("alice", "payment.resolve", "proposed"),
            ("bob", "proposal.approve", "done"),
        ])
    );
    let refusals: Vec<(String, String)> = sqlx::query!(
        "SELECT operator_name, action FROM operator_audit WHERE outcome = 'refused' AND proposal_id IS NOT NULL ORDER BY audit_id"
    )
    .map(|r| (r.operator_name, r.action))
    .fetch_all(&pool)
    .await
    .unwrap();
    let approve_refusal = |who: &str| (who.to_owned(), "proposal.approve".to_owned());
    assert_eq!(refusals, vec![approve_refusal("alice"), approve_refusal("vic"), approve_refusal("bob")]);
    let (_, page) = ops.get(&bob, &format!("/v1/payments/{payment_id}")).await;
    let trail: Vec<&str> =
        page["operator_audit"].as_array().unwrap().iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(trail, ["proposal.approve", "payment.resolve", "payment.resolve"], "newest first, before this read");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_approval_after_the_payment_moved_or_the_proposal_expired_does_nothing(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let moved = dead_lettered(&pool, acme, "k-moved", 60).await;
    let stale = dead_lettered(&pool, acme, "k-stale", 60).await;
    let alice = ops.operator("alice", "operator", None).await;
    let bob = ops.operator("bob", "approver", None).await;
    let propose = |payment_id: PaymentId| {
        let ops = &ops;
        let alice = &alice;
        async move {
            let (_, proposal) =
                ops.post(alice, &format!("/v1/payments/{payment_id}/resolve"), failed("declined")).await;
            proposal["proposal"]["proposal_id"].as_str().unwrap().to_owned()
        }
    };
    let on_moved = propose(moved).await;
    let on_stale = propose(stale).await;
    // A signed webhook's evidence arrives for one; the other's proposal runs out of time.
    let mut conn = pool.acquire().await.unwrap();
    let evidence = json!([{"source": "webhook", "charge": {"id": "ch_1", "status": "succeeded"}}]);
    assert!(dead_letters::attach_evidence(&mut conn, acme, moved, evidence).await.unwrap());
    sqlx::query!(
        "UPDATE proposals SET proposed_at = now() - interval '2 days', expires_at = now() - interval '1 day'
         WHERE proposal_id = $1",
        uuid::Uuid::parse_str(&on_stale).unwrap()
    )
    .execute(&pool)
    .await
    .unwrap();

    let (after_move, moved_refusal) =
        ops.post(&bob, &format!("/v1/proposals/{on_moved}/approve"), json!({"reason": "ok"})).await;
    let (after_expiry, expired_refusal) =
        ops.post(&bob, &format!("/v1/proposals/{on_stale}/approve"), json!({"reason": "ok"})).await;
    let (listed, proposals) = ops.get(&bob, &format!("/v1/proposals?payment_id={stale}")).await;
    let (proposed_again, _) =
        ops.post(&alice, &format!("/v1/payments/{stale}/resolve"), failed("still declined")).await;

    assert_eq!(after_move, StatusCode::CONFLICT);
    assert_eq!(
        problem(&moved_refusal).1,
        format!(
            "payment {moved} moved since it was proposed (1 new piece of evidence arrived); nothing was done. Read it \
             again, and propose anew if the decision still holds"
        )
    );
    assert_eq!(after_expiry, StatusCode::CONFLICT);
    assert!(problem(&expired_refusal).1.contains("expired at"), "{expired_refusal}");
    assert_eq!(status(&pool, acme, moved).await, PaymentStatus::DeadLettered);
    assert_eq!(status(&pool, acme, stale).await, PaymentStatus::DeadLettered);
    assert_eq!((listed, proposals[0]["status"].as_str()), (StatusCode::OK, Some("expired")));
    assert_eq!(proposed_again, StatusCode::ACCEPTED, "an expired proposal makes way for a new one");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_operator_limited_to_one_tenant_is_told_not_found_for_anothers_payments(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let globex = tenant(&pool, "globex").await;
    let mine = dead_lettered(&pool, acme, "k-acme", 60).await;
    let theirs = dead_lettered(&pool, globex, "k-globex", 60).await;
    let alice = ops.operator("alice", "operator", None).await;
    let lim = ops.operator("lim", "approver", Some(&["acme"])).await;
    let (_, proposal) = ops.post(&alice, &format!("/v1/payments/{theirs}/resolve"), failed("declined")).await;
    let theirs_proposal = proposal["proposal"]["proposal_id"].as_str().unwrap().to_owned();

    let (_, listed) = ops.get(&lim, "/v1/dead-letters").await;
    let (_, proposals) = ops.get(&lim, "/v1/proposals").await;
    let (_, audit) = ops.get(&lim, "/v1/audit").await;
    let reason = json!({"reason": "x"});
    let answers = [
        ops.get(&lim, &format!("/v1/payments/{theirs}")).await,
        ops.post(&lim, &format!("/v1/payments/{theirs}/retry"), reason.clone()).await,
        ops.post(&lim, &format!("/v1/payments/{theirs}/resolve"), failed("x")).await,
        ops.post(&lim, &format!("/v1/payments/{theirs}/resolve"), json!({"as": "acknowledged", "reason": "x"})).await,
        ops.post(&lim, &format!("/v1/proposals/{theirs_proposal}/approve"), reason.clone()).await,
        ops.post(&lim, &format!("/v1/proposals/{theirs_proposal}/reject"), reason.clone()).await,
    ];
    let (own, _) = ops.get(&lim, &format!("/v1/payments/{mine}")).await;

    let listed: Vec<&str> = listed.as_array().unwrap().iter().map(|e| e["payment_id"].as_str().unwrap()).collect();
    assert_eq!(listed, [mine.to_string()]);
    assert_eq!(proposals, json!([]));
    assert!(audit.as_array().unwrap().iter().all(|row| row["tenant_id"] == json!(acme)), "{audit}");
    for (status, body) in answers {
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert!(!body.to_string().contains("globex"), "{body}");
    }
    assert_eq!(own, StatusCode::OK);
    assert_eq!(status(&pool, globex, theirs).await, PaymentStatus::DeadLettered);
    let pending: i64 = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM proposals WHERE status = 'pending'"#)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(pending, 1, "the other tenant's proposal still waits");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_retry_in_the_key_window_is_done_and_one_past_it_is_proposed(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let recent = dead_lettered(&pool, acme, "k-recent", 60).await;
    let old = dead_lettered(&pool, acme, "k-old", 2 * DAY as i64).await;
    let alice = ops.operator("alice", "operator", None).await;
    let bob = ops.operator("bob", "approver", None).await;

    let (done, resolved) =
        ops.post(&alice, &format!("/v1/payments/{recent}/retry"), json!({"reason": "provider back"})).await;
    let (refused, refusal) = ops.post(&alice, &format!("/v1/payments/{old}/retry"), json!({"reason": "again"})).await;
    let body = json!({"reason": "no charge at the provider", "outside_key_window": true});
    let (proposed, proposal) = ops.post(&alice, &format!("/v1/payments/{old}/retry"), body).await;
    let still = status(&pool, acme, old).await;
    let proposal_id = proposal["proposal"]["proposal_id"].as_str().unwrap();
    let (approved, _) =
        ops.post(&bob, &format!("/v1/proposals/{proposal_id}/approve"), json!({"reason": "checked"})).await;

    assert_eq!(done, StatusCode::OK, "{resolved}");
    assert_eq!(resolved["resolved_by"], "operator:alice");
    assert_eq!(status(&pool, acme, recent).await, PaymentStatus::Pending);
    assert_eq!(refused, StatusCode::CONFLICT);
    assert!(problem(&refusal).1.contains("may have forgotten its key"), "{refusal}");
    assert_eq!(proposed, StatusCode::ACCEPTED, "{proposal}");
    assert_eq!(proposal["proposal"]["action"], json!({"kind": "retry", "outside_key_window": true}));
    assert_eq!(still, PaymentStatus::DeadLettered);
    assert_eq!(approved, StatusCode::OK);
    assert_eq!(status(&pool, acme, old).await, PaymentStatus::Pending);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_resolution_whose_money_is_not_money_is_refused_by_name_and_proposes_nothing(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let alice = ops.operator("alice", "operator", None).await;
    let resolve = format!("/v1/payments/{payment_id}/resolve");
    let succeeded = |amount: Value, currency: &str| {
        json!({
            "as": "succeeded", "charge_id": "ch_1", "amount": amount, "currency": currency,
            "charged_at": "2026-01-10T12:00:00Z", "reason": "the dashboard shows ch_1 charged"
        })
    };

    let (zero, zero_why) = ops.post(&alice, &resolve, succeeded(json!(0), "EUR")).await;
    let (fraction, fraction_why) = ops.post(&alice, &resolve, succeeded(json!(19.99), "EUR")).await;
    let (unknown, unknown_why) = ops.post(&alice, &resolve, succeeded(json!(1999), "ABC")).await;
    let pending = || async {
        sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM proposals WHERE status = 'pending'"#)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let proposed_before = pending().await;
    let (proposed, proposal) = ops.post(&alice, &resolve, succeeded(json!(1999), "EUR")).await;

    assert_eq!(zero, StatusCode::BAD_REQUEST, "{zero_why}");
    assert!(problem(&zero_why).1.contains("amount 0 must be an integer number of minor units"), "{zero_why}");
    assert_eq!(fraction, StatusCode::BAD_REQUEST, "{fraction_why}");
    assert_eq!(unknown, StatusCode::BAD_REQUEST, "{unknown_why}");
    assert!(problem(&unknown_why).1.contains(r#"currency "ABC" is not an active ISO 4217"#), "{unknown_why}");
    assert_eq!(proposed_before, 0, "nothing was proposed");
    assert_eq!(proposed, StatusCode::ACCEPTED, "{proposal}");
    let action = &proposal["proposal"]["action"];
    assert_eq!((&action["amount"], &action["currency"]), (&json!(1999), &json!("EUR")), "{action}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_proposal_is_withdrawn_only_by_its_maker_and_rejected_only_by_another_approver(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let alice = ops.operator("alice", "approver", None).await;
    let bob = ops.operator("bob", "approver", None).await;
    let resolve = format!("/v1/payments/{payment_id}/resolve");
    let reason = json!({"reason": "changed my mind"});

    let (_, first) = ops.post(&alice, &resolve, failed("declined")).await;
    let first = first["proposal"]["proposal_id"].as_str().unwrap().to_owned();
    let (second_while_pending, busy) = ops.post(&bob, &resolve, failed("declined")).await;
    let (withdrawn_by_other, _) = ops.post(&bob, &format!("/v1/proposals/{first}/withdraw"), reason.clone()).await;
    let (rejected_by_maker, _) = ops.post(&alice, &format!("/v1/proposals/{first}/reject"), reason.clone()).await;
    let (without_reason, _) =
        ops.post(&alice, &format!("/v1/proposals/{first}/withdraw"), json!({"reason": " "})).await;
    let (withdrawn, view) = ops.post(&alice, &format!("/v1/proposals/{first}/withdraw"), reason.clone()).await;
    let (_, second) = ops.post(&alice, &resolve, failed("declined after all")).await;
    let second = second["proposal"]["proposal_id"].as_str().unwrap().to_owned();
    let (rejected, rejection) = ops.post(&bob, &format!("/v1/proposals/{second}/reject"), reason.clone()).await;

    assert_eq!(second_while_pending, StatusCode::CONFLICT);
    assert!(problem(&busy).1.contains("another proposal already waits"), "{busy}");
    assert_eq!(withdrawn_by_other, StatusCode::FORBIDDEN);
    assert_eq!(rejected_by_maker, StatusCode::FORBIDDEN);
    assert_eq!(without_reason, StatusCode::BAD_REQUEST);
    assert_eq!((withdrawn, view["status"].as_str()), (StatusCode::OK, Some("withdrawn")));
    assert_eq!((rejected, rejection["status"].as_str()), (StatusCode::OK, Some("rejected")));
    assert_eq!(status(&pool, acme, payment_id).await, PaymentStatus::DeadLettered);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn viewers_see_customer_data_masked_and_every_read_is_in_the_audit_trail(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let vic = ops.operator("vic", "viewer", None).await;
    let alice = ops.operator("alice", "operator", None).await;

    let (_, masked) = ops.get(&vic, &format!("/v1/payments/{payment_id}")).await;
    let (_, whole) = ops.get(&alice, &format!("/v1/payments/{payment_id}")).await;

    let customer_id = whole["customer"]["customer_id"].as_str().unwrap();
    assert_eq!(whole["customer"]["masked"], false);
    assert_eq!(masked["customer"]["masked"], true);
    assert_eq!(masked["customer"]["customer_id"], format!("{}…", &customer_id[..3]));
    assert!(!masked.to_string().contains(customer_id), "{masked}");
    assert!(masked["customer"].get("metadata").is_none());
    assert_eq!(masked["entries"][0]["payment_id"], json!(payment_id));
    assert_eq!(
        audit_of(&pool, payment_id).await,
        rows(&[("vic", "payment.read", "done"), ("alice", "payment.read", "done")])
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn viewers_see_evidence_masked_and_lists_show_no_customer_data(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let charge = json!({
        "id": "ch_1", "status": "failed", "amount": 1999, "currency": "EUR", "customer": "cus_secret42",
        "payment_method": "pm_card_secret", "metadata": {"order": "o-secret"}, "description": "secret order",
    });
    let evidence = json!([{ "source": "webhook", "charge": charge }]);
    let mut conn = pool.acquire().await.unwrap();
    assert!(dead_letters::attach_evidence(&mut conn, acme, payment_id, evidence).await.unwrap());
    let vic = ops.operator("vic", "viewer", None).await;
    let alice = ops.operator("alice", "operator", None).await;

    let (_, viewer_page) = ops.get(&vic, &format!("/v1/payments/{payment_id}")).await;
    let (_, viewer_list) = ops.get(&vic, "/v1/dead-letters").await;
    let (_, operator_list) = ops.get(&alice, "/v1/dead-letters").await;
    let (_, operator_page) = ops.get(&alice, &format!("/v1/payments/{payment_id}")).await;

    for shown in [&viewer_page, &viewer_list, &operator_list] {
        let text = shown.to_string();
        assert!(!text.contains("secret"), "customer data shown: {text}");
        assert!(text.contains("ch_1") && text.contains("cus…") && text.contains("pm_…"), "{text}");
    }
    let evidence = operator_page["entries"][0]["evidence"].to_string();
    assert!(evidence.contains("cus_secret42") && evidence.contains("o-secret"), "{evidence}");
    assert_eq!(
        audit_of(&pool, payment_id).await,
        rows(&[("vic", "payment.read", "done"), ("alice", "payment.read", "done")]),
        "the payment's page is the only read that shows customer data"
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn tenant_changes_are_in_the_audit_trail_of_operators_limited_to_the_tenant(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let mut conn = pool.acquire().await.unwrap();
    let key = oncepay_store::tenants::issue_api_key(&mut conn, acme, None).await.unwrap();
    let vic = ops.operator("vic", "viewer", Some(&["acme"])).await;
    let revoke = format!("/v1/tenants/acme/keys/{}", key.key_id.as_str());
    let (revoked, _) = ops.call(&ops.admin, Method::DELETE, &revoke, Some(json!({"reason": "leaked"}))).await;
    let disconnect = json!({ "account": null, "reason": "left Connect" });
    let (disconnected, _) =
        ops.call(&ops.admin, Method::PUT, "/v1/tenants/acme/provider-account", Some(disconnect)).await;

    let (_, trail) = ops.get(&vic, "/v1/audit").await;

    assert_eq!((revoked, disconnected), (StatusCode::NO_CONTENT, StatusCode::OK));
    let actions: Vec<(&str, &str)> = trail
        .as_array()
        .unwrap()
        .iter()
        .map(|row| (row["action"].as_str().unwrap(), row["tenant_id"].as_str().unwrap_or("none")))
        .collect();
    let acme = acme.to_string();
    assert_eq!(actions, [("tenant.connect", acme.as_str()), ("key.revoke", acme.as_str())]);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_merchant_key_is_issued_only_with_a_second_person_and_only_its_proposer_collects_it(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let lim = ops.operator("lim", "admin", Some(&["acme"])).await;
    let bob = ops.operator("bob", "approver", None).await;

    let (proposed, proposal) = ops.post(&lim, "/v1/tenants/acme/keys", json!({"reason": "their new server"})).await;
    let proposal_id = proposal["proposal"]["proposal_id"].as_str().unwrap_or_default().to_owned();
    let collect = format!("/v1/proposals/{proposal_id}/key");
    let (too_early, _) = ops.post(&lim, &collect, json!({})).await;
    let (approved, done) =
        ops.post(&bob, &format!("/v1/proposals/{proposal_id}/approve"), json!({"reason": "asked by acme"})).await;
    let (by_approver, _) = ops.post(&bob, &collect, json!({})).await;
    let (collected, issued) = ops.post(&lim, &collect, json!({})).await;
    let (again, _) = ops.post(&lim, &collect, json!({})).await;

    assert_eq!(proposed, StatusCode::ACCEPTED, "{proposal}");
    assert!(proposal.get("api_key").is_none() && !proposal.to_string().contains("opk_"), "{proposal}");
    assert_eq!(too_early, StatusCode::CONFLICT);
    assert_eq!(approved, StatusCode::OK, "{done}");
    assert!(!done.to_string().contains("opk_"), "the approver never sees the key: {done}");
    assert_eq!(by_approver, StatusCode::FORBIDDEN);
    assert_eq!(collected, StatusCode::CREATED, "{issued}");
    let presented = oncepay_domain::api_key::parse(issued["api_key"].as_str().unwrap()).unwrap();
    assert_eq!(presented.tenant_id, acme);
    let mut conn = pool.acquire().await.unwrap();
    let stored = oncepay_store::tenants::find_api_key(&mut conn, acme, &presented.key_id).await.unwrap();
    assert!(stored.is_some_and(|key| !key.revoked && presented.secret_hash.matches(&key.secret_sha256)));
    assert_eq!(again, StatusCode::CONFLICT, "a key is collected once");
    let trail: Vec<(String, String, String, Option<uuid::Uuid>)> = sqlx::query!(
        "SELECT operator_name, action, outcome, tenant_id FROM operator_audit
         WHERE action IN ('key.issue', 'proposal.approve') ORDER BY audit_id"
    )
    .map(|r| (r.operator_name, r.action, r.outcome, r.tenant_id))
    .fetch_all(&pool)
    .await
    .unwrap();
    let row = |who: &str, action: &str, outcome: &str| (who.to_owned(), action.to_owned(), outcome.to_owned());
    let done: Vec<_> =
        trail.iter().filter(|r| r.2 != "refused").map(|r| (r.0.clone(), r.1.clone(), r.2.clone())).collect();
    assert_eq!(
        done,
        [row("lim", "key.issue", "proposed"), row("bob", "proposal.approve", "done"), row("lim", "key.issue", "done")]
    );
    assert!(trail.iter().filter(|r| r.2 != "refused").all(|r| r.3 == Some(acme.as_uuid())), "{trail:?}");
    assert_eq!(trail.iter().filter(|r| r.2 == "refused").count(), 3, "{trail:?}");
    let issued_row: Value = sqlx::query_scalar!(
        r#"SELECT detail AS "detail!" FROM operator_audit WHERE action = 'key.issue' AND outcome = 'done'"#
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((issued_row["proposed_by"].as_str(), issued_row["approved_by"].as_str()), (Some("lim"), Some("bob")));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_provider_account_changes_only_with_a_second_person_and_never_to_another_tenants(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let globex = tenant(&pool, "globex").await;
    let mut conn = pool.acquire().await.unwrap();
    let theirs = oncepay_domain::provider_ref::ProviderAccount::parse("acct_globex").unwrap();
    assert!(oncepay_store::tenants::set_provider_account(&mut conn, globex, Some(&theirs)).await.unwrap());
    let lim = ops.operator("lim", "admin", Some(&["acme"])).await;
    let bob = ops.operator("bob", "approver", None).await;
    let connect = |account: &str| json!({ "account": account, "reason": "onboarded to Connect" });
    let path = "/v1/tenants/acme/provider-account";

    let (stolen, why) = ops.call(&lim, Method::PUT, path, Some(connect("acct_globex"))).await;
    let (proposed, proposal) = ops.call(&lim, Method::PUT, path, Some(connect("acct_acme"))).await;
    let (_, listed) = ops.get(&lim, "/v1/tenants").await;
    let unchanged = listed[0]["provider_account"].clone();
    let proposal_id = proposal["proposal"]["proposal_id"].as_str().unwrap_or_default().to_owned();
    let (approved, done) =
        ops.post(&bob, &format!("/v1/proposals/{proposal_id}/approve"), json!({"reason": "acme's account"})).await;
    let (_, listed) = ops.get(&lim, "/v1/tenants").await;
    let shared =
        sqlx::query!("UPDATE tenants SET provider_account = 'acct_acme' WHERE name = 'globex'").execute(&pool).await;

    assert_eq!(stolen, StatusCode::CONFLICT, "{why}");
    assert!(problem(&why).1.contains("another tenant"), "{why}");
    assert_eq!(proposed, StatusCode::ACCEPTED, "{proposal}");
    assert_eq!(unchanged, Value::Null, "nothing changes before the approval");
    assert_eq!(approved, StatusCode::OK, "{done}");
    assert_eq!(listed[0]["provider_account"], "acct_acme");
    assert!(shared.is_err(), "one connected account belongs to at most one tenant");
    let _ = acme;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_broker_user_publishes_for_one_tenant_only_once_a_second_person_approves(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    tenant(&pool, "globex").await;
    let lim = ops.operator("lim", "admin", Some(&["acme"])).await;
    let vic = ops.operator("vic", "viewer", Some(&["acme"])).await;
    let bob = ops.operator("bob", "approver", None).await;
    let add = |tenant: &str, user: &str| format!("/v1/tenants/{tenant}/broker-users/{user}");
    let reason = || Some(json!({"reason": "their order system publishes to RabbitMQ"}));
    let publisher = async |user: &str| {
        let mut conn = pool.acquire().await.unwrap();
        oncepay_store::broker_users::tenant_of(&mut conn, user).await.unwrap().map(|found| found.tenant_id)
    };

    let (by_a_viewer, _) = ops.call(&vic, Method::PUT, &add("acme", "shop-1"), reason()).await;
    let (for_another, _) = ops.call(&lim, Method::PUT, &add("globex", "shop-1"), reason()).await;
    let (proposed, proposal) = ops.call(&lim, Method::PUT, &add("acme", "shop-1"), reason()).await;
    let before_approval = publisher("shop-1").await;
    let proposal_id = proposal["proposal"]["proposal_id"].as_str().unwrap_or_default().to_owned();
    let (approved, done) =
        ops.post(&bob, &format!("/v1/proposals/{proposal_id}/approve"), json!({"reason": "acme's system"})).await;
    let (again, why) = ops.call(&ops.admin, Method::PUT, &add("globex", "shop-1"), reason()).await;
    let (_, listed) = ops.get(&vic, "/v1/tenants/acme/broker-users").await;

    assert_eq!((by_a_viewer, for_another), (StatusCode::FORBIDDEN, StatusCode::NOT_FOUND));
    assert_eq!(proposed, StatusCode::ACCEPTED, "{proposal}");
    assert_eq!(before_approval, None, "nothing changes before the approval");
    assert_eq!(approved, StatusCode::OK, "{done}");
    assert_eq!(publisher("shop-1").await, Some(acme));
    assert_eq!(again, StatusCode::CONFLICT, "one broker user belongs to one tenant: {why}");
    assert_eq!(listed, json!({"broker_users": ["shop-1"]}));
    let (removed, _) = ops.call(&lim, Method::DELETE, &add("acme", "shop-1"), reason()).await;
    assert_eq!(removed, StatusCode::NO_CONTENT);
    assert_eq!(publisher("shop-1").await, None);
    let trail: Vec<(String, String, String)> = sqlx::query!(
        "SELECT operator_name, action, outcome FROM operator_audit
         WHERE (action LIKE 'broker_user.%' OR action = 'proposal.approve') AND outcome <> 'refused'
         ORDER BY audit_id"
    )
    .map(|r| (r.operator_name, r.action, r.outcome))
    .fetch_all(&pool)
    .await
    .unwrap();
    let row = |who: &str, action: &str, outcome: &str| (who.to_owned(), action.to_owned(), outcome.to_owned());
    assert_eq!(
        trail,
        [
            row("lim", "broker_user.map", "proposed"),
            row("bob", "proposal.approve", "done"),
            row("lim", "broker_user.unmap", "done")
        ]
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_cli_adds_a_broker_user_for_approval_lists_it_and_removes_it(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    tenant(&pool, "acme").await;
    let bob = ops.operator("bob", "approver", None).await;
    let reason = "their order system";

    let proposed =
        cli(&pool, &ops, &ops.admin, &["broker-users", "add", "acme", "shop-1", "--reason", reason, "--json"]).await;
    let proposal_id = stdout_json(&proposed)["proposal"]["proposal_id"].as_str().unwrap().to_owned();
    let before = cli(&pool, &ops, &ops.admin, &["broker-users", "list", "acme", "--json"]).await;
    let approved = cli(&pool, &ops, &bob, &["proposals", "approve", &proposal_id, "--reason", "checked"]).await;
    let after = cli(&pool, &ops, &ops.admin, &["broker-users", "list", "acme"]).await;
    let removed = cli(&pool, &ops, &ops.admin, &["broker-users", "remove", "acme", "shop-1", "--reason", "gone"]).await;
    let gone = cli(&pool, &ops, &ops.admin, &["broker-users", "list", "acme", "--json"]).await;

    assert_eq!(stdout_json(&before), json!({"broker_users": []}), "nothing before the approval");
    assert!(approved.status.success(), "{}", String::from_utf8_lossy(&approved.stderr));
    assert_eq!(String::from_utf8_lossy(&after.stdout), "shop-1\n");
    assert!(String::from_utf8_lossy(&removed.stdout).contains("no longer publishes"), "{removed:?}");
    assert_eq!(stdout_json(&gone), json!({"broker_users": []}));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_approval_of_a_provider_account_checks_the_tenant_again(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    tenant(&pool, "acme").await;
    let bob = ops.operator("bob", "approver", None).await;
    let path = "/v1/tenants/acme/provider-account";
    let (_, proposal) =
        ops.call(&ops.admin, Method::PUT, path, Some(json!({"account": "acct_one", "reason": "Connect"}))).await;
    let proposal_id = proposal["proposal"]["proposal_id"].as_str().unwrap_or_default().to_owned();
    // Meanwhile someone else's proposal for another account is approved... or the tenant is
    // disconnected, which needs nobody's approval.
    sqlx::query!("UPDATE tenants SET provider_account = 'acct_two' WHERE name = 'acme'").execute(&pool).await.unwrap();

    let (approved, why) =
        ops.post(&bob, &format!("/v1/proposals/{proposal_id}/approve"), json!({"reason": "looks right"})).await;

    assert_eq!(approved, StatusCode::CONFLICT, "{why}");
    assert!(problem(&why).1.contains("changed since it was proposed"), "{why}");
    let account: Option<String> =
        sqlx::query_scalar!("SELECT provider_account FROM tenants WHERE name = 'acme'").fetch_one(&pool).await.unwrap();
    assert_eq!(account.as_deref(), Some("acct_two"));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_tenant_and_its_first_key_are_made_only_with_a_second_person(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let bob = ops.operator("bob", "approver", None).await;
    let body = json!({ "name": "initech", "provider_account": "acct_initech", "reason": "signed" });

    let (proposed, proposal) = ops.post(&ops.admin, "/v1/tenants", body).await;
    let made_early: i64 =
        sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM tenants"#).fetch_one(&pool).await.unwrap();
    let proposal_id = proposal["proposal"]["proposal_id"].as_str().unwrap_or_default().to_owned();
    let (approved, done) =
        ops.post(&bob, &format!("/v1/proposals/{proposal_id}/approve"), json!({"reason": "contract seen"})).await;
    let (collected, issued) = ops.post(&ops.admin, &format!("/v1/proposals/{proposal_id}/key"), json!({})).await;

    assert_eq!(proposed, StatusCode::ACCEPTED, "{proposal}");
    assert!(!proposal.to_string().contains("opk_"), "{proposal}");
    assert_eq!(made_early, 0, "nothing is made before the approval");
    assert_eq!(approved, StatusCode::OK, "{done}");
    assert_eq!(collected, StatusCode::CREATED, "{issued}");
    assert_eq!(issued["tenant"]["name"], "initech");
    assert_eq!(issued["tenant"]["provider_account"], "acct_initech");
    assert!(issued["api_key"].as_str().unwrap().starts_with("opk_"));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn only_admins_manage_operators_and_the_audit_trail_cannot_be_edited(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let bob = ops.operator("bob", "approver", None).await;
    let body = json!({"name": "mallory", "role": "admin", "reason": "trust me"});

    let (by_approver, refusal) = ops.post(&bob, "/v1/operators", body).await;
    let (others_tokens, _) = ops.get(&bob, "/v1/operators/root/tokens").await;
    let (no_reason, _) =
        ops.post(&ops.admin, "/v1/operators", json!({"name": "eve", "role": "viewer", "reason": ""})).await;
    let (unknown_tenant, missing) = ops
        .post(&ops.admin, "/v1/operators", json!({"name": "eve", "role": "viewer", "tenants": ["nope"], "reason": "x"}))
        .await;
    let (listed, operators) = ops.get(&ops.admin, "/v1/operators").await;
    let updated = sqlx::query!("UPDATE operator_audit SET operator_name = 'someone else'").execute(&pool).await;
    let deleted = sqlx::query!("DELETE FROM operator_audit").execute(&pool).await;
    let truncated = sqlx::raw_sql("TRUNCATE operator_audit").execute(&pool).await;

    assert_eq!(by_approver, StatusCode::FORBIDDEN);
    assert_eq!(problem(&refusal).0, "forbidden");
    assert_eq!(others_tokens, StatusCode::FORBIDDEN);
    assert_eq!(no_reason, StatusCode::BAD_REQUEST);
    assert_eq!(unknown_tenant, StatusCode::NOT_FOUND, "{missing}");
    let names: Vec<&str> = operators.as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert_eq!((listed, names), (StatusCode::OK, vec!["bob", "root"]));
    for (what, result) in
        [("update", updated.map(|_| ())), ("delete", deleted.map(|_| ())), ("truncate", truncated.map(|_| ()))]
    {
        let error = result.expect_err(what).to_string();
        assert!(error.contains("the operator audit trail is append-only"), "{what}: {error}");
    }
    let refused: i64 = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM operator_audit WHERE operator_name = 'bob' AND action = 'operator.create' AND outcome = 'refused'"#
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(refused, 1);
}

/// Runs the real CLI with the operations API at `ops` and `token`, off the test's thread (the API
/// runs on it).
async fn cli(pool: &PgPool, ops: &Ops, token: &str, args: &[&str]) -> Output {
    let mut command = command(&support::reconciler_url_of(pool), args);
    command.env("ONCEPAY_OPS_URL", &ops.url).env("ONCEPAY_OPS_TOKEN", token);
    tokio::task::spawn_blocking(move || command.output().unwrap()).await.unwrap()
}

fn stdout_json(output: &Output) -> Value {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_cli_works_dead_letters_through_the_api_with_a_personal_token(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "order-1", 60).await;
    let id = payment_id.to_string();
    let carol = ops.operator("carol", "operator", None).await;
    let bob = ops.operator("bob", "approver", None).await;

    let without_api = tokio::task::spawn_blocking({
        let mut command = command(&support::reconciler_url_of(&pool), &["dead-letters", "list"]);
        move || command.env_remove("ONCEPAY_OPS_URL").env_remove("ONCEPAY_OPS_TOKEN").output().unwrap()
    })
    .await
    .unwrap();
    let listed = cli(&pool, &ops, &carol, &["dead-letters", "list", "--json"]).await;
    let shown = cli(&pool, &ops, &carol, &["dead-letters", "show", &id]).await;
    let resolve = ["dead-letters", "resolve", &id, "--as", "failed", "--reason", "card expired", "--json"];
    let proposed = cli(&pool, &ops, &carol, &resolve).await;
    let proposal_id = stdout_json(&proposed)["proposal"]["proposal_id"].as_str().unwrap().to_owned();
    let own = cli(&pool, &ops, &carol, &["proposals", "approve", &proposal_id, "--reason", "mine"]).await;
    let pending = cli(&pool, &ops, &bob, &["proposals", "list", "--status", "pending"]).await;
    let approved = cli(&pool, &ops, &bob, &["proposals", "approve", &proposal_id, "--reason", "checked"]).await;
    let nothing_open = cli(&pool, &ops, &carol, &["dead-letters", "retry", &id, "--reason", "again"]).await;
    let no_reason = cli(&pool, &ops, &carol, &["dead-letters", "retry", &id]).await;
    let bad_token = cli(&pool, &ops, "oot_not-a-token", &["dead-letters", "list"]).await;
    let trail = cli(&pool, &ops, &bob, &["audit", "--payment-id", &id, "--json"]).await;

    assert_eq!(without_api.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&without_api.stderr).contains("ONCEPAY_OPS_URL"));
    assert_eq!(stdout_json(&listed).as_array().unwrap().len(), 1);
    assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
    assert!(String::from_utf8_lossy(&shown.stdout).contains("operators' audit trail"));
    assert_eq!(own.status.code(), Some(5), "{}", String::from_utf8_lossy(&own.stderr));
    assert!(String::from_utf8_lossy(&pending.stdout).contains(&proposal_id));
    assert!(approved.status.success(), "{}", String::from_utf8_lossy(&approved.stderr));
    assert_eq!(status(&pool, acme, payment_id).await, PaymentStatus::Failed);
    assert_eq!(nothing_open.status.code(), Some(3), "{}", String::from_utf8_lossy(&nothing_open.stderr));
    assert_eq!(no_reason.status.code(), Some(2));
    assert_eq!(bad_token.status.code(), Some(5));
    let actions: Vec<String> =
        stdout_json(&trail).as_array().unwrap().iter().map(|r| r["action"].as_str().unwrap().to_owned()).collect();
    assert_eq!(actions[..3], ["payment.retry", "proposal.approve", "payment.resolve"], "{actions:?}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn recon_run_queues_the_window_and_waits_for_a_reconciler_to_run_it(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let provider = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [], "has_more": false})))
        .mount(&provider)
        .await;
    let config = ReconConfig {
        schedule: "0 0 2 * * *".into(),
        page_size: 10,
        stale_after: Duration::from_secs(300),
        queue_interval: Duration::from_millis(100),
        catch_up_days: 1,
        connected_accounts: false,
    };
    let recon = Reconciliation::new(pool.clone(), fixtures::provider(&provider.uri()), config);
    let olga = ops.operator("olga", "operator", None).await;
    let vic = ops.operator("vic", "viewer", None).await;
    let run = ["recon", "run", "--from", "2026-01-10", "--to", "2026-01-11", "--reason", "month end", "--json"];

    let viewer = cli(&pool, &ops, &vic, &run).await;
    // The reconciler looks only after the CLI has queued the run and started waiting for it.
    let reconciler = async {
        while !recon.run_queued().await.unwrap() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let (waited, ()) = tokio::join!(cli(&pool, &ops, &olga, &run), reconciler);
    let again = cli(&pool, &ops, &olga, &run).await;

    assert_eq!(viewer.status.code(), Some(5), "{}", String::from_utf8_lossy(&viewer.stderr));
    assert!(String::from_utf8_lossy(&waited.stderr).contains("queued"));
    let detail = stdout_json(&waited);
    assert_eq!(
        (detail["run"]["status"].as_str(), detail["run"]["trigger"].as_str()),
        (Some("completed"), Some("operator"))
    );
    assert_eq!(again.status.code(), Some(4), "{}", String::from_utf8_lossy(&again.stderr));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds this window (completed)"));
    let audited: Vec<String> = sqlx::query_scalar!(
        r#"SELECT outcome::text AS "outcome!" FROM operator_audit WHERE action = 'recon.run' ORDER BY audit_id"#
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(audited, ["refused", "done", "refused"]);
}

/// A request as a browser sends it: the session cookie, and the headers that say which site the
/// page it came from belongs to.
async fn browse(
    ops: &Ops,
    method: Method,
    path: &str,
    cookie: Option<&str>,
    from: &[(&str, &str)],
    body: Option<Value>,
) -> (StatusCode, Option<String>, Value) {
    let mut request = reqwest::Client::new().request(method, format!("{}{path}", ops.url));
    if let Some(cookie) = cookie {
        request = request.header("cookie", format!("oncepay_session={cookie}"));
    }
    for (name, value) in from {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let set_cookie = response.headers().get("set-cookie").map(|v| v.to_str().unwrap().to_owned());
    let text = response.text().await.unwrap();
    (status, set_cookie, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

const SAME_ORIGIN: &[(&str, &str)] = &[("sec-fetch-site", "same-origin")];

/// Signs `name` in; the session cookie's value, if one was set.
async fn sign_in(ops: &Ops, name: &str, password: &str) -> (StatusCode, Option<String>) {
    let body = json!({ "name": name, "password": password });
    let (status, set_cookie, _) = browse(ops, Method::POST, "/v1/session", None, SAME_ORIGIN, Some(body)).await;
    let cookie =
        set_cookie.and_then(|c| c.strip_prefix("oncepay_session=").map(|v| v.split(';').next().unwrap().to_owned()));
    (status, cookie)
}

const PASSWORD: &str = "a long enough password";

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_session_changes_things_only_from_a_page_of_its_own_origin(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let password = ops.person("alice", "operator", None).await;
    let retry = format!("/v1/payments/{payment_id}/retry");
    let reason = || Some(json!({ "reason": "provider back" }));

    let (wrong, none) = sign_in(&ops, "alice", "not the password").await;
    let body = json!({ "name": "alice", "password": password });
    let (from_elsewhere, _, _) =
        browse(&ops, Method::POST, "/v1/session", None, &[("sec-fetch-site", "cross-site")], Some(body.clone())).await;
    let (signed_in, set_cookie, _) = browse(&ops, Method::POST, "/v1/session", None, SAME_ORIGIN, Some(body)).await;
    let cookie =
        set_cookie.as_deref().unwrap().strip_prefix("oncepay_session=").unwrap().split(';').next().unwrap().to_owned();
    let (me, who, _) = {
        let (status, _, body) = browse(&ops, Method::GET, "/v1/me", Some(&cookie), &[], None).await;
        (status, body["name"].clone(), ())
    };
    let cross_site =
        browse(&ops, Method::POST, &retry, Some(&cookie), &[("sec-fetch-site", "cross-site")], reason()).await;
    let other_origin =
        browse(&ops, Method::POST, &retry, Some(&cookie), &[("origin", "http://evil.example")], reason()).await;
    let no_origin = browse(&ops, Method::POST, &retry, Some(&cookie), &[], reason()).await;
    let untouched = status(&pool, acme, payment_id).await;
    let (same_origin, _, done) = browse(&ops, Method::POST, &retry, Some(&cookie), SAME_ORIGIN, reason()).await;
    let (signed_out, cleared, _) = browse(&ops, Method::DELETE, "/v1/session", Some(&cookie), SAME_ORIGIN, None).await;
    let (after, _, _) = browse(&ops, Method::GET, "/v1/me", Some(&cookie), &[], None).await;

    assert_eq!((wrong, none), (StatusCode::UNAUTHORIZED, None));
    assert_eq!(from_elsewhere, StatusCode::FORBIDDEN);
    assert_eq!(signed_in, StatusCode::CREATED);
    let set_cookie = set_cookie.unwrap();
    for attribute in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    assert_eq!((me, who), (StatusCode::OK, json!("alice")));
    for (status, _, problem_body) in [cross_site, other_origin, no_origin] {
        assert_eq!(status, StatusCode::FORBIDDEN, "{problem_body}");
        assert_eq!(problem(&problem_body).0, "forbidden");
    }
    assert_eq!(untouched, PaymentStatus::DeadLettered, "a refused change changes nothing");
    assert_eq!(same_origin, StatusCode::OK, "{done}");
    assert_eq!(done["resolved_by"], "operator:alice");
    assert_eq!(signed_out, StatusCode::NO_CONTENT);
    assert!(cleared.unwrap().contains("Max-Age=0"));
    assert_eq!(after, StatusCode::UNAUTHORIZED);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn sessions_end_when_idle_at_their_expiry_and_everywhere_at_once(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let password = ops.person("bob", "approver", None).await;
    let (_, idle) = sign_in(&ops, "bob", &password).await;
    let (_, old) = sign_in(&ops, "bob", &password).await;
    let (_, laptop) = sign_in(&ops, "bob", &password).await;
    let (_, phone) = sign_in(&ops, "bob", &password).await;
    let hash = |cookie: &Option<String>| {
        use sha2::Digest;
        sha2::Sha256::digest(cookie.as_deref().unwrap().as_bytes()).to_vec()
    };
    sqlx::query!(
        "UPDATE operator_sessions SET last_seen_at = now() - interval '31 minutes' WHERE session_sha256 = $1",
        hash(&idle)
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query!(
        "UPDATE operator_sessions SET signed_in_at = now() - interval '13 hours', expires_at = now() - interval '1 hour'
         WHERE session_sha256 = $1",
        hash(&old)
    )
    .execute(&pool)
    .await
    .unwrap();
    let me = |cookie: Option<String>| {
        let ops = &ops;
        async move { browse(ops, Method::GET, "/v1/me", cookie.as_deref(), &[], None).await.0 }
    };

    let (idle_me, old_me, phone_before) = (me(idle).await, me(old).await, me(phone.clone()).await);
    let (everywhere, _, _) =
        browse(&ops, Method::DELETE, "/v1/session/everywhere", laptop.as_deref(), SAME_ORIGIN, None).await;
    let (laptop_after, phone_after) = (me(laptop).await, me(phone).await);

    assert_eq!(idle_me, StatusCode::UNAUTHORIZED, "idle too long");
    assert_eq!(old_me, StatusCode::UNAUTHORIZED, "past its absolute expiry");
    assert_eq!(phone_before, StatusCode::OK);
    assert_eq!(everywhere, StatusCode::NO_CONTENT);
    assert_eq!((laptop_after, phone_after), (StatusCode::UNAUTHORIZED, StatusCode::UNAUTHORIZED));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn wrong_passwords_lock_the_name_and_every_sign_in_is_in_the_audit_trail(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let password = ops.person("alice", "operator", None).await;

    let mut wrong = Vec::new();
    for _ in 0..5 {
        wrong.push(sign_in(&ops, "alice", "guessing wrongly").await.0);
    }
    let body = json!({ "name": "alice", "password": password });
    let response = reqwest::Client::new()
        .post(format!("{}/v1/session", ops.url))
        .header("sec-fetch-site", "same-origin")
        .json(&body)
        .send()
        .await
        .unwrap();
    let (locked, retry_after) = (response.status(), response.headers().get("retry-after").cloned());
    let (nobody, _) = sign_in(&ops, "mallory", &password).await;
    let (short, _, _) = browse(
        &ops,
        Method::PUT,
        "/v1/operators/alice/password",
        None,
        &[],
        Some(json!({ "password": "short", "reason": "x" })),
    )
    .await;

    assert_eq!(wrong, vec![StatusCode::UNAUTHORIZED; 5]);
    assert_eq!(locked, StatusCode::TOO_MANY_REQUESTS, "the right password too, while locked");
    assert_eq!(retry_after.unwrap(), "900");
    assert_eq!(nobody, StatusCode::UNAUTHORIZED);
    assert_eq!(short, StatusCode::UNAUTHORIZED, "no session, no token");
    let trail: Vec<(String, Option<uuid::Uuid>, String)> = sqlx::query!(
        "SELECT operator_name, operator_id, outcome FROM operator_audit WHERE action = 'session.sign_in' ORDER BY audit_id"
    )
    .map(|r| (r.operator_name, r.operator_id, r.outcome))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(trail.len(), 7);
    assert!(trail[..6].iter().all(|(name, id, outcome)| name == "alice" && id.is_some() && outcome == "refused"));
    assert_eq!((trail[6].0.as_str(), trail[6].1, trail[6].2.as_str()), ("(unknown name)", None, "refused"));
    let stored: Option<String> =
        sqlx::query_scalar!("SELECT password_hash FROM operators WHERE name = 'alice'").fetch_one(&pool).await.unwrap();
    assert!(stored.unwrap().starts_with("$argon2id$"));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn approving_from_a_session_takes_a_fresh_sign_in(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let alice = ops.operator("alice", "operator", None).await;
    let password = ops.person("bob", "approver", None).await;
    let (_, proposal) = ops.post(&alice, &format!("/v1/payments/{payment_id}/resolve"), failed("declined")).await;
    let approve = format!("/v1/proposals/{}/approve", proposal["proposal"]["proposal_id"].as_str().unwrap());
    let (_, stale) = sign_in(&ops, "bob", &password).await;
    sqlx::query!("UPDATE operator_sessions SET signed_in_at = now() - interval '10 minutes'")
        .execute(&pool)
        .await
        .unwrap();

    let reason = || Some(json!({ "reason": "checked" }));
    let (refused, _, why) = browse(&ops, Method::POST, &approve, stale.as_deref(), SAME_ORIGIN, reason()).await;
    let still = status(&pool, acme, payment_id).await;
    let (_, fresh) = sign_in(&ops, "bob", &password).await;
    let (approved, _, done) = browse(&ops, Method::POST, &approve, fresh.as_deref(), SAME_ORIGIN, reason()).await;

    assert_eq!(refused, StatusCode::FORBIDDEN, "{why}");
    assert!(problem(&why).1.contains("fresh sign-in"), "{why}");
    assert_eq!(still, PaymentStatus::DeadLettered);
    assert_eq!(approved, StatusCode::OK, "{done}");
    assert_eq!(status(&pool, acme, payment_id).await, PaymentStatus::Failed);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn proposals_are_listed_by_status_and_an_unknown_status_is_refused(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    tenant(&pool, "acme").await;
    let (proposed, _) = ops.post(&ops.admin, "/v1/tenants/acme/keys", json!({ "reason": "rotation" })).await;

    let (_, pending) = ops.get(&ops.admin, "/v1/proposals?status=pending").await;
    let (_, approved) = ops.get(&ops.admin, "/v1/proposals?status=approved").await;
    let (misspelt, why) = ops.get(&ops.admin, "/v1/proposals?status=pendng").await;

    assert_eq!(proposed, StatusCode::ACCEPTED);
    assert_eq!(pending.as_array().map(Vec::len), Some(1), "{pending}");
    assert_eq!(pending[0]["status"], "pending");
    assert_eq!(approved, json!([]));
    assert_eq!(misspelt, StatusCode::BAD_REQUEST, "{why}");
    assert!(problem(&why).1.contains("pendng"), "{why}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_operator_who_is_not_an_admin_may_not_propose_a_key_or_a_provider_account(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    tenant(&pool, "acme").await;
    let olga = ops.operator("olga", "operator", None).await;
    let connect = json!({ "account": "acct_1032D82eZvKYlo2C", "reason": "onboarded to Connect" });

    let (key, key_why) = ops.post(&olga, "/v1/tenants/acme/keys", json!({ "reason": "rotation" })).await;
    let (account, account_why) = ops.call(&olga, Method::PUT, "/v1/tenants/acme/provider-account", Some(connect)).await;

    assert_eq!(key, StatusCode::FORBIDDEN, "{key_why}");
    assert!(problem(&key_why).1.contains("admin"), "{key_why}");
    assert_eq!(account, StatusCode::FORBIDDEN, "{account_why}");
    assert!(problem(&account_why).1.contains("admin"), "{account_why}");
    let proposals: i64 =
        sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM proposals"#).fetch_one(&pool).await.unwrap();
    assert_eq!(proposals, 0, "a refused proposal leaves nothing to approve");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn admins_propose_tenants_and_keys_and_a_limited_admin_only_its_own(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let reason = |why: &str| json!({ "reason": why });
    let acme = tenant(&pool, "acme").await;
    tenant(&pool, "globex").await;
    let mut conn = pool.acquire().await.unwrap();
    let key = oncepay_store::tenants::issue_api_key(&mut conn, acme, None).await.unwrap();
    let lim = ops.operator("lim", "admin", Some(&["acme"])).await;
    let vic = ops.operator("vic", "viewer", None).await;

    let (root_creates, created) = ops.post(&ops.admin, "/v1/tenants", json!({"name": "initech", "reason": "x"})).await;
    let (lim_creates, _) = ops.post(&lim, "/v1/tenants", json!({"name": "hooli", "reason": "x"})).await;
    let (theirs, _) = ops.post(&lim, "/v1/tenants/globex/keys", reason("rotation")).await;
    let (viewer_issues, _) = ops.post(&vic, "/v1/tenants/acme/keys", reason("rotation")).await;
    let (issued, proposal) = ops.post(&lim, "/v1/tenants/acme/keys", reason("rotation")).await;
    let revoke = format!("/v1/tenants/acme/keys/{}", key.key_id.as_str());
    let (revoked, _) = ops.call(&lim, Method::DELETE, &revoke, Some(reason("leaked"))).await;
    let body = json!({"account": "acct_1032D82eZvKYlo2C", "reason": "onboarded to Connect"});
    let (not_theirs, _) = ops.call(&lim, Method::PUT, "/v1/tenants/globex/provider-account", Some(body)).await;
    let (_, listed) = ops.get(&lim, "/v1/tenants").await;
    let (lim_runs, _) = ops.get(&lim, "/v1/recon/runs").await;
    let (root_runs, runs) = ops.get(&ops.admin, "/v1/recon/runs").await;

    assert_eq!(root_creates, StatusCode::ACCEPTED, "{created}");
    assert_eq!(created["proposal"]["action"]["kind"], "tenant_create");
    assert_eq!(lim_creates, StatusCode::FORBIDDEN);
    assert_eq!(theirs, StatusCode::NOT_FOUND);
    assert_eq!(viewer_issues, StatusCode::FORBIDDEN);
    assert_eq!(issued, StatusCode::ACCEPTED, "{proposal}");
    assert_eq!(proposal["proposal"]["tenant"], "acme");
    assert_eq!(revoked, StatusCode::NO_CONTENT);
    assert_eq!(not_theirs, StatusCode::NOT_FOUND);
    let names: Vec<&str> = listed.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["acme"]);
    assert_eq!(lim_runs, StatusCode::FORBIDDEN);
    assert_eq!((root_runs, runs), (StatusCode::OK, json!([])));
    let trail: Vec<(String, String, String)> = sqlx::query!(
        "SELECT operator_name, action, outcome FROM operator_audit
         WHERE action LIKE 'tenant.%' OR action LIKE 'key.%' ORDER BY audit_id"
    )
    .map(|r| (r.operator_name, r.action, r.outcome))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        trail,
        rows(&[
            ("root", "tenant.create", "proposed"),
            ("lim", "tenant.create", "refused"),
            ("lim", "key.issue", "refused"),
            ("vic", "key.issue", "refused"),
            ("lim", "key.issue", "proposed"),
            ("lim", "key.revoke", "done"),
            ("lim", "tenant.connect", "refused"),
        ])
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_proposal_its_action_would_refuse_now_is_refused_at_once(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let alice = ops.operator("alice", "operator", None).await;
    let mut conn = pool.acquire().await.unwrap();
    let evidence = json!([{"source": "webhook", "charge": {"id": "ch_1", "status": "succeeded"}}]);
    assert!(dead_letters::attach_evidence(&mut conn, acme, payment_id, evidence).await.unwrap());

    let (refused, why) = ops.post(&alice, &format!("/v1/payments/{payment_id}/resolve"), failed("declined")).await;

    assert_eq!(refused, StatusCode::CONFLICT, "{why}");
    assert!(problem(&why).1.contains("a signed provider report says charge ch_1"), "{why}");
    let waiting: i64 = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM proposals"#).fetch_one(&pool).await.unwrap();
    assert_eq!(waiting, 0, "nothing waits for an approver");
    assert_eq!(status(&pool, acme, payment_id).await, PaymentStatus::DeadLettered);
    assert_eq!(audit_of(&pool, payment_id).await, rows(&[("alice", "payment.resolve", "refused")]));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_cli_proposes_a_tenant_and_collects_its_key_once_approved(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let bob = ops.operator("bob", "approver", None).await;

    let proposed = cli(&pool, &ops, &ops.admin, &["tenants", "create", "acme", "--reason", "signed", "--json"]).await;
    let proposal_id = stdout_json(&proposed)["proposal"]["proposal_id"].as_str().unwrap().to_owned();
    let approve = format!("/v1/proposals/{proposal_id}/approve");
    let (approved, _) = ops.post(&bob, &approve, json!({"reason": "contract seen"})).await;
    let collected = cli(&pool, &ops, &ops.admin, &["keys", "collect", &proposal_id, "--json"]).await;
    let again = cli(&pool, &ops, &ops.admin, &["keys", "collect", &proposal_id]).await;
    let taken = cli(&pool, &ops, &ops.admin, &["tenants", "create", "acme", "--reason", "signed"]).await;
    let listed = cli(&pool, &ops, &ops.admin, &["tenants", "list"]).await;

    assert!(proposed.status.success(), "{}", String::from_utf8_lossy(&proposed.stderr));
    assert_eq!(approved, StatusCode::OK);
    let json = stdout_json(&collected);
    assert!(json["notice"].as_str().unwrap().contains("shown once"));
    let presented = oncepay_domain::api_key::parse(json["api_key"].as_str().unwrap()).unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let stored = oncepay_store::tenants::find_api_key(&mut conn, presented.tenant_id, &presented.key_id).await.unwrap();
    assert!(stored.is_some_and(|key| !key.revoked && presented.secret_hash.matches(&key.secret_sha256)));
    for refused in [again, taken] {
        assert_eq!(refused.status.code(), Some(4));
        let stderr = String::from_utf8(refused.stderr).unwrap();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("shown only once") || stderr.contains("already exists"), "{stderr}");
    }
    let table = String::from_utf8(listed.stdout).unwrap();
    assert!(table.starts_with("NAME") && table.contains("acme"), "{table}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_admin_changes_another_operators_role_and_tenants_and_disables_them(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    tenant(&pool, "acme").await;
    let globex = tenant(&pool, "globex").await;
    let theirs = dead_lettered(&pool, globex, "k-1", 60).await;
    let alice = ops.operator("alice", "viewer", None).await;
    let patch = |body: Value| {
        let ops = &ops;
        async move { ops.call(&ops.admin, Method::PATCH, "/v1/operators/alice", Some(body)).await }
    };

    let (own, _) =
        ops.call(&ops.admin, Method::PATCH, "/v1/operators/root", Some(json!({"role": "viewer", "reason": "x"}))).await;
    let (nothing, _) = patch(json!({"reason": "x"})).await;
    let (before, _) = ops.get(&alice, &format!("/v1/payments/{theirs}")).await;
    let (limited, view) = patch(json!({"role": "operator", "tenants": ["acme"], "reason": "moved to acme"})).await;
    let (after, _) = ops.get(&alice, &format!("/v1/payments/{theirs}")).await;
    let (widened, widest) = patch(json!({"every_tenant": true, "reason": "covers everyone"})).await;
    let (disabled, _) =
        ops.call(&ops.admin, Method::DELETE, "/v1/operators/alice", Some(json!({"reason": "left"}))).await;
    let (gone, _) = ops.get(&alice, "/v1/me").await;
    let (_, listed) = ops.get(&ops.admin, "/v1/operators").await;

    assert_eq!(own, StatusCode::FORBIDDEN);
    assert_eq!(nothing, StatusCode::BAD_REQUEST);
    assert_eq!(before, StatusCode::OK);
    assert_eq!(limited, StatusCode::OK, "{view}");
    assert_eq!((view["role"].as_str(), view["tenants"].clone()), (Some("operator"), json!(["acme"])));
    assert_eq!(after, StatusCode::NOT_FOUND, "another tenant's payment, once limited");
    assert_eq!((widened, widest["tenants"].clone()), (StatusCode::OK, Value::Null));
    assert_eq!(disabled, StatusCode::NO_CONTENT);
    assert_eq!(gone, StatusCode::UNAUTHORIZED, "a disabled operator's token no longer works");
    let names: Vec<&str> = listed.as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["root"]);
    let trail: Vec<(String, String)> = sqlx::query!(
        "SELECT action, outcome FROM operator_audit WHERE action IN ('operator.update', 'operator.disable') ORDER BY audit_id"
    )
    .map(|r| (r.action, r.outcome))
    .fetch_all(&pool)
    .await
    .unwrap();
    let row = |action: &str, outcome: &str| (action.to_owned(), outcome.to_owned());
    assert_eq!(
        trail,
        [
            row("operator.update", "refused"),
            row("operator.update", "refused"),
            row("operator.update", "done"),
            row("operator.update", "done"),
            row("operator.disable", "done"),
        ]
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_admin_cannot_approve_their_own_proposal_with_a_token_they_issued_for_someone_else(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let body = json!({ "name": "bob", "role": "approver", "reason": "joined" });
    let (created, _) = ops.post(&ops.admin, "/v1/operators", body).await;
    let (_, proposal) = ops.post(&ops.admin, &format!("/v1/payments/{payment_id}/resolve"), failed("declined")).await;
    let approve = format!("/v1/proposals/{}/approve", proposal["proposal"]["proposal_id"].as_str().unwrap());
    // The admin issues bob a token, and bob's token a token of its own.
    let issue = json!({ "label": "laptop", "reason": "first token" });
    let (_, given) = ops.post(&ops.admin, "/v1/operators/bob/tokens", issue.clone()).await;
    let given = given["token"].as_str().unwrap().to_owned();
    let (_, laundered) = ops.post(&given, "/v1/operators/bob/tokens", issue).await;
    let laundered = laundered["token"].as_str().unwrap().to_owned();

    let (with_given, why) = ops.post(&given, &approve, json!({ "reason": "looks right" })).await;
    let (with_laundered, _) = ops.post(&laundered, &approve, json!({ "reason": "looks right" })).await;

    assert_eq!(created, StatusCode::CREATED);
    assert_eq!(with_given, StatusCode::FORBIDDEN, "{why}");
    assert!(problem(&why).1.contains("one person could stand behind both sides"), "{why}");
    assert_eq!(with_laundered, StatusCode::FORBIDDEN);
    assert_eq!(status(&pool, acme, payment_id).await, PaymentStatus::DeadLettered);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_approval_is_refused_when_one_person_made_both_sides_credentials(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    // root makes both accounts and issues both their tokens, so root holds both credentials.
    let alice = ops.operator_given_by_admin("alice", "operator").await;
    let bob = ops.operator_given_by_admin("bob", "approver").await;
    let (proposed, proposal) =
        ops.post(&alice, &format!("/v1/payments/{payment_id}/resolve"), failed("declined")).await;
    let approve = format!("/v1/proposals/{}/approve", proposal["proposal"]["proposal_id"].as_str().unwrap());

    let (approved, why) = ops.post(&bob, &approve, json!({ "reason": "looks right" })).await;

    assert_eq!(proposed, StatusCode::ACCEPTED, "{proposal}");
    assert_eq!(approved, StatusCode::FORBIDDEN, "{why}");
    assert!(problem(&why).1.contains("one person could stand behind both sides"), "{why}");
    assert_eq!(status(&pool, acme, payment_id).await, PaymentStatus::DeadLettered);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_admin_of_some_tenants_cannot_make_or_take_over_an_account_of_every_tenant(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    tenant(&pool, "acme").await;
    let lim = ops.operator("lim", "admin", Some(&["acme"])).await;
    let body = json!({ "name": "mallory", "role": "admin", "reason": "x" });
    let reason = json!({ "label": "x", "reason": "x" });

    let (creates, why) = ops.post(&lim, "/v1/operators", body).await;
    let (widens, _) =
        ops.call(&lim, Method::PATCH, "/v1/operators/lim", Some(json!({"every_tenant": true, "reason": "x"}))).await;
    let (issues, _) = ops.post(&lim, "/v1/operators/root/tokens", reason).await;
    let (resets, _) = ops
        .call(&lim, Method::PUT, "/v1/operators/root/password", Some(json!({"password": PASSWORD, "reason": "x"})))
        .await;
    let (disables, _) = ops.call(&lim, Method::DELETE, "/v1/operators/root", Some(json!({"reason": "x"}))).await;
    let (lists, _) = ops.get(&lim, "/v1/operators").await;

    assert_eq!(creates, StatusCode::FORBIDDEN, "{why}");
    assert!(problem(&why).1.contains("only an admin of every tenant"), "{why}");
    for status in [widens, issues, resets, disables, lists] {
        assert_eq!(status, StatusCode::FORBIDDEN);
    }
    let operators: i64 =
        sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM operators"#).fetch_one(&pool).await.unwrap();
    assert_eq!(operators, 2, "root and lim, and nobody else");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_proposal_on_a_closed_dead_letter_makes_way_for_one_on_the_next(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let alice = ops.operator("alice", "operator", None).await;
    let resolve = format!("/v1/payments/{payment_id}/resolve");
    let (_, first) = ops.post(&alice, &resolve, failed("declined")).await;
    // Someone resends it instead; it ends up dead-lettered again, under a new entry.
    let (retried, _) = ops.post(&alice, &format!("/v1/payments/{payment_id}/retry"), json!({"reason": "again"})).await;
    crate::support::claim(&pool, acme, payment_id, 60).await;
    crate::support::uncertain(&pool, acme, payment_id).await;
    let mut tx = pool.begin().await.unwrap();
    let why = oncepay_reconciler::unknown::Why { actor: "reconciler:poller", reason: "no conclusive response" };
    oncepay_reconciler::unknown::payments::exhaust(&mut tx, acme, payment_id, why, json!({"source": "poll"}))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let (second, proposal) = ops.post(&alice, &resolve, failed("declined again")).await;
    let (_, listed) = ops.get(&alice, &format!("/v1/proposals?payment_id={payment_id}")).await;

    assert_eq!(retried, StatusCode::OK);
    assert_eq!(second, StatusCode::ACCEPTED, "{proposal}");
    let first = first["proposal"]["proposal_id"].clone();
    let old = listed.as_array().unwrap().iter().find(|p| p["proposal_id"] == first).unwrap();
    assert_eq!(old["status"], "expired");
    assert_eq!(old["decision_note"], "its dead letter was closed before anyone decided");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_disabled_operators_proposals_can_no_longer_be_approved(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let alice = ops.operator("alice", "operator", None).await;
    let bob = ops.operator("bob", "approver", None).await;
    let (_, proposal) = ops.post(&alice, &format!("/v1/payments/{payment_id}/resolve"), failed("declined")).await;
    let approve = format!("/v1/proposals/{}/approve", proposal["proposal"]["proposal_id"].as_str().unwrap());

    let (disabled, _) =
        ops.call(&ops.admin, Method::DELETE, "/v1/operators/alice", Some(json!({"reason": "left"}))).await;
    let (approved, why) = ops.post(&bob, &approve, json!({"reason": "looks right"})).await;

    assert_eq!(disabled, StatusCode::NO_CONTENT);
    assert_eq!(approved, StatusCode::CONFLICT, "{why}");
    assert!(problem(&why).1.contains("already withdrawn"), "{why}");
    assert_eq!(status(&pool, acme, payment_id).await, PaymentStatus::DeadLettered);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_sign_in_posted_from_another_origin_is_refused_even_without_sec_fetch_site(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let password = ops.person("alice", "operator", None).await;
    let sign_in = || Some(json!({ "name": "alice", "password": password }));

    let (elsewhere, set, _) =
        browse(&ops, Method::POST, "/v1/session", None, &[("origin", "http://evil.example")], sign_in()).await;
    let own_origin = [("origin", ops.url.as_str())];
    let (own, own_set, _) = browse(&ops, Method::POST, "/v1/session", None, &own_origin, sign_in()).await;
    let (program, _, _) = browse(&ops, Method::POST, "/v1/session", None, &[], sign_in()).await;

    assert_eq!((elsewhere, set), (StatusCode::FORBIDDEN, None));
    assert_eq!(own, StatusCode::CREATED);
    assert!(own_set.is_some());
    assert_eq!(program, StatusCode::CREATED, "a program sends neither header");
}
