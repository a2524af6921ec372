//! The store against a real PostgreSQL: each test gets a fresh, migrated database.

// The helpers below are test code too; clippy's test allowance only covers `#[test]` functions.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use oncepay_domain::api_key;
use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::payment::PaymentResource;
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_store::fixtures::{Submission, accept, body, count, tenant};
use oncepay_store::intake::{self, Intake};
use oncepay_store::payments;
use oncepay_store::sending::{self, ClaimRequest};
use oncepay_store::tenants::{self, TenantError, TenantName};
use oncepay_store::transitions::{self, Change, Recorded, Settlement, TransitionError};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use time::OffsetDateTime;

/// What intake makes of `body` under `key`.
async fn intake_of(pool: &PgPool, tenant_id: TenantId, key: &str, body: &Value) -> Intake {
    let submission = Submission::new(key, body);
    let mut conn = pool.acquire().await.unwrap();
    intake::accept(&mut conn, &submission.for_tenant(tenant_id, None)).await.unwrap()
}

/// Puts an accepted payment into `processing` with the worker's claim.
async fn claim(pool: &PgPool, tenant_id: TenantId, payment_id: PaymentId) {
    let request = ClaimRequest {
        tenant_id,
        limit: 1,
        worker_id: "test",
        actor: "worker:test",
        lease: Duration::from_secs(60),
        resend_horizon: Duration::from_secs(3_600),
    };
    let claimed = sending::claim(&mut pool.acquire().await.unwrap(), &request).await.unwrap();
    let ids: Vec<PaymentId> = claimed.iter().map(|claimed| claimed.payment_id).collect();
    assert_eq!(ids, [payment_id], "the claim takes the tenant's oldest due payment: claim that one first");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn accepting_writes_the_key_payment_outbox_row_and_audit_row_together(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;

    let created = accept(&pool, tenant_id, "order-1", &body(1999), None).await.unwrap();

    assert_eq!(created.payment.status, PaymentStatus::Pending);
    assert!(created.key_expires_at > created.payment.created_at + time::Duration::hours(23));
    for table in ["idempotency_keys", "payments", "outbox", "payment_events"] {
        assert_eq!(count(&pool, table).await, 1, "{table}");
    }
    let mut conn = pool.acquire().await.unwrap();
    let stored = payments::fetch(&mut conn, tenant_id, created.payment.payment_id).await.unwrap().unwrap();
    assert_eq!(PaymentResource::from(&stored), PaymentResource::from(&created.payment));
}

/// Intake writes the key before its payment (the key decides between a new payment and a
/// duplicate), so the key's foreign key to its payment is checked at commit. It still holds there.
#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_key_whose_payment_was_never_written_is_refused_at_commit(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let mut tx = pool.begin().await.unwrap();

    sqlx::query!(
        "INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, payment_id, expires_at)
         VALUES ($1, 'orphan', sha256(''), $2, now() + interval '1 day')",
        tenant_id.as_uuid(),
        PaymentId::generate().as_uuid(),
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    let refused = tx.commit().await.unwrap_err();

    assert_eq!(refused.as_database_error().and_then(|e| e.code()).as_deref(), Some("23503"), "{refused}");
    assert_eq!(count(&pool, "idempotency_keys").await, 0);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn accepting_wakes_the_workers_unless_the_caller_defers_the_wakeup(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen("oncepay_outbox").await.unwrap();
    let body = body(1999);
    let submission = Submission::new("order-quiet", &body);
    let new = submission.for_tenant(tenant_id, None);

    // Deferred: the rows, and no notification. A marker sent afterwards must be the first one
    // received, since notifications arrive in commit order.
    let mut conn = pool.acquire().await.unwrap();
    let quiet = intake::accept_deferring_wakeup(&mut conn, &new).await.unwrap().created().unwrap();
    sqlx::query!("SELECT pg_notify('oncepay_outbox', 'marker')").execute(&mut *conn).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), listener.recv()).await.unwrap().unwrap();
    // Not deferred: the same rows and a notification naming the tenant, as the api's notifier does.
    accept(&pool, tenant_id, "order-loud", &body, None).await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), listener.recv()).await.unwrap().unwrap();

    assert_eq!(first.payload(), "marker");
    assert_eq!(second.payload(), tenant_id.to_string());
    assert_eq!(quiet.payment.status, PaymentStatus::Pending);
    for table in ["idempotency_keys", "payments", "outbox", "payment_events"] {
        assert_eq!(count(&pool, table).await, 2, "{table}");
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn accepting_an_existing_key_writes_nothing_and_returns_the_key_as_stored(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let first = accept(&pool, tenant_id, "order-1", &body(1999), None).await.unwrap();

    let Intake::Existing(retry) = intake_of(&pool, tenant_id, "order-1", &body(1999)).await else {
        panic!("a retry created a payment")
    };
    let Intake::Existing(misuse) = intake_of(&pool, tenant_id, "order-1", &body(5)).await else {
        panic!("a misuse created a payment")
    };

    assert_eq!(count(&pool, "payments").await, 1);
    assert_eq!(count(&pool, "outbox").await, 1);
    for existing in [&retry, &misuse] {
        assert_eq!(existing.payment_id, first.payment.payment_id);
        assert_eq!(existing.fingerprint, Fingerprint::of("POST", "/v1/payments", &body(1999)));
        assert_eq!(existing.expires_at, first.key_expires_at);
        assert!(existing.stored_response.is_none());
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_key_committed_by_a_concurrent_request_is_waited_for_and_returned_as_stored(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let request = body(1999);
    let submission = Submission::new("order-1", &request);
    let new = submission.for_tenant(tenant_id, None);
    // The first request has written the key and not committed yet.
    let mut first = pool.begin().await.unwrap();
    let created = intake::accept(&mut first, &new).await.unwrap().created().unwrap();

    // The second finds no key, so its insert waits on the first's, then reads the key again.
    let second = tokio::spawn({
        let pool = pool.clone();
        async move { intake_of(&pool, tenant_id, "order-1", &body(1999)).await }
    });
    support::blocks_another(&pool, &mut first).await;
    assert!(!second.is_finished(), "the second request did not wait for the first");
    first.commit().await.unwrap();
    let Intake::Existing(existing) = second.await.unwrap() else { panic!("the second request created a payment") };

    assert_eq!(existing.payment_id, created.payment.payment_id);
    assert_eq!(count(&pool, "payments").await, 1);
    assert_eq!(count(&pool, "outbox").await, 1);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_same_key_from_two_tenants_makes_two_payments_each_invisible_to_the_other(pool: PgPool) {
    let acme = tenant(&pool, "acme").await;
    let globex = tenant(&pool, "globex").await;

    let a = accept(&pool, acme, "order-1", &body(100), None).await.unwrap();
    let g = accept(&pool, globex, "order-1", &body(100), None).await.unwrap();

    assert_ne!(a.payment.payment_id, g.payment.payment_id);
    let mut conn = pool.acquire().await.unwrap();
    assert!(payments::fetch(&mut conn, acme, g.payment.payment_id).await.unwrap().is_none());
    assert!(payments::fetch(&mut conn, globex, a.payment.payment_id).await.unwrap().is_none());
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_success_writes_status_audit_ledger_stored_response_and_wakes_listeners(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = accept(&pool, tenant_id, "order-1", &body(1999), None).await.unwrap().payment.payment_id;
    claim(&pool, tenant_id, payment_id).await;
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen("oncepay_payment").await.unwrap();
    let charged_at = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();

    let mut tx = pool.begin().await.unwrap();
    let applied = transitions::settle(
        &mut tx,
        &Change {
            tenant_id,
            payment_id,
            from: PaymentStatus::Processing,
            transition: Transition::Charged,
            actor: "worker:test",
            reason: "provider answered 201",
            detail: Some(json!({"http_status": 201})),
        },
        &Settlement::Succeeded {
            charge_id: "ch_1".into(),
            amount: Amount::new(1999).unwrap(),
            currency: Currency::parse("EUR").unwrap(),
            charged_at,
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let Recorded::Moved(payment) = applied else { panic!("lost a race nobody ran") };
    assert_eq!(payment.status, PaymentStatus::Succeeded);
    assert_eq!(payment.provider_charge_id.as_deref(), Some("ch_1"));
    let notification = tokio::time::timeout(Duration::from_secs(5), listener.recv()).await.unwrap().unwrap();
    assert_eq!(notification.payload(), payment_id.to_string());
    let ledger = sqlx::query!(
        "SELECT amount, provider_charge_id, charged_at FROM ledger_entries WHERE payment_id = $1",
        payment_id.as_uuid()
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((ledger.amount, ledger.provider_charge_id.as_str(), ledger.charged_at), (1999, "ch_1", charged_at));
    let key = sqlx::query!(
        r#"SELECT response_status AS "response_status!", response_body AS "response_body!"
           FROM idempotency_keys WHERE payment_id = $1"#,
        payment_id.as_uuid()
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(key.response_status, 200);
    assert_eq!(key.response_body, serde_json::to_value(PaymentResource::from(&payment)).unwrap());
    let trail: Vec<(Option<PaymentStatus>, PaymentStatus, String)> = sqlx::query!(
        r#"SELECT from_status AS "from_status: PaymentStatus", to_status AS "to_status!: PaymentStatus", actor
           FROM payment_events WHERE payment_id = $1 ORDER BY seq"#,
        payment_id.as_uuid()
    )
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .map(|event| (event.from_status, event.to_status, event.actor))
    .collect();
    assert_eq!(
        trail.last().unwrap(),
        &(Some(PaymentStatus::Processing), PaymentStatus::Succeeded, "worker:test".into())
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_decline_records_the_failure_and_no_ledger_entry(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = accept(&pool, tenant_id, "order-1", &body(1999), None).await.unwrap().payment.payment_id;
    claim(&pool, tenant_id, payment_id).await;

    let mut conn = pool.acquire().await.unwrap();
    let applied = transitions::settle(
        &mut conn,
        &Change {
            tenant_id,
            payment_id,
            from: PaymentStatus::Processing,
            transition: Transition::Declined,
            actor: "worker:test",
            reason: "provider answered 402",
            detail: None,
        },
        &Settlement::Failed {
            code: "card_declined".into(),
            message: "Declined".into(),
            charge_id: Some("ch_2".into()),
        },
    )
    .await
    .unwrap();

    let Recorded::Moved(payment) = applied else { panic!("lost a race nobody ran") };
    let resource = PaymentResource::from(&payment);
    assert_eq!(resource.failure.unwrap().code, "card_declined");
    assert_eq!(count(&pool, "ledger_entries").await, 0);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_change_from_a_status_the_payment_has_left_loses_the_race_and_writes_nothing(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = accept(&pool, tenant_id, "order-1", &body(1999), None).await.unwrap().payment.payment_id;
    let events_before = count(&pool, "payment_events").await;

    let mut conn = pool.acquire().await.unwrap();
    let settled = transitions::settle(
        &mut conn,
        &Change {
            tenant_id,
            payment_id,
            from: PaymentStatus::Processing,
            transition: Transition::Charged,
            actor: "worker:late",
            reason: "a stale worker",
            detail: None,
        },
        &Settlement::Succeeded {
            charge_id: "ch_1".into(),
            amount: Amount::new(1999).unwrap(),
            currency: Currency::parse("EUR").unwrap(),
            charged_at: OffsetDateTime::now_utc(),
        },
    )
    .await
    .unwrap();
    let moved = transitions::apply(
        &mut conn,
        &Change {
            tenant_id,
            payment_id,
            from: PaymentStatus::Processing,
            transition: Transition::Uncertain,
            actor: "worker:late",
            reason: "a stale worker",
            detail: None,
        },
    )
    .await
    .unwrap();

    assert!(matches!(settled, Recorded::LostRace));
    assert!(matches!(moved, Recorded::LostRace));
    assert_eq!(count(&pool, "payment_events").await, events_before);
    assert_eq!(count(&pool, "ledger_entries").await, 0);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn moves_the_state_machine_forbids_are_refused_before_touching_the_database(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = accept(&pool, tenant_id, "order-1", &body(1999), None).await.unwrap().payment.payment_id;
    let mut conn = pool.acquire().await.unwrap();
    let change = |transition| Change {
        tenant_id,
        payment_id,
        from: PaymentStatus::Pending,
        transition,
        actor: "test",
        reason: "test",
        detail: None,
    };

    let illegal = transitions::apply(&mut conn, &change(Transition::Exhausted)).await;
    let terminal_without_settlement = transitions::apply(&mut conn, &change(Transition::Claim)).await;
    let mismatched = transitions::settle(
        &mut conn,
        &Change { from: PaymentStatus::Processing, ..change(Transition::Charged) },
        &Settlement::Failed { code: "x".into(), message: "x".into(), charge_id: None },
    )
    .await;

    assert!(matches!(illegal, Err(TransitionError::Illegal(_))));
    // Claiming is the worker's own statement: it also counts the attempt, which the schema demands.
    assert!(matches!(terminal_without_settlement, Err(TransitionError::Store(_))));
    assert!(matches!(mismatched, Err(TransitionError::SettlementMismatch { .. })));
    let status = sqlx::query_scalar!(r#"SELECT status AS "status!: PaymentStatus" FROM payments"#)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, PaymentStatus::Pending);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn tenant_names_are_unique_and_keys_are_stored_only_as_hashes(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let name = TenantName::parse("acme").unwrap();
    let acme = tenants::create(&mut conn, TenantId::generate(), &name, Some(50), None).await.unwrap();

    let duplicate = tenants::create(&mut conn, TenantId::generate(), &name, None, None).await;
    let key = tenants::issue_api_key(&mut conn, acme.tenant_id, Some("ci")).await.unwrap();
    let presented = api_key::parse(api_key::reveal(&key)).unwrap();
    let stored = tenants::find_api_key(&mut conn, presented.tenant_id, &presented.key_id).await.unwrap().unwrap();

    assert!(matches!(duplicate, Err(TenantError::NameTaken(_))));
    assert!(presented.secret_hash.matches(&stored.secret_sha256));
    assert!(!stored.revoked);
    assert_eq!(stored.rate_limit_per_second, Some(50));
    let secret_in_db = sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM api_keys WHERE position($1 in encode(secret_sha256, 'escape')) > 0"#,
        &api_key::reveal(&key)[api_key::PREFIX.len()..]
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(secret_in_db, 0);

    assert!(tenants::revoke_api_key(&mut conn, acme.tenant_id, &presented.key_id).await.unwrap());
    let revoked = tenants::find_api_key(&mut conn, presented.tenant_id, &presented.key_id).await.unwrap().unwrap();
    assert!(revoked.revoked);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn one_provider_charge_is_never_booked_to_two_payments(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let mut payments = Vec::new();
    for key in ["order-1", "order-2"] {
        let payment_id = accept(&pool, tenant_id, key, &body(1999), None).await.unwrap().payment.payment_id;
        claim(&pool, tenant_id, payment_id).await;
        payments.push(payment_id);
    }
    let charged = Settlement::Succeeded {
        charge_id: "ch_once".into(),
        amount: Amount::new(1999).unwrap(),
        currency: Currency::parse("EUR").unwrap(),
        charged_at: OffsetDateTime::now_utc(),
    };
    let change = |payment_id| Change {
        tenant_id,
        payment_id,
        from: PaymentStatus::Processing,
        transition: Transition::Charged,
        actor: "worker:test",
        reason: "provider answered 201",
        detail: None,
    };
    let mut conn = pool.acquire().await.unwrap();

    let first = transitions::settle(&mut conn, &change(payments[0]), &charged).await;
    let second = transitions::settle(&mut conn, &change(payments[1]), &charged).await;

    assert!(matches!(first, Ok(Recorded::Moved(_))), "{first:?}");
    assert!(matches!(second, Err(TransitionError::Store(_))), "{second:?}");
    assert_eq!(count(&pool, "ledger_entries").await, 1);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_method_is_stored_read_back_and_kept_in_the_final_response(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let mut with_method = body(1999);
    with_method["payment_method"] = json!("pm_card_visa");

    let created = accept(&pool, tenant_id, "order-1", &with_method, None).await.unwrap();

    let payment_id = created.payment.payment_id;
    let mut conn = pool.acquire().await.unwrap();
    let stored = payments::fetch(&mut conn, tenant_id, payment_id).await.unwrap().unwrap();
    assert_eq!(stored.payment_method.as_ref().map(|m| m.as_str()), Some("pm_card_visa"));
    assert_eq!(PaymentResource::from(&stored), PaymentResource::from(&created.payment));
    claim(&pool, tenant_id, payment_id).await;
    let change = Change {
        tenant_id,
        payment_id,
        from: PaymentStatus::Processing,
        transition: Transition::Charged,
        actor: "worker:test",
        reason: "provider answered 201",
        detail: None,
    };
    let charged = Settlement::Succeeded {
        charge_id: "ch_1".into(),
        amount: Amount::new(1999).unwrap(),
        currency: Currency::parse("EUR").unwrap(),
        charged_at: OffsetDateTime::now_utc(),
    };
    let Recorded::Moved(settled) = transitions::settle(&mut conn, &change, &charged).await.unwrap() else {
        panic!("lost a race nobody ran")
    };
    assert_eq!(settled.payment_method, stored.payment_method);
    let response = sqlx::query_scalar!(
        r#"SELECT response_body AS "response_body!" FROM idempotency_keys WHERE payment_id = $1"#,
        payment_id.as_uuid()
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(response["payment_method"], "pm_card_visa");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_database_refuses_a_payment_method_the_request_would_refuse(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = accept(&pool, tenant_id, "order-1", &body(1999), None).await.unwrap().payment.payment_id;
    let set = |method: String| {
        sqlx::query!(
            "UPDATE payments SET payment_method = $1 WHERE tenant_id = $2 AND payment_id = $3",
            method,
            tenant_id.as_uuid(),
            payment_id.as_uuid()
        )
        .execute(&pool)
    };

    for refused in [String::new(), "pm-card".into(), "pm card".into(), "pm_cärd".into(), "p".repeat(256)] {
        let error = set(refused.clone()).await.unwrap_err();
        assert_eq!(oncepay_store::sqlstate(&error).as_deref(), Some("23514"), "{refused:?}: {error}");
    }
    for allowed in ["pm_card_visa".to_owned(), "p".repeat(255)] {
        set(allowed).await.unwrap();
    }
}

/// An api built before the payment method existed calls `intake` with thirteen arguments; while it is
/// rolled out after the migration, its accepts must keep working.
#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn intake_called_without_a_payment_method_accepts_a_payment_without_one(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let fingerprint = Fingerprint::of("POST", "/v1/payments", &body(1999));
    let payment_id = PaymentId::generate();

    let created = sqlx::query_scalar!(
        r#"SELECT created AS "created!"
           FROM intake($1, 'order-1', $2, $3, 86400, 1999, 'EUR', 'cus_1', NULL, '{}', NULL, NULL, false)"#,
        tenant_id.as_uuid(),
        fingerprint.as_bytes().as_slice(),
        payment_id.as_uuid()
    )
    .fetch_one(&pool)
    .await
    .unwrap();

    assert!(created);
    let mut conn = pool.acquire().await.unwrap();
    let stored = payments::fetch(&mut conn, tenant_id, payment_id).await.unwrap().unwrap();
    assert_eq!(stored.payment_method, None);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refused_refund_leaves_its_payment_unlocked_on_the_connection_it_used(pool: PgPool) {
    use oncepay_store::fixtures::RefundSubmission;
    use oncepay_store::refunds::intake::{self as refund_intake, RefundIntake, Refusal};

    let tenant_id = tenant(&pool, "acme").await;
    let created = accept(&pool, tenant_id, "order-1", &body(1999), None).await.unwrap();
    let payment_id = created.payment.payment_id;
    let submission = RefundSubmission::new("refund-1", payment_id, &json!({"amount": 500}));
    let new = submission.for_payment(tenant_id, payment_id, None);
    // Held, not returned to the pool: the api keeps a refused request's connection for the next.
    let mut conn = pool.acquire().await.unwrap();

    let intake = refund_intake::accept(&mut conn, &new).await.unwrap();

    assert!(
        matches!(intake, RefundIntake::Refused(Refusal::NotRefundable { status: PaymentStatus::Pending })),
        "{intake:?}"
    );
    // The refusal was decided with the payment's row locked; the lock went with the transaction.
    let locked = sqlx::query_scalar!(
        r#"SELECT true AS "locked!" FROM payments WHERE tenant_id = $1 AND payment_id = $2 FOR UPDATE NOWAIT"#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_one(&pool)
    .await;
    assert!(locked.is_ok(), "the payment is still locked by the refused refund: {locked:?}");
    drop(conn);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn two_creates_with_one_key_at_once_make_one_endpoint(pool: PgPool) {
    use oncepay_store::merchant_endpoints::{self, CreateKey, Created, NewEndpoint};
    use sqlx::Connection;

    static FINGERPRINT: [u8; 32] = [7; 32];
    let tenant_id = tenant(&pool, "acme").await;
    let new = NewEndpoint {
        url: "https://merchant.example/hooks",
        description: "",
        event_types: &[],
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    };
    let key = CreateKey { key: "endpoint-1", fingerprint: &FINGERPRINT, retention: Duration::from_secs(86_400) };
    // The first create holds its transaction open while the second starts.
    let mut first = pool.acquire().await.unwrap();
    let mut open = first.begin().await.unwrap();
    let made = merchant_endpoints::create_once(&mut open, tenant_id, &new, &key).await.unwrap();
    let Created::New { endpoint: made, .. } = made else { panic!("the first create made nothing: {made:?}") };
    let second = tokio::spawn({
        let (pool, new) = (pool.clone(), new.clone());
        async move {
            let mut conn = pool.acquire().await.unwrap();
            merchant_endpoints::create_once(&mut conn, tenant_id, &new, &key).await.unwrap()
        }
    });
    support::blocks_another(&pool, &mut open).await;
    assert!(!second.is_finished(), "the second create did not wait for the first");
    open.commit().await.unwrap();

    match second.await.unwrap() {
        Created::Existing { endpoint, fingerprint: made_by, .. } => {
            assert_eq!(endpoint.endpoint_id, made.endpoint_id);
            assert_eq!(made_by, FINGERPRINT);
        }
        other => panic!("the second create made another endpoint: {other:?}"),
    }
    assert_eq!(count(&pool, "merchant_endpoints").await, 1);
}

/// A plan made while the outbox was empty must not read a whole backlog later. The worker keeps
/// its connections, and PostgreSQL keeps a connection's plans until the outbox is analysed or
/// vacuumed again (migration 0540, BENCHMARKS.md "Plans made on an empty outbox"). In each test the
/// connection that runs the statement plans it first on an emptied outbox, beside a history of
/// payments; a backlog of 2,000 then builds up, and the statement may read only the rows it works on.
///
/// The claim, on an outbox emptied by `TRUNCATE` (which leaves its size unknown to PostgreSQL).
#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_claim_planned_on_a_truncated_outbox_reads_only_what_it_claims_from_a_backlog(pool: PgPool) {
    let read = outbox_rows_read_by_a_claim_of_5(&pool, &["TRUNCATE outbox"]).await;

    assert!(read <= 50, "the claim of 5 read {read} outbox rows");
}

/// The claim, on an outbox that drained to nothing and was vacuumed, as autovacuum leaves a queue
/// that the workers emptied: PostgreSQL then knows the table holds no row at all.
#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_claim_planned_on_a_drained_and_vacuumed_outbox_reads_only_what_it_claims_from_a_backlog(pool: PgPool) {
    let read = outbox_rows_read_by_a_claim_of_5(&pool, &["DELETE FROM outbox", "VACUUM outbox"]).await;

    assert!(read <= 50, "the claim of 5 read {read} outbox rows");
}

/// The take that ends sends, run often enough on the vacuumed empty outbox for PostgreSQL to
/// consider a reusable plan.
#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn ending_sends_planned_on_a_drained_and_vacuumed_outbox_reads_only_their_rows(pool: PgPool) {
    let (tenant_id, mut conn) = outbox_drained_and_vacuumed(&pool).await;
    let gone = claimed_then_gone(&pool, tenant_id).await;
    for _ in 0..8 {
        assert!(sending::take_all(&mut conn, &gone.iter().collect::<Vec<_>>()).await.unwrap().is_empty());
    }
    queue_pending(&pool, tenant_id, 2_000).await;
    let claimed = sending::claim(&mut pool.acquire().await.unwrap(), &claim_request(tenant_id, 5)).await.unwrap();

    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let taken = sending::take_all(&mut tx, &claimed.iter().collect::<Vec<_>>()).await.unwrap();
    let read = rows_read(&mut tx, "outbox").await;

    assert_eq!(taken.len(), 5);
    assert!(read <= 50, "ending 5 sends read {read} outbox rows");
}

/// The release that schedules a send again, likewise.
#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_release_planned_on_a_drained_and_vacuumed_outbox_reads_only_its_row(pool: PgPool) {
    let (tenant_id, mut conn) = outbox_drained_and_vacuumed(&pool).await;
    let gone = claimed_then_gone(&pool, tenant_id).await;
    for claimed in &gone {
        assert!(!sending::release(&mut conn, claimed, Duration::from_secs(1)).await.unwrap());
        assert!(!sending::release(&mut conn, claimed, Duration::from_secs(1)).await.unwrap());
    }
    queue_pending(&pool, tenant_id, 2_000).await;
    let claimed = sending::claim(&mut pool.acquire().await.unwrap(), &claim_request(tenant_id, 1)).await.unwrap();

    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let released = sending::release(&mut tx, &claimed[0], Duration::from_secs(1)).await.unwrap();
    let read = rows_read(&mut tx, "outbox").await;

    assert!(released);
    assert!(read <= 10, "releasing one send read {read} outbox rows");
}

/// The release that ends a refund's send, from a refund outbox drained and vacuumed likewise:
/// refunds are sent by the same protocol.
#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_release_planned_on_a_drained_and_vacuumed_outbox_reads_only_its_row(pool: PgPool) {
    use oncepay_store::refunds::sending::{self as refund_sending, Release};
    let window = oncepay_provider::KeyWindow { window: Duration::from_secs(86_400), safety_margin: Duration::ZERO };
    let lease = Duration::from_secs(60);
    let mut conn = pool.acquire().await.unwrap();
    let tenant_id = tenant(&pool, "acme").await;
    queue_refunds(&pool, tenant_id, 2_000).await;
    for statement in ["ANALYZE refund_outbox", "DELETE FROM refund_outbox", "VACUUM refund_outbox"] {
        sqlx::query(statement).execute(&pool).await.unwrap();
    }
    queue_refunds(&pool, tenant_id, 5).await;
    let gone =
        refund_sending::claim(&mut pool.acquire().await.unwrap(), tenant_id, 5, "test", lease, window).await.unwrap();
    for statement in ["DELETE FROM refund_outbox", "VACUUM refund_outbox"] {
        sqlx::query(statement).execute(&pool).await.unwrap();
    }
    let later = OffsetDateTime::now_utc() + time::Duration::minutes(1);
    for claimed in gone.iter().chain(&gone) {
        assert!(!refund_sending::release(&mut conn, claimed, Release::Done).await.unwrap());
        assert!(!refund_sending::release(&mut conn, claimed, Release::RetryAt(later)).await.unwrap());
    }
    queue_refunds(&pool, tenant_id, 2_000).await;
    let claimed =
        refund_sending::claim(&mut pool.acquire().await.unwrap(), tenant_id, 2, "test", lease, window).await.unwrap();

    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let done = refund_sending::release(&mut tx, &claimed[0], Release::Done).await.unwrap();
    let again = refund_sending::release(&mut tx, &claimed[1], Release::RetryAt(later)).await.unwrap();
    let read = rows_read(&mut tx, "refund_outbox").await;

    assert!(done && again);
    assert!(read <= 10, "releasing two refunds read {read} outbox rows");
}

/// Queues `count` pending refunds of the tenant, each of a succeeded payment of its own.
async fn queue_refunds(pool: &PgPool, tenant_id: TenantId, count: i32) {
    sqlx::query(
        "WITH paid AS (
             INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id, metadata, status,
                                   send_attempts, first_sent_at, provider_charge_id, may_be_charged, refunds_reserved)
             SELECT $1, gen_random_uuid(), 1999, 'EUR', 'cus-1', '{}', 'succeeded', 1, now(), 'ch_' || g, true, 100
             FROM generate_series(1, $2) AS g
             RETURNING tenant_id, payment_id
         ), asked AS (
             INSERT INTO refunds (tenant_id, refund_id, payment_id, amount, currency, requested_by)
             SELECT tenant_id, gen_random_uuid(), payment_id, 100, 'EUR', 'test' FROM paid
             RETURNING tenant_id, refund_id
         )
         INSERT INTO refund_outbox (tenant_id, refund_id) SELECT tenant_id, refund_id FROM asked",
    )
    .bind(tenant_id.as_uuid())
    .bind(count)
    .execute(pool)
    .await
    .unwrap();
}

/// Analyses an outbox of 2,000 rows, empties it with `emptying`, makes a connection's first claim,
/// builds a backlog of 2,000, and returns how many outbox rows a claim of 5 then reads.
async fn outbox_rows_read_by_a_claim_of_5(pool: &PgPool, emptying: &[&'static str]) -> i64 {
    // Held from the start: PostgreSQL may report a connection's earlier reads with its transaction's.
    let mut conn = pool.acquire().await.unwrap();
    let tenant_id = tenant(pool, "acme").await;
    outbox_analysed_then_emptied(pool, tenant_id, emptying).await;
    let request = claim_request(tenant_id, 5);
    assert!(sending::claim(&mut conn, &request).await.unwrap().is_empty());
    queue_pending(pool, tenant_id, 2_000).await;

    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let claimed = sending::claim(&mut tx, &request).await.unwrap();
    let read = rows_read(&mut tx, "outbox").await;
    assert_eq!(claimed.len(), 5);
    read
}

/// A tenant whose outbox was analysed with 2,000 rows, then drained and vacuumed, and a connection
/// that has read nothing yet (held from the start: PostgreSQL may report a connection's earlier
/// reads with its transaction's).
async fn outbox_drained_and_vacuumed(pool: &PgPool) -> (TenantId, sqlx::pool::PoolConnection<sqlx::Postgres>) {
    let conn = pool.acquire().await.unwrap();
    let tenant_id = tenant(pool, "acme").await;
    outbox_analysed_then_emptied(pool, tenant_id, &["DELETE FROM outbox", "VACUUM outbox"]).await;
    (tenant_id, conn)
}

/// Five claims whose outbox rows are gone again, as after the sweeper dropped them: statements
/// that end a send find nothing for them. The outbox is left drained and vacuumed.
async fn claimed_then_gone(pool: &PgPool, tenant_id: TenantId) -> Vec<sending::Claimed> {
    queue_pending(pool, tenant_id, 5).await;
    let claimed = sending::claim(&mut pool.acquire().await.unwrap(), &claim_request(tenant_id, 5)).await.unwrap();
    for statement in ["DELETE FROM outbox", "VACUUM outbox"] {
        sqlx::query(statement).execute(pool).await.unwrap();
    }
    assert_eq!(claimed.len(), 5);
    claimed
}

/// Fills the tenant's outbox with 2,000 rows of finished payments, analyses it, and empties it.
async fn outbox_analysed_then_emptied(pool: &PgPool, tenant_id: TenantId, emptying: &[&'static str]) {
    sqlx::query(
        "INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id, metadata, status,
                               failure_code, failure_message)
         SELECT $1, gen_random_uuid(), 1999, 'EUR', 'cus-1', '{}', 'failed', 'card_declined', 'declined'
         FROM generate_series(1, 2000)",
    )
    .bind(tenant_id.as_uuid())
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO outbox (tenant_id, payment_id) SELECT tenant_id, payment_id FROM payments")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("ANALYZE payments, outbox").execute(pool).await.unwrap();
    for &statement in emptying {
        sqlx::query(statement).execute(pool).await.unwrap();
    }
}

/// Queues `count` new pending payments of the tenant.
async fn queue_pending(pool: &PgPool, tenant_id: TenantId, count: i32) {
    sqlx::query(
        "WITH paid AS (
             INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id, metadata)
             SELECT $1, gen_random_uuid(), 1999, 'EUR', 'cus-1', '{}' FROM generate_series(1, $2)
             RETURNING tenant_id, payment_id)
         INSERT INTO outbox (tenant_id, payment_id) SELECT tenant_id, payment_id FROM paid",
    )
    .bind(tenant_id.as_uuid())
    .bind(count)
    .execute(pool)
    .await
    .unwrap();
}

fn claim_request(tenant_id: TenantId, limit: u32) -> ClaimRequest<'static> {
    ClaimRequest {
        tenant_id,
        limit,
        worker_id: "test",
        actor: "worker:test",
        lease: Duration::from_secs(60),
        resend_horizon: Duration::from_secs(3_600),
    }
}

/// Rows of `table` the connection's transaction has read so far, by scans and through indexes.
async fn rows_read(tx: &mut sqlx::PgConnection, table: &str) -> i64 {
    let (scanned, fetched): (i64, i64) =
        sqlx::query_as("SELECT seq_tup_read, idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relname = $1")
            .bind(table)
            .fetch_one(tx)
            .await
            .unwrap();
    scanned + fetched
}
