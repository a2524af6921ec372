//! The operator console's reads against a history of payments: the history, loaded in bulk, and
//! the four reads an operator makes most (the first page of dead letters, a later page, a search by
//! `Idempotency-Key`, a dead-lettered payment's page with its timeline), as HTTP requests to a
//! running reconciler.
//!
//! The history is what the services would have written over a month: payments spread over
//! [`TENANTS`], most of them charged (a ledger entry, a stored response on the key, the provider's
//! webhook for the last days' ones), one in [`DEAD_LETTERED_EVERY`] dead-lettered after an
//! uncertain send (an open dead letter, which an operator has looked at once), each with its audit
//! rows. The requests are found on the console itself, as an operator finds them: a later page from
//! the first page's link, a payment's page from the search's redirect. Benchmark databases only.

use std::fmt;

use anyhow::Context;
use oncepay_domain::ids::TenantId;
use sqlx::PgConnection;

use crate::closed_loop::Window;
use crate::dataset::{BATCH, Tenant};
use crate::measure::Timing;

/// The tenants the payments are spread over, in turn.
pub const TENANTS: [&str; 3] = ["console-a", "console-b", "console-c"];

/// One payment in this many is dead-lettered; the others succeeded.
pub const DEAD_LETTERED_EVERY: u64 = 10;

/// Payments are created over this many days, evenly, ending a day ago.
const HISTORY_DAYS: u64 = 29;

/// Charged payments of this many last days have the provider's webhook recorded: fewer days than
/// the reaper keeps webhook ids (seven by default), so it deletes none while the benchmark runs.
const WEBHOOK_DAYS: u64 = 6;

/// How many different keys the search asks for, and how many dead-lettered payments' pages are
/// read, each set spread evenly over the whole history.
const SPREAD: u64 = 1_000;

/// Rows on a page of dead letters (the console's page size): the first page must be full.
const PAGE_ROWS: usize = 50;

/// The `Idempotency-Key` of payment `i`. SQL: `'order-' || i`.
pub fn key(i: u64) -> String {
    format!("order-{i}")
}

/// Creates [`TENANTS`] and writes `payments` payments for them, with their keys, audit rows,
/// ledger entries, webhooks, dead letters and an operator's read of each dead letter.
pub async fn load(conn: &mut PgConnection, payments: u64) -> anyhow::Result<()> {
    let mut tenants = Vec::new();
    for name in TENANTS {
        tenants.push(Tenant::create(conn, name).await?.id);
    }
    let mut start = 0;
    while start < payments {
        let end = (start + BATCH).min(payments) - 1;
        load_batch(conn, &tenants, start, end, payments).await?;
        start = end + 1;
    }
    Ok(())
}

/// Payments `start..=end` of `payments`. Payment `i` belongs to tenant `i mod 3`, was created at
/// its place in the history (its id ordered by that time, as the api's UUIDv7 are), sent once, and
/// settled half a second later, or, one in [`DEAD_LETTERED_EVERY`], went `unknown` and was
/// dead-lettered by the poller one to three hours after it was created.
async fn load_batch(
    conn: &mut PgConnection,
    tenants: &[TenantId],
    start: u64,
    end: u64,
    payments: u64,
) -> anyhow::Result<()> {
    let tenants: Vec<uuid::Uuid> = tenants.iter().map(|t| t.as_uuid()).collect();
    let loaded = sqlx::query_file_scalar!(
        "sql/console_history.sql",
        &tenants,
        i64::try_from(start)?,
        i64::try_from(end)?,
        i64::try_from(payments)?,
        i32::try_from(HISTORY_DAYS)?,
        i64::try_from(DEAD_LETTERED_EVERY)?,
        i32::try_from(WEBHOOK_DAYS)?,
    )
    .fetch_one(conn)
    .await
    .context("loading the console's payments")?;
    anyhow::ensure!(u64::try_from(loaded)? == end - start + 1, "loaded {loaded} payments of {start}..={end}");
    Ok(())
}

/// The token in what `oncepay-reconciler operators bootstrap NAME --json` printed.
pub fn bootstrapped_token(printed: &str) -> anyhow::Result<String> {
    let printed: serde_json::Value = serde_json::from_str(printed).context("reading `operators bootstrap --json`")?;
    printed["token"].as_str().map(str::to_owned).context("`operators bootstrap --json` printed no token")
}

/// One of the console's reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// `GET /console/dead-letters`: the oldest open dead letters.
    FirstPage,
    /// The page the first page's "Next page" link leads to (`?after=` its last entry).
    LaterPage,
    /// `POST /console/search` with one of the keys, which names one payment: a 303 to its page.
    Search,
    /// `GET /console/payments/{id}` of one of the dead-lettered payments: its facts, timeline,
    /// dead letters and proposals, and the audit row of the read.
    Payment,
}

impl Read {
    /// Every read, in the order measured.
    pub const ALL: [Self; 4] = [Self::FirstPage, Self::LaterPage, Self::Search, Self::Payment];

    /// The status a successful read responds with.
    pub fn expected(self) -> u16 {
        match self {
            Self::Search => 303,
            Self::FirstPage | Self::LaterPage | Self::Payment => 200,
        }
    }

    /// How the report names it.
    pub fn name(self) -> &'static str {
        match self {
            Self::FirstPage | Self::LaterPage => "console dead letters",
            Self::Search => "console search",
            Self::Payment => "console payment",
        }
    }

    /// What exactly is asked, for the report.
    pub fn setup(self) -> &'static str {
        match self {
            Self::FirstPage => "first page",
            Self::LaterPage => "second page, by its cursor",
            Self::Search => "by Idempotency-Key, 303",
            Self::Payment => "a dead letter's page and timeline",
        }
    }
}

impl fmt::Display for Read {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.setup())
    }
}

/// The requests of every [`Read`] on one console, found there.
#[derive(Debug, Clone)]
pub struct Probes {
    /// `http://127.0.0.1:port` of the operations API.
    base: String,
    /// An admin's token: every tenant is visible.
    token: String,
    /// The second page's path and query.
    later_page: String,
    /// Keys of payments spread over the history.
    keys: Vec<String>,
    /// Paths of dead-lettered payments' pages, spread over the history.
    payments: Vec<String>,
}

impl Probes {
    /// Finds the requests on the console at `base` over a history of `payments`, reading each
    /// once and checking its response: the first page is full and links to a second, and the search
    /// for a dead-lettered payment's key leads to its page.
    pub async fn find(base: &str, token: &str, payments: u64) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
        let page = |path: String| {
            let request = client.get(format!("{base}{path}")).bearer_auth(token);
            async move {
                let response = request.send().await?;
                anyhow::ensure!(response.status() == 200, "GET {path} responded {}", response.status());
                Ok(response.text().await?)
            }
        };
        let first = page("/console/dead-letters".into()).await?;
        anyhow::ensure!(
            payment_links(&first) == PAGE_ROWS,
            "the first page of dead letters lists {} payments, not {PAGE_ROWS}",
            payment_links(&first)
        );
        let later_page = next_page(&first).context("the first page of dead letters has no next page")?;
        anyhow::ensure!(payment_links(&page(later_page.clone()).await?) > 0, "the second page lists no payment");
        let keys = spread(SPREAD, payments, 1).map(key).collect();
        let mut found = Vec::new();
        for i in spread(SPREAD, payments, DEAD_LETTERED_EVERY) {
            let response = search(&client, base, token, &key(i)).send().await?;
            let location = response.headers().get("location").and_then(|l| l.to_str().ok()).unwrap_or_default();
            anyhow::ensure!(
                response.status() == 303 && location.starts_with("/console/payments/"),
                "the search for {} responded {} {location:?}, not a 303 to its payment",
                key(i),
                response.status()
            );
            found.push(location.to_owned());
        }
        anyhow::ensure!(page(found[0].clone()).await?.contains("dead_lettered"), "a dead letter's page has no status");
        Ok(Self { base: base.to_owned(), token: token.to_owned(), later_page, keys, payments: found })
    }

    /// The request of `read`, the `number`-th of its window: the searches and payments go round
    /// their sets.
    fn request(&self, read: Read, client: &reqwest::Client, number: u64) -> reqwest::RequestBuilder {
        let pick = |set: &[String]| set[usize::try_from(number).unwrap_or(0) % set.len()].clone();
        match read {
            Read::FirstPage => client.get(format!("{}/console/dead-letters", self.base)).bearer_auth(&self.token),
            Read::LaterPage => client.get(format!("{}{}", self.base, self.later_page)).bearer_auth(&self.token),
            Read::Search => search(client, &self.base, &self.token, &pick(&self.keys)),
            Read::Payment => client.get(format!("{}{}", self.base, pick(&self.payments))).bearer_auth(&self.token),
        }
    }
}

/// Runs one closed loop of `read` (one connection) and returns what it measured.
pub async fn closed_loop(probes: &Probes, read: Read, timing: Timing) -> anyhow::Result<Window> {
    let probes = probes.clone();
    crate::closed_loop::run(1, timing, move |client, number| probes.request(read, client, number)).await
}

/// The search for `q`, as the console's form posts it.
fn search(client: &reqwest::Client, base: &str, token: &str, q: &str) -> reqwest::RequestBuilder {
    client.post(format!("{base}/console/search")).bearer_auth(token).form(&[("q", q)])
}

/// `count` payment numbers spread evenly over `payments`, each a multiple of `every` (fewer when
/// there are not that many multiples).
fn spread(count: u64, payments: u64, every: u64) -> impl Iterator<Item = u64> {
    let multiples = payments.div_ceil(every);
    let count = count.clamp(1, multiples.max(1));
    (0..count).map(move |n| n * (multiples / count) * every)
}

/// How many payments a page links to.
fn payment_links(html: &str) -> usize {
    html.matches("href=\"/console/payments/").count()
}

/// The path and query of the page's "Next page" link (`rel="next"`), unescaped.
fn next_page(html: &str) -> Option<String> {
    let before = &html[..html.find("rel=\"next\"")?];
    let start = before.rfind("href=\"")? + "href=\"".len();
    let href = &before[start..before[start..].find('"')? + start];
    Some(href.replace("&#38;", "&").replace("&amp;", "&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_is_read_from_its_link_and_unescaped() {
        let html = r#"<table><a href="/console/payments/x">x</a></table>
            <p><a href="/console/dead-letters?kind=&#38;tenant=&#38;state=open&#38;after=1700000000000000.51" rel="next">Next page</a></p>"#;

        assert_eq!(
            next_page(html).as_deref(),
            Some("/console/dead-letters?kind=&tenant=&state=open&after=1700000000000000.51")
        );
        assert_eq!(next_page("<p>No dead letter matches.</p>"), None);
        assert_eq!(payment_links(html), 1);
    }

    #[test]
    fn spread_payments_cover_the_history_and_keep_to_the_multiples_asked_for() {
        let all: Vec<u64> = spread(1_000, 1_000_000, 1).collect();
        let dead: Vec<u64> = spread(1_000, 1_000_000, 10).collect();
        let few: Vec<u64> = spread(1_000, 1_000, 10).collect();

        assert_eq!((all.len(), all[1], all[999]), (1_000, 1_000, 999_000));
        assert_eq!((dead.len(), dead[1], dead[999]), (1_000, 1_000, 999_000));
        assert_eq!((few.len(), few[1], few[99]), (100, 10, 990), "every dead-lettered payment of a short history");
        assert!(spread(1_000, 12_345, 10).all(|i| i % 10 == 0 && i < 12_345));
    }

    #[test]
    fn the_token_is_read_from_the_bootstrap_output() {
        let printed = r#"{"operator": {"name": "bench"}, "token": "oot_abc"}"#;

        assert_eq!(bootstrapped_token(printed).unwrap(), "oot_abc");
        assert!(bootstrapped_token("{}").is_err());
    }
}
