//! End to end through Stripe's API, with localstripe (a third-party fake of it, from PyPI) in
//! Stripe's place: PostgreSQL, two api processes, two workers and a reconciler, every one configured
//! with `provider.kind = "stripe"`, driven through the client library by concurrent clients of two
//! tenants, as in `e2e.rs`. Each payment is paid with a test card, and the card decides its end:
//!
//! - `pm_card_visa` is charged: `succeeded`.
//! - `pm_card_chargeCustomerFail` is declined: `failed`. localstripe's 402 does not have the
//!   `card_error` shape Stripe's has, so the worker cannot tell it is a decline and the payment
//!   becomes `unknown`; localstripe's `payment_intent.payment_failed` webhook then settles it.
//! - A 3-D Secure card leaves the intent in `requires_action`, so the payment becomes `unknown`
//!   (`not_final`). The test acts as the customer and completes 3-D Secure at localstripe, whose
//!   `payment_intent.succeeded` webhook then settles the payment `succeeded`.
//!
//! Every invariant of the contract is then checked against the database, with every PaymentIntent
//! localstripe holds as the ground truth. localstripe has no idempotency keys, so a second send of
//! any payment would show as a second intent: the check proves oncepay sent each payment once.
//!
//! Needs every binary built and localstripe installed; the test command does both.

// Helpers outside `#[test]` functions fail loudly too: clippy's test exemption does not reach them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use oncepay_devkit::pg::Durability;
use oncepay_tests::checker;
use oncepay_tests::localstripe::{Localstripe, cards};
use oncepay_tests::report::Report;
use oncepay_tests::system::{Binaries, Provider, System, SystemConfig, Timing, Topology};
use oncepay_tests::workload::{self, Clients, MisuseOutcome, Plan, ProbeOutcome, WorkloadConfig};

const TOPOLOGY: Topology = Topology { apis: 2, workers: 2, reconcilers: 1 };

/// How often the customer looks for a 3-D Secure challenge to complete.
const CUSTOMER_PAUSE: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payments_through_localstripe_end_as_their_test_cards_say_and_its_webhooks_settle_the_unknown_ones() {
    let seed = 0x5751_BE00;
    let mut system = System::start(SystemConfig {
        binaries: Binaries::built().unwrap(),
        topology: TOPOLOGY,
        tenants: vec!["acme".into(), "globex".into()],
        durability: Durability::Fast,
        // localstripe cannot answer a lookup (no search, no list filters), so the poller never
        // settles anything here; it must not give up on a payment before the webhook arrives.
        timing: Timing { poller_max_attempts: 10_000, ..Timing::default() },
        provider: Provider::Localstripe { python: Localstripe::python().unwrap() },
        log_dir: None,
        env: Vec::new(),
        broker: false,
    })
    .await
    .unwrap();
    let stripe = system.localstripe().unwrap();
    let three_d_secure = stripe.card(cards::THREE_D_SECURE_NUMBER).await.unwrap();
    let config = WorkloadConfig {
        seed,
        intents: 90,
        concurrency: 16,
        spread: Duration::from_secs(3),
        storm_rate: 0.1,
        storm_size: 4,
        shared_key_rate: 0.1,
        misuse_rate: 0.1,
        probe_rate: 0.1,
        follow: Duration::from_secs(20),
        resends: 2,
        payment_methods: vec![cards::VISA.into(), cards::DECLINED.into(), three_d_secure.clone()],
        refund_rate: 0.3,
        broker_rate: 0.0,
    };
    let plan = Plan::draw(&config, system.tenants().len(), TOPOLOGY.apis).unwrap();
    let clients = Clients::new(system.tenants(), &system.api_urls()).unwrap();

    // The clients send and follow their payments while the customer completes every 3-D Secure
    // challenge that appears, until every payment has settled.
    let settling = AtomicBool::new(true);
    let merchants = async {
        let observations = workload::run(&plan, &config, &clients).await;
        let settled = checker::settle(system.pool(), Duration::from_secs(60)).await.unwrap();
        settling.store(false, Ordering::Release);
        (observations, settled)
    };
    let customer = async {
        let mut completed = 0;
        while settling.load(Ordering::Acquire) {
            completed += stripe.authenticate_waiting().await.unwrap();
            tokio::time::sleep(CUSTOMER_PAUSE).await;
        }
        completed
    };
    let ((observations, settled), completed) = tokio::join!(merchants, customer);

    let charges = stripe.charges().await.unwrap();
    let refunds = stripe.refunds().await.unwrap();
    let verdict = checker::check(system.pool(), &charges, &refunds, system.tenants(), &observations).await.unwrap();
    let report = Report {
        title: "oncepay end to end through localstripe".into(),
        seed,
        span: config.spread,
        topology: TOPOLOGY,
        tenants: system.tenants().len(),
        faults: Default::default(),
        plan_storms: plan.jobs.iter().filter(|job| job.copies > 1).count(),
        observations,
        settled,
        verdict,
        two_phase_commits: system.two_phase_commits_since_start().await.unwrap(),
        broker: None,
        events: None,
    };
    // Shown by the test runner when asked (`--no-capture`), and with any failure.
    eprintln!("{report}");
    let passed = report.passed();
    let logs = if passed { None } else { Some(system.keep_logs()) };
    assert!(passed, "{report}\nlogs: {logs:?}");

    // The run did what it claims: otherwise a pass would prove nothing.
    let o = &report.observations;
    assert_eq!(o.accepted(), plan.jobs.len(), "every intent was answered\n{report}");
    assert!(o.intents.values().any(|r| r.replayed > 0), "duplicates were replayed\n{report}");
    assert!(o.intents.values().filter_map(|r| r.misuse.as_ref()).all(|m| *m == MisuseOutcome::Rejected), "{report}");
    assert!(o.probes.iter().all(|p| p.outcome == ProbeOutcome::NotFound), "{report}");
    assert_eq!(report.verdict.payments, plan.jobs.len(), "one payment per (tenant, key)\n{report}");
    assert_eq!(charges.len(), plan.jobs.len(), "localstripe holds one intent per payment\n{report}");
    // Refunds went back through localstripe, and it holds exactly the ones oncepay made.
    let v = &report.verdict;
    let made = v.refunds.by_status.get("succeeded").copied().unwrap_or(0);
    assert!(made > 0, "some refunds succeeded\n{report}");
    assert_eq!(v.refunds.provider_refunds, made, "localstripe holds one refund per succeeded refund\n{report}");

    // Each card ended its payments as Stripe's test cards say.
    let ends = ends_by_method(&system).await;
    let of = |method: &str| ends.iter().filter(|end| end.method == method).collect::<Vec<_>>();
    let (visa, declined, challenged) = (of(cards::VISA), of(cards::DECLINED), of(&three_d_secure));
    assert!(!visa.is_empty() && !declined.is_empty() && !challenged.is_empty(), "every card was used: {ends:?}");
    assert!(visa.iter().all(|end| end.status == "succeeded"), "{visa:?}");
    assert!(
        declined.iter().all(|end| end.status == "failed" && end.failure_code == Some("card_declined".into())),
        "{declined:?}"
    );
    assert!(challenged.iter().all(|end| end.status == "succeeded"), "{challenged:?}");

    // The declined and challenged payments went through `unknown`, and Stripe's webhooks settled
    // them: the customer completed each challenge once.
    for end in declined.iter().chain(&challenged) {
        assert!(end.settled_by_webhook_from_unknown, "{end:?}");
    }
    assert_eq!(completed, challenged.len(), "one 3-D Secure challenge per challenged payment");
    let unclean = system.shutdown().await.unwrap();
    assert!(unclean.is_empty(), "every process exits 0 on SIGTERM: {unclean:?}");
}

/// How one payment ended, and with which payment method.
#[derive(Debug)]
struct End {
    method: String,
    status: String,
    failure_code: Option<String>,
    /// Whether its last move was a webhook's, out of `unknown`.
    settled_by_webhook_from_unknown: bool,
}

async fn ends_by_method(system: &System) -> Vec<End> {
    sqlx::query_as!(
        End,
        r#"SELECT p.payment_method AS "method!", p.status::text AS "status!", p.failure_code,
                EXISTS (SELECT 1 FROM payment_events e
                         WHERE e.tenant_id = p.tenant_id AND e.payment_id = p.payment_id
                           AND e.from_status = 'unknown' AND e.to_status = p.status AND e.actor = 'webhook')
                  AS "settled_by_webhook_from_unknown!"
           FROM payments p"#
    )
    .fetch_all(system.pool())
    .await
    .unwrap()
}
