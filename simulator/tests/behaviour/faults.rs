//! Each fault does what it says, and faults change at run time.

use std::time::{Duration, Instant};

use oncepay_provider::wire::{Charge, ChargePage, CreateCharge, ErrorBody};
use oncepay_provider::{PaymentProvider, SendOutcome, UncertainReason};
use oncepay_simulator::faults::{Faults, FaultsPatch};

use crate::support::{Sim, body, body_paying_with, charge_request, eventually, settings};

#[tokio::test]
async fn a_5xx_before_creates_nothing_and_the_key_stays_free() {
    let sim = Sim::with_faults(FaultsPatch { error_before_rate: Some(1.0), ..Default::default() }).await;

    let failed = sim.post_charge("key-1", &body(1999)).await;
    let truth_after_failure = sim.control.ground_truth().await.unwrap();
    sim.control.set_faults(&FaultsPatch { error_before_rate: Some(0.0), ..Default::default() }).await.unwrap();
    let retried = sim.post_charge("key-1", &body(1999)).await;

    assert_eq!(failed.status(), 500);
    assert!(truth_after_failure.charges.is_empty());
    assert_eq!(truth_after_failure.posts_with_key("key-1"), 1, "the failed POST is still counted");
    assert_eq!(retried.status(), 201);
    assert!(retried.headers().get("idempotent-replayed").is_none(), "nothing was remembered to replay");
    assert_eq!(sim.control.ground_truth().await.unwrap().charges.len(), 1);
}

#[tokio::test]
async fn a_5xx_after_leaves_a_charge_and_a_retry_gets_the_charge() {
    let sim = Sim::with_faults(FaultsPatch { error_after_rate: Some(1.0), ..Default::default() }).await;

    let failed = sim.post_charge("key-1", &body(1999)).await;
    let failed_status = failed.status();
    let retried = sim.post_charge("key-1", &body(1999)).await;

    assert_eq!(failed_status, 500);
    let truth = sim.control.ground_truth().await.unwrap();
    assert_eq!(truth.charges.len(), 1, "the charge was made before the 500");
    assert_eq!(retried.status(), 201);
    assert_eq!(retried.json::<Charge>().await.unwrap(), truth.charges[0]);
}

#[tokio::test]
async fn with_replay_on_a_retry_gets_the_stored_5xx_while_the_charge_exists() {
    let sim = Sim::with_faults(FaultsPatch {
        error_after_rate: Some(1.0),
        replay_stored_5xx: Some(true),
        ..Default::default()
    })
    .await;

    let first = sim.post_charge("key-1", &body(1999)).await;
    let first_body = first.bytes().await.unwrap();
    let replays = [sim.post_charge("key-1", &body(1999)).await, sim.post_charge("key-1", &body(1999)).await];

    for replay in replays {
        assert_eq!(replay.status(), 500);
        assert_eq!(replay.bytes().await.unwrap(), first_body);
    }
    let truth = sim.control.ground_truth().await.unwrap();
    assert_eq!(truth.charges.len(), 1);
    assert_eq!(truth.posts_with_key("key-1"), 3);
    let by_key: ChargePage = sim.get("/v1/charges?idempotency_key=key-1").await.json().await.unwrap();
    assert_eq!(by_key.data, truth.charges, "only a lookup can tell the charge exists");
}

#[tokio::test]
async fn a_hang_after_leaves_a_charge_answers_late_and_holds_the_key_in_flight() {
    let sim =
        Sim::with_faults(FaultsPatch { hang_after_rate: Some(1.0), hang_ms: Some(60_000), ..Default::default() }).await;
    let request = charge_request(1999);
    let key = request.downstream_key.as_str().to_owned();

    let outcome = sim.provider(Duration::from_millis(300)).create_charge(&request).await;
    let truth = sim.control.ground_truth().await.unwrap();
    let duplicate = sim
        .http
        .post(sim.url("/v1/charges"))
        .bearer_auth(sim.api_key())
        .header("Idempotency-Key", &key)
        .json(&CreateCharge {
            amount: 1999,
            currency: "EUR".into(),
            customer: "cus_42".into(),
            metadata: request.metadata.clone(),
            payment_method: None,
        })
        .send()
        .await
        .unwrap();

    assert_eq!(outcome, SendOutcome::Uncertain(UncertainReason::Timeout));
    assert_eq!(truth.charges_with_key(&key).len(), 1, "the charge exists while the answer hangs");
    assert_eq!(duplicate.status(), 409);
}

#[tokio::test]
async fn a_hung_answer_arrives_after_the_hang_and_the_key_is_then_replayed() {
    let sim =
        Sim::with_faults(FaultsPatch { hang_after_rate: Some(1.0), hang_ms: Some(1_000), ..Default::default() }).await;

    let started = Instant::now();
    let answer = sim.post_charge("key-1", &body(1999)).await;
    let waited = started.elapsed();
    let replay = sim.post_charge("key-1", &body(1999)).await;

    assert_eq!(answer.status(), 201);
    assert!(waited >= Duration::from_millis(1_000), "answered after {waited:?}");
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.json::<Charge>().await.unwrap(), answer.json::<Charge>().await.unwrap());
}

#[tokio::test]
async fn a_dropped_connection_leaves_a_charge_that_a_resend_returns() {
    let sim = Sim::with_faults(FaultsPatch { drop_after_rate: Some(1.0), ..Default::default() }).await;
    let provider = sim.provider(Duration::from_secs(5));
    let request = charge_request(1999);

    let dropped = provider.create_charge(&request).await;
    let truth = sim.control.ground_truth().await.unwrap();
    sim.control.set_faults(&FaultsPatch { drop_after_rate: Some(0.0), ..Default::default() }).await.unwrap();
    let resent = provider.create_charge(&request).await;

    assert_eq!(dropped, SendOutcome::Uncertain(UncertainReason::ConnectionLost));
    assert_eq!(truth.charges_with_key(request.downstream_key.as_str()).len(), 1);
    assert_eq!(resent, SendOutcome::Charged(truth.charges[0].clone()));
}

#[tokio::test]
async fn a_dropped_connection_sends_not_a_single_byte() {
    let sim = Sim::with_faults(FaultsPatch { drop_after_rate: Some(1.0), ..Default::default() }).await;

    let result = sim
        .http
        .post(sim.url("/v1/charges"))
        .bearer_auth(sim.api_key())
        .header("Idempotency-Key", "key-1")
        .json(&body(1999))
        .send()
        .await;

    let error = result.expect_err("no answer at all");
    assert!(!error.is_timeout() && !error.is_connect() && error.status().is_none(), "{error:?}");
}

#[tokio::test]
async fn latency_delays_the_answer() {
    let sim = Sim::with_faults(FaultsPatch { latency_ms: Some(300), ..Default::default() }).await;

    let started = Instant::now();
    let answer = sim.post_charge("key-1", &body(1999)).await;
    let post_took = started.elapsed();
    let started = Instant::now();
    let lookup = sim.get("/v1/charges?idempotency_key=key-1").await;
    let get_took = started.elapsed();

    assert_eq!((answer.status().as_u16(), lookup.status().as_u16()), (201, 200));
    assert!(post_took >= Duration::from_millis(300), "{post_took:?}");
    assert!(get_took >= Duration::from_millis(300), "{get_took:?}");
}

#[tokio::test]
async fn fault_changes_take_effect_at_once_and_invalid_ones_change_nothing() {
    let sim = Sim::start().await;
    assert_eq!(sim.control.faults().await.unwrap(), Faults::default());

    let declining =
        sim.control.set_faults(&FaultsPatch { decline_rate: Some(1.0), ..Default::default() }).await.unwrap();
    let declined = sim.post_charge("key-1", &body(1999)).await;
    let invalid = sim.control.set_faults(&FaultsPatch { error_after_rate: Some(2.0), ..Default::default() }).await;
    let still = sim.control.faults().await.unwrap();
    sim.control.set_faults(&FaultsPatch { decline_rate: Some(0.0), ..Default::default() }).await.unwrap();
    let charged = sim.post_charge("key-2", &body(1999)).await;

    assert_eq!(declining, Faults { decline_rate: 1.0, ..Faults::default() });
    assert_eq!(declined.status(), 402);
    assert!(invalid.is_err());
    assert_eq!(still, declining);
    assert_eq!(charged.status(), 201);
}

#[tokio::test]
async fn the_same_seed_makes_the_same_fault_decisions() {
    async fn run() -> Vec<(u16, String)> {
        let sim = Sim::with_faults(FaultsPatch { decline_rate: Some(0.5), ..Default::default() }).await;
        let mut answers = Vec::new();
        for n in 0..20 {
            let answer = sim.post_charge(&format!("key-{n}"), &body(100)).await;
            let status = answer.status().as_u16();
            let id = match status {
                201 => answer.json::<Charge>().await.unwrap().id,
                _ => answer.json::<ErrorBody>().await.unwrap().error.charge.unwrap(),
            };
            answers.push((status, id));
        }
        answers
    }

    let (first, second) = (run().await, run().await);

    assert_eq!(first, second);
    let declines = first.iter().filter(|(status, _)| *status == 402).count();
    assert!((1..20).contains(&declines), "a rate of 0.5 both charges and declines: {declines}");
}

#[tokio::test]
async fn fault_settings_at_start_up_apply_from_the_first_request() {
    let mut settings = settings();
    settings.faults.decline_rate = 1.0;
    let sim = Sim::start_with(settings).await;

    let answer = sim.post_charge("key-1", &body(1999)).await;

    assert_eq!(answer.status(), 402);
}

#[tokio::test]
async fn a_hang_ends_when_the_key_is_decided_and_a_poll_sees_it() {
    // The worker's view: after timing out it may resend; once the hang ends the resend is answered.
    let sim =
        Sim::with_faults(FaultsPatch { hang_after_rate: Some(1.0), hang_ms: Some(500), ..Default::default() }).await;
    let provider = sim.provider(Duration::from_millis(100));
    let request = charge_request(1999);

    let timed_out = provider.create_charge(&request).await;
    let resent = eventually("the hang to end", || async {
        match provider.create_charge(&request).await {
            SendOutcome::Charged(charge) => Some(charge),
            SendOutcome::Uncertain(UncertainReason::KeyInFlight) => None,
            other => panic!("unexpected {other:?}"),
        }
    })
    .await;

    assert_eq!(timed_out, SendOutcome::Uncertain(UncertainReason::Timeout));
    assert_eq!(sim.control.ground_truth().await.unwrap().charges, vec![resent]);
}

#[tokio::test]
async fn a_shutdown_cuts_a_hang_short_answers_it_and_stops() {
    let sim =
        Sim::with_faults(FaultsPatch { hang_after_rate: Some(1.0), hang_ms: Some(600_000), ..Default::default() })
            .await;
    let (http, url, api_key) = (sim.http.clone(), sim.url("/v1/charges"), sim.api_key());
    let hung = tokio::spawn(async move {
        http.post(url).bearer_auth(api_key).header("Idempotency-Key", "key-1").json(&body(1999)).send().await
    });
    eventually("the charge behind the hang", || async {
        (!sim.control.ground_truth().await.unwrap().charges.is_empty()).then_some(())
    })
    .await;

    sim.simulator.stop().await.unwrap();
    let answer = hung.await.unwrap().unwrap();

    assert_eq!(answer.status(), 201);
}

#[tokio::test]
async fn a_rate_limited_post_is_a_429_with_retry_after_and_creates_nothing() {
    let sim = Sim::with_faults(FaultsPatch {
        rate_limit_rate: Some(1.0),
        rate_limit_retry_after_secs: Some(90),
        ..Default::default()
    })
    .await;

    let limited = sim.post_charge("key-1", &body(1999)).await;

    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers().get("retry-after").unwrap(), "90");
    assert!(sim.control.ground_truth().await.unwrap().charges.is_empty());
}

#[tokio::test]
async fn a_failing_lookup_api_answers_503_while_charges_are_still_made() {
    let sim = Sim::with_faults(FaultsPatch { lookup_error_rate: Some(1.0), ..Default::default() }).await;

    let created = sim.post_charge("key-1", &body(1999)).await;
    let by_key = sim.get("/v1/charges?idempotency_key=key-1").await;
    let charge: Charge = created.json().await.unwrap();
    let by_id = sim.get(&format!("/v1/charges/{}", charge.id)).await;

    assert_eq!((by_key.status().as_u16(), by_id.status().as_u16()), (503, 503));
    assert_eq!(sim.control.ground_truth().await.unwrap().charges.len(), 1);
}

#[tokio::test]
async fn a_hang_before_makes_the_charge_late_so_a_lookup_meanwhile_finds_nothing() {
    let sim = Sim::with_faults(FaultsPatch {
        hang_before_rate: Some(1.0),
        hang_before_ms: Some(1_000),
        ..Default::default()
    })
    .await;
    let posting = tokio::spawn({
        let (http, url, api_key) = (sim.http.clone(), sim.url("/v1/charges"), sim.api_key().to_owned());
        async move { http.post(url).bearer_auth(api_key).header("Idempotency-Key", "key-1").json(&body(1999)).send().await }
    });
    // The POST is counted and its key taken in one step: once counted, it hangs before charging.
    while sim.control.ground_truth().await.unwrap().keys.iter().all(|k| k.posts == 0) {
        tokio::task::yield_now().await;
    }

    let during: ChargePage = sim.get("/v1/charges?idempotency_key=key-1").await.json().await.unwrap();
    let answer = posting.await.unwrap().unwrap();
    let after: ChargePage = sim.get("/v1/charges?idempotency_key=key-1").await.json().await.unwrap();

    assert!(during.data.is_empty(), "no charge while the request hangs: {:?}", during.data);
    assert_eq!(answer.status(), 201);
    assert_eq!(after.data.len(), 1);
}

#[tokio::test]
async fn a_mismatched_charge_really_takes_another_amount_and_says_so() {
    let sim = Sim::with_faults(FaultsPatch { mismatch_rate: Some(1.0), ..Default::default() }).await;

    let answered: Charge = sim.post_charge("key-1", &body(1999)).await.json().await.unwrap();

    let truth = sim.control.ground_truth().await.unwrap();
    assert_eq!(answered.amount, 2000);
    assert_eq!(truth.charges[0].amount, 2000, "the provider's own books agree with its answer");
}

#[tokio::test]
async fn a_malformed_answer_misreports_the_currency_while_the_books_keep_it_right() {
    let sim = Sim::with_faults(FaultsPatch { malformed_rate: Some(1.0), ..Default::default() }).await;

    let answered: Charge = sim.post_charge("key-1", &body(1999)).await.json().await.unwrap();
    let listed: ChargePage = sim.get("/v1/charges?idempotency_key=key-1").await.json().await.unwrap();

    assert_eq!(answered.currency, "eur");
    assert_eq!(listed.data[0].currency, "EUR");
}

#[tokio::test]
async fn a_resend_of_a_charged_key_can_be_refused_while_the_charge_stands() {
    let sim = Sim::with_faults(FaultsPatch { refuse_resend_rate: Some(1.0), ..Default::default() }).await;

    let first = sim.post_charge("key-1", &body(1999)).await;
    let resend = sim.post_charge("key-1", &body(1999)).await;
    let declined = sim.post_charge("key-2", &body_paying_with(1999, "pm_card_chargeDeclined")).await;
    let declined_again = sim.post_charge("key-2", &body_paying_with(1999, "pm_card_chargeDeclined")).await;

    assert_eq!(first.status(), 201, "a new charge is made and answered as usual");
    assert_eq!(resend.status(), 400);
    let refusal: serde_json::Value = resend.json().await.unwrap();
    assert_eq!(refusal["error"]["code"], "resource_missing");
    assert_eq!(refusal["error"].get("charge"), None, "the refusal names no charge");
    assert_eq!(
        (declined.status().as_u16(), declined_again.status().as_u16()),
        (402, 402),
        "only a succeeded charge's key is refused"
    );
    let truth = sim.control.ground_truth().await.unwrap();
    assert_eq!(truth.charges.len(), 2, "the refused resend made no charge and undid none");
}
