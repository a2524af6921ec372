//! The provider protocol without faults: idempotency, declines, windows, lookups, listing, auth.

use std::time::Duration;

use futures::future::join_all;
use oncepay_domain::ids::DownstreamKey;
use oncepay_provider::wire::{Charge, ChargePage, ChargeStatus, ErrorBody};
use oncepay_provider::{ListCharges, PaymentProvider, SendOutcome};
use oncepay_simulator::control::PlantCharge;
use oncepay_simulator::faults::FaultsPatch;

use crate::support::{Sim, body, charge_request, settings};

#[tokio::test]
async fn a_repeated_key_replays_the_first_answer_and_creates_no_second_charge() {
    let sim = Sim::start().await;

    let first = sim.post_charge("key-1", &body(1999)).await;
    let (first_status, first_body) = (first.status(), first.bytes().await.unwrap());
    let again = sim.post_charge("key-1", &body(1999)).await;
    let replayed_header = again.headers().get("idempotent-replayed").cloned();
    let (again_status, again_body) = (again.status(), again.bytes().await.unwrap());

    assert_eq!(first_status, 201);
    let charge: Charge = serde_json::from_slice(&first_body).unwrap();
    assert_eq!(
        (charge.status, charge.amount, charge.idempotency_key.as_str()),
        (ChargeStatus::Succeeded, 1999, "key-1")
    );
    assert!(charge.id.starts_with("ch_"));
    assert_eq!(again_status, 201);
    assert_eq!(again_body, first_body, "the replay is the first answer, byte for byte");
    assert_eq!(replayed_header.unwrap(), "true");
    let truth = sim.control.ground_truth().await.unwrap();
    assert_eq!(truth.charges, vec![charge]);
    assert_eq!(truth.posts_with_key("key-1"), 2);
}

#[tokio::test]
async fn concurrent_requests_with_one_key_make_one_charge() {
    let sim = Sim::start().await;

    let charge = body(500);
    let answers = join_all((0..20).map(|_| sim.post_charge("key-race", &charge))).await;

    let mut ids = Vec::new();
    for answer in answers {
        match answer.status().as_u16() {
            201 => ids.push(answer.json::<Charge>().await.unwrap().id),
            409 => assert_eq!(answer.json::<ErrorBody>().await.unwrap().error.code, "idempotency_key_in_use"),
            other => panic!("unexpected status {other}"),
        }
    }
    let truth = sim.control.ground_truth().await.unwrap();
    assert_eq!(truth.charges.len(), 1);
    assert!(ids.iter().all(|id| *id == truth.charges[0].id), "every 201 names the one charge");
    assert_eq!(truth.posts_with_key("key-race"), 20);
}

#[tokio::test]
async fn a_key_reused_with_other_parameters_is_refused_with_422() {
    let sim = Sim::start().await;
    sim.post_charge("key-1", &body(1999)).await;

    let reused = sim.post_charge("key-1", &body(2000)).await;

    assert_eq!(reused.status(), 422);
    assert_eq!(reused.json::<ErrorBody>().await.unwrap().error.code, "idempotency_key_reused");
    assert_eq!(sim.control.ground_truth().await.unwrap().charges.len(), 1);
}

#[tokio::test]
async fn a_decline_answers_402_naming_a_failed_charge_that_is_listed() {
    let sim = Sim::with_faults(FaultsPatch { decline_rate: Some(1.0), ..Default::default() }).await;

    let declined = sim.post_charge("key-1", &body(1999)).await;
    assert_eq!(declined.status(), 402);
    let error = declined.json::<ErrorBody>().await.unwrap().error;
    let charge_id = error.charge.expect("a decline names its charge");
    let replay = sim.post_charge("key-1", &body(1999)).await;

    assert_eq!(replay.status(), 402);
    assert_eq!(replay.json::<ErrorBody>().await.unwrap().error.charge.as_deref(), Some(charge_id.as_str()));
    let charge: Charge = sim.get(&format!("/v1/charges/{charge_id}")).await.json().await.unwrap();
    assert_eq!(charge.status, ChargeStatus::Failed);
    assert_eq!(charge.failure_code.as_deref(), Some(error.code.as_str()));
    let by_key: ChargePage = sim.get("/v1/charges?idempotency_key=key-1").await.json().await.unwrap();
    assert_eq!(by_key.data, vec![charge.clone()]);
    assert_eq!(sim.control.ground_truth().await.unwrap().charges, vec![charge]);
}

#[tokio::test]
async fn oncepays_client_reads_a_decline_as_declined() {
    let sim = Sim::with_faults(FaultsPatch { decline_rate: Some(1.0), ..Default::default() }).await;

    let outcome = sim.provider(Duration::from_secs(5)).create_charge(&charge_request(700)).await;

    let truth = sim.control.ground_truth().await.unwrap();
    assert!(
        matches!(&outcome, SendOutcome::Declined { charge_id: Some(id), .. } if *id == truth.charges[0].id),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_forgotten_key_makes_a_new_charge() {
    let sim = Sim::start().await;
    let first: Charge = sim.post_charge("key-1", &body(1999)).await.json().await.unwrap();

    let forgotten = sim.control.expire_keys().await.unwrap();
    let second = sim.post_charge("key-1", &body(1999)).await;

    assert_eq!(forgotten, 1);
    assert_eq!(second.status(), 201);
    assert!(second.headers().get("idempotent-replayed").is_none());
    let second: Charge = second.json().await.unwrap();
    assert_ne!(second.id, first.id);
    let truth = sim.control.ground_truth().await.unwrap();
    assert_eq!(truth.charges_with_key("key-1").len(), 2);
}

#[tokio::test]
async fn with_a_zero_window_every_request_makes_a_new_charge() {
    let mut settings = settings();
    settings.simulator.key_window_secs = 0;
    let sim = Sim::start_with(settings).await;

    for _ in 0..3 {
        assert_eq!(sim.post_charge("key-1", &body(1999)).await.status(), 201);
    }

    assert_eq!(sim.control.ground_truth().await.unwrap().charges_with_key("key-1").len(), 3);
}

#[tokio::test]
async fn charges_are_found_by_id_and_by_key() {
    let sim = Sim::start().await;
    let provider = sim.provider(Duration::from_secs(5));
    let request = charge_request(1234);
    let never_used = charge_request(1).downstream_key;

    let SendOutcome::Charged(charge) = provider.create_charge(&request).await else { panic!("not charged") };
    let by_key = provider.find_by_key(&request.downstream_key, None).await.unwrap();
    let none = provider.find_by_key(&never_used, None).await.unwrap();
    let by_id = sim.get(&format!("/v1/charges/{}", charge.id)).await;
    let missing = sim.get("/v1/charges/ch_nothing").await;

    assert_eq!(by_key, vec![charge.clone()]);
    assert_eq!(charge.payment_ref().map(|(_, p)| p.downstream_key()), Some(request.downstream_key));
    assert!(none.is_empty());
    assert_eq!(by_id.json::<Charge>().await.unwrap(), charge);
    assert_eq!(missing.status(), 404);
    assert_eq!(DownstreamKey::parse_payment_id(&charge.idempotency_key), charge.payment_ref().map(|(_, p)| p));
}

#[tokio::test]
async fn listing_pages_through_a_window_oldest_first_with_ties_broken_by_id() {
    let sim = Sim::start().await;
    let t = 1_700_000_000;
    let mut inside = Vec::new();
    for created in [t, t, t + 1, t, t, t + 1, t] {
        inside.push(
            sim.control
                .plant(&PlantCharge { created: Some(created), ..PlantCharge::succeeded(100, "EUR") })
                .await
                .unwrap(),
        );
    }
    for created in [t - 1, t + 2] {
        sim.control.plant(&PlantCharge { created: Some(created), ..PlantCharge::succeeded(100, "EUR") }).await.unwrap();
    }
    inside.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
    let provider = sim.provider(Duration::from_secs(5));

    let mut listed = Vec::new();
    let mut pages = 0;
    let mut starting_after = None;
    loop {
        let page = provider
            .list_charges(&ListCharges {
                account: None,
                created_gte: t,
                created_lt: t + 2,
                starting_after: starting_after.clone(),
                limit: 2,
            })
            .await
            .unwrap();
        pages += 1;
        starting_after = page.data.last().map(|c| c.id.clone());
        listed.extend(page.data);
        if !page.has_more {
            break;
        }
    }

    assert_eq!(listed, inside);
    assert_eq!(pages, 4);
}

#[tokio::test]
async fn a_bad_listing_query_is_refused() {
    let sim = Sim::start().await;

    for query in ["limit=0", "limit=101", "starting_after=ch_nothing", "colour=blue", "created_gte=yesterday"] {
        let answer = sim.get(&format!("/v1/charges?{query}")).await;
        assert_eq!(answer.status(), 400, "{query}");
    }
}

#[tokio::test]
async fn requests_without_the_api_key_are_refused_with_401_and_change_nothing() {
    let sim = Sim::start().await;
    let url = sim.url("/v1/charges");

    let anonymous = sim.http.post(&url).header("Idempotency-Key", "k").json(&body(1)).send().await.unwrap();
    let wrong =
        sim.http.post(&url).bearer_auth("sk_wrong").header("Idempotency-Key", "k").json(&body(1)).send().await.unwrap();
    let lookup = sim.http.get(&url).send().await.unwrap();

    assert_eq!(anonymous.status(), 401);
    assert_eq!(anonymous.headers().get("www-authenticate").unwrap(), "Bearer");
    assert_eq!(wrong.status(), 401);
    assert_eq!(lookup.status(), 401);
    let truth = sim.control.ground_truth().await.unwrap();
    assert!(truth.charges.is_empty() && truth.keys.is_empty());
}

#[tokio::test]
async fn a_charge_without_a_key_or_with_a_bad_body_is_refused_with_400() {
    let sim = Sim::start().await;
    let url = sim.url("/v1/charges");
    let api_key = sim.api_key();

    let no_key = sim.http.post(&url).bearer_auth(&api_key).json(&body(1)).send().await.unwrap();
    let unknown_field = sim
        .http
        .post(&url)
        .bearer_auth(&api_key)
        .header("Idempotency-Key", "k")
        .json(&serde_json::json!({"amount": 1, "currency": "EUR", "customer": "c", "colour": "red"}))
        .send()
        .await
        .unwrap();
    let zero = sim.post_charge("k2", &body(0)).await;

    assert_eq!(no_key.status(), 400);
    assert_eq!(no_key.json::<ErrorBody>().await.unwrap().error.code, "missing_idempotency_key");
    assert_eq!(unknown_field.status(), 400);
    assert_eq!(zero.status(), 400);
    assert!(sim.control.ground_truth().await.unwrap().charges.is_empty());
}
