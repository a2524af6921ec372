//! [`StripeProvider`]: oncepay's payments as Stripe PaymentIntents, over reqwest.
//!
//! Each payment is one PaymentIntent, created and confirmed in one call (`confirm=true`,
//! `off_session=true`, card only, so nothing waits on a customer or a redirect), under the payment's
//! downstream key as Stripe's `Idempotency-Key`. Every resend sends the same form, byte for byte,
//! with the same pinned `Stripe-Version`, so Stripe replays the first response instead of seeing a
//! reused key. Lookups never say "none" without a consistent source ([`super::lookup`]).
//! Hand-written rather than a generated SDK: the classification depends on the exact status codes
//! and error types, which an SDK turns into its own exceptions and retries.

use reqwest::header::CONTENT_TYPE;
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use tracing::instrument;

use oncepay_domain::ids::{DownstreamKey, PaymentId};

use crate::http::{self, read_json, retry_after, trace_headers};
use crate::{
    Charge, ChargePage, ChargeRequest, ListCharges, LookupError, NotSentReason, PaymentProvider, SendOutcome,
    UncertainReason, metadata_keys,
};

use super::classify;
use super::lookup::{self, CantTell, Lookup, Step, WindowScan};
use super::wire::{ListPage, PaymentIntent, SearchPage, Settled};

/// How to reach Stripe, as whom, and how long to wait.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct StripeSettings {
    /// The secret API key, `sk_live_…` or `sk_test_…` (a restricted `rk_…` key works if it may
    /// write PaymentIntents).
    pub secret_key: SecretString,
    /// Stripe's API, or a stand-in for tests.
    #[serde(default = "defaults::base_url")]
    pub base_url: String,
    /// The pinned API version, sent as `Stripe-Version` on every call, so the account's default
    /// version cannot change the shapes oncepay reads, or the parameters a resend is compared with.
    pub api_version: String,
    /// The payment method (`pm_…`) used when a payment names none.
    #[serde(default)]
    pub default_payment_method: Option<String>,
    /// How long to wait for a connection.
    #[serde(default = "defaults::connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// How long to wait for a whole response. A confirmation talks to the card network, so this is
    /// longer than for the simulator; a timeout makes the payment uncertain.
    #[serde(default = "defaults::request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Intents per page of a list call (Stripe allows 1 to 100).
    #[serde(default = "defaults::list_page_size")]
    pub list_page_size: u32,
    /// The most list pages one lookup reads before it gives up with "can't tell".
    #[serde(default = "defaults::max_lookup_pages")]
    pub max_lookup_pages: u32,
    /// How far Stripe's clock may be behind ours: a lookup lists intents from this long before the
    /// payment was created.
    #[serde(default = "defaults::clock_skew_secs")]
    pub clock_skew_secs: i64,
}

mod defaults {
    pub fn base_url() -> String {
        "https://api.stripe.com".to_owned()
    }
    pub const fn connect_timeout_ms() -> u64 {
        2_000
    }
    pub const fn request_timeout_ms() -> u64 {
        30_000
    }
    pub const fn list_page_size() -> u32 {
        100
    }
    pub const fn max_lookup_pages() -> u32 {
        20
    }
    pub const fn clock_skew_secs() -> i64 {
        10 * 60
    }
}

/// Settings that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// No API version: the account's default would apply and could change under oncepay.
    #[error("stripe.api_version must name a Stripe API version, e.g. \"2024-06-20\"")]
    NoApiVersion,
    /// A page size Stripe refuses.
    #[error("stripe.list_page_size must be between 1 and 100, not {0}")]
    PageSize(u32),
    /// A lookup that can read nothing.
    #[error("stripe.max_lookup_pages must be at least 1")]
    NoLookupPages,
    /// A negative clock skew.
    #[error("stripe.clock_skew_secs must not be negative")]
    NegativeSkew,
}

impl StripeSettings {
    /// Rejects settings that cannot work.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.api_version.trim().is_empty() {
            return Err(SettingsError::NoApiVersion);
        }
        if !(1..=100).contains(&self.list_page_size) {
            return Err(SettingsError::PageSize(self.list_page_size));
        }
        if self.max_lookup_pages == 0 {
            return Err(SettingsError::NoLookupPages);
        }
        if self.clock_skew_secs < 0 {
            return Err(SettingsError::NegativeSkew);
        }
        Ok(())
    }
}

/// Why the Stripe client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The settings cannot work.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// The HTTP client could not be built.
    #[error("the HTTP client could not be built: {0}")]
    Client(#[from] reqwest::Error),
}

/// Stripe, behind [`PaymentProvider`]. Cheap to clone: clones share one connection pool.
#[derive(Debug, Clone)]
pub struct StripeProvider {
    client: reqwest::Client,
    base_url: String,
    secret_key: SecretString,
    api_version: String,
    default_payment_method: Option<String>,
    list_page_size: u32,
    max_lookup_pages: u32,
    clock_skew_secs: i64,
}

/// The form of `POST /v1/payment_intents` for `request`, paid with `payment_method`.
///
/// A function of its inputs alone, in a fixed order, so every resend of a payment sends the same
/// parameters: Stripe compares them with the first request's and refuses a difference.
pub fn create_form(request: &ChargeRequest, payment_method: &str) -> Vec<(String, String)> {
    let mut form: Vec<(String, String)> = vec![
        ("amount".into(), request.amount.minor_units().to_string()),
        // Stripe wants ISO codes in lower case.
        ("currency".into(), request.currency.as_str().to_ascii_lowercase()),
        ("confirm".into(), "true".into()),
        // The customer is not there to authenticate: a card that needs it is declined, not left
        // waiting in `requires_action`.
        ("off_session".into(), "true".into()),
        ("payment_method".into(), payment_method.to_owned()),
        // Cards only, so no payment method can ask for a redirect.
        ("payment_method_types[]".into(), "card".into()),
    ];
    // Only a Stripe Customer id is a `customer`; any other reference stays in oncepay.
    if request.customer.starts_with("cus_") {
        form.push(("customer".into(), request.customer.clone()));
    }
    form.extend(request.metadata.iter().map(|(key, value)| (format!("metadata[{key}]"), value.clone())));
    form
}

/// The search query that finds a payment's intents by oncepay's metadata.
pub fn search_query(payment: PaymentId) -> String {
    // A payment id is a UUID: no quote to escape.
    format!("metadata['{}']:'{payment}'", metadata_keys::PAYMENT_ID)
}

/// When `payment` was created, Unix seconds, read from its time-ordered (v7) id.
fn created_at(payment: PaymentId) -> Option<i64> {
    let (secs, _) = payment.as_uuid().get_timestamp()?.to_unix();
    i64::try_from(secs).ok()
}

/// The most pages `list_charges` skips for holding only unfinished intents before it gives up.
const MAX_SKIPPED_PAGES: u32 = 100;

impl StripeProvider {
    /// Builds the client.
    pub fn new(settings: &StripeSettings) -> Result<Self, BuildError> {
        settings.validate()?;
        Ok(Self {
            client: http::client(settings.connect_timeout_ms, settings.request_timeout_ms)?,
            base_url: settings.base_url.trim_end_matches('/').to_owned(),
            secret_key: settings.secret_key.clone(),
            api_version: settings.api_version.clone(),
            default_payment_method: settings.default_payment_method.clone(),
            list_page_size: settings.list_page_size,
            max_lookup_pages: settings.max_lookup_pages,
            clock_skew_secs: settings.clock_skew_secs,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    async fn get<T: DeserializeOwned>(&self, path: &str, query: &[(&str, String)]) -> Result<T, LookupError> {
        let request = self
            .client
            .get(self.url(path))
            .bearer_auth(self.secret_key.expose_secret())
            .header("Stripe-Version", &self.api_version)
            .headers(trace_headers())
            .query(query);
        read_json(request).await
    }

    /// What Stripe's search shows for `payment`: a hit is found, a miss is "can't tell".
    #[instrument(name = "stripe.search", skip_all, fields(payment.id = %payment))]
    pub async fn search(&self, payment: PaymentId) -> Lookup {
        let query = [("query", search_query(payment)), ("limit", "100".to_owned())];
        match self.get::<SearchPage<PaymentIntent>>("/v1/payment_intents/search", &query).await {
            Ok(page) => lookup::from_search(&page, payment),
            Err(error) => Lookup::CantTell(CantTell::SearchFailed(error)),
        }
    }

    /// What the consistent list shows for `payment`, reading every intent created since
    /// `created_gte` (Unix seconds). Only a list read to its end says "certainly none".
    #[instrument(name = "stripe.list_window", skip_all, fields(payment.id = %payment))]
    pub async fn list_window(&self, payment: PaymentId, created_gte: i64) -> Lookup {
        let mut scan = WindowScan::new(payment, self.max_lookup_pages);
        let mut starting_after: Option<String> = None;
        loop {
            let mut query = vec![("created[gte]", created_gte.to_string()), ("limit", self.list_page_size.to_string())];
            if let Some(after) = &starting_after {
                query.push(("starting_after", after.clone()));
            }
            match self.get::<ListPage<PaymentIntent>>("/v1/payment_intents", &query).await {
                Err(error) => return scan.failed(error),
                Ok(page) => match scan.page(page) {
                    Step::Next(after) => starting_after = Some(after),
                    Step::Done(lookup) => return lookup,
                },
            }
        }
    }

    /// Every intent Stripe holds for `payment`, from search first, else from the list of the window
    /// since the payment was created.
    pub async fn lookup(&self, payment: PaymentId) -> Lookup {
        match self.search(payment).await {
            found @ Lookup::Found(_) => found,
            // A miss, an error or an intent seen mid-way: search may be behind, the list is not.
            _ => match created_at(payment) {
                Some(created) => self.list_window(payment, created.saturating_sub(self.clock_skew_secs)).await,
                None => Lookup::CantTell(CantTell::NoWindow),
            },
        }
    }

    /// One page of the intents created in a window, newest first, as Stripe lists them.
    #[instrument(name = "stripe.list_payment_intents", skip_all)]
    pub async fn list_payment_intents(&self, query: &ListCharges) -> Result<ListPage<PaymentIntent>, LookupError> {
        let mut params = vec![
            ("created[gte]", query.created_gte.to_string()),
            ("created[lt]", query.created_lt.to_string()),
            ("limit", query.limit.clamp(1, 100).to_string()),
        ];
        if let Some(after) = &query.starting_after {
            params.push(("starting_after", after.clone()));
        }
        self.get("/v1/payment_intents", &params).await
    }
}

impl PaymentProvider for StripeProvider {
    #[instrument(name = "provider.create_charge", skip_all, fields(provider.outcome))]
    async fn create_charge(&self, request: &ChargeRequest) -> SendOutcome {
        let Some(payment_method) = request.payment_method.as_deref().or(self.default_payment_method.as_deref()) else {
            tracing::error!("The payment names no payment method and stripe.default_payment_method is not set.");
            return SendOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None };
        };
        let Ok(form) = serde_urlencoded::to_string(create_form(request, payment_method)) else {
            return SendOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None };
        };
        let sent = self
            .client
            .post(self.url("/v1/payment_intents"))
            .bearer_auth(self.secret_key.expose_secret())
            .header("Idempotency-Key", request.downstream_key.as_str())
            .header("Stripe-Version", &self.api_version)
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .headers(trace_headers())
            .body(form)
            .send()
            .await;
        let key = request.downstream_key.as_str();
        let outcome = match sent {
            Err(error) => SendOutcome::from_transport_error(&error),
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_after = retry_after(response.headers());
                match response.bytes().await {
                    Ok(body) => classify::create_outcome(status, retry_after, &body, key),
                    // The status line arrived and the body broke off: the request was certainly sent.
                    Err(_) if status < 300 => SendOutcome::Uncertain(UncertainReason::ConnectionLost),
                    Err(_) => classify::create_outcome(status, retry_after, b"", key),
                }
            }
        };
        tracing::Span::current().record("provider.outcome", outcome.class());
        outcome
    }

    /// Never `Ok` with no charges unless the consistent list proved there are none.
    #[instrument(name = "provider.find_by_key", skip_all)]
    async fn find_by_key(&self, key: &DownstreamKey) -> Result<Vec<Charge>, LookupError> {
        let Some(payment) = key.payment_id() else {
            return Err(LookupError::Inconclusive("the key is not one oncepay derives from a payment".to_owned()));
        };
        match self.lookup(payment).await {
            Lookup::Found(charges) => Ok(charges),
            Lookup::CertainlyNone => Ok(Vec::new()),
            Lookup::CantTell(why) => Err(LookupError::Inconclusive(why.to_string())),
        }
    }

    /// The final intents of a window as charges. An intent that has not finished is no charge yet and
    /// is left out; pages that hold nothing else are read past, so an empty page always means the
    /// window is done. Newest first, as Stripe lists them: `starting_after` the last charge of a page
    /// still gives the next one.
    #[instrument(name = "provider.list_charges", skip_all)]
    async fn list_charges(&self, query: &ListCharges) -> Result<ChargePage, LookupError> {
        let mut query = query.clone();
        for _ in 0..MAX_SKIPPED_PAGES {
            let page = self.list_payment_intents(&query).await?;
            let last = page.data.last().map(|i| i.id.clone());
            let data: Vec<Charge> = page
                .data
                .iter()
                .filter_map(|intent| match intent.settled_by_metadata() {
                    Settled::Final(charge) => Some(*charge),
                    Settled::NotFinal(_) => None,
                })
                .collect();
            match last {
                Some(after) if data.is_empty() && page.has_more => query.starting_after = Some(after),
                // No cursor to go on from, yet more to come: returning it would end the window early.
                None if page.has_more => {
                    return Err(LookupError::Unreadable("an empty page of intents said more would follow".to_owned()));
                }
                _ => return Ok(ChargePage { data, has_more: page.has_more }),
            }
        }
        Err(LookupError::Inconclusive(format!(
            "more than {MAX_SKIPPED_PAGES} pages in a row hold only unfinished intents"
        )))
    }
}

/// Contract tests: Stripe's responses as its documentation shapes them, served by wiremock.
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{Value, json};
    use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
    use wiremock::{Mock, MockServer, Request, ResponseTemplate};

    use oncepay_domain::ids::TenantId;
    use oncepay_domain::money::{Amount, Currency};

    use super::*;
    use crate::ChargeStatus;
    use crate::stripe::wire::samples::{declined_intent, error, intent};

    const VERSION: &str = "2024-06-20";

    fn settings(base_url: String) -> StripeSettings {
        StripeSettings {
            secret_key: SecretString::from("sk_test_oncepay"),
            base_url,
            api_version: VERSION.to_owned(),
            default_payment_method: None,
            connect_timeout_ms: 2_000,
            request_timeout_ms: 2_000,
            list_page_size: 2,
            max_lookup_pages: 5,
            clock_skew_secs: 600,
        }
    }

    async fn stripe() -> (MockServer, StripeProvider) {
        let server = MockServer::start().await;
        let provider = StripeProvider::new(&settings(server.uri())).unwrap();
        (server, provider)
    }

    fn request(payment: PaymentId) -> ChargeRequest {
        let merchant: BTreeMap<String, String> = [("order".to_owned(), "A-17".to_owned())].into();
        ChargeRequest::for_payment(
            TenantId::generate(),
            payment,
            Amount::new(1999).unwrap(),
            Currency::parse("EUR").unwrap(),
            "cus_Q1".into(),
            &merchant,
            Some("pm_card_visa".to_owned()),
        )
    }

    async fn respond_to_create(server: &MockServer, status: u16, body: Value) {
        Mock::given(method("POST"))
            .and(path("/v1/payment_intents"))
            .respond_with(ResponseTemplate::new(status).set_body_json(body))
            .mount(server)
            .await;
    }

    fn form_of(request: &Request) -> BTreeMap<String, String> {
        serde_urlencoded::from_bytes::<Vec<(String, String)>>(&request.body).unwrap().into_iter().collect()
    }

    #[tokio::test]
    async fn a_payment_is_created_and_confirmed_off_session_in_one_form_encoded_call() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate();
        let request = request(payment);
        respond_to_create(&server, 200, intent("pi_1", "succeeded", &payment.to_string())).await;

        let outcome = provider.create_charge(&request).await;

        let received = server.received_requests().await.unwrap();
        assert_eq!(received.len(), 1);
        let sent = &received[0];
        let header_of = |name: &str| sent.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        assert_eq!(header_of("content-type").as_deref(), Some("application/x-www-form-urlencoded"));
        assert_eq!(header_of("idempotency-key").as_deref(), Some(request.downstream_key.as_str()));
        assert_eq!(header_of("stripe-version").as_deref(), Some(VERSION));
        assert_eq!(header_of("authorization").as_deref(), Some("Bearer sk_test_oncepay"));
        let form = form_of(sent);
        let field = |name: &str| form.get(name).map(String::as_str);
        assert_eq!(field("amount"), Some("1999"));
        assert_eq!(field("currency"), Some("eur"));
        assert_eq!(field("confirm"), Some("true"));
        assert_eq!(field("off_session"), Some("true"));
        assert_eq!(field("payment_method"), Some("pm_card_visa"));
        assert_eq!(field("payment_method_types[]"), Some("card"));
        assert_eq!(field("customer"), Some("cus_Q1"));
        assert_eq!(field("metadata[order]"), Some("A-17"));
        assert_eq!(field("metadata[oncepay_payment_id]").map(str::to_owned), Some(payment.to_string()));
        assert!(field("metadata[oncepay_tenant_id]").is_some());
        let SendOutcome::Charged(charge) = outcome else { panic!("{outcome:?}") };
        assert_eq!((charge.id.as_str(), charge.amount, charge.currency.as_str()), ("pi_1", 1999, "EUR"));
        assert_eq!(charge.idempotency_key, request.downstream_key.as_str());
    }

    #[tokio::test]
    async fn an_intent_still_processing_is_uncertain() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate();
        respond_to_create(&server, 200, intent("pi_1", "processing", &payment.to_string())).await;

        let outcome = provider.create_charge(&request(payment)).await;

        assert_eq!(outcome, SendOutcome::Uncertain(UncertainReason::NotFinal));
    }

    #[tokio::test]
    async fn an_intent_waiting_for_the_customer_is_uncertain() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate();
        let mut body = intent("pi_1", "requires_action", &payment.to_string());
        body["next_action"] = json!({"type": "use_stripe_sdk", "use_stripe_sdk": {}});
        respond_to_create(&server, 200, body).await;

        let outcome = provider.create_charge(&request(payment)).await;

        assert_eq!(outcome, SendOutcome::Uncertain(UncertainReason::NotFinal));
    }

    #[tokio::test]
    async fn a_card_declined_by_the_issuer_is_declined_with_its_reason_and_intent() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate();
        let mut body = error("card_error", Some("card_declined"), "Your card has insufficient funds.");
        body["error"]["decline_code"] = json!("insufficient_funds");
        body["error"]["charge"] = json!("ch_3Q");
        body["error"]["payment_intent"] = declined_intent("pi_7", &payment.to_string());
        respond_to_create(&server, 402, body).await;

        let outcome = provider.create_charge(&request(payment)).await;

        assert_eq!(
            outcome,
            SendOutcome::Declined {
                code: "insufficient_funds".into(),
                message: "Your card has insufficient funds.".into(),
                charge_id: Some("pi_7".into()),
            }
        );
    }

    #[tokio::test]
    async fn a_key_reused_with_other_parameters_is_uncertain() {
        let (server, provider) = stripe().await;
        let body = error(
            "idempotency_error",
            None,
            "Keys for idempotent requests can only be used with the same parameters they were first used with. \
             Try using a key other than 'oncepay-…' if you meant to execute a different request.",
        );
        respond_to_create(&server, 400, body).await;

        let outcome = provider.create_charge(&request(PaymentId::generate())).await;

        assert_eq!(outcome, SendOutcome::Uncertain(UncertainReason::KeyReused));
    }

    #[tokio::test]
    async fn an_invalid_request_is_declined_as_rejected() {
        let (server, provider) = stripe().await;
        let mut body = error("invalid_request_error", Some("resource_missing"), "No such PaymentMethod: 'pm_gone'");
        body["error"]["param"] = json!("payment_method");
        respond_to_create(&server, 400, body).await;

        let outcome = provider.create_charge(&request(PaymentId::generate())).await;

        assert_eq!(
            outcome,
            SendOutcome::Declined {
                code: "provider_rejected".into(),
                message: "No such PaymentMethod: 'pm_gone' (resource_missing)".into(),
                charge_id: None,
            }
        );
    }

    #[tokio::test]
    async fn a_500_replayed_for_a_resend_with_the_same_key_stays_uncertain() {
        let (server, provider) = stripe().await;
        let request = request(PaymentId::generate());
        Mock::given(method("POST"))
            .and(path("/v1/payment_intents"))
            .and(header("Idempotency-Key", request.downstream_key.as_str()))
            .respond_with(ResponseTemplate::new(500).insert_header("Idempotent-Replayed", "true").set_body_json(error(
                "api_error",
                None,
                "An unknown error occurred",
            )))
            .expect(2)
            .mount(&server)
            .await;

        let first = provider.create_charge(&request).await;
        let resend = provider.create_charge(&request).await;

        assert_eq!(first, SendOutcome::Uncertain(UncertainReason::ServerError(500)));
        assert_eq!(resend, SendOutcome::Uncertain(UncertainReason::ServerError(500)));
        let received = server.received_requests().await.unwrap();
        assert_eq!(received[0].body, received[1].body, "a resend must send the very same parameters");
    }

    #[tokio::test]
    async fn a_response_that_names_a_member_twice_is_uncertain_whatever_its_status() {
        let payment = PaymentId::generate();
        let ours = format!(r#""oncepay_payment_id":"{payment}""#);
        let two_payments = format!(r#"{ours},"oncepay_payment_id":"{}""#, PaymentId::generate());
        let mut declined = error("card_error", Some("card_declined"), "Your card was declined.");
        declined["error"]["payment_intent"] = declined_intent("pi_7", &payment.to_string());
        let cases = [
            (200, intent("pi_1", "succeeded", &payment.to_string()).to_string().replace(&ours, &two_payments)),
            (402, declined.to_string().replace(&ours, &two_payments)),
            (429, r#"{"error":{"type":"invalid_request_error","code":"rate_limit","code":"lock_timeout"}}"#.to_owned()),
        ];
        for (status, body) in cases {
            let (server, provider) = stripe().await;
            Mock::given(method("POST"))
                .and(path("/v1/payment_intents"))
                .respond_with(ResponseTemplate::new(status).set_body_raw(body.clone(), "application/json"))
                .mount(&server)
                .await;

            let outcome = provider.create_charge(&request(payment)).await;

            assert_eq!(outcome, SendOutcome::Uncertain(UncertainReason::UnreadableResponse), "HTTP {status}: {body}");
        }
    }

    #[tokio::test]
    async fn a_key_still_in_flight_is_uncertain() {
        let (server, provider) = stripe().await;
        let body = error(
            "idempotency_error",
            Some("idempotency_key_in_use"),
            "There is currently another in-progress request using this Idempotent Key.",
        );
        respond_to_create(&server, 409, body).await;

        let outcome = provider.create_charge(&request(PaymentId::generate())).await;

        assert_eq!(outcome, SendOutcome::Uncertain(UncertainReason::KeyInFlight));
    }

    #[tokio::test]
    async fn a_rate_limited_request_is_not_sent_and_keeps_the_retry_after() {
        let (server, provider) = stripe().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", "3").set_body_json(error(
                "invalid_request_error",
                Some("rate_limit"),
                "Too many requests hit the API too quickly.",
            )))
            .mount(&server)
            .await;

        let outcome = provider.create_charge(&request(PaymentId::generate())).await;

        assert_eq!(
            outcome,
            SendOutcome::NotSent {
                reason: NotSentReason::RateLimited,
                retry_after: Some(std::time::Duration::from_secs(3))
            }
        );
    }

    #[tokio::test]
    async fn a_refused_key_is_not_sent() {
        let (server, provider) = stripe().await;
        respond_to_create(&server, 401, error("invalid_request_error", None, "Invalid API Key provided: sk_test_****"))
            .await;

        let outcome = provider.create_charge(&request(PaymentId::generate())).await;

        assert_eq!(outcome, SendOutcome::NotSent { reason: NotSentReason::Unauthorized(401), retry_after: None });
    }

    #[tokio::test]
    async fn without_any_payment_method_nothing_is_sent() {
        let (server, provider) = stripe().await;
        let request = ChargeRequest { payment_method: None, ..request(PaymentId::generate()) };

        let outcome = provider.create_charge(&request).await;

        assert_eq!(outcome, SendOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None });
        assert!(server.received_requests().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_configured_payment_method_stands_in_only_for_a_missing_one() {
        let server = MockServer::start().await;
        let provider = StripeProvider::new(&StripeSettings {
            default_payment_method: Some("pm_default".into()),
            ..settings(server.uri())
        })
        .unwrap();
        let payment = PaymentId::generate();
        respond_to_create(&server, 200, intent("pi_1", "succeeded", &payment.to_string())).await;
        let without = ChargeRequest { payment_method: None, customer: "merchant-ref-9".into(), ..request(payment) };

        provider.create_charge(&without).await;
        provider.create_charge(&request(payment)).await;

        let received = server.received_requests().await.unwrap();
        let (first, second) = (form_of(&received[0]), form_of(&received[1]));
        assert_eq!(first.get("payment_method").map(String::as_str), Some("pm_default"));
        assert_eq!(first.get("customer"), None, "only a Stripe Customer id is sent as `customer`");
        assert_eq!(second.get("payment_method").map(String::as_str), Some("pm_card_visa"));
    }

    // Lookups.

    async fn search_returns(server: &MockServer, payment: PaymentId, data: Vec<Value>) {
        Mock::given(method("GET"))
            .and(path("/v1/payment_intents/search"))
            .and(query_param("query", search_query(payment)))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "object": "search_result", "url": "/v1/payment_intents/search",
                "has_more": false, "next_page": null, "data": data
            })))
            .mount(server)
            .await;
    }

    fn list(data: Vec<Value>, has_more: bool) -> ResponseTemplate {
        ResponseTemplate::new(200)
            .set_body_json(json!({"object": "list", "url": "/v1/payment_intents", "has_more": has_more, "data": data}))
    }

    /// The window a lookup of `payment` lists: from its creation, less the clock skew.
    fn window_start(payment: PaymentId) -> String {
        (created_at(payment).unwrap() - 600).to_string()
    }

    #[tokio::test]
    async fn a_search_hit_is_found() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate();
        search_returns(&server, payment, vec![intent("pi_1", "succeeded", &payment.to_string())]).await;

        let charges = provider.find_by_key(&payment.downstream_key()).await.unwrap();

        assert_eq!(charges.len(), 1);
        assert_eq!((charges[0].id.as_str(), charges[0].status), ("pi_1", ChargeStatus::Succeeded));
        assert_eq!(charges[0].idempotency_key, payment.downstream_key().as_str());
    }

    #[tokio::test]
    async fn an_empty_search_proves_nothing() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate();
        search_returns(&server, payment, vec![]).await;

        let lookup = provider.search(payment).await;

        assert!(matches!(lookup, Lookup::CantTell(CantTell::SearchMissed)), "{lookup:?}");
    }

    #[tokio::test]
    async fn an_intent_search_has_not_indexed_yet_is_found_by_the_list() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate();
        let other = PaymentId::generate().to_string();
        search_returns(&server, payment, vec![]).await;
        Mock::given(method("GET"))
            .and(path("/v1/payment_intents"))
            .and(query_param("created[gte]", window_start(payment)))
            .and(query_param_is_missing("starting_after"))
            .respond_with(list(vec![intent("pi_9", "succeeded", &other), intent("pi_8", "succeeded", &other)], true))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/payment_intents"))
            .and(query_param("starting_after", "pi_8"))
            .respond_with(list(vec![intent("pi_1", "succeeded", &payment.to_string())], false))
            .mount(&server)
            .await;

        let charges = provider.find_by_key(&payment.downstream_key()).await.unwrap();

        assert_eq!(charges.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["pi_1"]);
    }

    #[tokio::test]
    async fn a_whole_window_without_the_payment_is_certainly_none() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate();
        let other = PaymentId::generate().to_string();
        search_returns(&server, payment, vec![]).await;
        Mock::given(method("GET"))
            .and(path("/v1/payment_intents"))
            .and(query_param("created[gte]", window_start(payment)))
            .and(query_param_is_missing("starting_after"))
            .respond_with(list(vec![intent("pi_9", "succeeded", &other), intent("pi_8", "canceled", &other)], true))
            .expect(2)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/payment_intents"))
            .and(query_param("starting_after", "pi_8"))
            .respond_with(list(vec![], false))
            .expect(2)
            .mount(&server)
            .await;

        // Asked twice: as the three-way lookup, and through the trait.
        let lookup = provider.lookup(payment).await;
        let by_key = provider.find_by_key(&payment.downstream_key()).await;

        assert!(matches!(lookup, Lookup::CertainlyNone), "{lookup:?}");
        assert!(matches!(by_key, Ok(ref charges) if charges.is_empty()), "{by_key:?}");
    }

    #[tokio::test]
    async fn a_list_that_fails_midway_proves_nothing() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate();
        let other = PaymentId::generate().to_string();
        search_returns(&server, payment, vec![]).await;
        Mock::given(method("GET"))
            .and(path("/v1/payment_intents"))
            .and(query_param_is_missing("starting_after"))
            .respond_with(list(vec![intent("pi_9", "succeeded", &other), intent("pi_8", "succeeded", &other)], true))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/payment_intents"))
            .and(query_param("starting_after", "pi_8"))
            .respond_with(ResponseTemplate::new(500).set_body_json(error("api_error", None, "oops")))
            .mount(&server)
            .await;

        let lookup = provider.lookup(payment).await;
        let by_key = provider.find_by_key(&payment.downstream_key()).await;

        assert!(matches!(lookup, Lookup::CantTell(CantTell::ListFailed(LookupError::Status(500)))), "{lookup:?}");
        assert!(matches!(by_key, Err(LookupError::Inconclusive(_))), "{by_key:?}");
    }

    #[tokio::test]
    async fn a_lookup_whose_body_names_a_member_twice_proves_nothing() {
        let payment = PaymentId::generate();
        let ours = format!(r#""oncepay_payment_id":"{payment}""#);
        let other = format!(r#""oncepay_payment_id":"{}""#, PaymentId::generate());
        // An intent whose metadata names this payment and another one.
        let naming_both = |first: &str, last: &str| {
            intent("pi_1", "succeeded", &payment.to_string()).to_string().replace(&ours, &format!("{first},{last}"))
        };
        let page =
            |data: &str| format!(r#"{{"object":"list","url":"/v1/payment_intents","data":[{data}],"has_more":false}}"#);
        let search = |data: &str| format!(r#"{{"object":"search_result","has_more":false,"data":[{data}]}}"#);
        let cases = [
            // Last-wins found this payment's charge in an intent that names another payment first.
            (search(&naming_both(&other, &ours)), page(&naming_both(&other, &ours))),
            // Last-wins saw a window without this payment's intent, so concluded that there is none:
            // the answer that allows a resend.
            (search(""), page(&naming_both(&ours, &other))),
        ];
        for (search, list) in cases {
            let (server, provider) = stripe().await;
            Mock::given(method("GET"))
                .and(path("/v1/payment_intents/search"))
                .respond_with(ResponseTemplate::new(200).set_body_raw(search.clone(), "application/json"))
                .mount(&server)
                .await;
            Mock::given(method("GET"))
                .and(path("/v1/payment_intents"))
                .respond_with(ResponseTemplate::new(200).set_body_raw(list.clone(), "application/json"))
                .mount(&server)
                .await;

            let lookup = provider.lookup(payment).await;
            let by_key = provider.find_by_key(&payment.downstream_key()).await;
            let nightly = provider
                .list_charges(&ListCharges { created_gte: 0, created_lt: 1, starting_after: None, limit: 10 })
                .await;

            assert!(
                matches!(lookup, Lookup::CantTell(CantTell::ListFailed(LookupError::Unreadable(_)))),
                "{search} / {list}: {lookup:?}"
            );
            assert!(matches!(by_key, Err(LookupError::Inconclusive(_))), "{search} / {list}: {by_key:?}");
            assert!(matches!(nightly, Err(LookupError::Unreadable(_))), "{list}: {nightly:?}");
        }
    }

    #[tokio::test]
    async fn an_intent_still_processing_in_the_list_proves_nothing() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate();
        search_returns(&server, payment, vec![]).await;
        Mock::given(method("GET"))
            .and(path("/v1/payment_intents"))
            .respond_with(list(vec![intent("pi_1", "processing", &payment.to_string())], false))
            .mount(&server)
            .await;

        let by_key = provider.find_by_key(&payment.downstream_key()).await;

        assert!(matches!(by_key, Err(LookupError::Inconclusive(ref why)) if why.contains("pi_1")), "{by_key:?}");
    }

    #[tokio::test]
    async fn the_nightly_list_reads_past_pages_of_unfinished_intents_only() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate().to_string();
        Mock::given(method("GET"))
            .and(path("/v1/payment_intents"))
            .and(query_param("created[gte]", "100"))
            .and(query_param("created[lt]", "200"))
            .and(query_param("limit", "2"))
            .and(query_param_is_missing("starting_after"))
            .respond_with(list(
                vec![intent("pi_6", "processing", &payment), intent("pi_5", "requires_action", &payment)],
                true,
            ))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/payment_intents"))
            .and(query_param("starting_after", "pi_5"))
            .respond_with(list(
                vec![intent("pi_4", "succeeded", &payment), intent("pi_3", "processing", &payment)],
                true,
            ))
            .mount(&server)
            .await;
        let query = ListCharges { created_gte: 100, created_lt: 200, starting_after: None, limit: 2 };

        let page = provider.list_charges(&query).await.unwrap();

        assert_eq!(page.data.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["pi_4"]);
        assert!(page.has_more);
    }
}
