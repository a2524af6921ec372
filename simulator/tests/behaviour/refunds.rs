//! Refunds: idempotent as charges are, never beyond their charge, under the same faults, and read
//! by oncepay's own client.

use std::time::{Duration, Instant};

use futures::future::join_all;
use oncepay_domain::ids::DownstreamKey;
use oncepay_provider::wire::{ChargeStatus, ErrorBody, Refund, RefundPage, RefundState};
use oncepay_provider::{NotSentReason, PaymentProvider, RefundLookup, RefundOutcome, RefundRequest, UncertainReason};
use oncepay_simulator::control::PlantCharge;
use oncepay_simulator::faults::FaultsPatch;

use crate::support::{Sim, body, refund_body, refund_request};

async fn error_code(response: reqwest::Response) -> String {
    response.json::<ErrorBody>().await.unwrap().error.code
}

#[tokio::test]
async fn a_refund_is_made_once_and_a_repeated_key_replays_it() {
    let sim = Sim::start().await;
    let charge = sim.charged(1999).await;

    let first = sim.post_refund("refund-1", &refund_body(&charge.id, 500)).await;
    let (first_status, first_body) = (first.status(), first.bytes().await.unwrap());
    let again = sim.post_refund("refund-1", &refund_body(&charge.id, 500)).await;
    let replayed_header = again.headers().get("idempotent-replayed").cloned();
    let (again_status, again_body) = (again.status(), again.bytes().await.unwrap());

    assert_eq!(first_status, 201);
    let refund: Refund = serde_json::from_slice(&first_body).unwrap();
    assert_eq!(
        (refund.status, refund.charge.as_str(), refund.amount, refund.currency.as_str()),
        (RefundState::Succeeded, charge.id.as_str(), 500, "EUR")
    );
    assert_eq!(refund.idempotency_key.as_deref(), Some("refund-1"));
    assert_eq!(refund.metadata["ticket"], "T-1");
    assert!(refund.id.starts_with("re_"), "{}", refund.id);
    assert_eq!(again_status, 201);
    assert_eq!(again_body, first_body, "the replay is the first response, byte for byte");
    assert_eq!(replayed_header.unwrap(), "true");
    let truth = sim.control.refund_truth().await.unwrap();
    assert_eq!(truth.refunds, vec![refund]);
    assert_eq!(truth.posts_with_key("refund-1"), 2);
    assert_eq!(sim.control.ground_truth().await.unwrap().posts_with_key("refund-1"), 0, "not a charge POST");
}

#[tokio::test]
async fn concurrent_requests_with_one_refund_key_make_one_refund() {
    let sim = Sim::with_faults(FaultsPatch { latency_ms: Some(100), ..Default::default() }).await;
    let charge = sim.charged(1999).await;

    let refund = refund_body(&charge.id, 1999);
    let responses = join_all((0..20).map(|_| sim.post_refund("refund-race", &refund))).await;

    let mut ids = Vec::new();
    let mut in_flight = 0;
    for response in responses {
        match response.status().as_u16() {
            201 => ids.push(response.json::<Refund>().await.unwrap().id),
            409 => {
                assert_eq!(error_code(response).await, "idempotency_key_in_use");
                in_flight += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    let truth = sim.control.refund_truth().await.unwrap();
    assert_eq!(truth.refunds.len(), 1);
    assert!(in_flight > 0, "the duplicates overlapped the first request");
    assert!(ids.iter().all(|id| *id == truth.refunds[0].id), "every 201 names the one refund");
    assert_eq!(truth.posts_with_key("refund-race"), 20);
}

#[tokio::test]
async fn a_refund_beyond_the_charge_is_refused_with_400_and_nothing_is_made() {
    let sim = Sim::start().await;
    let charge = sim.charged(1000).await;
    let failed = sim
        .control
        .plant(&PlantCharge { status: ChargeStatus::Failed, ..PlantCharge::succeeded(1000, "EUR") })
        .await
        .unwrap();

    let part = sim.post_refund("refund-1", &refund_body(&charge.id, 600)).await;
    let over = sim.post_refund("refund-2", &refund_body(&charge.id, 401)).await;
    let over_again = sim.post_refund("refund-2", &refund_body(&charge.id, 401)).await;
    let replay_header = over_again.headers().get("idempotent-replayed").cloned();
    let unknown = sim.post_refund("refund-3", &refund_body("ch_nothing", 1)).await;
    let of_a_failed_charge = sim.post_refund("refund-4", &refund_body(&failed.id, 1)).await;
    let truth_after_refusals = sim.control.refund_truth().await.unwrap();
    let rest = sim.post_refund("refund-5", &refund_body(&charge.id, 400)).await;

    assert_eq!(part.status(), 201);
    assert_eq!(over.status(), 400);
    let refusal = over.json::<ErrorBody>().await.unwrap().error;
    assert_eq!(refusal.code, "amount_too_large");
    assert_eq!((refusal.refund, refusal.charge), (None, None), "a refusal names no refund");
    assert_eq!(over_again.status(), 400, "the refused key is decided: its retry gets the refusal");
    assert_eq!(replay_header.unwrap(), "true");
    assert_eq!(unknown.status(), 400);
    assert_eq!(error_code(unknown).await, "no_such_charge");
    assert_eq!(of_a_failed_charge.status(), 400);
    assert_eq!(error_code(of_a_failed_charge).await, "charge_not_refundable");
    assert_eq!(truth_after_refusals.refunds.len(), 1, "no refused request made a refund");
    assert_eq!(truth_after_refusals.posts_with_key("refund-2"), 2);
    assert_eq!(rest.status(), 201, "what is left can still be refunded");
    let truth = sim.control.refund_truth().await.unwrap();
    assert_eq!(truth.refunded(&charge.id), 1000);
}

#[tokio::test]
async fn concurrent_refunds_that_together_exceed_the_charge_get_one_201_and_one_400() {
    // The latency keeps both requests in flight at once.
    let sim = Sim::with_faults(FaultsPatch { latency_ms: Some(200), ..Default::default() }).await;
    let charge = sim.charged(1000).await;

    let refund = refund_body(&charge.id, 600);
    let (first, second) = tokio::join!(sim.post_refund("refund-a", &refund), sim.post_refund("refund-b", &refund));

    let mut statuses = [first.status().as_u16(), second.status().as_u16()];
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 400]);
    let truth = sim.control.refund_truth().await.unwrap();
    assert_eq!(truth.refunds.len(), 1);
    assert_eq!(truth.refunded(&charge.id), 600);
}

#[tokio::test]
async fn a_storm_of_concurrent_refunds_never_refunds_more_than_the_charge() {
    let sim = Sim::with_faults(FaultsPatch { latency_ms: Some(50), ..Default::default() }).await;
    let charge = sim.charged(1000).await;

    let keys: Vec<String> = (0..12).map(|n| format!("refund-{n}")).collect();
    let refund = refund_body(&charge.id, 300);
    let responses = join_all(keys.iter().map(|key| sim.post_refund(key, &refund))).await;

    let mut made = 0;
    for response in responses {
        match response.status().as_u16() {
            201 => made += 1,
            400 => assert_eq!(error_code(response).await, "amount_too_large"),
            other => panic!("unexpected status {other}"),
        }
    }
    let truth = sim.control.refund_truth().await.unwrap();
    assert_eq!(made, 3, "three refunds of 300 fit in 1000, a fourth does not");
    assert_eq!(truth.refunds.len(), 3);
    assert_eq!(truth.refunded(&charge.id), 900);
}

#[tokio::test]
async fn a_key_used_for_one_kind_is_refused_for_the_other_and_replays_neither() {
    let sim = Sim::start().await;
    let charge = sim.charged(1000).await;
    let charge_key = charge.idempotency_key.clone();
    sim.post_refund("refund-1", &refund_body(&charge.id, 100)).await;

    let refund_with_a_charge_key = sim.post_refund(&charge_key, &refund_body(&charge.id, 100)).await;
    let charge_with_a_refund_key = sim.post_charge("refund-1", &body(1000)).await;

    assert_eq!(refund_with_a_charge_key.status(), 422);
    assert_eq!(error_code(refund_with_a_charge_key).await, "idempotency_key_reused");
    assert_eq!(charge_with_a_refund_key.status(), 422);
    assert_eq!(error_code(charge_with_a_refund_key).await, "idempotency_key_reused");
    assert_eq!(sim.control.refund_truth().await.unwrap().refunds.len(), 1);
    assert_eq!(sim.control.ground_truth().await.unwrap().charges.len(), 1);
}

#[tokio::test]
async fn a_refund_key_reused_with_other_parameters_is_refused_with_422() {
    let sim = Sim::start().await;
    let charge = sim.charged(1000).await;
    sim.post_refund("refund-1", &refund_body(&charge.id, 100)).await;

    let reused = sim.post_refund("refund-1", &refund_body(&charge.id, 200)).await;

    assert_eq!(reused.status(), 422);
    assert_eq!(error_code(reused).await, "idempotency_key_reused");
    assert_eq!(sim.control.refund_truth().await.unwrap().refunds.len(), 1);
}

#[tokio::test]
async fn a_failed_refund_answers_402_naming_a_failed_refund_that_gives_nothing_back() {
    let sim = Sim::with_faults(FaultsPatch { refund_failure_rate: Some(1.0), ..Default::default() }).await;
    let charge = sim.charged(1000).await;

    let failed = sim.post_refund("refund-1", &refund_body(&charge.id, 1000)).await;
    assert_eq!(failed.status(), 402);
    let error = failed.json::<ErrorBody>().await.unwrap().error;
    let refund_id = error.refund.clone().expect("a failed refund is named");
    let replay = sim.post_refund("refund-1", &refund_body(&charge.id, 1000)).await;
    sim.control.set_faults(&FaultsPatch { refund_failure_rate: Some(0.0), ..Default::default() }).await.unwrap();
    let full = sim.post_refund("refund-2", &refund_body(&charge.id, 1000)).await;

    assert_eq!(error.charge, None);
    assert_eq!(replay.status(), 402);
    assert_eq!(replay.json::<ErrorBody>().await.unwrap().error.refund, Some(refund_id.clone()));
    let refund: Refund = sim.get(&format!("/v1/refunds/{refund_id}")).await.json().await.unwrap();
    assert_eq!(refund.status, RefundState::Failed);
    assert_eq!(refund.failure_reason.as_deref(), Some(error.code.as_str()));
    assert_eq!(full.status(), 201, "a failed refund does not count against the charge");
    let truth = sim.control.refund_truth().await.unwrap();
    assert_eq!(truth.refunds.len(), 2);
    assert_eq!(truth.refunded(&charge.id), 1000);
}

#[tokio::test]
async fn a_charge_decline_rate_does_not_fail_refunds() {
    let sim = Sim::start().await;
    let charge = sim.charged(1000).await;
    sim.control.set_faults(&FaultsPatch { decline_rate: Some(1.0), ..Default::default() }).await.unwrap();

    let refunded = sim.post_refund("refund-1", &refund_body(&charge.id, 1000)).await;

    assert_eq!(refunded.status(), 201);
}

#[tokio::test]
async fn oncepays_client_reads_each_refund_outcome() {
    let sim = Sim::start().await;
    let provider = sim.provider(Duration::from_secs(5));
    let charge = sim.charged(1000).await;
    let request = refund_request(&charge.id, 700);

    let refunded = provider.create_refund(&request).await;
    let resent = provider.create_refund(&request).await;
    let over = provider.create_refund(&refund_request(&charge.id, 301)).await;
    sim.control.set_faults(&FaultsPatch { refund_failure_rate: Some(1.0), ..Default::default() }).await.unwrap();
    let failed = provider.create_refund(&refund_request(&charge.id, 300)).await;

    let truth = sim.control.refund_truth().await.unwrap();
    let RefundOutcome::Refunded(refund) = &refunded else { panic!("not refunded: {refunded:?}") };
    assert_eq!(refund, &truth.refunds[0]);
    assert_eq!(refund.idempotency_key.as_deref(), Some(request.downstream_key.as_str()));
    assert_eq!(refund.refund_ref().map(|(_, id)| id.downstream_key()), Some(request.downstream_key.clone()));
    assert_eq!(resent, refunded, "a resend under the same key is the same refund");
    assert!(
        matches!(&over, RefundOutcome::Failed { code, refund_id: None, .. } if code == "provider_rejected"),
        "{over:?}"
    );
    assert!(
        matches!(&failed, RefundOutcome::Failed { refund_id: Some(id), .. } if *id == truth.refunds[1].id),
        "{failed:?}"
    );
    assert_eq!(truth.refunds.len(), 2);
}

#[tokio::test]
async fn refunds_are_found_by_charge_and_key_and_only_then() {
    let sim = Sim::start().await;
    let provider = sim.provider(Duration::from_secs(5));
    let charge = sim.charged(1000).await;
    let other_charge = sim.charged(1000).await;
    let request = refund_request(&charge.id, 100);
    let lookup = |key: &DownstreamKey, charge: &str| RefundLookup {
        key: key.clone(),
        charge_id: charge.to_owned(),
        account: None,
    };

    let RefundOutcome::Refunded(refund) = provider.create_refund(&request).await else { panic!("not refunded") };
    let found = provider.find_refunds(&lookup(&request.downstream_key, &charge.id)).await.unwrap();
    let never_used =
        provider.find_refunds(&lookup(&refund_request(&charge.id, 1).downstream_key, &charge.id)).await.unwrap();
    let of_another_charge = provider.find_refunds(&lookup(&request.downstream_key, &other_charge.id)).await.unwrap();
    let by_id = sim.get(&format!("/v1/refunds/{}", refund.id)).await;
    let missing = sim.get("/v1/refunds/re_nothing").await;

    assert_eq!(found, vec![refund.clone()]);
    assert!(never_used.is_empty());
    assert!(of_another_charge.is_empty());
    assert_eq!(by_id.json::<Refund>().await.unwrap(), refund);
    assert_eq!(missing.status(), 404);
    assert_eq!(error_code(missing).await, "resource_missing");
}

#[tokio::test]
async fn refunds_are_listed_by_window_oldest_first_a_page_at_a_time() {
    let sim = Sim::start().await;
    let charge = sim.charged(1000).await;
    let mut made = Vec::new();
    for n in 0..5 {
        made.push(
            sim.post_refund(&format!("refund-{n}"), &refund_body(&charge.id, 10)).await.json::<Refund>().await.unwrap(),
        );
    }
    made.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
    let (from, to) = (made[0].created, made[4].created + 1);

    let mut listed = Vec::new();
    let mut pages = 0;
    let mut after = String::new();
    loop {
        let cursor = if after.is_empty() { String::new() } else { format!("&starting_after={after}") };
        let page: RefundPage = sim
            .get(&format!("/v1/refunds?created_gte={from}&created_lt={to}&limit=2{cursor}"))
            .await
            .json()
            .await
            .unwrap();
        pages += 1;
        after = page.data.last().map(|r| r.id.clone()).unwrap_or_default();
        listed.extend(page.data);
        if !page.has_more {
            break;
        }
    }

    assert_eq!(listed, made);
    assert_eq!(pages, 3);
    for query in ["limit=0", "limit=101", "starting_after=re_nothing", "colour=blue", "created_gte=yesterday"] {
        assert_eq!(sim.get(&format!("/v1/refunds?{query}")).await.status(), 400, "{query}");
    }
}

#[tokio::test]
async fn refund_requests_without_the_api_key_or_with_a_bad_body_are_refused_and_change_nothing() {
    let sim = Sim::start().await;
    let charge = sim.charged(1000).await;
    let url = sim.url("/v1/refunds");

    let anonymous =
        sim.http.post(&url).header("Idempotency-Key", "k").json(&refund_body(&charge.id, 1)).send().await.unwrap();
    let lookup = sim.http.get(&url).send().await.unwrap();
    let no_key = sim.http.post(&url).bearer_auth(sim.api_key()).json(&refund_body(&charge.id, 1)).send().await.unwrap();
    let zero = sim.post_refund("k", &refund_body(&charge.id, 0)).await;
    let unknown_field = sim
        .http
        .post(&url)
        .bearer_auth(sim.api_key())
        .header("Idempotency-Key", "k2")
        .json(&serde_json::json!({"charge": charge.id, "amount": 1, "currency": "EUR"}))
        .send()
        .await
        .unwrap();

    assert_eq!((anonymous.status().as_u16(), lookup.status().as_u16()), (401, 401));
    assert_eq!(no_key.status(), 400);
    assert_eq!(error_code(no_key).await, "missing_idempotency_key");
    assert_eq!(zero.status(), 400);
    assert_eq!(unknown_field.status(), 400);
    let truth = sim.control.refund_truth().await.unwrap();
    assert!(truth.refunds.is_empty() && truth.keys.is_empty(), "{truth:?}");
}

mod faults {
    use super::*;

    #[tokio::test]
    async fn a_5xx_before_makes_no_refund_and_the_key_stays_free() {
        let sim = Sim::start().await;
        let charge = sim.charged(1000).await;
        sim.control.set_faults(&FaultsPatch { error_before_rate: Some(1.0), ..Default::default() }).await.unwrap();

        let failed = sim.post_refund("refund-1", &refund_body(&charge.id, 1000)).await;
        let truth_after_failure = sim.control.refund_truth().await.unwrap();
        sim.control.set_faults(&FaultsPatch { error_before_rate: Some(0.0), ..Default::default() }).await.unwrap();
        let retried = sim.post_refund("refund-1", &refund_body(&charge.id, 1000)).await;

        assert_eq!(failed.status(), 500);
        assert!(truth_after_failure.refunds.is_empty());
        assert_eq!(truth_after_failure.posts_with_key("refund-1"), 1, "the failed POST is still counted");
        assert_eq!(retried.status(), 201);
        assert!(retried.headers().get("idempotent-replayed").is_none(), "nothing was remembered to replay");
    }

    #[tokio::test]
    async fn a_5xx_after_leaves_a_refund_that_a_retry_gets_and_with_replay_only_a_lookup_shows() {
        let sim = Sim::start().await;
        let charge = sim.charged(1000).await;
        sim.control.set_faults(&FaultsPatch { error_after_rate: Some(1.0), ..Default::default() }).await.unwrap();

        let failed = sim.post_refund("refund-1", &refund_body(&charge.id, 400)).await;
        let failed_status = failed.status();
        let retried = sim.post_refund("refund-1", &refund_body(&charge.id, 400)).await;
        sim.control.set_faults(&FaultsPatch { replay_stored_5xx: Some(true), ..Default::default() }).await.unwrap();
        let replayed_5xx = sim.post_refund("refund-2", &refund_body(&charge.id, 400)).await;
        let replayed_again = sim.post_refund("refund-2", &refund_body(&charge.id, 400)).await;
        let listed: RefundPage =
            sim.get(&format!("/v1/refunds?charge={}&idempotency_key=refund-2", charge.id)).await.json().await.unwrap();

        assert_eq!(failed_status, 500);
        let truth = sim.control.refund_truth().await.unwrap();
        assert_eq!(truth.refunds.len(), 2, "each refund was made before its 500");
        assert_eq!(retried.status(), 201);
        assert_eq!(retried.json::<Refund>().await.unwrap(), truth.refunds[0]);
        assert_eq!((replayed_5xx.status().as_u16(), replayed_again.status().as_u16()), (500, 500));
        assert_eq!(listed.data, vec![truth.refunds[1].clone()]);
    }

    #[tokio::test]
    async fn a_hang_after_leaves_a_refund_holds_the_key_and_times_oncepay_out() {
        let sim = Sim::start().await;
        let charge = sim.charged(1000).await;
        sim.control
            .set_faults(&FaultsPatch { hang_after_rate: Some(1.0), hang_ms: Some(60_000), ..Default::default() })
            .await
            .unwrap();
        let request = refund_request(&charge.id, 1000);

        let outcome = sim.provider(Duration::from_millis(300)).create_refund(&request).await;
        let truth = sim.control.refund_truth().await.unwrap();
        let duplicate = sim.provider(Duration::from_secs(5)).create_refund(&request).await;

        assert_eq!(outcome, RefundOutcome::Uncertain(UncertainReason::Timeout));
        assert_eq!(truth.refunds_with_key(request.downstream_key.as_str()).len(), 1, "the refund exists meanwhile");
        assert_eq!(duplicate, RefundOutcome::Uncertain(UncertainReason::KeyInFlight));
    }

    #[tokio::test]
    async fn a_dropped_connection_leaves_a_refund_that_a_resend_returns() {
        let sim = Sim::start().await;
        let charge = sim.charged(1000).await;
        sim.control.set_faults(&FaultsPatch { drop_after_rate: Some(1.0), ..Default::default() }).await.unwrap();
        let provider = sim.provider(Duration::from_secs(5));
        let request = refund_request(&charge.id, 1000);

        let dropped = provider.create_refund(&request).await;
        let truth = sim.control.refund_truth().await.unwrap();
        sim.control.set_faults(&FaultsPatch { drop_after_rate: Some(0.0), ..Default::default() }).await.unwrap();
        let resent = provider.create_refund(&request).await;

        assert_eq!(dropped, RefundOutcome::Uncertain(UncertainReason::ConnectionLost));
        assert_eq!(truth.refunds_with_key(request.downstream_key.as_str()).len(), 1);
        assert_eq!(resent, RefundOutcome::Refunded(truth.refunds[0].clone()));
    }

    #[tokio::test]
    async fn a_rate_limited_refund_is_a_429_that_makes_nothing() {
        let sim = Sim::start().await;
        let charge = sim.charged(1000).await;
        sim.control
            .set_faults(&FaultsPatch {
                rate_limit_rate: Some(1.0),
                rate_limit_retry_after_secs: Some(90),
                ..Default::default()
            })
            .await
            .unwrap();

        let outcome = sim.provider(Duration::from_secs(5)).create_refund(&refund_request(&charge.id, 1000)).await;

        assert_eq!(
            outcome,
            RefundOutcome::NotSent { reason: NotSentReason::RateLimited, retry_after: Some(Duration::from_secs(90)) }
        );
        assert!(sim.control.refund_truth().await.unwrap().refunds.is_empty());
    }

    #[tokio::test]
    async fn latency_delays_refunds_and_failing_lookups_answer_503() {
        let sim = Sim::start().await;
        let charge = sim.charged(1000).await;
        sim.control
            .set_faults(&FaultsPatch { latency_ms: Some(300), lookup_error_rate: Some(1.0), ..Default::default() })
            .await
            .unwrap();

        let started = Instant::now();
        let refunded = sim.post_refund("refund-1", &refund_body(&charge.id, 1000)).await;
        let took = started.elapsed();
        let refund: Refund = refunded.json().await.unwrap();
        let by_id = sim.get(&format!("/v1/refunds/{}", refund.id)).await;
        let by_key = sim.get(&format!("/v1/refunds?charge={}&idempotency_key=refund-1", charge.id)).await;

        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert_eq!((by_id.status().as_u16(), by_key.status().as_u16()), (503, 503));
    }

    #[tokio::test]
    async fn a_hang_before_makes_the_refund_late_so_a_lookup_meanwhile_finds_nothing() {
        let sim = Sim::start().await;
        let charge = sim.charged(1000).await;
        sim.control
            .set_faults(&FaultsPatch { hang_before_rate: Some(1.0), hang_before_ms: Some(1_000), ..Default::default() })
            .await
            .unwrap();
        let provider = sim.provider(Duration::from_secs(5));
        let request = refund_request(&charge.id, 1000);
        let lookup = RefundLookup { key: request.downstream_key.clone(), charge_id: charge.id.clone(), account: None };

        let refunding = tokio::spawn({
            let (provider, request) = (provider.clone(), request.clone());
            async move { provider.create_refund(&request).await }
        });
        // The POST is counted and its key taken in one step: once counted, it hangs before refunding.
        while sim.control.refund_truth().await.unwrap().posts_with_key(request.downstream_key.as_str()) == 0 {
            tokio::task::yield_now().await;
        }
        let during = provider.find_refunds(&lookup).await.unwrap();
        let outcome = refunding.await.unwrap();
        let after = provider.find_refunds(&lookup).await.unwrap();

        assert!(during.is_empty(), "no refund while the request hangs: {during:?}");
        assert!(matches!(outcome, RefundOutcome::Refunded(_)), "{outcome:?}");
        assert_eq!(after.len(), 1);
    }

    #[tokio::test]
    async fn a_malformed_response_misreports_the_currency_while_the_books_keep_it_right() {
        let sim = Sim::start().await;
        let charge = sim.charged(1000).await;
        sim.control.set_faults(&FaultsPatch { malformed_rate: Some(1.0), ..Default::default() }).await.unwrap();

        let shown: Refund = sim.post_refund("refund-1", &refund_body(&charge.id, 1000)).await.json().await.unwrap();

        assert_eq!(shown.currency, "eur");
        assert_eq!(sim.control.refund_truth().await.unwrap().refunds[0].currency, "EUR");
    }

    /// Charge faults that would break a refund's guarantees do not touch refunds: taking one unit
    /// more would refund beyond the charge.
    #[tokio::test]
    async fn a_refund_is_never_mismatched_nor_refused_on_resend() {
        let sim = Sim::start().await;
        let charge = sim.charged(1000).await;
        sim.control
            .set_faults(&FaultsPatch { mismatch_rate: Some(1.0), refuse_resend_rate: Some(1.0), ..Default::default() })
            .await
            .unwrap();
        let request = refund_request(&charge.id, 1000);
        let provider = sim.provider(Duration::from_secs(5));

        let first = provider.create_refund(&request).await;
        let resent = provider.create_refund(&request).await;

        assert!(matches!(&first, RefundOutcome::Refunded(refund) if refund.amount == 1000), "{first:?}");
        assert_eq!(resent, first);
        assert_eq!(sim.control.refund_truth().await.unwrap().refunded(&charge.id), 1000);
    }
}

/// A request as the worker builds it, aimed at a charge in a provider account the protocol does
/// not have: refused before anything is sent.
#[tokio::test]
async fn a_refund_in_a_provider_account_is_never_sent() {
    let sim = Sim::start().await;
    let charge = sim.charged(1000).await;
    let account = oncepay_domain::provider_ref::ProviderAccount::parse("acct_1").unwrap();
    let request = RefundRequest { account: Some(account), ..refund_request(&charge.id, 1000) };

    let outcome = sim.provider(Duration::from_secs(5)).create_refund(&request).await;

    assert_eq!(outcome, RefundOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None });
    let truth = sim.control.refund_truth().await.unwrap();
    assert!(truth.refunds.is_empty() && truth.keys.is_empty());
}
