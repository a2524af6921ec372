//! Payment methods: recorded on the charge, part of a key's parameters, and declined when the
//! settings say so (Stripe's declining test methods by default).

use std::collections::BTreeMap;
use std::time::Duration;

use oncepay_provider::wire::{Charge, ChargeStatus, ErrorBody};
use oncepay_provider::{PaymentProvider, SendOutcome};
use oncepay_simulator::faults::FaultsPatch;

use crate::support::{Sim, body, body_paying_with, charge_request_paying_with};

#[tokio::test]
async fn a_payment_method_is_recorded_on_the_charge_and_reported_with_it() {
    let sim = Sim::start().await;

    let created = sim.post_charge("key-1", &body_paying_with(1999, "pm_card_visa")).await;

    assert_eq!(created.status(), 201);
    let charge: Charge = created.json().await.unwrap();
    assert_eq!((charge.status, charge.payment_method.as_deref()), (ChargeStatus::Succeeded, Some("pm_card_visa")));
    assert_eq!(sim.control.ground_truth().await.unwrap().charges, vec![charge]);
}

#[tokio::test]
async fn stripes_declining_test_methods_are_declined_with_stripes_codes() {
    let sim = Sim::start().await;
    let provider = sim.provider(Duration::from_secs(5));
    let cases = [
        ("pm_card_chargeDeclined", "card_declined"),
        ("pm_card_chargeDeclinedInsufficientFunds", "insufficient_funds"),
    ];

    for (method, expected_code) in cases {
        let outcome = provider.create_charge(&charge_request_paying_with(700, method)).await;

        let SendOutcome::Declined { code, charge_id: Some(charge_id), .. } = &outcome else {
            panic!("{method}: {outcome:?}")
        };
        assert_eq!(code, expected_code, "{method}");
        let charge: Charge = sim.get(&format!("/v1/charges/{charge_id}")).await.json().await.unwrap();
        assert_eq!(charge.status, ChargeStatus::Failed, "{method}");
        assert_eq!(charge.failure_code.as_deref(), Some(expected_code), "{method}");
        assert_eq!(charge.payment_method.as_deref(), Some(method));
    }
}

#[tokio::test]
async fn the_declined_methods_can_be_replaced_at_run_time() {
    let sim = Sim::start().await;
    let declining = FaultsPatch {
        declined_payment_methods: Some(BTreeMap::from([("pm_card_visa".into(), "do_not_honor".into())])),
        ..Default::default()
    };

    let faults = sim.control.set_faults(&declining).await.unwrap();
    let visa = sim.post_charge("key-visa", &body_paying_with(1999, "pm_card_visa")).await;
    let formerly_declined = sim.post_charge("key-declined", &body_paying_with(1999, "pm_card_chargeDeclined")).await;

    assert_eq!(faults.declined_payment_methods.len(), 1, "a patch replaces the whole table");
    assert_eq!(visa.status(), 402);
    let error = visa.json::<ErrorBody>().await.unwrap().error;
    assert_eq!(error.code, "do_not_honor");
    assert_eq!(error.message, "The payment method was declined.");
    assert_eq!(formerly_declined.status(), 201);
}

#[tokio::test]
async fn a_key_reused_with_another_payment_method_is_refused_with_422() {
    let sim = Sim::start().await;
    sim.post_charge("key-1", &body_paying_with(1999, "pm_card_visa")).await;

    let other_method = sim.post_charge("key-1", &body_paying_with(1999, "pm_card_mastercard")).await;
    let no_method = sim.post_charge("key-1", &body(1999)).await;

    for reused in [other_method, no_method] {
        assert_eq!(reused.status(), 422);
        assert_eq!(reused.json::<ErrorBody>().await.unwrap().error.code, "idempotency_key_reused");
    }
    assert_eq!(sim.control.ground_truth().await.unwrap().charges.len(), 1);
}

#[tokio::test]
async fn a_malformed_payment_method_is_refused_with_400_and_charges_nothing() {
    let sim = Sim::start().await;

    for method in ["", "pm card", "pm-card"] {
        let refused = sim.post_charge("key-1", &body_paying_with(1999, method)).await;

        assert_eq!(refused.status(), 400, "{method:?}");
        assert_eq!(refused.json::<ErrorBody>().await.unwrap().error.code, "invalid_request");
    }
    assert!(sim.control.ground_truth().await.unwrap().charges.is_empty());
}
