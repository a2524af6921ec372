//! The operator console over HTTP, as a browser's requests reach it (the real browser drives it in
//! the cross-process suite, `tests/tests/console.rs`): the sign-in form and session cookie, the
//! headers every page carries, the dead-letter list and its pages, the search, and changes that ask
//! to confirm before they are done, are refused from another origin or to a role too weak, and show
//! an operator limited to some tenants nothing of another's; and webhook endpoints, listed, started
//! and replayed as the JSON API does it.

use oncepay_domain::ids::PaymentId;
use oncepay_domain::refund_status::RefundStatus;
use oncepay_domain::status::PaymentStatus;
use oncepay_ops::operators::api::BulkRetrier;
use oncepay_service::runner::Pass;
use oncepay_store::broker_queues::{self, Queue};
use oncepay_store::fixtures::tenant;
use oncepay_store::merchant_deliveries::{self, Attempt, Health, Next, Record, Recording};
use oncepay_store::merchant_endpoints::{self, NewEndpoint};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION, SET_COOKIE};
use serde_json::json;
use sqlx::PgPool;
use time::{Duration, OffsetDateTime};

use crate::refund_proposals::{contradicted_refund, dead_lettered_refund};
use crate::support::{
    Ops, audit_of_actions, dead_lettered, reasoned, refund, refund_status, refunded, settle_succeeded, status,
    succeeded_payment, unknown_refund,
};

const SAME_ORIGIN: (&str, &str) = ("sec-fetch-site", "same-origin");
/// Five days, in seconds: how long an endpoint may fail before it is stopped.
const DAYS_5: u64 = 5 * 86_400;

/// A browser signed in to the console as one operator.
struct Browser {
    url: String,
    http: reqwest::Client,
    cookie: String,
}

/// A page as the browser received it.
struct Page {
    status: StatusCode,
    location: Option<String>,
    csp: Option<String>,
    body: String,
}

impl Browser {
    /// Makes operator `name` with `role` (and `tenants`), who sets their own password with their
    /// enrollment code, and signs in with the console's form.
    async fn sign_in(ops: &Ops, name: &str, role: &str, tenants: Option<&[&str]>) -> Self {
        let password = ops.person(name, role, tenants).await;
        let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        let response = http
            .post(format!("{}/console/sign-in", ops.url))
            .header(SAME_ORIGIN.0, SAME_ORIGIN.1)
            .form(&[("name", name), ("password", password.as_str())])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        let cookie = response.headers()[SET_COOKIE].to_str().unwrap().split(';').next().unwrap().to_owned();
        Self { url: ops.url.clone(), http, cookie }
    }

    async fn get(&self, path: &str) -> Page {
        let response = self.http.get(format!("{}{path}", self.url)).header("cookie", &self.cookie).send().await;
        page(response.unwrap()).await
    }

    /// Posts a form from a page of `site` (`same-origin`, `same-site`, `cross-site`).
    async fn post_from(&self, site: &str, path: &str, form: &[(&str, &str)]) -> Page {
        let request = self.http.post(format!("{}{path}", self.url)).header("cookie", &self.cookie);
        page(request.header("sec-fetch-site", site).form(form).send().await.unwrap()).await
    }

    async fn post(&self, path: &str, form: &[(&str, &str)]) -> Page {
        self.post_from("same-origin", path, form).await
    }
}

/// The path of the first form on `body` whose action ends with `ending`, without the ending:
/// `/console/proposals/<id>`.
fn hidden_action(body: &str, ending: &str) -> String {
    let end = body.find(&format!("{ending}\"")).unwrap_or_else(|| panic!("no form for {ending} in {body}"));
    let start = body[..end].rfind("action=\"").unwrap() + "action=\"".len();
    body[start..end].to_owned()
}

async fn page(response: reqwest::Response) -> Page {
    let header =
        |name| response.headers().get(name).map(|v: &reqwest::header::HeaderValue| v.to_str().unwrap().to_owned());
    let (status, location, csp) = (response.status(), header(LOCATION), header(CONTENT_SECURITY_POLICY));
    Page { status, location, csp, body: response.text().await.unwrap() }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn every_page_needs_a_session_and_forbids_inline_scripts_framing_and_other_origins(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let anonymous = page(http.get(format!("{}/console/dead-letters", ops.url)).send().await.unwrap()).await;
    let sign_in_page = page(http.get(format!("{}/console/sign-in", ops.url)).send().await.unwrap()).await;
    let wrong = page(
        http.post(format!("{}/console/sign-in", ops.url))
            .header(SAME_ORIGIN.0, SAME_ORIGIN.1)
            .form(&[("name", "nobody"), ("password", "guess")])
            .send()
            .await
            .unwrap(),
    )
    .await;
    let script = page(http.get(format!("{}/console/assets/console.js", ops.url)).send().await.unwrap()).await;
    let browser = Browser::sign_in(&ops, "alice", "operator", None).await;
    let overview = browser.get("/console/").await;
    let live = browser.get("/console/live").await;

    assert_eq!(anonymous.status, StatusCode::SEE_OTHER);
    assert_eq!(anonymous.location.as_deref(), Some("/console/sign-in"));
    assert_eq!(sign_in_page.status, StatusCode::OK);
    assert!(sign_in_page.body.contains("name=\"password\""), "{}", sign_in_page.body);
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.body.contains("wrong name or password"), "{}", wrong.body);
    assert_eq!(script.status, StatusCode::OK);
    assert_eq!(overview.status, StatusCode::OK);
    assert!(overview.body.contains("alice (operator)") && overview.body.contains("Payments waiting to be sent"));
    assert!(overview.body.contains("href=\"/console/recon\""), "an operator of every tenant reads the runs");
    assert!(live.body.starts_with("<div id=\"live-figures\">"), "{}", live.body);
    for page in [&anonymous, &sign_in_page, &wrong, &overview] {
        let csp = page.csp.as_deref().unwrap();
        for rule in ["default-src 'none'", "script-src 'self'", "frame-ancestors 'none'", "form-action 'self'"] {
            assert!(csp.contains(rule), "{csp}");
        }
        assert!(!csp.contains("unsafe-inline"), "{csp}");
    }
    assert!(!overview.body.contains("<script>"), "no inline script");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_overview_shows_the_broker_queues_as_an_api_last_sampled_them_to_operators_of_every_tenant(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    tenant(&pool, "globex").await;
    let alice = Browser::sign_in(&ops, "alice", "operator", None).await;
    let gina = Browser::sign_in(&ops, "gina", "operator", Some(&["globex"])).await;
    let before = alice.get("/console/live").await;
    let now = OffsetDateTime::now_utc();
    let mut conn = pool.acquire().await.unwrap();
    broker_queues::record(&mut conn, Queue::Payments, 37, None, now).await.unwrap();
    let refused = Some(now - Duration::hours(3));
    broker_queues::record(&mut conn, Queue::DeadLetters, 4, refused, now).await.unwrap();
    // An api that sampled earlier, writing late, changes nothing.
    broker_queues::record(&mut conn, Queue::DeadLetters, 0, None, now - Duration::seconds(5)).await.unwrap();

    let live = alice.get("/console/live").await;
    let limited = gina.get("/console/live").await;

    assert!(!before.body.contains("Payments from RabbitMQ"), "no api samples a broker yet: {}", before.body);
    for expected in [
        "Payments from RabbitMQ",
        "<span class=\"value\">37</span>Messages waiting in the intake queue",
        "<span class=\"value\">4</span>Messages in the dead-letter queue",
        "<span class=\"value\">3h 0m ago</span>The oldest dead letter was refused",
    ] {
        assert!(live.body.contains(expected), "{expected:?} missing from {}", live.body);
    }
    assert!(!limited.body.contains("Payments from RabbitMQ"), "the queues hold every tenant's messages");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payments_timeline_shows_every_attempt_of_its_events_the_one_that_delivered_too(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let secret = oncepay_webhook_signature::WebhookSecret::generate();
    let endpoint =
        NewEndpoint { url: "https://acme.example/hooks", description: "", event_types: &[], secret: &secret };
    merchant_endpoints::create(&mut pool.acquire().await.unwrap(), acme, &endpoint).await.unwrap();
    // Dead-lettering the payment writes its event; the endpoint answers 500 once, then 204.
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    for (status, next) in [(500, Next::RetryIn(std::time::Duration::ZERO)), (204, Next::Delivered)] {
        let mut conn = pool.acquire().await.unwrap();
        let lease = std::time::Duration::from_secs(30);
        let claimed = merchant_deliveries::claim(&mut conn, acme, "w1", 8, 4, lease).await.unwrap().remove(0);
        let attempt = Attempt {
            attempted_at: OffsetDateTime::now_utc(),
            status: Some(status),
            response: String::new(),
            error: None,
        };
        let health = if next == Next::Delivered {
            Health::Took
        } else {
            Health::Failed { disable_after: std::time::Duration::from_secs(DAYS_5) }
        };
        let recorded = merchant_deliveries::record(&mut conn, "w1", &[Record { claimed, attempt, next, health }]).await;
        assert_eq!(recorded.unwrap(), [Recording::Recorded { disabled: false }]);
    }
    let ana = Browser::sign_in(&ops, "ana", "operator", Some(&["acme"])).await;

    let page = ana.get(&format!("/console/payments/{payment_id}")).await;

    let lines = [
        "event payment.dead_lettered queued for https://acme.example/hooks: delivered (2 attempts)",
        "event payment.dead_lettered sent to https://acme.example/hooks: answered 500",
        "event payment.dead_lettered sent to https://acme.example/hooks: answered 204",
    ];
    let at: Vec<Option<usize>> = lines.iter().map(|line| page.body.find(line)).collect();
    assert!(at.iter().all(Option::is_some), "{lines:?} not all on {}", page.body);
    assert!(at.is_sorted(), "not in this order, {lines:?}: {}", page.body);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_retry_from_the_console_asks_to_confirm_then_is_done_and_recorded(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let browser = Browser::sign_in(&ops, "alice", "operator", None).await;
    let retry = format!("/console/payments/{payment_id}/retry");
    // The merchant listens for events: the retry sends one, and the timeline shows it.
    let secret = oncepay_webhook_signature::WebhookSecret::generate();
    let endpoint =
        NewEndpoint { url: "https://acme.example/hooks", description: "", event_types: &[], secret: &secret };
    merchant_endpoints::create(&mut pool.acquire().await.unwrap(), acme, &endpoint).await.unwrap();

    let listed = browser.get("/console/dead-letters").await;
    let shown = browser.get(&format!("/console/payments/{payment_id}")).await;
    let no_reason = browser.post(&retry, &[("reason", " ")]).await;
    let confirm = browser.post(&retry, &[("reason", "provider back")]).await;
    let before_confirming = status(&pool, acme, payment_id).await;
    let done = browser.post(&retry, &[("reason", "provider back"), ("confirmed", "yes")]).await;
    let after = status(&pool, acme, payment_id).await;
    let landed = browser.get(done.location.as_deref().unwrap()).await;

    assert!(listed.body.contains(&payment_id.to_string()), "{}", listed.body);
    assert!(shown.body.contains("Send it again") && shown.body.contains("k-1"), "{}", shown.body);
    assert!(shown.body.contains("reconciler (poll 30)"), "the timeline shows the lookups: {}", shown.body);
    assert_eq!(no_reason.status, StatusCode::BAD_REQUEST);
    assert_eq!(confirm.status, StatusCode::OK);
    assert!(confirm.body.contains("same idempotency key"), "{}", confirm.body);
    assert!(confirm.body.contains("name=\"confirmed\" value=\"yes\""), "{}", confirm.body);
    assert_eq!(before_confirming, PaymentStatus::DeadLettered, "nothing is done before it is confirmed");
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    assert_eq!(done.location, Some(format!("/console/payments/{payment_id}?notice=retried")));
    assert_eq!(after, PaymentStatus::Pending);
    assert!(landed.body.contains("Queued to be sent again"), "{}", landed.body);
    assert!(landed.body.contains("payment.retry (done): provider back"), "the timeline shows the action");
    assert!(
        landed.body.contains("event payment.retried queued for https://acme.example/hooks: pending (0 attempts)"),
        "the timeline shows the event to the merchant: {}",
        landed.body
    );
    let actions = sqlx::query_scalar!(
        "SELECT action FROM operator_audit WHERE payment_id = $1 AND outcome = 'done' ORDER BY audit_id",
        payment_id.as_uuid()
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(actions, ["payment.read", "payment.retry", "payment.read"]);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_form_posted_from_another_origin_or_beyond_the_role_changes_nothing(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let alice = Browser::sign_in(&ops, "alice", "operator", None).await;
    let viewer = Browser::sign_in(&ops, "vera", "viewer", None).await;
    let retry = format!("/console/payments/{payment_id}/retry");
    let confirmed = [("reason", "provider back"), ("confirmed", "yes")];

    let same_site = alice.post_from("same-site", &retry, &confirmed).await;
    let cross_site = alice.post_from("cross-site", &retry, &confirmed).await;
    let offered = viewer.get(&format!("/console/payments/{payment_id}")).await;
    let by_a_viewer = viewer.post(&retry, &confirmed).await;
    let viewer_by_customer = viewer.post("/console/search", &[("q", "cus_1")]).await;
    let operator_by_customer = alice.post("/console/search", &[("q", "cus_1")]).await;

    for refused in [&same_site, &cross_site] {
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
        assert!(refused.body.contains("must come from a page of this origin"), "{}", refused.body);
    }
    assert!(!offered.body.contains("Send it again"), "a viewer is offered no action");
    assert!(offered.body.contains("cus…"), "a viewer sees the customer reference masked");
    assert_eq!(by_a_viewer.status, StatusCode::FORBIDDEN);
    assert!(viewer_by_customer.body.contains("No payment of a tenant you may see matches"), "a viewer's is masked");
    assert_eq!(operator_by_customer.location, Some(format!("/console/payments/{payment_id}")));
    assert_eq!(status(&pool, acme, payment_id).await, PaymentStatus::DeadLettered);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_operator_limited_to_one_tenant_never_sees_anothers_payment(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let globex = tenant(&pool, "globex").await;
    let theirs = dead_lettered(&pool, acme, "k-acme", 60).await;
    let ours = dead_lettered(&pool, globex, "k-globex", 60).await;
    let browser = Browser::sign_in(&ops, "gina", "operator", Some(&["globex"])).await;

    let listed = browser.get("/console/dead-letters").await;
    let filtered = browser.get("/console/dead-letters?tenant=acme").await;
    let page = browser.get(&format!("/console/payments/{theirs}")).await;
    let by_id = browser.post("/console/search", &[("q", &theirs.to_string())]).await;
    let by_key = browser.post("/console/search", &[("q", "k-acme")]).await;
    let own = browser.post("/console/search", &[("q", "k-globex")]).await;
    let retry = browser
        .post(&format!("/console/payments/{theirs}/retry"), &[("reason", "mine now"), ("confirmed", "yes")])
        .await;

    assert!(listed.body.contains(&ours.to_string()) && !listed.body.contains(&theirs.to_string()));
    assert!(!listed.body.contains("href=\"/console/recon\""), "runs cover every tenant: not offered");
    assert!(!filtered.body.contains(&theirs.to_string()));
    assert_eq!(page.status, StatusCode::NOT_FOUND);
    for search in [&by_id, &by_key] {
        assert_eq!(search.status, StatusCode::OK);
        assert!(search.body.contains("No payment of a tenant you may see matches"), "{}", search.body);
    }
    assert_eq!(own.location, Some(format!("/console/payments/{ours}")), "one match opens the payment");
    assert_eq!(retry.status, StatusCode::NOT_FOUND);
    assert_eq!(status(&pool, acme, theirs).await, PaymentStatus::DeadLettered);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_dead_letter_list_pages_by_age_without_repeating_or_skipping_and_filters_in_the_url(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let mut made: Vec<PaymentId> = Vec::new();
    for n in 0..60 {
        made.push(dead_lettered(&pool, acme, &format!("k-{n}"), 60).await);
    }
    let browser = Browser::sign_in(&ops, "alice", "viewer", None).await;

    let first = browser.get("/console/dead-letters?kind=unresolved&state=open").await;
    let next = first.body.split("href=\"").find_map(|rest| {
        let link = rest.split('"').next().unwrap();
        // The page writes `&` as an HTML entity, which a browser reads back as `&`.
        link.contains("after=").then(|| link.replace("&#38;", "&"))
    });
    let second = browser.get(next.as_deref().expect("a link to the next page")).await;
    let conflicts = browser.get("/console/dead-letters?kind=conflict").await;
    let bad = browser.get("/console/dead-letters?after=nonsense").await;

    let on = |page: &Page| made.iter().filter(|id| page.body.contains(&id.to_string())).count();
    assert_eq!((on(&first), on(&second)), (50, 10), "{next:?}");
    assert!(made.iter().all(|id| first.body.contains(&id.to_string()) != second.body.contains(&id.to_string())));
    assert!(next.unwrap().contains("kind=unresolved"), "the next page keeps the filters");
    assert!(!second.body.contains("rel=\"next\""), "the last page links to no next one");
    assert_eq!(on(&conflicts), 0);
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_resolution_proposed_in_the_console_is_done_when_another_operator_approves_it(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let alice = Browser::sign_in(&ops, "alice", "operator", None).await;
    let bob = Browser::sign_in(&ops, "bob", "approver", None).await;
    let resolve = format!("/console/payments/{payment_id}/resolve");

    let proposed =
        alice.post(&resolve, &[("as", "failed"), ("reason", "provider has no charge"), ("confirmed", "yes")]).await;
    let still = status(&pool, acme, payment_id).await;
    let alices_view = alice.get(&format!("/console/payments/{payment_id}")).await;
    let bobs_view = bob.get(&format!("/console/payments/{payment_id}")).await;
    let proposal_id =
        sqlx::query_scalar!("SELECT proposal_id FROM proposals WHERE payment_id = $1", payment_id.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    let approve = format!("/console/proposals/{proposal_id}/approve");
    let by_alice = alice.post(&approve, &[("reason", "looks right"), ("confirmed", "yes")]).await;
    let confirm = bob.post(&approve, &[("reason", "checked the provider")]).await;
    let approved = bob.post(&approve, &[("reason", "checked the provider"), ("confirmed", "yes")]).await;

    assert_eq!(proposed.location, Some(format!("/console/payments/{payment_id}?notice=proposed")));
    assert_eq!(still, PaymentStatus::DeadLettered, "a proposal changes nothing");
    assert!(alices_view.body.contains("Withdraw") && !alices_view.body.contains("Approve…"));
    assert!(bobs_view.body.contains("Approve…") && bobs_view.body.contains("Reject…"));
    assert!(
        bobs_view.body.contains("<strong>settle as failed</strong>"),
        "what is proposed, in words: {}",
        bobs_view.body
    );
    assert_eq!(by_alice.status, StatusCode::FORBIDDEN, "nobody approves their own: {}", by_alice.body);
    assert!(confirm.body.contains("is done now"), "{}", confirm.body);
    assert_eq!(approved.location, Some(format!("/console/payments/{payment_id}?notice=approved")));
    assert_eq!(status(&pool, acme, payment_id).await, PaymentStatus::Failed);
}

/// The value of the hidden input `name` of a page.
fn hidden(page: &Page, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = page.body.find(&marker).unwrap_or_else(|| panic!("no {name} in {}", page.body)) + marker.len();
    page.body[start..].split('"').next().unwrap().to_owned()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_bulk_retry_resends_exactly_the_payments_shown_and_a_new_worker_finishes_it(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let globex = tenant(&pool, "globex").await;
    let fresh = [dead_lettered(&pool, acme, "k-1", 60).await, dead_lettered(&pool, acme, "k-2", 60).await];
    let past_the_window = dead_lettered(&pool, acme, "k-old", 2 * 86_400).await;
    let other_tenant = dead_lettered(&pool, globex, "k-globex", 60).await;
    let alice = Browser::sign_in(&ops, "alice", "operator", None).await;
    let filter = [("kind", "unresolved"), ("tenant", "acme"), ("older_than", ""), ("reason", "provider back")];

    let listed = alice.get("/console/dead-letters?tenant=acme").await;
    let shown = alice.post("/console/bulk-retries", &filter).await;
    let late = dead_lettered(&pool, acme, "k-late", 60).await;
    let payments = hidden(&shown, "payments");
    let mut confirmed = filter.to_vec();
    confirmed.extend([("payments", payments.as_str()), ("confirmed", "yes")]);
    let created = alice.post("/console/bulk-retries", &confirmed).await;
    let job = created.location.clone().expect("the job's page");
    let waiting = alice.get(&job).await;
    // One worker resends one payment and stops, as a reconciler that restarts would; another
    // finishes the rest.
    assert!(BulkRetrier::new(ops.state.clone()).pass().await.unwrap());
    let second = BulkRetrier::new(ops.state.clone());
    while second.pass().await.unwrap() {}
    let finished = alice.get(&job).await;

    assert!(listed.body.contains("Retry all that match"), "{}", listed.body);
    assert_eq!(shown.status, StatusCode::OK);
    assert!(shown.body.contains("Confirm: retry 3 payments"), "{}", shown.body);
    assert!(!payments.contains(&other_tenant.to_string()));
    assert!(job.starts_with("/console/bulk-retries/"), "{job}");
    assert!(waiting.body.contains("running"), "{}", waiting.body);
    assert!(finished.body.contains("<td>retried</td><td>queued to be sent again</td>"), "{}", finished.body);
    assert!(finished.body.contains("finished"), "{}", finished.body);
    for payment_id in fresh {
        assert_eq!(status(&pool, acme, payment_id).await, PaymentStatus::Pending);
    }
    assert_eq!(status(&pool, acme, past_the_window).await, PaymentStatus::DeadLettered);
    assert!(finished.body.contains("<td>refused</td>"), "{}", finished.body);
    assert_eq!(status(&pool, acme, late).await, PaymentStatus::DeadLettered, "not in the frozen selection");
    assert_eq!(status(&pool, globex, other_tenant).await, PaymentStatus::DeadLettered);
    let retries =
        sqlx::query!("SELECT payment_id, outcome FROM operator_audit WHERE action = 'payment.retry' ORDER BY audit_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let done: Vec<_> = retries.iter().filter(|r| r.outcome == "done").map(|r| r.payment_id.unwrap()).collect();
    assert_eq!(done.len(), 2, "each payment resent once: {retries:?}");
    assert!(retries.iter().any(|r| r.outcome == "refused" && r.payment_id == Some(past_the_window.as_uuid())));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_bulk_retry_proposes_with_the_maker_of_the_credential_it_was_confirmed_with(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    // root made alice's token, so root holds it too.
    let alice = ops.operator_given_by_admin("alice", "operator").await;
    let form = [("reason", "provider back"), ("payments", &payment_id.to_string()), ("confirmed", "yes")];
    let created = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{}/console/bulk-retries", ops.url))
        .bearer_auth(&alice)
        .form(&form)
        .send()
        .await
        .unwrap();
    let mut state = ops.state.clone();
    state.retries_need_approval = true;
    assert!(BulkRetrier::new(state).pass().await.unwrap());
    let (_, waiting) = ops.get(&ops.admin, "/v1/proposals?status=pending").await;
    let proposal_id = waiting[0]["proposal_id"].as_str().unwrap().to_owned();

    let (approved, why) =
        ops.post(&ops.admin, &format!("/v1/proposals/{proposal_id}/approve"), json!({"reason": "fine"})).await;

    assert_eq!(created.status(), StatusCode::SEE_OTHER);
    assert_eq!(approved, StatusCode::FORBIDDEN, "{why}");
    assert!(why["detail"].as_str().unwrap().contains("one person could stand behind both sides"), "{why}");
    assert_eq!(status(&pool, acme, payment_id).await, PaymentStatus::DeadLettered);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_bulk_retry_of_payments_the_operator_may_not_see_is_refused_whole(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    tenant(&pool, "globex").await;
    let theirs = dead_lettered(&pool, acme, "k-acme", 60).await;
    let gina = Browser::sign_in(&ops, "gina", "operator", Some(&["globex"])).await;
    let theirs_text = theirs.to_string();
    let forged = [("reason", "mine now"), ("payments", theirs_text.as_str()), ("confirmed", "yes")];

    let refused = gina.post("/console/bulk-retries", &forged).await;

    assert_eq!(refused.status, StatusCode::NOT_FOUND, "{}", refused.body);
    let jobs = sqlx::query_scalar!("SELECT count(*) FROM bulk_retries").fetch_one(&pool).await.unwrap();
    assert_eq!(jobs, Some(0));
    assert_eq!(status(&pool, acme, theirs).await, PaymentStatus::DeadLettered);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn admins_issue_and_revoke_keys_and_manage_operators_in_the_console_and_others_are_refused(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let ada = Browser::sign_in(&ops, "ada", "admin", None).await;
    let bea = Browser::sign_in(&ops, "bea", "approver", None).await;
    let vera = Browser::sign_in(&ops, "vera", "viewer", None).await;
    let keys = || async {
        sqlx::query!("SELECT key_id, revoked_at FROM api_keys WHERE tenant_id = $1 ORDER BY created_at", acme.as_uuid())
            .fetch_all(&pool)
            .await
            .unwrap()
    };
    let issue = [("reason", "rotating"), ("confirmed", "yes")];

    let listed = ada.get("/console/tenants").await;
    let confirm = ada.post("/console/tenants/acme/keys", &[("reason", "rotating")]).await;
    let proposed = ada.post("/console/tenants/acme/keys", &issue).await;
    let before_approval = keys().await.len();
    let waiting = bea.get("/console/proposals").await;
    let proposal_id = hidden_action(&waiting.body, "/approve");
    let approved =
        bea.post(&format!("{proposal_id}/approve"), &[("reason", "asked by acme"), ("confirmed", "yes")]).await;
    let collectable = ada.get("/console/proposals").await;
    let collect = format!("{proposal_id}/key");
    let by_the_approver = bea.post(&collect, &[("reason", "x"), ("confirmed", "yes")]).await;
    let asked = ada.post(&collect, &[("reason", "the approved key")]).await;
    let issued = ada.post(&collect, &[("reason", "the approved key"), ("confirmed", "yes")]).await;
    let again = ada.post(&collect, &[("reason", "the approved key"), ("confirmed", "yes")]).await;
    let after_issue = keys().await;
    let by_a_viewer = vera.post("/console/tenants/acme/keys", &issue).await;
    let viewers_list = vera.get("/console/tenants").await;
    let first = after_issue[0].key_id.clone();
    let revoke = format!("/console/tenants/acme/keys/{first}/revoke");
    let revoked = ada.post(&revoke, &[("reason", "leaked"), ("confirmed", "yes")]).await;
    let created = ada
        .post(
            "/console/operators",
            &[("name", "otto"), ("role", "operator"), ("tenants", "acme"), ("reason", "joins"), ("confirmed", "yes")],
        )
        .await;
    let changed = ada
        .post(
            "/console/operators/otto",
            &[("role", "approver"), ("tenants", ""), ("reason", "promoted"), ("confirmed", "yes")],
        )
        .await;
    let operators = ada.get("/console/operators").await;
    let disabled = ada.post("/console/operators/otto/disable", &[("reason", "left"), ("confirmed", "yes")]).await;
    let operators_for_a_viewer = vera.get("/console/operators").await;

    assert!(listed.body.contains("acme") && listed.body.contains("Propose…"), "{}", listed.body);
    assert!(confirm.body.contains("You propose another API key for acme"), "{}", confirm.body);
    assert_eq!(proposed.location.as_deref(), Some("/console/proposals?notice=proposed"), "{}", proposed.body);
    assert_eq!(before_approval, 0, "nothing is issued before the approval");
    assert_eq!(approved.location.as_deref(), Some("/console/proposals?notice=approved"), "{}", approved.body);
    assert!(!approved.body.contains("opk_"));
    assert!(collectable.body.contains("Collect the API key"), "{}", collectable.body);
    assert_eq!(by_the_approver.status, StatusCode::FORBIDDEN, "{}", by_the_approver.body);
    assert!(asked.body.contains("shown on the next page, once"), "{}", asked.body);
    assert_eq!(issued.status, StatusCode::OK);
    assert!(issued.body.contains("opk_") && issued.body.contains("shown once"), "{}", issued.body);
    assert_eq!(again.status, StatusCode::CONFLICT, "a key is collected once");
    assert_eq!(after_issue.len(), 1, "the fixture's tenant has no key of its own");
    assert_eq!(by_a_viewer.status, StatusCode::FORBIDDEN);
    assert_eq!(keys().await.len(), 1, "a refused issue makes no key");
    assert!(viewers_list.body.contains("acme") && !viewers_list.body.contains("Propose…"));
    assert!(!viewers_list.body.contains("opk_"), "no page ever shows a stored key");
    assert_eq!(revoked.location.as_deref(), Some("/console/tenants?notice=key_revoked"));
    assert!(keys().await[0].revoked_at.is_some());
    assert_eq!(created.status, StatusCode::OK);
    assert!(created.body.contains("oec_") && created.body.contains("shown once"), "the code, once: {}", created.body);
    assert_eq!(changed.location.as_deref(), Some("/console/operators?notice=operator_changed"), "{}", changed.body);
    assert!(operators.body.contains("<td>otto</td><td>approver</td>"), "{}", operators.body);
    assert_eq!(disabled.location.as_deref(), Some("/console/operators?notice=operator_disabled"));
    assert_eq!(operators_for_a_viewer.status, StatusCode::FORBIDDEN);
    let trail = sqlx::query_scalar!(
        "SELECT action FROM operator_audit WHERE operator_name = 'ada' AND outcome = 'done' ORDER BY audit_id"
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        trail,
        [
            "operator.enroll",
            "session.sign_in",
            "key.issue",
            "key.revoke",
            "operator.create",
            "operator.update",
            "operator.disable"
        ]
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_audit_trail_is_filtered_by_operator_action_and_day(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    let alice = Browser::sign_in(&ops, "alice", "operator", None).await;
    alice.post(&format!("/console/payments/{payment_id}/retry"), &[("reason", "back"), ("confirmed", "yes")]).await;
    let today = time::OffsetDateTime::now_utc().date().to_string();

    let todays =
        alice.get(&format!("/console/audit?operator=alice&action=payment.retry&from={today}&to={today}")).await;
    let long_ago = alice.get("/console/audit?operator=alice&from=2000-01-01&to=2000-01-02").await;
    let others = alice.get("/console/audit?operator=bob").await;
    let bad_day = alice.get("/console/audit?from=yesterday").await;

    assert!(
        todays.body.contains("<td>payment.retry</td>") && todays.body.contains(&payment_id.to_string()),
        "{}",
        todays.body
    );
    assert!(!todays.body.contains("session.sign_in"), "only the action asked for");
    assert!(long_ago.body.contains("Nothing is recorded that matches"), "{}", long_ago.body);
    assert!(others.body.contains("Nothing is recorded that matches"));
    assert_eq!(bad_day.status, StatusCode::BAD_REQUEST);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_overview_refreshing_itself_does_not_keep_an_idle_session_alive(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let alice = Browser::sign_in(&ops, "alice", "operator", None).await;
    let away = || async {
        sqlx::query!("UPDATE operator_sessions SET last_seen_at = now() - interval '10 minutes'")
            .execute(&pool)
            .await
            .unwrap();
    };
    let idle_for = || async {
        sqlx::query_scalar!(
            r#"SELECT extract(epoch FROM now() - last_seen_at)::bigint AS "secs!" FROM operator_sessions"#
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };

    away().await;
    let refreshed = alice
        .http
        .get(format!("{}/console/live", alice.url))
        .header("cookie", &alice.cookie)
        .header("oncepay-background", "refresh")
        .send()
        .await
        .unwrap();
    let after_refresh = idle_for().await;
    alice.get("/console/").await;
    let after_a_page = idle_for().await;

    assert_eq!(refreshed.status(), StatusCode::OK);
    assert!(after_refresh >= 590, "a refresh the person did not ask for leaves the session idle: {after_refresh}s");
    assert!(after_a_page < 5, "opening a page is using the session: {after_a_page}s");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_bulk_retry_leaves_conflicts_alone_and_is_hidden_from_other_tenants_operators(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    tenant(&pool, "globex").await;
    let unresolved = dead_lettered(&pool, acme, "k-1", 60).await;
    let disputed = crate::support::accept(&pool, acme, "k-2", 1999).await;
    let mut conn = pool.acquire().await.unwrap();
    let evidence = json!([{ "source": "webhook", "result": "a charge for other money" }]);
    let kind = oncepay_ops::dead_letters::Kind::Conflict;
    oncepay_ops::dead_letters::record(&mut conn, acme, disputed, kind, "other money", evidence, 0).await.unwrap();
    let alice = Browser::sign_in(&ops, "alice", "operator", None).await;
    let gina = Browser::sign_in(&ops, "gina", "viewer", Some(&["globex"])).await;
    let disputed_text = disputed.to_string();

    let shown = alice.post("/console/bulk-retries", &[("reason", "provider back")]).await;
    let conflicts = alice.post("/console/bulk-retries", &[("kind", "conflict"), ("reason", "all of them")]).await;
    let forged = alice
        .post("/console/bulk-retries", &[("reason", "all"), ("payments", &disputed_text), ("confirmed", "yes")])
        .await;
    let payments = hidden(&shown, "payments");
    let created = alice
        .post("/console/bulk-retries", &[("reason", "provider back"), ("payments", &payments), ("confirmed", "yes")])
        .await;
    let job = created.location.expect("the job's page");
    let seen_by_alice = alice.get(&job).await;
    let seen_by_gina = gina.get(&job).await;

    assert_eq!(payments, unresolved.to_string(), "only the unresolved dead letter is selected");
    assert_eq!(conflicts.status, StatusCode::BAD_REQUEST, "{}", conflicts.body);
    assert_eq!(forged.status, StatusCode::NOT_FOUND, "{}", forged.body);
    assert!(forged.body.contains("no open unresolved dead letter"), "{}", forged.body);
    assert_eq!(seen_by_alice.status, StatusCode::OK);
    assert_eq!(seen_by_gina.status, StatusCode::NOT_FOUND, "another tenant's job is not even named");
    assert!(!seen_by_gina.body.contains("provider back"));
}

/// The payment's refunds, oldest first: (status, amount, requested_by).
async fn refunds_of(pool: &PgPool, payment_id: PaymentId) -> Vec<(PaymentStatus, i64, String)> {
    sqlx::query!(
        r#"SELECT status AS "status: PaymentStatus", amount, requested_by FROM refunds WHERE payment_id = $1
           ORDER BY created_at, refund_id"#,
        payment_id.as_uuid()
    )
    .map(|r| (r.status, r.amount, r.requested_by))
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_proposed_in_the_console_is_made_when_another_operator_approves_it(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 1999).await;
    let alice = Browser::sign_in(&ops, "alice", "operator", None).await;
    let bob = Browser::sign_in(&ops, "bob", "approver", None).await;
    let viewer = Browser::sign_in(&ops, "vera", "viewer", None).await;
    let page = format!("/console/payments/{payment_id}");
    let refund = format!("{page}/refund");
    let form = [("amount", "500"), ("refund_reason", "requested_by_customer"), ("reason", "the order came back")];

    let offered = alice.get(&page).await;
    let not_offered = viewer.get(&page).await;
    let by_a_viewer = viewer.post(&refund, &[&form[..], &[("confirmed", "yes")]].concat()).await;
    let confirm = alice.post(&refund, &form).await;
    let before_confirming = refunds_of(&pool, payment_id).await.len();
    let proposed = alice.post(&refund, &[&form[..], &[("confirmed", "yes")]].concat()).await;
    let proposals = bob.get("/console/proposals").await;
    let bobs_view = bob.get(&page).await;
    let proposal_id =
        sqlx::query_scalar!("SELECT proposal_id FROM proposals WHERE payment_id = $1", payment_id.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    let approve = format!("/console/proposals/{proposal_id}/approve");
    let approved = bob.post(&approve, &[("reason", "the return is in"), ("confirmed", "yes")]).await;
    let after = alice.get(&page).await;

    assert!(offered.body.contains("Propose a refund") && offered.body.contains("19.99 EUR is left to refund"));
    assert!(offered.body.contains("0.00 EUR of 19.99 EUR"), "what was refunded: {}", offered.body);
    assert!(offered.body.contains("(1999 is all that is left"), "the form's unit, with the figure: {}", offered.body);
    assert!(!not_offered.body.contains("Propose a refund"), "a viewer is offered no refund");
    assert_eq!(by_a_viewer.status, StatusCode::FORBIDDEN);
    assert_eq!(confirm.status, StatusCode::OK);
    assert!(confirm.body.contains(&format!("This proposes giving 500 (minor units) of payment {payment_id} back")));
    assert!(confirm.body.contains("name=\"amount\" value=\"500\""), "the form is posted again as it was");
    assert_eq!(before_confirming, 0, "asking to confirm changes nothing");
    assert_eq!(proposed.location, Some(format!("{page}?notice=proposed")));
    assert!(proposals.body.contains("refund 5.00 EUR (requested by customer)"), "in words: {}", proposals.body);
    assert!(bobs_view.body.contains("<strong>refund 5.00 EUR (requested by customer)</strong>"));
    assert!(!bobs_view.body.contains("Propose a refund"), "one proposal waits at a time");
    assert_eq!(approved.location, Some(format!("{page}?notice=approved")));
    assert_eq!(refunds_of(&pool, payment_id).await, [(PaymentStatus::Pending, 500, "operator:alice".to_owned())]);
    assert_eq!(refunded(&pool, payment_id).await, (500, 0));
    assert!(
        after.body.contains("operator:alice") && after.body.contains("14.99 EUR is left to refund"),
        "{}",
        after.body
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_automation_gave_up_on_is_listed_and_sent_again_from_the_console(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 1999).await;
    let refund_id = dead_lettered_refund(&pool, acme, payment_id, "r-1", 500, 60).await;
    let alice = Browser::sign_in(&ops, "alice", "operator", None).await;
    let retry = format!("/console/refunds/{refund_id}/retry");

    let listed = alice.get("/console/dead-letters").await;
    let shown = alice.get(&format!("/console/payments/{payment_id}")).await;
    let confirm = alice.post(&retry, &[("reason", "provider back")]).await;
    let before_confirming = refund_status(&pool, refund_id).await;
    let done = alice.post(&retry, &[("reason", "provider back"), ("confirmed", "yes")]).await;
    let unknown = alice.post(&format!("/console/refunds/{}/retry", uuid::Uuid::now_v7()), &[("reason", "x")]).await;

    assert!(listed.body.contains("Refunds that wait for an operator") && listed.body.contains(&refund_id.to_string()));
    assert!(listed.body.contains(&format!("href=\"/console/payments/{payment_id}\"")), "linked to its payment");
    assert!(shown.body.contains(&format!("Refund {refund_id} needs a decision")), "{}", shown.body);
    assert!(shown.body.contains(&format!("action=\"/console/refunds/{refund_id}/resolve\"")));
    assert!(confirm.body.contains(&format!("Refund {refund_id} is queued to be sent to the provider again")));
    assert_eq!(before_confirming, RefundStatus::DeadLettered);
    assert_eq!(done.location, Some(format!("/console/payments/{payment_id}?notice=refund_retried")));
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Pending);
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let actions: Vec<String> = sqlx::query_scalar!(
        "SELECT action FROM operator_audit WHERE payment_id = $1 AND action <> 'payment.read' ORDER BY audit_id",
        payment_id.as_uuid()
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(actions, ["refund.retry"]);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_conflict_is_listed_and_acknowledged_from_the_console(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 1999).await;
    let refund_id = contradicted_refund(&pool, acme, payment_id, "r-1").await;
    let alice = Browser::sign_in(&ops, "alice", "operator", None).await;
    let acknowledge = format!("/console/refunds/{refund_id}/resolve");
    let form = [("as", "acknowledged"), ("reason", "paid back by bank transfer")];

    let listed = alice.get("/console/dead-letters").await;
    let shown = alice.get(&format!("/console/payments/{payment_id}")).await;
    let confirm = alice.post(&acknowledge, &form).await;
    let still_open = alice.get("/console/dead-letters").await;
    let done = alice.post(&acknowledge, &[&form[..], &[("confirmed", "yes")]].concat()).await;
    let after = alice.get(&format!("/console/payments/{payment_id}")).await;

    assert!(listed.body.contains(&refund_id.to_string()), "{}", listed.body);
    assert!(listed.body.contains("contradicts"), "the list says why: {}", listed.body);
    assert!(shown.body.contains(&format!("Refund {refund_id} is contradicted by the provider")), "{}", shown.body);
    assert!(shown.body.contains("name=\"as\" value=\"acknowledged\""), "{}", shown.body);
    assert!(confirm.body.contains(&format!("The conflict on refund {refund_id} is closed as acknowledged")));
    assert!(still_open.body.contains(&refund_id.to_string()), "nothing is done before it is confirmed");
    assert_eq!(done.location, Some(format!("/console/payments/{payment_id}?notice=refund_acknowledged")));
    assert!(!after.body.contains("is contradicted by the provider"), "{}", after.body);
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Succeeded);
    let actions: Vec<String> = sqlx::query_scalar!(
        "SELECT action FROM operator_audit WHERE payment_id = $1 AND action <> 'payment.read' ORDER BY audit_id",
        payment_id.as_uuid()
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(actions, ["refund.acknowledge"]);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_overview_counts_the_refunds_that_wait_for_an_operator_of_the_tenants_shown(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let globex = tenant(&pool, "globex").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 10_000).await;
    dead_lettered_refund(&pool, acme, payment_id, "r-1", 500, 60).await;
    contradicted_refund(&pool, acme, payment_id, "r-2").await;
    let theirs = succeeded_payment(&pool, globex, "order-2", 10_000).await;
    dead_lettered_refund(&pool, globex, theirs, "r-3", 500, 60).await;
    let alice = Browser::sign_in(&ops, "alice", "operator", None).await;
    let gail = Browser::sign_in(&ops, "gail", "operator", Some(&["globex"])).await;

    let every_tenant = alice.get("/console/live").await.body;
    let globex_only = gail.get("/console/live").await.body;

    let row = |kind: &str, open: u32| format!("href=\"/console/dead-letters#refunds\">{kind}</a></th><td>{open}</td>");
    assert!(every_tenant.contains(&row("refund_unresolved", 2)), "{every_tenant}");
    assert!(every_tenant.contains(&row("refund_conflict", 1)), "{every_tenant}");
    assert!(globex_only.contains(&row("refund_unresolved", 1)), "{globex_only}");
    assert!(!globex_only.contains("refund_conflict"), "{globex_only}");
    let listed = alice.get("/console/dead-letters").await.body;
    assert!(listed.contains("<h2 id=\"refunds\">Refunds that wait for an operator</h2>"), "the link's target");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_overview_counts_the_refunds_in_flight_of_the_tenants_shown(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let globex = tenant(&pool, "globex").await;
    let payment_id = succeeded_payment(&pool, acme, "order-1", 10_000).await;
    let done = unknown_refund(&pool, acme, payment_id, "r-1", 500, 60).await;
    settle_succeeded(&pool, acme, done, "re_1", time::OffsetDateTime::now_utc()).await;
    unknown_refund(&pool, acme, payment_id, "r-2", 500, 60).await;
    refund(&pool, acme, payment_id, "r-3", 500).await;
    let theirs = succeeded_payment(&pool, globex, "order-2", 10_000).await;
    refund(&pool, globex, theirs, "r-4", 500).await;
    let alice = Browser::sign_in(&ops, "alice", "operator", None).await;
    let gail = Browser::sign_in(&ops, "gail", "operator", Some(&["globex"])).await;

    let every_tenant = alice.get("/console/live").await.body;
    let globex_only = gail.get("/console/live").await.body;

    let figure = |label: &str, value: &str| format!("<li><span class=\"value\">{value}</span>{label}</li>");
    let unknown = "Refunds unknown (the provider may have given the money back)";
    let oldest = "The oldest unknown refund has waited";
    for (label, value) in [
        ("Refunds waiting to be sent", "2"),
        ("Refunds being sent now", "0"),
        (unknown, "1"),
        ("Refunds given back in the last hour", "1"),
    ] {
        assert!(every_tenant.contains(&figure(label, value)), "{label}: {every_tenant}");
    }
    assert!(every_tenant.contains(oldest) && !every_tenant.contains(&figure(oldest, "none waits")), "{every_tenant}");
    for (label, value) in [
        ("Refunds waiting to be sent", "1"),
        (unknown, "0"),
        (oldest, "none waits"),
        ("Refunds given back in the last hour", "0"),
    ] {
        assert!(globex_only.contains(&figure(label, value)), "{label}: {globex_only}");
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn endpoints_are_listed_started_and_replayed_from_the_console_as_the_json_api_does_them(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    tenant(&pool, "globex").await;
    let secret = oncepay_webhook_signature::WebhookSecret::generate();
    let new =
        NewEndpoint { url: "https://acme.example/hooks", description: "orders", event_types: &[], secret: &secret };
    let endpoint_id =
        merchant_endpoints::create(&mut pool.acquire().await.unwrap(), acme, &new).await.unwrap().endpoint_id;
    // Dead-lettering a payment writes its event and queues it for the endpoint; then the worker
    // gave up on the delivery and stopped the endpoint, which kept failing.
    let payment_id = dead_lettered(&pool, acme, "k-1", 60).await;
    sqlx::query("UPDATE merchant_deliveries SET state = 'dead_lettered', attempts = 10").execute(&pool).await.unwrap();
    sqlx::query(
        "UPDATE merchant_endpoints SET enabled = false, disabled_reason = 'failing', disabled_at = now(),
         failing_since = now() - interval '5 days'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let ana = Browser::sign_in(&ops, "ana", "operator", Some(&["acme"])).await;
    let vic = Browser::sign_in(&ops, "vic", "viewer", Some(&["acme"])).await;
    let gus = Browser::sign_in(&ops, "gus", "operator", Some(&["globex"])).await;
    let enable = format!("/console/tenants/acme/endpoints/{endpoint_id}/enable");
    let replay = format!("/console/tenants/acme/endpoints/{endpoint_id}/replay");

    let overview = ana.get("/console/").await;
    let listed = ana.get("/console/endpoints").await;
    let seen_by_a_viewer = vic.get("/console/endpoints").await;
    let elsewhere = gus.get("/console/endpoints").await;
    let globex_overview = gus.get("/console/").await;
    let by_a_viewer = vic.post(&enable, &[("reason", "fixed"), ("confirmed", "yes")]).await;
    let by_another_tenant = gus.post(&enable, &[("reason", "fixed"), ("confirmed", "yes")]).await;
    let confirm = ana.post(&enable, &[("reason", "they fixed their server")]).await;
    let still_stopped: bool =
        sqlx::query_scalar("SELECT enabled FROM merchant_endpoints").fetch_one(&pool).await.unwrap();
    let started = ana.post(&enable, &[("reason", "they fixed their server"), ("confirmed", "yes")]).await;
    let landed = ana.get(started.location.as_deref().unwrap()).await;
    let bad_time = ana.post(&replay, &[("since", "yesterday"), ("reason", "their outage")]).await;
    let confirm_replay = ana.post(&replay, &[("since", "2000-01-01T00:00"), ("reason", "their outage")]).await;
    let replayed =
        ana.post(&replay, &[("since", "2000-01-01T00:00"), ("reason", "their outage"), ("confirmed", "yes")]).await;
    let after_replay: Vec<String> =
        sqlx::query_scalar("SELECT state FROM merchant_deliveries").fetch_all(&pool).await.unwrap();
    let payment_page = ana.get(&format!("/console/payments/{payment_id}")).await;
    let event_id: uuid::Uuid =
        sqlx::query_scalar("SELECT event_id FROM merchant_events").fetch_one(&pool).await.unwrap();
    let replay_event = format!("/console/tenants/acme/events/{event_id}/replay");
    let back = payment_id.to_string();
    let event_replayed = ana
        .post(&replay_event, &[("reason", "they lost it"), ("payment_id", back.as_str()), ("confirmed", "yes")])
        .await;

    assert!(
        overview.body.contains("1 webhook endpoint is stopped")
            && overview.body.contains("href=\"/console/endpoints\"")
    );
    assert!(!globex_overview.body.contains("webhook endpoint is stopped"), "only the tenants one may see");
    assert!(listed.body.contains("https://acme.example/hooks") && listed.body.contains("every delivery failed"));
    assert!(listed.body.contains("<td>0</td><td>1</td>"), "nothing waits, one is dead-lettered: {}", listed.body);
    assert!(!listed.body.contains(&secret), "never the secret");
    assert!(listed.body.contains(&format!("action=\"{enable}\"")), "{}", listed.body);
    assert!(seen_by_a_viewer.body.contains("https://acme.example/hooks") && !seen_by_a_viewer.body.contains("Start…"));
    assert!(!elsewhere.body.contains("https://acme.example/hooks"), "{}", elsewhere.body);
    assert_eq!((by_a_viewer.status, by_another_tenant.status), (StatusCode::FORBIDDEN, StatusCode::NOT_FOUND));
    assert_eq!(confirm.status, StatusCode::OK);
    assert!(confirm.body.contains("is started again now"), "{}", confirm.body);
    assert!(!still_stopped, "nothing is done before it is confirmed");
    assert_eq!(started.location.as_deref(), Some("/console/endpoints?notice=endpoint_enabled"));
    assert!(landed.body.contains("Started:") && landed.body.contains(">enabled<"), "{}", landed.body);
    assert_eq!(bad_time.status, StatusCode::BAD_REQUEST);
    assert!(confirm_replay.body.contains("written since 2000-01-01T00:00:00Z"), "{}", confirm_replay.body);
    assert_eq!(replayed.location.as_deref(), Some("/console/endpoints?notice=replayed"));
    assert_eq!(after_replay, ["pending"]);
    assert!(payment_page.body.contains(&event_id.to_string()) && payment_page.body.contains(&replay_event));
    assert_eq!(event_replayed.location, Some(format!("/console/payments/{payment_id}?notice=replayed")));
    let trail = audit_of_actions(&pool, &["webhook_endpoint.%", "event.replay"]).await;
    assert_eq!(
        trail,
        [
            reasoned("vic", "webhook_endpoint.enable", "refused", None),
            reasoned("gus", "webhook_endpoint.enable", "refused", None),
            reasoned("ana", "webhook_endpoint.enable", "done", Some("they fixed their server")),
            reasoned("ana", "webhook_endpoint.replay", "done", Some("their outage")),
            reasoned("ana", "event.replay", "done", Some("they lost it")),
        ]
    );
}
