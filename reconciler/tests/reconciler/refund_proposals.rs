//! Operators' refunds through the operations API against a real PostgreSQL: a refund of a succeeded
//! payment proposed by one operator and made, once, through the merchants' intake when a second
//! approves it; and refunds automation gave up on (`dead_lettered`), listed, resent and settled with
//! their money booked right. The server runs in the test's process; the CLI as a child process.

use std::process::Output;

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::refund_status::RefundStatus;
use oncepay_ops::dead_letters::refunds::{self as dead_refunds, RefundResolution};
use oncepay_ops::operator_error::OperatorError;
use oncepay_provider::{Refund as ProviderRefund, RefundState};
use oncepay_reconciler::unknown::refunds as unknown_refunds;
use oncepay_reconciler::unknown::{self, Why};
use oncepay_store::fixtures::{self, tenant};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;
use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::cli::command;
use crate::support::{
    self, Ops, accept, audit_of, count_for, count_for_refund, problem, refund, refund_status, refunded, rows,
    succeeded_payment, unknown_refund,
};

const DAY: i64 = 86_400;

/// The `before` and `after` of the payment's audit row of `action` with `outcome`.
async fn before_and_after(pool: &PgPool, payment_id: PaymentId, action: &str, outcome: &str) -> (Value, Value) {
    sqlx::query!(
        "SELECT before, after FROM operator_audit WHERE payment_id = $1 AND action = $2 AND outcome = $3",
        payment_id.as_uuid(),
        action,
        outcome
    )
    .map(|r| (r.before.unwrap_or(Value::Null), r.after.unwrap_or(Value::Null)))
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The payment's refunds, oldest first: (id, status, amount, requested_by).
async fn refunds_of(pool: &PgPool, payment_id: PaymentId) -> Vec<(RefundId, RefundStatus, i64, String)> {
    sqlx::query!(
        r#"SELECT refund_id AS "refund_id: RefundId", status AS "status: RefundStatus", amount, requested_by
           FROM refunds WHERE payment_id = $1 ORDER BY created_at, refund_id"#,
        payment_id.as_uuid()
    )
    .map(|r| (r.refund_id, r.status, r.amount, r.requested_by))
    .fetch_all(pool)
    .await
    .unwrap()
}

fn proposal_id(answer: &Value) -> String {
    answer["proposal"]["proposal_id"].as_str().unwrap_or_else(|| panic!("no proposal in {answer}")).to_owned()
}

fn refund_body(amount: Option<i64>, reason: &str) -> Value {
    json!({ "amount": amount, "refund_reason": "requested_by_customer", "reason": reason })
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_is_made_once_and_only_when_a_second_approver_approves_it(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 1999).await;
    let alice = ops.operator("alice", "approver", None).await;
    let bob = ops.operator("bob", "approver", None).await;
    let vic = ops.operator("vic", "viewer", None).await;
    let path = format!("/v1/payments/{payment_id}/refund");

    let (viewer_proposes, viewer_refusal) = ops.post(&vic, &path, refund_body(Some(500), "returned")).await;
    let (proposed, proposal) = ops.post(&alice, &path, refund_body(Some(500), "the order came back")).await;
    let proposal_id = proposal_id(&proposal);
    let approve = format!("/v1/proposals/{proposal_id}/approve");
    let nothing_yet = (refunds_of(&pool, payment_id).await.len(), refunded(&pool, payment_id).await);
    let (own, own_refusal) = ops.post(&alice, &approve, json!({"reason": "looks right"})).await;
    let (approved, done) = ops.post(&bob, &approve, json!({"reason": "the return is in the warehouse"})).await;
    let (again, again_refusal) = ops.post(&bob, &approve, json!({"reason": "twice"})).await;
    let (_, page) = ops.get(&bob, &format!("/v1/payments/{payment_id}")).await;

    assert_eq!(viewer_proposes, StatusCode::FORBIDDEN);
    assert_eq!(problem(&viewer_refusal).1, "vic is a viewer; to refund a payment takes the operator role or above");
    assert_eq!(proposed, StatusCode::ACCEPTED, "{proposal}");
    assert_eq!(
        proposal["proposal"]["action"],
        json!({"kind": "refund", "amount": 500, "comes_to": 500, "currency": "EUR", "reason": "requested_by_customer"})
    );
    assert_eq!(nothing_yet, (0, (0, 0)), "a proposal moves no money");
    assert_eq!(own, StatusCode::FORBIDDEN);
    assert!(problem(&own_refusal).1.contains("nobody approves their own"), "{own_refusal}");
    assert_eq!(approved, StatusCode::OK, "{done}");
    assert_eq!(done["proposal"]["status"], "approved");
    assert_eq!(done["result"]["done"], "accepted");
    assert_eq!(done["result"]["refund_status"], "pending");
    assert_eq!(done["result"]["by"], "operator:alice, approved by bob");
    assert_eq!(again, StatusCode::CONFLICT);
    assert_eq!(problem(&again_refusal).1, format!("proposal {proposal_id} was already approved by bob"));
    let made = refunds_of(&pool, payment_id).await;
    assert_eq!(made.len(), 1, "exactly one refund: {made:?}");
    let (refund_id, status, amount, requested_by) = made[0].clone();
    assert_eq!((status, amount, requested_by.as_str()), (RefundStatus::Pending, 500, "operator:alice"));
    assert_eq!(done["result"]["refund_id"], json!(refund_id));
    assert_eq!(refunded(&pool, payment_id).await, (500, 0), "reserved on the payment, not yet given back");
    assert_eq!(count_for_refund(&pool, "refund_outbox", refund_id).await, 1, "queued for the worker");
    let key: String =
        sqlx::query_scalar!("SELECT idempotency_key FROM refund_keys WHERE refund_id = $1", refund_id.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(key, format!("proposal-{proposal_id}"));
    let first_actor: String =
        sqlx::query_scalar!("SELECT actor FROM refund_events WHERE refund_id = $1 AND seq = 1", refund_id.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(first_actor, "operator:alice");
    assert_eq!(
        audit_of(&pool, payment_id).await,
        rows(&[
            ("vic", "payment.refund", "refused"),
            ("alice", "payment.refund", "proposed"),
            ("bob", "proposal.approve", "done"),
            ("bob", "payment.read", "done"),
        ])
    );
    let (proposed_before, _) = before_and_after(&pool, payment_id, "payment.refund", "proposed").await;
    assert_eq!(
        (proposed_before["refunds_reserved"].as_i64(), proposed_before["refund_count"].as_i64()),
        (Some(0), Some(0))
    );
    let (approved_before, approved_after) = before_and_after(&pool, payment_id, "proposal.approve", "done").await;
    assert_eq!(approved_before["refunds_reserved"], 0);
    assert_eq!((approved_after["refund_id"].clone(), approved_after["amount"].clone()), (json!(refund_id), json!(500)));
    assert_eq!(page["refunds"]["refunds_reserved"], 500);
    assert_eq!(page["refunds"]["amount_refunded"], 0);
    assert_eq!(page["refunds"]["refunds"][0]["refund_id"], json!(refund_id));
    assert_eq!(page["refunds"]["refunds"][0]["requested_by"], "operator:alice");
    assert_eq!(page["entries"], json!([]), "a payment without a dead letter has a page too");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_approval_carried_out_again_finds_the_refund_its_key_made_and_makes_no_second(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 1999).await;
    let alice = ops.operator("alice", "operator", None).await;
    let bob = ops.operator("bob", "approver", None).await;
    let carol = ops.operator("carol", "approver", None).await;
    let (_, proposal) =
        ops.post(&alice, &format!("/v1/payments/{payment_id}/refund"), refund_body(Some(500), "returned")).await;
    let proposal_id = proposal_id(&proposal);
    let approve = format!("/v1/proposals/{proposal_id}/approve");
    let (_, first) = ops.post(&bob, &approve, json!({"reason": "checked"})).await;
    // As if the approval's answer was lost and the proposal still waited, with what it saw now:
    // only the refund's key stands between a second approval and a second refund.
    sqlx::query!(
        "UPDATE proposals SET status = 'pending', decided_by = NULL, decided_at = NULL, decision_note = NULL,
                seen_refunds_reserved = 500, seen_refund_count = 1
         WHERE proposal_id = $1",
        Uuid::parse_str(&proposal_id).unwrap()
    )
    .execute(&pool)
    .await
    .unwrap();

    let (approved_again, second) = ops.post(&carol, &approve, json!({"reason": "checked again"})).await;

    assert_eq!(approved_again, StatusCode::OK, "{second}");
    assert_eq!(second["result"]["refund_id"], first["result"]["refund_id"]);
    assert_eq!(refunds_of(&pool, payment_id).await.len(), 1, "no second refund");
    assert_eq!(refunded(&pool, payment_id).await, (500, 0), "nothing reserved twice");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_that_could_not_be_made_now_is_refused_at_once_and_nothing_is_written(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 1999).await;
    let pending = accept(&pool, acme, "order-2", 1999).await;
    let alice = ops.operator("alice", "operator", None).await;
    refund(&pool, acme, payment_id, "r-api-1", 1500).await;
    let path = format!("/v1/payments/{payment_id}/refund");

    let (too_much, too_much_refusal) = ops.post(&alice, &path, refund_body(Some(700), "returned")).await;
    let (zero, _) = ops.post(&alice, &path, refund_body(Some(0), "returned")).await;
    let (no_reason, _) = ops.post(&alice, &path, refund_body(Some(100), " ")).await;
    let (not_charged, not_charged_refusal) =
        ops.post(&alice, &format!("/v1/payments/{pending}/refund"), refund_body(None, "returned")).await;
    refund(&pool, acme, payment_id, "r-api-2", 499).await;
    let (nothing_left, nothing_left_refusal) = ops.post(&alice, &path, refund_body(None, "returned")).await;

    assert_eq!(too_much, StatusCode::CONFLICT);
    assert_eq!(
        problem(&too_much_refusal).1,
        format!("payment {payment_id} has 4.99 EUR left to refund, and 7.00 EUR is more than that")
    );
    assert_eq!(zero, StatusCode::BAD_REQUEST);
    assert_eq!(no_reason, StatusCode::BAD_REQUEST);
    assert_eq!(not_charged, StatusCode::CONFLICT);
    assert_eq!(
        problem(&not_charged_refusal).1,
        format!("payment {pending} is pending: only a succeeded payment can be refunded")
    );
    assert_eq!(nothing_left, StatusCode::CONFLICT);
    assert!(problem(&nothing_left_refusal).1.contains("nothing left to refund"), "{nothing_left_refusal}");
    assert_eq!(fixtures::count(&pool, "proposals").await, 0);
    let made: Vec<String> = refunds_of(&pool, payment_id).await.into_iter().map(|r| r.3).collect();
    assert_eq!(made, ["api", "api"], "only the merchant's refunds");
    assert_eq!(refunded(&pool, payment_id).await, (1999, 0));
    assert_eq!(count_for(&pool, "refunds", pending).await, 0);
    let refused = rows(&[
        ("alice", "payment.refund", "refused"),
        ("alice", "payment.refund", "refused"),
        ("alice", "payment.refund", "refused"),
        ("alice", "payment.refund", "refused"),
    ]);
    assert_eq!(audit_of(&pool, payment_id).await, refused, "each refusal is recorded, and nothing else");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_approval_after_the_merchant_refunded_in_between_does_nothing(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 1999).await;
    let alice = ops.operator("alice", "operator", None).await;
    let bob = ops.operator("bob", "approver", None).await;
    let (_, proposal) =
        ops.post(&alice, &format!("/v1/payments/{payment_id}/refund"), refund_body(Some(1500), "returned")).await;
    let proposal_id = proposal_id(&proposal);
    refund(&pool, acme, payment_id, "r-api-1", 1000).await;

    let (approved, refusal) =
        ops.post(&bob, &format!("/v1/proposals/{proposal_id}/approve"), json!({"reason": "checked"})).await;

    assert_eq!(approved, StatusCode::CONFLICT);
    assert_eq!(
        problem(&refusal).1,
        format!(
            "the refunds of payment {payment_id} changed since it was proposed (1 more refund was accepted; what it has \
             promised back went from 0.00 EUR to 10.00 EUR); nothing was done. Read it again, and propose anew if the decision \
             still holds"
        )
    );
    let made: Vec<(RefundStatus, i64, String)> =
        refunds_of(&pool, payment_id).await.into_iter().map(|r| (r.1, r.2, r.3)).collect();
    assert_eq!(made, [(RefundStatus::Pending, 1000, "api".to_owned())], "only the merchant's refund");
    assert_eq!(refunded(&pool, payment_id).await, (1000, 0));
    let status: String = sqlx::query_scalar!(
        "SELECT status::text AS \"status!\" FROM proposals WHERE proposal_id = $1",
        Uuid::parse_str(&proposal_id).unwrap()
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(status, "pending", "the refused approval decided nothing");
}

/// A refund of `amount` of `payment_id`, sent `sent_secs_ago`, that the reconciler gave up on after
/// its lookups: `dead_lettered`, with the last lookup in its history.
pub(crate) async fn dead_lettered_refund(
    pool: &PgPool,
    tenant_id: TenantId,
    payment_id: PaymentId,
    key: &str,
    amount: i64,
    sent_secs_ago: i64,
) -> RefundId {
    let refund_id = unknown_refund(pool, tenant_id, payment_id, key, amount, sent_secs_ago).await;
    let why =
        Why { actor: "reconciler:refund-poller", reason: "no conclusive response from the provider after 30 lookups" };
    let evidence = unknown::evidence("poll", json!({"attempt": 30, "result": "lookup failed: HTTP 503"}));
    let mut tx = pool.begin().await.unwrap();
    unknown_refunds::exhaust(&mut tx, tenant_id, refund_id, why, evidence).await.unwrap();
    tx.commit().await.unwrap();
    refund_id
}

/// The provider's refund `id` of `refund_id`, of the payment's charge `ch_order-1`.
fn provider_refund(refund_id: RefundId, id: &str, status: RefundState, amount: i64) -> ProviderRefund {
    oncepay_provider::fixtures::refund(refund_id, id, "ch_order-1", status, amount)
}

/// A refund the provider reported under its key for other money: `dead_lettered` with that refund
/// as evidence.
async fn mismatched_refund(pool: &PgPool, tenant_id: TenantId, payment_id: PaymentId, key: &str) -> RefundId {
    let refund_id = unknown_refund(pool, tenant_id, payment_id, key, 500, 60).await;
    let reported = provider_refund(refund_id, "re_other", RefundState::Succeeded, 400);
    let why = Why { actor: "reconciler:refund-poller", reason: "The provider's refund re_other is for 400, not 500." };
    let evidence = unknown::evidence("poll", json!({"attempt": 1, "refunds": [reported]}));
    let mut tx = pool.begin().await.unwrap();
    unknown_refunds::mismatch(&mut tx, tenant_id, refund_id, why, evidence).await.unwrap();
    tx.commit().await.unwrap();
    refund_id
}

/// The refund's ledger entries: (provider refund id, amount).
async fn refund_ledger(pool: &PgPool, refund_id: RefundId) -> Vec<(String, i64)> {
    sqlx::query!(
        "SELECT provider_refund_id, amount FROM refund_ledger_entries WHERE refund_id = $1",
        refund_id.as_uuid()
    )
    .map(|r| (r.provider_refund_id, r.amount))
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The last row of the refund's history: (actor, to_status).
async fn last_refund_event(pool: &PgPool, refund_id: RefundId) -> (String, RefundStatus) {
    sqlx::query!(
        r#"SELECT actor, to_status AS "to_status: RefundStatus" FROM refund_events WHERE refund_id = $1
           ORDER BY seq DESC LIMIT 1"#,
        refund_id.as_uuid()
    )
    .map(|r| (r.actor, r.to_status))
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_dead_lettered_refund_settled_as_succeeded_is_booked_and_given_back_once_approved(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 1999).await;
    let refund_id = dead_lettered_refund(&pool, acme, payment_id, "r-1", 500, 60).await;
    let alice = ops.operator("alice", "operator", None).await;
    let bob = ops.operator("bob", "approver", None).await;
    let resolve = format!("/v1/refunds/{refund_id}/resolve");
    let succeeded = |amount: i64| {
        json!({
            "as": "succeeded", "provider_refund_id": "re_1", "amount": amount, "currency": "EUR",
            "refunded_at": "2026-01-10T12:00:00Z", "reason": "the dashboard shows re_1 refunded"
        })
    };

    let (listed, list) = ops.get(&alice, "/v1/dead-letters/refunds").await;
    let (shown, detail) = ops.get(&alice, &format!("/v1/refunds/{refund_id}")).await;
    let (other_money, other_money_refusal) = ops.post(&alice, &resolve, succeeded(400)).await;
    let (proposed, proposal) = ops.post(&alice, &resolve, succeeded(500)).await;
    let before_approval = (refund_status(&pool, refund_id).await, refunded(&pool, payment_id).await);
    let (approved, done) =
        ops.post(&bob, &format!("/v1/proposals/{}/approve", proposal_id(&proposal)), json!({"reason": "seen"})).await;

    assert_eq!(listed, StatusCode::OK);
    assert_eq!(list[0]["refund_id"], json!(refund_id));
    assert_eq!(list[0]["reason"], "no conclusive response from the provider after 30 lookups");
    assert_eq!(shown, StatusCode::OK);
    assert_eq!(detail["history"].as_array().unwrap().last().unwrap()["to_status"], "dead_lettered");
    assert_eq!(other_money, StatusCode::CONFLICT);
    assert!(problem(&other_money_refusal).1.contains("4.00 EUR is not it"), "{other_money_refusal}");
    assert_eq!(proposed, StatusCode::ACCEPTED, "{proposal}");
    assert_eq!(proposal["proposal"]["action"]["kind"], "refund_succeeded");
    assert_eq!(before_approval, (RefundStatus::DeadLettered, (500, 0)), "nothing moves before the approval");
    assert_eq!(approved, StatusCode::OK, "{done}");
    assert_eq!(done["result"]["done"], "succeeded");
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Succeeded);
    assert_eq!(refund_ledger(&pool, refund_id).await, [("re_1".to_owned(), 500)]);
    assert_eq!(refunded(&pool, payment_id).await, (500, 500), "given back, once");
    assert_eq!(
        last_refund_event(&pool, refund_id).await,
        ("operator:alice, approved by bob".to_owned(), RefundStatus::Succeeded)
    );
    assert_eq!(
        audit_of(&pool, payment_id).await,
        rows(&[
            ("alice", "payment.read", "done"),
            ("alice", "refund.resolve", "proposed"),
            ("bob", "proposal.approve", "done")
        ]),
        "reading the refund shows customer data, and is recorded"
    );
    let refusal: Value = sqlx::query_scalar!(
        r#"SELECT detail AS "detail!" FROM operator_audit WHERE action = 'refund.resolve' AND outcome = 'refused'"#
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(refusal["refund_id"], json!(refund_id), "a refusal is recorded with the refund it was about");
    assert!(refusal["refusal"].as_str().unwrap().contains("4.00 EUR"), "{refusal}");
    let (_, list) = ops.get(&alice, "/v1/dead-letters/refunds").await;
    assert_eq!(list, json!([]), "settled, it waits for nobody");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refunds_resolution_takes_the_providers_lower_case_currency_and_refuses_money_that_is_not_money(
    pool: PgPool,
) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 1999).await;
    let refund_id = dead_lettered_refund(&pool, acme, payment_id, "r-1", 500, 60).await;
    let alice = ops.operator("alice", "operator", None).await;
    let resolve = format!("/v1/refunds/{refund_id}/resolve");
    let succeeded = |amount: i64, currency: &str| {
        json!({
            "as": "succeeded", "provider_refund_id": "re_1", "amount": amount, "currency": currency,
            "refunded_at": "2026-01-10T12:00:00Z", "reason": "the dashboard shows re_1 refunded"
        })
    };

    let (negative, negative_why) = ops.post(&alice, &resolve, succeeded(-500, "EUR")).await;
    let (malformed, malformed_why) = ops.post(&alice, &resolve, succeeded(500, "EURO")).await;
    let (proposed, proposal) = ops.post(&alice, &resolve, succeeded(500, "eur")).await;

    assert_eq!(negative, StatusCode::BAD_REQUEST, "{negative_why}");
    assert!(problem(&negative_why).1.contains("amount -500 must be"), "{negative_why}");
    assert_eq!(malformed, StatusCode::BAD_REQUEST, "{malformed_why}");
    assert!(problem(&malformed_why).1.contains(r#"currency "EURO""#), "{malformed_why}");
    assert_eq!(proposed, StatusCode::ACCEPTED, "{proposal}");
    assert_eq!(proposal["proposal"]["action"]["kind"], "refund_succeeded");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_dead_lettered_refund_settled_as_failed_gives_its_money_back_to_the_payment(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 1999).await;
    let lost = dead_lettered_refund(&pool, acme, payment_id, "r-1", 500, 60).await;
    let contradicted = mismatched_refund(&pool, acme, payment_id, "r-2").await;
    let alice = ops.operator("alice", "operator", None).await;
    let bob = ops.operator("bob", "approver", None).await;
    let failed = |force: bool| json!({"as": "failed", "force": force, "reason": "the provider has no such refund"});

    let (_, proposal) = ops.post(&alice, &format!("/v1/refunds/{lost}/resolve"), failed(false)).await;
    let (approved, done) =
        ops.post(&bob, &format!("/v1/proposals/{}/approve", proposal_id(&proposal)), json!({"reason": "ok"})).await;
    let after_lost = refunded(&pool, payment_id).await;
    let (unforced, unforced_refusal) =
        ops.post(&alice, &format!("/v1/refunds/{contradicted}/resolve"), failed(false)).await;
    let (forced, _) = ops.post(&alice, &format!("/v1/refunds/{contradicted}/resolve"), failed(true)).await;

    assert_eq!(approved, StatusCode::OK, "{done}");
    assert_eq!(refund_status(&pool, lost).await, RefundStatus::Failed);
    let failure: (Option<String>, Option<String>) =
        sqlx::query!("SELECT failure_code, failure_message FROM refunds WHERE refund_id = $1", lost.as_uuid())
            .map(|r| (r.failure_code, r.failure_message))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(failure, (Some("resolved_by_operator".to_owned()), Some("the provider has no such refund".to_owned())));
    assert!(refund_ledger(&pool, lost).await.is_empty());
    assert_eq!(after_lost, (500, 0), "its 500 is back to refund; the other refund's 500 stays reserved");
    assert_eq!(unforced, StatusCode::CONFLICT);
    assert!(problem(&unforced_refusal).1.contains("re_other"), "{unforced_refusal}");
    assert_eq!(forced, StatusCode::ACCEPTED, "an operator who says why may force it, for an approver");
    assert_eq!(refund_status(&pool, contradicted).await, RefundStatus::DeadLettered);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_dead_lettered_refund_is_resent_at_once_in_the_key_window_and_past_it_only_when_approved(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 1999).await;
    let recent = dead_lettered_refund(&pool, acme, payment_id, "r-recent", 500, 60).await;
    let old = dead_lettered_refund(&pool, acme, payment_id, "r-old", 700, 2 * DAY).await;
    let alice = ops.operator("alice", "operator", None).await;
    let bob = ops.operator("bob", "approver", None).await;
    let retry = |refund_id: RefundId, outside: bool| {
        let ops = &ops;
        let alice = &alice;
        async move {
            let body = json!({"reason": "the provider is back", "outside_key_window": outside});
            ops.post(alice, &format!("/v1/refunds/{refund_id}/retry"), body).await
        }
    };

    let (done, resent) = retry(recent, false).await;
    let (refused, refusal) = retry(old, false).await;
    let (proposed, proposal) = retry(old, true).await;
    let still = refund_status(&pool, old).await;
    let (approved, _) =
        ops.post(&bob, &format!("/v1/proposals/{}/approve", proposal_id(&proposal)), json!({"reason": "ok"})).await;

    assert_eq!(done, StatusCode::OK, "{resent}");
    assert_eq!(resent["done"], "retried");
    assert_eq!(refund_status(&pool, recent).await, RefundStatus::Pending);
    assert_eq!(count_for_refund(&pool, "refund_outbox", recent).await, 1, "queued for the worker");
    assert_eq!(refused, StatusCode::CONFLICT);
    assert!(problem(&refusal).1.contains("may have forgotten its key"), "{refusal}");
    assert_eq!(proposed, StatusCode::ACCEPTED, "{proposal}");
    assert_eq!(
        proposal["proposal"]["action"],
        json!({"kind": "refund_retry", "refund_id": old, "outside_key_window": true})
    );
    assert_eq!(still, RefundStatus::DeadLettered);
    assert_eq!(approved, StatusCode::OK);
    assert_eq!(refund_status(&pool, old).await, RefundStatus::Pending);
    let may_have_moved: bool =
        sqlx::query_scalar!("SELECT may_have_moved FROM refunds WHERE refund_id = $1", old.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(!may_have_moved, "the approvers vouched that no earlier send refunded");
    assert_eq!(count_for_refund(&pool, "refund_outbox", old).await, 1);
    assert_eq!(refunded(&pool, payment_id).await, (1200, 0), "still reserved, never given back twice");
    assert_eq!(
        last_refund_event(&pool, old).await,
        ("operator:alice, approved by bob".to_owned(), RefundStatus::Pending)
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_operator_limited_to_one_tenant_is_told_not_found_for_anothers_refunds(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let globex = tenant(&pool, "globex").await;
    let mine = succeeded_payment(&pool, acme, "order-acme", 1999).await;
    let theirs = succeeded_payment(&pool, globex, "order-1", 1999).await;
    let their_refund = dead_lettered_refund(&pool, globex, theirs, "r-1", 500, 60).await;
    let lim = ops.operator("lim", "approver", Some(&["acme"])).await;
    let reason = json!({"reason": "x"});

    let answers = [
        ops.get(&lim, &format!("/v1/payments/{theirs}")).await,
        ops.post(&lim, &format!("/v1/payments/{theirs}/refund"), refund_body(Some(100), "x")).await,
        ops.get(&lim, &format!("/v1/refunds/{their_refund}")).await,
        ops.post(&lim, &format!("/v1/refunds/{their_refund}/retry"), reason.clone()).await,
        ops.post(&lim, &format!("/v1/refunds/{their_refund}/resolve"), json!({"as": "failed", "reason": "x"})).await,
    ];
    let (_, listed) = ops.get(&lim, "/v1/dead-letters/refunds").await;
    let (own, _) = ops.get(&lim, &format!("/v1/payments/{mine}")).await;

    for (status, body) in answers {
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert!(!body.to_string().contains("globex"), "{body}");
    }
    assert_eq!(listed, json!([]));
    assert_eq!(own, StatusCode::OK);
    assert_eq!(fixtures::count(&pool, "proposals").await, 0);
    assert_eq!(refund_status(&pool, their_refund).await, RefundStatus::DeadLettered);
    assert_eq!(refunds_of(&pool, theirs).await.len(), 1, "no refund made for another tenant");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_provider_refund_named_for_a_resolution_is_looked_up_and_judged_against_the_refund(pool: PgPool) {
    let acme = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 1999).await;
    let refund_id = dead_lettered_refund(&pool, acme, payment_id, "r-1", 500, 60).await;
    let provider = MockServer::start().await;
    let listed = json!({"data": [
        provider_refund(refund_id, "re_1", RefundState::Succeeded, 500),
        provider_refund(refund_id, "re_2", RefundState::Succeeded, 400),
        provider_refund(refund_id, "re_3", RefundState::Pending, 500),
    ], "has_more": false});
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .and(query_param("charge", "ch_order-1"))
        .and(query_param("idempotency_key", refund_id.downstream_key().as_str()))
        .respond_with(ResponseTemplate::new(200).set_body_json(listed))
        .mount(&provider)
        .await;
    let provider = fixtures::provider(&provider.uri());
    let mut conn = pool.acquire().await.unwrap();

    let found = dead_refunds::find_refund(&mut conn, &provider, acme, refund_id, "re_1").await;
    let other_money = dead_refunds::find_refund(&mut conn, &provider, acme, refund_id, "re_2").await;
    let unfinished = dead_refunds::find_refund(&mut conn, &provider, acme, refund_id, "re_3").await;
    let unknown = dead_refunds::find_refund(&mut conn, &provider, acme, refund_id, "re_9").await;

    assert!(
        matches!(found, Ok(RefundResolution::Succeeded { ref provider_refund_id, .. }) if provider_refund_id == "re_1"),
        "{found:?}"
    );
    assert!(matches!(other_money, Err(OperatorError::Refused(ref why)) if why.contains("400")), "{other_money:?}");
    assert!(
        matches!(unfinished, Err(OperatorError::Refused(ref why)) if why.contains("not finished")),
        "{unfinished:?}"
    );
    assert!(matches!(unknown, Err(OperatorError::Refused(ref why)) if why.contains("re_9")), "{unknown:?}");
}

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
async fn the_cli_proposes_a_refund_and_works_dead_lettered_refunds_through_the_api(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 1999).await;
    let other = succeeded_payment(&pool, acme, "order-2", 1999).await;
    let refund_id = dead_lettered_refund(&pool, acme, other, "r-1", 500, 60).await;
    let carol = ops.operator("carol", "operator", None).await;
    let bob = ops.operator("bob", "approver", None).await;
    let (payment, refund) = (payment_id.to_string(), refund_id.to_string());

    let proposed = cli(
        &pool,
        &ops,
        &carol,
        &[
            "--json",
            "refunds",
            "propose",
            &payment,
            "--amount",
            "500",
            "--refund-reason",
            "duplicate",
            "--reason",
            "charged twice",
        ],
    )
    .await;
    let too_much =
        cli(&pool, &ops, &carol, &["refunds", "propose", &payment, "--amount", "5000", "--reason", "all of it"]).await;
    let listed = cli(&pool, &ops, &carol, &["refunds", "dead-letters"]).await;
    let shown = cli(&pool, &ops, &carol, &["refunds", "show", &refund]).await;
    let retried = cli(&pool, &ops, &carol, &["--json", "refunds", "retry", &refund, "--reason", "provider back"]).await;
    let proposal_id = stdout_json(&proposed)["proposal"]["proposal_id"].as_str().unwrap().to_owned();
    let approved =
        cli(&pool, &ops, &bob, &["--json", "proposals", "approve", &proposal_id, "--reason", "it was a duplicate"])
            .await;
    let page = cli(&pool, &ops, &bob, &["dead-letters", "show", &payment]).await;

    assert_eq!(stdout_json(&proposed)["proposal"]["action"]["reason"], "duplicate");
    assert_eq!(too_much.status.code(), Some(4), "refused: {}", String::from_utf8_lossy(&too_much.stderr));
    assert!(String::from_utf8_lossy(&too_much.stderr).contains("19.99 EUR left to refund"));
    let table = String::from_utf8(listed.stdout).unwrap();
    assert!(table.starts_with("REFUND") && table.contains(&refund), "{table}");
    let detail = String::from_utf8(shown.stdout).unwrap();
    assert!(detail.contains("dead_lettered") && detail.contains("30 lookups"), "{detail}");
    assert_eq!(stdout_json(&retried)["done"], "retried");
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Pending);
    assert_eq!(stdout_json(&approved)["result"]["refund_status"], "pending");
    let page = String::from_utf8(page.stdout).unwrap();
    assert!(page.contains("operator:carol") && page.contains("5.00 EUR"), "{page}");
    assert_eq!(refunded(&pool, payment_id).await, (500, 0));
}

/// The provider's refund `id` of `refund_id` as a webhook reports it: naming the refund in its
/// metadata, as oncepay's refunds do.
fn reported_by_webhook(tenant_id: TenantId, refund_id: RefundId, id: &str, status: RefundState) -> ProviderRefund {
    ProviderRefund {
        metadata: [
            (oncepay_provider::metadata_keys::TENANT_ID.to_owned(), tenant_id.to_string()),
            (oncepay_provider::metadata_keys::REFUND_ID.to_owned(), refund_id.to_string()),
        ]
        .into(),
        ..provider_refund(refund_id, id, status, 500)
    }
}

/// A refund of 500 under `key` that a webhook settled as succeeded with the provider's refund
/// `re_<key>`, and that two later webhooks say failed: `succeeded`, with a conflict for an operator.
pub(crate) async fn contradicted_refund(
    pool: &PgPool,
    tenant_id: TenantId,
    payment_id: PaymentId,
    key: &str,
) -> RefundId {
    use oncepay_reconciler::refund_webhooks as webhooks;

    let refund_id = unknown_refund(pool, tenant_id, payment_id, key, 500, 60).await;
    let provider_refund_id = format!("re_{key}");
    let succeeded = reported_by_webhook(tenant_id, refund_id, &provider_refund_id, RefundState::Succeeded);
    let failed = reported_by_webhook(tenant_id, refund_id, &provider_refund_id, RefundState::Failed);
    let applied = webhooks::apply_reported(pool, &format!("{key}-1"), "refund.updated", &succeeded).await.unwrap();
    assert_eq!(applied.label(), "applied");
    for id in [format!("{key}-2"), format!("{key}-3")] {
        let contradicted = webhooks::apply_reported(pool, &id, "refund.failed", &failed).await.unwrap();
        assert_eq!(contradicted.label(), "conflict");
    }
    refund_id
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_webhook_that_contradicts_a_final_refund_is_a_dead_letter_an_operator_acknowledges(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 1999).await;
    let refund_id = contradicted_refund(&pool, acme, payment_id, "r-1").await;
    let alice = ops.operator("alice", "operator", None).await;
    let vic = ops.operator("vic", "viewer", None).await;
    let resolve = format!("/v1/refunds/{refund_id}/resolve");
    let acknowledge = json!({"as": "acknowledged", "reason": "the customer's bank confirms the money came back"});

    let (_, listed) = ops.get(&vic, "/v1/dead-letters/refunds").await;
    let (by_a_viewer, _) = ops.post(&vic, &resolve, acknowledge.clone()).await;
    let (settle_instead, settle_refusal) =
        ops.post(&alice, &resolve, json!({"as": "failed", "reason": "the provider says it failed"})).await;
    let (acknowledged, done) = ops.post(&alice, &resolve, acknowledge.clone()).await;
    let (again, again_refusal) = ops.post(&alice, &resolve, acknowledge).await;
    let (_, after) = ops.get(&vic, "/v1/dead-letters/refunds").await;

    let entries = listed.as_array().unwrap_or_else(|| panic!("not a list: {listed}"));
    assert_eq!(entries.len(), 1, "{listed}");
    assert_eq!(entries[0]["refund_id"], json!(refund_id));
    assert_eq!(entries[0]["kind"], "conflict");
    assert_eq!(entries[0]["refund_status"], "succeeded");
    assert!(entries[0]["reason"].as_str().unwrap().contains("failed"), "{listed}");
    assert_eq!(entries[0]["evidence"].as_array().map(Vec::len), Some(2), "both contradictions: {listed}");
    assert_eq!(by_a_viewer, StatusCode::FORBIDDEN);
    assert_eq!(settle_instead, StatusCode::CONFLICT, "a final refund never moves: {settle_refusal}");
    assert_eq!(acknowledged, StatusCode::OK, "{done}");
    assert_eq!(done["done"], "acknowledged");
    assert_eq!(done["refund_status"], "succeeded");
    assert_eq!(done["by"], "operator:alice");
    assert_eq!(again, StatusCode::CONFLICT, "{again_refusal}");
    assert!(problem(&again_refusal).1.contains("no open conflict"), "{again_refusal}");
    assert_eq!(after, json!([]), "acknowledged, it is no longer waiting");
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Succeeded, "the refund keeps its final status");
    assert_eq!(refunded(&pool, payment_id).await, (500, 500));
    assert_eq!(count_for_refund(&pool, "refund_ledger_entries", refund_id).await, 1);
    let audit = audit_of(&pool, payment_id).await;
    assert!(audit.contains(&("alice".into(), "refund.acknowledge".into(), "done".into())), "{audit:?}");
    let (before, after) = before_and_after(&pool, payment_id, "refund.acknowledge", "done").await;
    assert_eq!(before["status"], "succeeded", "{before}");
    assert_eq!(after["done"], "acknowledged", "{after}");
}
