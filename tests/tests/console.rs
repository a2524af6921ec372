//! The operator console in a real browser: headless Chromium driven over WebDriver (chromedriver),
//! against the real binaries, signing in through a real OpenID provider (oidc-provider under Node).
//!
//! One operator finds a dead-lettered payment by its Idempotency-Key, reads the provider's view
//! beside the ledger, and proposes settling it; a second approves; the payment settles and the
//! audit trail shows it. An endpoint the worker stopped is flagged on the overview, then started
//! again and replayed from the console. A form posted from a page of another origin is refused; an
//! operator limited to one tenant never sees another's payment. axe-core runs on every page the test opens
//! and must find no serious or critical problem. The test leaves two screenshots in
//! `target/console-screenshots/` for docs/operators.md.

// Helpers outside `#[test]` functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fantoccini::{Client, Locator};
use oncepay_devkit::browser::{self, Browser};
use oncepay_devkit::oidc::{Client as OidcClient, OidcProvider};
use oncepay_devkit::pg::Durability;
use oncepay_devkit::process::setting_variable;
use oncepay_devkit::wait::wait_until;
use oncepay_simulator::faults::FaultsPatch;
use oncepay_tests::system::{Binaries, Provider, Role, System, SystemConfig, Timing, Topology};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use uuid::Uuid;

/// How many pages the test has checked, to number their screenshots.
static PAGES_SEEN: AtomicUsize = AtomicUsize::new(0);

/// How long anything the processes or the browser do may take.
const PATIENCE: Duration = Duration::from_secs(60);
const CLIENT_SECRET: &str = "a-client-secret-for-the-console-test";
const KEY: &str = "order-4711";

/// A browser session and what it found wrong with the pages it opened.
struct Operator {
    session: browser::Session,
    ops: String,
    /// Every serious or critical accessibility problem, with the page it was on.
    problems: Vec<String>,
    pages: usize,
}

impl Operator {
    async fn new(chromedriver: &Browser, ops: &str) -> Self {
        Self { session: chromedriver.session().await.unwrap(), ops: ops.to_owned(), problems: Vec::new(), pages: 0 }
    }

    fn client(&self) -> &Client {
        &self.session
    }

    /// Runs axe-core on the open page and keeps what it finds.
    /// Also keeps a screenshot of the page in `target/console-screenshots/pages/`, for a person to
    /// look at.
    async fn check(&mut self) {
        let url = self.client().current_url().await.unwrap();
        let found = browser::axe(self.client()).await.unwrap();
        self.problems.extend(found.iter().map(|violation| format!("{url}: {violation}")));
        self.pages += 1;
        let seen = PAGES_SEEN.fetch_add(1, Ordering::Relaxed);
        let slug: String = url.path().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        self.screenshot(&format!("pages/{seen:02}{slug}.png")).await;
    }

    /// Opens `path` of the console and checks the page.
    async fn open(&mut self, path: &str) -> String {
        self.client().goto(&format!("{}{path}", self.ops)).await.unwrap();
        self.check().await;
        self.client().source().await.unwrap()
    }

    /// Waits until the open page contains `text`, checks it, and returns it.
    async fn until(&mut self, text: &str) -> String {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let source = self.client().source().await.unwrap();
            if source.contains(text) {
                self.check().await;
                return source;
            }
            assert!(tokio::time::Instant::now() < deadline, "the page never said {text:?}:\n{source}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn fill(&self, css: &str, text: &str) {
        self.client().find(Locator::Css(css)).await.unwrap().send_keys(text).await.unwrap();
    }

    async fn click(&self, css: &str) {
        self.client().find(Locator::Css(css)).await.unwrap().click().await.unwrap();
    }

    /// Signs in at the OpenID provider as `login`, from the console's sign-in page.
    async fn sign_in_with_oidc(&mut self, login: &str) {
        self.open("/console/").await;
        self.click("a[href='/v1/session/oidc']").await;
        let login_field = self.client().wait().at_most(PATIENCE).for_element(Locator::Css("input[name=login]"));
        login_field.await.unwrap().send_keys(login).await.unwrap();
        self.fill("input[name=password]", "any").await;
        self.click("button[type=submit]").await;
        self.until(&format!("{login} (")).await;
    }

    /// Signs in with a local password, on the console's form.
    async fn sign_in_with_password(&mut self, name: &str, password: &str) {
        self.open("/console/sign-in").await;
        self.fill("#name", name).await;
        self.fill("#password", password).await;
        self.click("main button[type=submit]").await;
        self.until(&format!("{name} (")).await;
    }

    /// Types `text` into the search box and waits for the page it leads to.
    async fn search(&mut self, text: &str, then: &str) -> String {
        self.fill("#q", text).await;
        self.click("form.search button").await;
        self.until(then).await
    }

    async fn screenshot(&self, name: &str) {
        let png = self.client().screenshot().await.unwrap();
        let dir = screenshots();
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}

/// `target/console-screenshots/`, beside the test binary's profile directory.
fn screenshots() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().join("console-screenshots")
}

/// Makes an operator who signs in at the OpenID provider, through the operations API as the
/// system's admin.
async fn make_operator(system: &System, body: Value) {
    let http = reqwest::Client::new();
    let ops = &system.operations_urls()[0];
    let made = http.post(format!("{ops}/v1/operators")).bearer_auth(system.admin_token()).json(&body).send().await;
    let made = made.unwrap();
    assert_eq!(made.status(), 201);
    assert_eq!(made.json::<Value>().await.unwrap()["enrollment"], Value::Null, "no code with an OpenID provider");
}

async fn status_of(pool: &PgPool, payment_id: Uuid) -> String {
    sqlx::query_scalar!("SELECT status::text AS \"status!\" FROM payments WHERE payment_id = $1", payment_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn refund_statuses_of(pool: &PgPool, payment_id: Uuid) -> Vec<String> {
    sqlx::query_scalar!("SELECT status::text AS \"status!\" FROM refunds WHERE payment_id = $1", payment_id)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Serves, on a port of its own (another origin, the same site), a page whose form posts `fields`
/// to `target`, as a page an attacker made would.
async fn other_origin(target: String, fields: &[(&str, &str)]) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let inputs: String = fields
        .iter()
        .map(|(name, value)| format!("<input type=\"hidden\" name=\"{name}\" value=\"{value}\">"))
        .collect();
    let page = format!(
        "<!doctype html><html lang=\"en\"><title>Win a prize</title><form method=\"post\" action=\"{target}\">\
         {inputs}<button id=\"go\">Claim</button></form></html>"
    );
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut request = [0_u8; 4096];
            let _ = stream.read(&mut request).await;
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                page.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_find_propose_and_approve_in_a_real_browser_and_see_only_their_tenants() {
    // A key window long enough that the bulk retry below resends inside it, whatever the pace.
    // Only this run's pages, for a person to look at.
    let _ = std::fs::remove_dir_all(screenshots().join("pages"));
    let timing =
        Timing { poller_max_attempts: 2, key_window_secs: 600, key_window_margin_secs: 60, ..Timing::default() };
    let mut system = System::start(SystemConfig {
        binaries: Binaries::built().unwrap(),
        topology: Topology { apis: 1, workers: 1, reconcilers: 1 },
        tenants: vec!["acme".into(), "globex".into()],
        durability: Durability::Fast,
        timing,
        provider: Provider::Simulator { seed: 0xC0_501E },
        log_dir: None,
        env: Vec::new(),
        broker: false,
    })
    .await
    .unwrap();
    let ops = system.operations_urls()[0].clone();
    let client = OidcClient {
        client_id: "oncepay-console".into(),
        client_secret: CLIENT_SECRET.into(),
        redirect_uris: vec![format!("{ops}/v1/session/oidc/callback")],
    };
    let provider = OidcProvider::start(&[client], None, system.log_dir()).await.unwrap();
    let oidc = [
        ("operators.oidc.issuer", provider.issuer().to_owned()),
        ("operators.oidc.client_id", "oncepay-console".to_owned()),
        ("operators.oidc.client_secret", CLIENT_SECRET.to_owned()),
        ("operators.oidc.redirect_uri", format!("{ops}/v1/session/oidc/callback")),
        ("operators.break_glass", system.admin_name().to_owned()),
    ];
    let oidc: Vec<(String, String)> = oidc.into_iter().map(|(key, value)| (setting_variable(key), value)).collect();
    system.restart(Role::Reconciler, 0, &oidc).await.unwrap();
    make_operator(
        &system,
        json!({ "name": "alice", "role": "operator", "oidc_subject": "alice", "reason": "on call" }),
    )
    .await;
    make_operator(&system, json!({ "name": "bob", "role": "approver", "oidc_subject": "bob", "reason": "lead" })).await;
    let limited = json!({
        "name": "carol", "role": "operator", "tenants": ["globex"], "oidc_subject": "carol", "reason": "globex's support"
    });
    make_operator(&system, limited).await;

    // A charge the provider made but whose response never arrived, whose lookups fail until the
    // poller gives up, and whose webhook is lost: a dead letter only a person can settle.
    let simulator = system.simulator().unwrap();
    let faults = FaultsPatch {
        error_after_rate: Some(1.0),
        lookup_error_rate: Some(1.0),
        webhook_drop_rate: Some(1.0),
        ..Default::default()
    };
    simulator.set_faults(&faults).await.unwrap();
    let accept = |tenant: usize, key: &'static str| {
        let tenant = system.tenants()[tenant].clone();
        let api = system.api_urls()[0].clone();
        async move {
            let accepted: Value = reqwest::Client::new()
                .post(format!("{api}/v1/payments"))
                .bearer_auth(&tenant.api_key)
                .header("Idempotency-Key", key)
                .json(&json!({ "amount": 1999, "currency": "EUR", "customer_id": "cus_4711" }))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            accepted["id"].as_str().unwrap().parse::<Uuid>().unwrap()
        }
    };
    let payment_id = accept(0, KEY).await;
    let globex_payment = accept(1, "order-4712").await;
    let pool = system.pool().clone();
    for id in [payment_id, globex_payment] {
        let dead_lettered = || async { (status_of(&pool, id).await == "dead_lettered").then_some(()) };
        wait_until("the payment is dead-lettered", PATIENCE, dead_lettered).await.unwrap();
    }
    simulator.set_faults(&FaultsPatch { lookup_error_rate: Some(0.0), ..Default::default() }).await.unwrap();

    let chromedriver = Browser::start(system.log_dir()).await.unwrap();
    let mut alice = Operator::new(&chromedriver, &ops).await;
    alice.sign_in_with_oidc("alice").await;
    let found = alice.search(KEY, "Ask the provider now").await;
    assert!(found.contains(&payment_id.to_string()) && found.contains("dead_lettered"));
    alice.click("main form[method=get] button").await;
    let compared = alice.until("disagree").await;
    assert!(compared.contains("but oncepay's ledger books no charge"), "{compared}");
    assert!(compared.contains("<td>19.99 EUR</td>"), "the provider's charge, as people read money: {compared}");
    alice.screenshot("payment.png").await;
    let charge_id = alice.client().find(Locator::Css("main table td")).await.unwrap().text().await.unwrap();
    assert!(!charge_id.is_empty());
    alice.fill("#succeeded-charge", &charge_id).await;
    alice.fill("#succeeded-reason", "the provider took the money; its response was lost").await;
    alice.click("form:has(#succeeded-charge) button").await;
    alice.until("Confirm: what will happen").await;
    alice.click("main form button").await;
    let proposed = alice.until("Proposed: nothing changes").await;
    assert!(proposed.contains("Withdraw"), "the proposer may withdraw, not approve");
    assert_eq!(status_of(&pool, payment_id).await, "dead_lettered");

    // A page of another origin posts a resend with Alice's session: refused, nothing done.
    let target = format!("{ops}/console/payments/{payment_id}/retry");
    let attack = other_origin(target, &[("reason", "free money"), ("confirmed", "yes")]).await;
    alice.client().goto(&attack).await.unwrap();
    alice.click("#go").await;
    alice.until("must come from a page of this origin").await;
    assert_eq!(status_of(&pool, payment_id).await, "dead_lettered", "the refused resend did nothing");

    // An api that takes payments from RabbitMQ has sampled its queues.
    sqlx::query(
        "INSERT INTO broker_queue_samples (queue, messages, oldest_failed_at, sampled_at) \
         VALUES ('payments', 12, NULL, now()), ('dead_letters', 2, now() - interval '2 hours', now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut bob = Operator::new(&chromedriver, &ops).await;
    bob.sign_in_with_oidc("bob").await;
    // The overview's figures refresh themselves: its script polls under the page's strict policy.
    // Read in one script: the refresh may replace the element between finding it and reading it.
    let as_of = || async {
        let text = bob.client().execute("return document.querySelector('#live-figures p.muted').textContent", vec![]);
        text.await.unwrap().as_str().unwrap().to_owned()
    };
    let first = as_of().await;
    let refreshed = wait_until("the overview refreshes itself", PATIENCE, || async {
        let now = as_of().await;
        (now != first).then_some(now)
    });
    refreshed.await.unwrap();
    let overview = bob.client().source().await.unwrap();
    assert!(overview.contains("/console/dead-letters?kind=unresolved"), "the open dead letter is counted");
    assert!(overview.contains("Payments from RabbitMQ") && overview.contains(">2h "), "the broker's queues");
    bob.screenshot("overview.png").await;
    // The broker's figures are below the fold: the same page, scrolled to them.
    let to_broker =
        "[...document.querySelectorAll('h2')].find(h => h.textContent === 'Payments from RabbitMQ').scrollIntoView()";
    bob.client().execute(to_broker, vec![]).await.unwrap();
    bob.screenshot("overview-broker.png").await;
    bob.open("/console/proposals").await;
    bob.click(&format!("a[href='/console/payments/{payment_id}']")).await;
    bob.until("Waiting for approval").await;
    bob.fill("#approve-reason", "checked the charge at the provider").await;
    bob.click("form[action$='/approve'] button").await;
    bob.until("Confirm: what will happen").await;
    bob.click("main form button").await;
    let settled = bob.until("Approved and done").await;
    assert!(settled.contains("succeeded") && settled.contains(&charge_id), "{settled}");
    assert_eq!(status_of(&pool, payment_id).await, "succeeded");
    let trail = bob.open("/console/audit?action=proposal.approve").await;
    assert!(
        trail.contains("<td>bob</td><td>proposal.approve</td>") && trail.contains(&payment_id.to_string()),
        "{trail}"
    );

    // The customer sends part of the order back: Alice proposes a refund, Bob approves it, and the
    // worker sends it (its response lost too; a lookup settles it).
    let page = format!("/console/payments/{payment_id}");
    let offered = alice.open(&page).await;
    assert!(offered.contains("19.99 EUR is left to refund"), "{offered}");
    alice.fill("#refund-amount", "500").await;
    alice.fill("#refund-reason", "the customer sent one item back").await;
    alice.click(&format!("form[action='{page}/refund'] button")).await;
    let confirm = alice.until("Confirm: what will happen").await;
    assert!(confirm.contains(&format!("This proposes giving 500 (minor units) of payment {payment_id} back")));
    alice.click("main form button").await;
    alice.until("Proposed: nothing changes").await;
    bob.open(&page).await;
    bob.until("refund 5.00 EUR").await;
    bob.fill("#approve-reason", "the item is back in the warehouse").await;
    bob.click("form[action$='/approve'] button").await;
    bob.until("Confirm: what will happen").await;
    bob.click("main form button").await;
    bob.until("Approved and done").await;
    let made = || async { (refund_statuses_of(&pool, payment_id).await == ["succeeded"]).then_some(()) };
    wait_until("the refund is made", PATIENCE, made).await.unwrap();
    let refunded = alice.open(&page).await;
    assert!(refunded.contains("<td>5.00 EUR</td><td>succeeded</td>"), "{refunded}");
    assert!(refunded.contains("operator:alice") && refunded.contains("14.99 EUR is left to refund"), "{refunded}");
    alice.screenshot("refunded.png").await;

    // acme's merchant listens for events, but its receiver answered 410 Gone: the worker stopped
    // the endpoint. The overview says so; Alice starts it again from the endpoints page, replays
    // its dead-lettered deliveries and one of the payment's events, and the audit trail shows it.
    let endpoint_id: Uuid = sqlx::query_scalar(
        "INSERT INTO merchant_endpoints
             (tenant_id, endpoint_id, url, secret, enabled, disabled_reason, disabled_at, failing_since)
         SELECT tenant_id, gen_random_uuid(), 'https://acme.example/hooks', 'whsec_' || repeat('A', 32), false,
                'gone', now(), now() - interval '1 hour'
         FROM tenants WHERE name = 'acme' RETURNING endpoint_id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let warned = alice.open("/console/").await;
    assert!(warned.contains("1 webhook endpoint is stopped"), "{warned}");
    alice.click("p.alert a[href='/console/endpoints']").await;
    let listed = alice.until("it answered 410 Gone").await;
    assert!(listed.contains("https://acme.example/hooks") && !listed.contains("whsec_"), "{listed}");
    alice.screenshot("endpoints.png").await;
    alice.fill(&format!("#enable-{endpoint_id}"), "acme's receiver is back").await;
    alice.click(&format!("form[action$='{endpoint_id}/enable'] button")).await;
    let confirm = alice.until("Confirm: what will happen").await;
    assert!(confirm.contains("is started again now"), "{confirm}");
    alice.click("main form button").await;
    let started = alice.until("Started:").await;
    assert!(started.contains("<td>enabled</td>"), "{started}");
    let enabled: bool = sqlx::query_scalar("SELECT enabled FROM merchant_endpoints WHERE endpoint_id = $1")
        .bind(endpoint_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(enabled);
    let trail = alice.open("/console/audit?action=webhook_endpoint.enable").await;
    assert!(trail.contains("<td>alice</td><td>webhook_endpoint.enable</td>"), "{trail}");
    alice.open("/console/endpoints").await;
    alice.fill(&format!("#replay-{endpoint_id}"), "their outage").await;
    alice.click(&format!("form[action$='{endpoint_id}/replay'] button")).await;
    let confirm = alice.until("Confirm: what will happen").await;
    assert!(confirm.contains("Every dead-lettered delivery"), "{confirm}");
    alice.click("main form button").await;
    // The endpoint has no dead-lettered delivery: the notice says nothing was queued, not that
    // something was.
    let nothing = alice.until("Nothing to replay").await;
    assert!(!nothing.contains("Queued again"), "{nothing}");
    alice.screenshot("replayed-nothing.png").await;
    alice.open(&page).await;
    alice.fill("form[action*='/events/'] input[name=reason]", "acme lost it while its receiver was away").await;
    alice.click("form[action*='/events/'] button").await;
    alice.until("Confirm: what will happen").await;
    alice.click("main form button").await;
    alice.until("Queued again").await;
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM merchant_deliveries WHERE endpoint_id = $1")
        .bind(endpoint_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(queued, 1, "the replayed event is queued for the endpoint started again");
    let replays: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM operator_audit WHERE operator_name = 'alice' AND action LIKE '%replay' AND outcome = 'done'
         ORDER BY audit_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(replays, ["webhook_endpoint.replay", "event.replay"]);

    bob.open("/console/dead-letters?state=all").await;
    bob.open("/console/recon").await;
    bob.open("/console/").await;

    let mut carol = Operator::new(&chromedriver, &ops).await;
    carol.sign_in_with_oidc("carol").await;
    // The keyboard alone: the first Tab reaches the link that skips to the content, and Enter in
    // the search box searches.
    carol.client().find(Locator::Css("body")).await.unwrap().send_keys("\u{E004}").await.unwrap();
    let focused = carol.client().active_element().await.unwrap().text().await.unwrap();
    assert_eq!(focused, "Skip to the content");
    carol.fill("#q", &format!("{KEY}\u{E007}")).await;
    let nothing = carol.until("No payment of a tenant you may see matches").await;
    assert!(!nothing.contains(&payment_id.to_string()));
    let hidden = carol.open(&format!("/console/payments/{payment_id}")).await;
    assert!(hidden.contains("Not found") && !hidden.contains(&charge_id), "{hidden}");
    let listed = carol.open("/console/dead-letters").await;
    assert!(!listed.contains(&payment_id.to_string()) && listed.contains(&globex_payment.to_string()));
    // Carol resends every open dead letter of hers at once; the reconciler works the job.
    carol.fill("#bulk-reason", "the provider is back").await;
    carol.click("form[action='/console/bulk-retries'] button").await;
    carol.until("Confirm: retry 1 payment").await;
    carol.click("main form button").await;
    let job = carol.until("Bulk retry").await;
    assert!(job.contains(&globex_payment.to_string()), "{job}");
    let job_url = carol.client().current_url().await.unwrap();
    let retried = wait_until("the bulk retry resends the payment", PATIENCE, || async {
        carol.client().goto(job_url.as_str()).await.unwrap();
        let page = carol.client().source().await.unwrap();
        page.contains("finished").then_some(page)
    });
    assert!(retried.await.unwrap().contains("<td>retried</td><td>queued to be sent again</td>"));
    carol.check().await;
    let settled = || async { (status_of(&pool, globex_payment).await == "succeeded").then_some(()) };
    wait_until("the resent payment settles", PATIENCE, settled).await.unwrap();

    // The administration pages, as the system's first admin: with the OpenID provider configured,
    // the break-glass account, the one that still signs in with a password, every use recorded.
    let mut admin = Operator::new(&chromedriver, &ops).await;
    let enroll = admin.open("/console/enroll").await;
    assert!(enroll.contains("Enrollment code"), "{enroll}");
    let refused = admin.open("/console/sign-in").await;
    assert!(refused.contains("break-glass"), "{refused}");
    admin.sign_in_with_password(system.admin_name(), system.admin_password()).await;
    let overview = admin.open("/console/").await;
    assert!(overview.contains("The break-glass account") && overview.contains("session.sign_in"), "{overview}");
    let account = admin.open("/console/account").await;
    assert!(account.contains("Change your password") && account.contains("Sign out everywhere"), "{account}");
    let tenants = admin.open("/console/tenants").await;
    assert!(tenants.contains("acme") && tenants.contains("globex") && tenants.contains("Propose…"));
    // A key for a tenant waits for a second person; its proposal is decided on the proposals page.
    let ops = system.operations_urls().into_iter().next().unwrap();
    let proposed = reqwest::Client::new()
        .post(format!("{ops}/v1/tenants/acme/keys"))
        .bearer_auth(system.admin_token())
        .json(&json!({ "reason": "acme's new server" }))
        .send()
        .await
        .unwrap();
    assert_eq!(proposed.status(), reqwest::StatusCode::ACCEPTED);
    let waiting = admin.open("/console/proposals").await;
    assert!(waiting.contains("tenant acme") && waiting.contains("Withdraw…"), "{waiting}");
    let operators = admin.open("/console/operators").await;
    assert!(operators.contains("carol") && operators.contains("globex"));
    // On a phone's width, nothing runs off the side of the page: wide tables scroll in their box.
    admin.client().set_window_size(390, 844).await.unwrap();
    for path in [
        "/console/".to_owned(),
        format!("/console/payments/{payment_id}"),
        "/console/dead-letters?state=all".into(),
        "/console/endpoints".into(),
    ] {
        admin.open(&path).await;
        let fits = admin.client().execute("return document.documentElement.scrollWidth <= window.innerWidth", vec![]);
        assert_eq!(fits.await.unwrap(), json!(true), "{path} is wider than a phone");
    }

    let problems: Vec<String> =
        [&alice, &bob, &carol, &admin].iter().flat_map(|operator| operator.problems.iter().cloned()).collect();
    assert!(problems.is_empty(), "axe-core found serious problems:\n{}", problems.join("\n"));
    assert!(alice.pages + bob.pages + carol.pages + admin.pages >= 20, "axe-core checked at least 20 pages");
    for operator in [alice, bob, carol, admin] {
        operator.session.close().await.unwrap();
    }
    chromedriver.stop().await.unwrap();
    provider.stop().await.unwrap();
}
