//! [`StripeProvider`]: oncepay's payments as Stripe PaymentIntents, over reqwest.
//!
//! Each payment is one PaymentIntent, created and confirmed in one call (`confirm=true`,
//! `off_session=true`, card only, so nothing waits on a customer or a redirect), under the payment's
//! downstream key as Stripe's `Idempotency-Key`. Every resend sends the same form, byte for byte,
//! with the same pinned `Stripe-Version`, so Stripe replays the first response instead of seeing a
//! reused key. Lookups never say "none" without a consistent source ([`super::lookup`]).
//!
//! Each refund is one Stripe Refund of the payment's PaymentIntent (the `pi_…` oncepay books as the
//! payment's charge id), created under the refund's downstream key, and found again by the refund id
//! in its metadata, in the consistent list of the intent's refunds (never by search). The nightly
//! reconciliation lists an account's refunds by creation time, and reads one again by its id.
//!
//! Every call made for a payment charged to a connected account carries that account as
//! `Stripe-Account` (Stripe Connect), so Stripe itself limits the payment methods, customers and
//! intents it can touch to that merchant's. Stripe's objects do not name the account they live in,
//! so the client stamps each charge it returns with the account it asked in.
//! Hand-written rather than a generated SDK: the classification depends on the exact status codes
//! and error types, which an SDK turns into its own exceptions and retries.

use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use tracing::instrument;

use oncepay_domain::ids::{DownstreamKey, PaymentId};
use oncepay_domain::provider_ref::ProviderAccount;

use crate::transport::{self, read_json, retry_after, trace_headers};
use crate::{
    Charge, ChargePage, ChargeRequest, ListCharges, ListRefunds, LookupError, NotSentReason, PaymentProvider, Refund,
    RefundLookup, RefundOutcome, RefundPage, RefundRequest, Retrieved, SendOutcome, UncertainReason, metadata_keys,
};

use super::classify;
use super::lookup::{self, CantTell, Lookup, RefundScan, RefundStep, Step, WindowScan};
use super::settings::{SettingsError, StripeMode, StripeSettings};
use super::wire::{ListPage, PaymentIntent, SearchPage, Settled, StripeRefund};

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
    mode: StripeMode,
    base_url: String,
    secret_key: SecretString,
    api_version: String,
    default_payment_method: Option<String>,
    list_page_size: u32,
    max_lookup_pages: u32,
    clock_skew_secs: i64,
    lookup_deadline: Duration,
}

/// The header that names the connected account a call is made in.
const STRIPE_ACCOUNT: &str = "Stripe-Account";

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
    // The merchant's `customer_id` is its own reference and stays in oncepay; a Stripe Customer is
    // only ever the one the payment names as such.
    if let Some(customer) = &request.provider_customer {
        form.push(("customer".into(), customer.as_str().to_owned()));
    }
    form.extend(request.metadata.iter().map(|(key, value)| (format!("metadata[{key}]"), value.clone())));
    form
}

/// The form of `POST /v1/refunds` for `request`.
///
/// As [`create_form`], a function of the request alone, in a fixed order, so every resend of a
/// refund sends the same parameters. Per Stripe's Refunds API ("Create a refund"): the intent to
/// refund (`payment_intent`: oncepay books a Stripe payment under its intent's id), the amount in
/// the currency's smallest unit (no `currency`: a refund is in its charge's), the `reason` only when
/// given (Stripe accepts `duplicate`, `fraudulent` and `requested_by_customer`, see
/// [`super::limits::check_refund`]), and the metadata, oncepay's keys among it.
pub fn refund_form(request: &RefundRequest) -> Vec<(String, String)> {
    let mut form: Vec<(String, String)> = vec![
        ("payment_intent".into(), request.charge_id.clone()),
        ("amount".into(), request.amount.minor_units().to_string()),
    ];
    if let Some(reason) = &request.reason {
        form.push(("reason".into(), reason.clone()));
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
            client: transport::client(settings.connect_timeout_ms, settings.request_timeout_ms)?,
            mode: settings.mode,
            base_url: settings.base_url.trim_end_matches('/').to_owned(),
            secret_key: settings.secret_key.clone(),
            api_version: settings.api_version.clone(),
            default_payment_method: settings.default_payment_method.clone(),
            list_page_size: settings.list_page_size,
            max_lookup_pages: settings.max_lookup_pages,
            clock_skew_secs: settings.clock_skew_secs,
            lookup_deadline: Duration::from_millis(settings.lookup_deadline_ms),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// A call to Stripe: authenticated, with the pinned version, the trace context and, for a
    /// connected account, `Stripe-Account`.
    fn call(&self, method: reqwest::Method, path: &str, account: Option<&ProviderAccount>) -> reqwest::RequestBuilder {
        let mut call = self
            .client
            .request(method, self.url(path))
            .bearer_auth(self.secret_key.expose_secret())
            .header("Stripe-Version", &self.api_version)
            .headers(trace_headers());
        if let Some(account) = account {
            call = call.header(STRIPE_ACCOUNT, account.as_str());
        }
        call
    }

    async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
        account: Option<&ProviderAccount>,
    ) -> Result<T, LookupError> {
        read_json(self.call(reqwest::Method::GET, path, account).query(query)).await
    }

    /// What Stripe's search in `account` shows for `payment`: a hit is found, a miss is "can't tell".
    #[instrument(name = "stripe.search", skip_all, fields(payment.id = %payment))]
    pub async fn search(&self, payment: PaymentId, account: Option<&ProviderAccount>) -> Lookup {
        let query = [("query", search_query(payment)), ("limit", "100".to_owned())];
        match self.get::<SearchPage<PaymentIntent>>("/v1/payment_intents/search", &query, account).await {
            Ok(page) => lookup::from_search(&page, payment),
            Err(error) => Lookup::CantTell(CantTell::SearchFailed(error)),
        }
    }

    /// What the consistent list of `account` shows for `payment`, reading every intent created since
    /// `created_gte` (Unix seconds). Only a list read to its end says "certainly none".
    #[instrument(name = "stripe.list_window", skip_all, fields(payment.id = %payment))]
    pub async fn list_window(&self, payment: PaymentId, account: Option<&ProviderAccount>, created_gte: i64) -> Lookup {
        let mut scan = WindowScan::new(payment, self.max_lookup_pages);
        let mut starting_after: Option<String> = None;
        loop {
            let mut query = vec![("created[gte]", created_gte.to_string()), ("limit", self.list_page_size.to_string())];
            if let Some(after) = &starting_after {
                query.push(("starting_after", after.clone()));
            }
            match self.get::<ListPage<PaymentIntent>>("/v1/payment_intents", &query, account).await {
                Err(error) => return scan.failed(error),
                Ok(page) => match scan.page(page) {
                    Step::Next(after) => starting_after = Some(after),
                    Step::Done(lookup) => return lookup,
                },
            }
        }
    }

    /// Every intent `account` holds for `payment`, from search first, else from the list of the
    /// window since the payment was created, all within `stripe.lookup_deadline_ms` (past it, the
    /// lookup stops and can't tell). Each charge found is stamped with `account`.
    pub async fn lookup(&self, payment: PaymentId, account: Option<&ProviderAccount>) -> Lookup {
        let looked_up = async {
            match self.search(payment, account).await {
                found @ Lookup::Found(_) => found,
                // A miss, an error or an intent seen mid-way: search may be behind, the list is not.
                _ => match created_at(payment) {
                    Some(created) => {
                        self.list_window(payment, account, created.saturating_sub(self.clock_skew_secs)).await
                    }
                    None => Lookup::CantTell(CantTell::NoWindow),
                },
            }
        };
        let deadline_passed = || Lookup::CantTell(CantTell::DeadlinePassed { ms: self.lookup_deadline.as_millis() });
        match tokio::time::timeout(self.lookup_deadline, looked_up).await.unwrap_or_else(|_| deadline_passed()) {
            Lookup::Found(charges) => Lookup::Found(charges.into_iter().map(|c| in_account(c, account)).collect()),
            other => other,
        }
    }

    /// One page of the intents created in a window in `query.account`, newest first, as Stripe
    /// lists them.
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
        self.get("/v1/payment_intents", &params, query.account.as_ref()).await
    }

    /// One page of the refunds of `payment_intent` in `account`, newest first, as Stripe lists
    /// them (`GET /v1/refunds?payment_intent=…`: "List all refunds", filtered by intent, paged with
    /// `limit` and `starting_after`).
    #[instrument(name = "stripe.list_intent_refunds", skip_all)]
    pub async fn list_intent_refunds(
        &self,
        payment_intent: &str,
        starting_after: Option<&str>,
        account: Option<&ProviderAccount>,
    ) -> Result<ListPage<StripeRefund>, LookupError> {
        let mut params =
            vec![("payment_intent", payment_intent.to_owned()), ("limit", self.list_page_size.to_string())];
        if let Some(after) = starting_after {
            params.push(("starting_after", after.to_owned()));
        }
        self.get("/v1/refunds", &params, account).await
    }

    /// Every refund of `payment_intent` in `account` that `scan` looks for, read to the end of the
    /// list.
    async fn scan_refunds(
        &self,
        mut scan: RefundScan,
        payment_intent: &str,
        account: Option<&ProviderAccount>,
    ) -> Result<Vec<StripeRefund>, LookupError> {
        let mut starting_after: Option<String> = None;
        loop {
            let page = self.list_intent_refunds(payment_intent, starting_after.as_deref(), account).await?;
            match scan.page(page) {
                RefundStep::Next(after) => starting_after = Some(after),
                RefundStep::Done(found) => return found,
            }
        }
    }
}

/// `charge`, as held by `account`: Stripe's objects do not say which account they live in.
fn in_account(charge: Charge, account: Option<&ProviderAccount>) -> Charge {
    Charge { account: account.map(|a| a.as_str().to_owned()), ..charge }
}

impl PaymentProvider for StripeProvider {
    #[instrument(name = "provider.create_charge", skip_all, fields(provider.outcome))]
    async fn create_charge(&self, request: &ChargeRequest) -> SendOutcome {
        if self.mode == StripeMode::Connect && request.account.is_none() {
            // An api in direct mode, or of a version before accounts, accepted it: whatever accepted
            // it, a payment is never charged in the platform's own account in connect mode.
            tracing::error!(
                "The payment names no connected account, and in connect mode a payment is charged only in its \
                 tenant's account."
            );
            return SendOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None };
        }
        // The platform's default payment method means nothing in a connected account (and the settings
        // refuse one in connect mode).
        let default = self.default_payment_method.as_deref().filter(|_| request.account.is_none());
        let Some(payment_method) = request.payment_method.as_deref().or(default) else {
            tracing::error!(
                "The payment names no payment method, and none stands in for it (stripe.default_payment_method \
                 is unset, or the payment is charged to a connected account)."
            );
            return SendOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None };
        };
        let Ok(form) = serde_urlencoded::to_string(create_form(request, payment_method)) else {
            return SendOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None };
        };
        let account = request.account.as_ref();
        let sent = self
            .call(reqwest::Method::POST, "/v1/payment_intents", account)
            .header("Idempotency-Key", request.downstream_key.as_str())
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
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
        match outcome {
            SendOutcome::Charged(charge) => SendOutcome::Charged(in_account(charge, account)),
            other => other,
        }
    }

    /// Never `Ok` with no charges unless the consistent list proved there are none.
    #[instrument(name = "provider.find_by_key", skip_all)]
    async fn find_by_key(
        &self,
        key: &DownstreamKey,
        account: Option<&ProviderAccount>,
    ) -> Result<Vec<Charge>, LookupError> {
        let Some(payment) = key.payment_id() else {
            return Err(LookupError::Inconclusive("the key is not one oncepay derives from a payment".to_owned()));
        };
        match self.lookup(payment, account).await {
            Lookup::Found(charges) => Ok(charges),
            Lookup::CertainlyNone => Ok(Vec::new()),
            Lookup::CantTell(why) => Err(LookupError::Inconclusive(why.to_string())),
        }
    }

    /// The intents of a window: the final ones as charges, the unfinished ones apart (no charge yet,
    /// but they may still take money). Pages that hold only unfinished intents are read past, their
    /// intents kept, so an empty `data` always means the window is done. Newest first, as Stripe
    /// lists them: `starting_after` the last charge of a page still gives the next one, and an
    /// unfinished intent after it may be returned again with the next page.
    #[instrument(name = "provider.list_charges", skip_all)]
    async fn list_charges(&self, query: &ListCharges) -> Result<ChargePage, LookupError> {
        let account = query.account.as_ref();
        let mut query = query.clone();
        let mut unfinished = Vec::new();
        for _ in 0..MAX_SKIPPED_PAGES {
            let page = self.list_payment_intents(&query).await?;
            let last = page.data.last().map(|i| i.id.clone());
            let mut data = Vec::with_capacity(page.data.len());
            for intent in &page.data {
                match intent.settled_by_metadata() {
                    Settled::Final(charge) => data.push(in_account(*charge, account)),
                    Settled::NotFinal(_) => unfinished.push(intent.unfinished(account.map(ProviderAccount::as_str))),
                }
            }
            match last {
                Some(after) if data.is_empty() && page.has_more => query.starting_after = Some(after),
                // No cursor to go on from, yet more to come: returning it would end the window early.
                None if page.has_more => {
                    return Err(LookupError::Unreadable("an empty page of intents said more would follow".to_owned()));
                }
                _ => return Ok(ChargePage { data, has_more: page.has_more, unfinished }),
            }
        }
        Err(LookupError::Inconclusive(format!(
            "more than {MAX_SKIPPED_PAGES} pages in a row hold only unfinished intents"
        )))
    }

    /// The intent `id` in `account`, as it stands now.
    #[instrument(name = "provider.retrieve", skip_all)]
    async fn retrieve(&self, id: &str, account: Option<&ProviderAccount>) -> Result<Retrieved, LookupError> {
        // An id is Stripe's `pi_…`: nothing in it to escape, but never a path of its own.
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(LookupError::Inconclusive(format!("{id:?} is not a PaymentIntent id")));
        }
        match self.get::<PaymentIntent>(&format!("/v1/payment_intents/{id}"), &[], account).await {
            Ok(intent) => Ok(match intent.settled_by_metadata() {
                Settled::Final(charge) => Retrieved::Final(in_account(*charge, account)),
                Settled::NotFinal(_) => Retrieved::Unfinished(intent.unfinished(account.map(ProviderAccount::as_str))),
            }),
            Err(LookupError::Status(404)) => Ok(Retrieved::Missing),
            Err(error) => Err(error),
        }
    }

    /// Refunds (part of) the payment's PaymentIntent, under the refund's downstream key, classified
    /// as a charge is ([`classify::refund_outcome`]).
    #[instrument(name = "provider.create_refund", skip_all, fields(provider.outcome))]
    async fn create_refund(&self, request: &RefundRequest) -> RefundOutcome {
        if self.mode == StripeMode::Connect && request.account.is_none() {
            // The payment was charged in its tenant's account, and is refunded only there.
            tracing::error!(
                "The refund names no connected account, and in connect mode a payment is refunded only in its \
                 tenant's account."
            );
            return RefundOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None };
        }
        let Ok(form) = serde_urlencoded::to_string(refund_form(request)) else {
            return RefundOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None };
        };
        let sent = self
            .call(reqwest::Method::POST, "/v1/refunds", request.account.as_ref())
            .header("Idempotency-Key", request.downstream_key.as_str())
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form)
            .send()
            .await;
        let outcome = match sent {
            Err(error) => not_answered(&error),
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_after = retry_after(response.headers());
                match response.bytes().await {
                    Ok(body) => classify::refund_outcome(status, retry_after, &body, request),
                    // The status line arrived and the body broke off: the request was certainly sent.
                    Err(_) if status < 300 => RefundOutcome::Uncertain(UncertainReason::ConnectionLost),
                    Err(_) => classify::refund_outcome(status, retry_after, b"", request),
                }
            }
        };
        tracing::Span::current().record("provider.outcome", outcome.class());
        outcome
    }

    /// The refunds of the lookup's PaymentIntent whose metadata names the refund its key was derived
    /// from, from the consistent list of the intent's refunds read to its end; never from search,
    /// which lags behind writes. `Ok` with none only when that whole list showed none.
    #[instrument(name = "provider.find_refunds", skip_all)]
    async fn find_refunds(&self, lookup: &RefundLookup) -> Result<Vec<Refund>, LookupError> {
        let Some(refund) = lookup.key.refund_id() else {
            return Err(LookupError::Inconclusive("the key is not one oncepay derives from a refund".to_owned()));
        };
        let account = lookup.account.as_ref();
        if self.mode == StripeMode::Connect && account.is_none() {
            // The platform's own account holds none of a tenant's refunds: an empty list there
            // would prove nothing.
            return Err(LookupError::Inconclusive(
                "in connect mode a refund is looked up only in its tenant's connected account".to_owned(),
            ));
        }
        // An empty filter would list every refund of the account.
        if !lookup.charge_id.starts_with("pi_") {
            return Err(LookupError::Inconclusive(format!("{:?} is not a PaymentIntent id", lookup.charge_id)));
        }
        let scan = RefundScan::new(refund, &lookup.charge_id, self.max_lookup_pages);
        let listed = self.scan_refunds(scan, &lookup.charge_id, account);
        let found = tokio::time::timeout(self.lookup_deadline, listed).await.unwrap_or_else(|_| {
            Err(LookupError::Inconclusive(format!(
                "the lookup did not finish within {} ms",
                self.lookup_deadline.as_millis()
            )))
        })?;
        let account = account.map(ProviderAccount::as_str);
        Ok(found.iter().map(|r| r.to_refund(&lookup.charge_id, account)).collect())
    }

    /// The refunds created in a window in `query.account`, in every state, newest first as Stripe
    /// lists them ("List all refunds", `GET /v1/refunds` filtered by `created[gte]` and
    /// `created[lt]`, paged with `limit` and `starting_after`). Each is booked as a refund of its
    /// PaymentIntent ([`StripeRefund::refunded`]) and stamped with the account asked in.
    #[instrument(name = "provider.list_refunds", skip_all)]
    async fn list_refunds(&self, query: &ListRefunds) -> Result<RefundPage, LookupError> {
        let account = query.account.as_ref();
        let mut params = vec![
            ("created[gte]", query.created_gte.to_string()),
            ("created[lt]", query.created_lt.to_string()),
            ("limit", query.limit.clamp(1, 100).to_string()),
        ];
        if let Some(after) = &query.starting_after {
            params.push(("starting_after", after.clone()));
        }
        let page: ListPage<StripeRefund> = self.get("/v1/refunds", &params, account).await?;
        if page.data.is_empty() && page.has_more {
            // No cursor to go on from, yet more to come: returning it would end the window early.
            return Err(LookupError::Unreadable("an empty page of refunds said more would follow".to_owned()));
        }
        let account = account.map(ProviderAccount::as_str);
        let data = page.data.iter().map(|r| r.to_refund(r.refunded(), account)).collect();
        Ok(RefundPage { data, has_more: page.has_more })
    }

    /// The refund `id` in `account`, as it stands now (`GET /v1/refunds/{id}`, "Retrieve a refund").
    #[instrument(name = "provider.retrieve_refund", skip_all)]
    async fn retrieve_refund(
        &self,
        id: &str,
        account: Option<&ProviderAccount>,
    ) -> Result<Option<Refund>, LookupError> {
        // An id is Stripe's `re_…` (or `pyr_…`): nothing in it to escape, but never a path of its own.
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(LookupError::Inconclusive(format!("{id:?} is not a Refund id")));
        }
        match self.get::<StripeRefund>(&format!("/v1/refunds/{id}"), &[], account).await {
            Ok(refund) => Ok(Some(refund.to_refund(refund.refunded(), account.map(ProviderAccount::as_str)))),
            Err(LookupError::Status(404)) => Ok(None),
            Err(error) => Err(error),
        }
    }
}

/// A refund request that got no HTTP response: not sent when no byte of it left, else uncertain,
/// exactly as for a charge.
fn not_answered(error: &reqwest::Error) -> RefundOutcome {
    match SendOutcome::from_transport_error(error) {
        SendOutcome::NotSent { reason, retry_after } => RefundOutcome::NotSent { reason, retry_after },
        SendOutcome::Uncertain(reason) => RefundOutcome::Uncertain(reason),
        // A transport error never shows a charge or a decline; should it, nothing is proven.
        SendOutcome::Charged(_) | SendOutcome::Declined { .. } => {
            RefundOutcome::Uncertain(UncertainReason::ConnectionLost)
        }
    }
}

/// Contract tests: Stripe's responses as its documentation shapes them, served by wiremock.
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{Value, json};
    use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
    use wiremock::{Mock, MockServer, Request, ResponseTemplate};

    use oncepay_domain::ids::{RefundId, TenantId};
    use oncepay_domain::money::{Amount, Currency};
    use oncepay_domain::provider_ref::{ProviderAccount, ProviderCustomer};

    use super::*;
    use crate::stripe::wire::samples::{declined_intent, error, intent, refund as stripe_refund};
    use crate::{ChargeStatus, RefundState};

    const VERSION: &str = "2024-06-20";

    fn settings(base_url: String) -> StripeSettings {
        StripeSettings {
            mode: StripeMode::Direct,
            secret_key: SecretString::from("sk_test_oncepay"),
            base_url,
            api_version: VERSION.to_owned(),
            default_payment_method: None,
            connect_timeout_ms: 2_000,
            request_timeout_ms: 2_000,
            list_page_size: 2,
            max_lookup_pages: 5,
            clock_skew_secs: 600,
            lookup_deadline_ms: 30_000,
        }
    }

    async fn stripe() -> (MockServer, StripeProvider) {
        let server = MockServer::start().await;
        let provider = StripeProvider::new(&settings(server.uri())).unwrap();
        (server, provider)
    }

    fn request(payment: PaymentId) -> ChargeRequest {
        let merchant: BTreeMap<String, String> = [("order".to_owned(), "A-17".to_owned())].into();
        let request = ChargeRequest::for_payment(
            TenantId::generate(),
            payment,
            Amount::new(1999).unwrap(),
            Currency::parse("EUR").unwrap(),
            "merchant-ref-9".into(),
            &merchant,
        );
        ChargeRequest {
            payment_method: Some("pm_card_visa".to_owned()),
            provider_customer: Some(ProviderCustomer::parse("cus_Q1").unwrap()),
            ..request
        }
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
                message: "Stripe declined the payment (code card_declined, decline code insufficient_funds).".into(),
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
                message: "Stripe refused the request as invalid (code resource_missing).".into(),
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
        let without = ChargeRequest { payment_method: None, ..request(payment) };
        let connected = ChargeRequest { account: Some(ProviderAccount::parse("acct_A").unwrap()), ..without.clone() };

        provider.create_charge(&without).await;
        provider.create_charge(&request(payment)).await;
        let in_connected_account = provider.create_charge(&connected).await;

        let received = server.received_requests().await.unwrap();
        let (first, second) = (form_of(&received[0]), form_of(&received[1]));
        assert_eq!(first.get("payment_method").map(String::as_str), Some("pm_default"));
        assert_eq!(second.get("payment_method").map(String::as_str), Some("pm_card_visa"));
        assert_eq!(received.len(), 2, "the platform's default means nothing in a connected account");
        assert_eq!(in_connected_account, SendOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None });
    }

    #[tokio::test]
    async fn a_merchants_customer_reference_is_never_sent_as_a_stripe_customer() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate();
        respond_to_create(&server, 200, intent("pi_1", "succeeded", &payment.to_string())).await;
        // docs/api.md's own example: `--customer cus_42` is the merchant's reference, not Stripe's.
        let merchants_reference =
            ChargeRequest { customer: "cus_42".into(), provider_customer: None, ..request(payment) };

        provider.create_charge(&merchants_reference).await;
        provider.create_charge(&request(payment)).await;

        let received = server.received_requests().await.unwrap();
        assert_eq!(form_of(&received[0]).get("customer"), None);
        assert_eq!(form_of(&received[1]).get("customer").map(String::as_str), Some("cus_Q1"));
        assert!(!received.iter().any(|r| String::from_utf8_lossy(&r.body).contains("cus_42")));
    }

    // Connect.

    /// Responds to every call that names `account` as its `Stripe-Account`; any other call gets the 403
    /// Stripe gives a key without access to the account it names.
    async fn connected_account(server: &MockServer, account: &str, payment: PaymentId) {
        let named = || Mock::given(header(STRIPE_ACCOUNT, account));
        named()
            .and(method("POST"))
            .and(path("/v1/payment_intents"))
            .respond_with(ResponseTemplate::new(200).set_body_json(intent("pi_1", "succeeded", &payment.to_string())))
            .mount(server)
            .await;
        named()
            .and(method("GET"))
            .and(path("/v1/payment_intents/search"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "object": "search_result", "url": "/v1/payment_intents/search", "has_more": false, "data": []
            })))
            .mount(server)
            .await;
        named()
            .and(method("GET"))
            .and(path("/v1/payment_intents"))
            .respond_with(list(vec![intent("pi_1", "succeeded", &payment.to_string())], false))
            .mount(server)
            .await;
        Mock::given(wiremock::matchers::any())
            .respond_with(ResponseTemplate::new(403).set_body_json(error(
                "invalid_request_error",
                None,
                "The provided key does not have access to account 'acct_…' (or that account does not exist).",
            )))
            .mount(server)
            .await;
    }

    #[tokio::test]
    async fn every_call_for_a_connected_payment_names_its_account() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate();
        connected_account(&server, "acct_A", payment).await;
        let account = ProviderAccount::parse("acct_A").unwrap();
        let window = ListCharges {
            account: Some(account.clone()),
            created_gte: 0,
            created_lt: i64::MAX,
            starting_after: None,
            limit: 10,
        };

        let outcome =
            provider.create_charge(&ChargeRequest { account: Some(account.clone()), ..request(payment) }).await;
        let found = provider.find_by_key(&payment.downstream_key(), Some(&account)).await.unwrap();
        let listed = provider.list_charges(&window).await.unwrap();

        let received = server.received_requests().await.unwrap();
        assert_eq!(received.len(), 4, "create, search, the lookup's list, the nightly list");
        for call in &received {
            let named = call.headers.get(STRIPE_ACCOUNT).and_then(|v| v.to_str().ok());
            assert_eq!(named, Some("acct_A"), "{} {}", call.method, call.url);
        }
        let SendOutcome::Charged(charge) = outcome else { panic!("{outcome:?}") };
        let accounts: Vec<Option<&str>> =
            [&charge].into_iter().chain(&found).chain(&listed.data).map(|c| c.account.as_deref()).collect();
        assert_eq!(accounts, [Some("acct_A"); 3], "each charge says which account holds it");
    }

    #[tokio::test]
    async fn in_connect_mode_a_payment_without_an_account_is_never_charged_in_the_platforms() {
        let server = MockServer::start().await;
        let provider =
            StripeProvider::new(&StripeSettings { mode: StripeMode::Connect, ..settings(server.uri()) }).unwrap();
        respond_to_create(&server, 200, intent("pi_1", "succeeded", &PaymentId::generate().to_string())).await;

        let outcome = provider.create_charge(&ChargeRequest { account: None, ..request(PaymentId::generate()) }).await;

        assert!(matches!(outcome, SendOutcome::NotSent { reason: NotSentReason::LocalError, .. }), "{outcome:?}");
        assert!(server.received_requests().await.unwrap().is_empty(), "nothing reaches Stripe");
    }

    #[test]
    fn a_default_payment_method_is_refused_in_connect_mode() {
        let connect = StripeSettings {
            mode: StripeMode::Connect,
            default_payment_method: Some("pm_card_visa".into()),
            ..settings("http://127.0.0.1:1".into())
        };

        assert!(matches!(connect.validate(), Err(SettingsError::DefaultPaymentMethodInConnect)));
    }

    #[tokio::test]
    async fn a_payment_in_oncepays_own_account_names_none() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate();
        respond_to_create(&server, 200, intent("pi_1", "succeeded", &payment.to_string())).await;
        search_returns(&server, payment, vec![intent("pi_1", "succeeded", &payment.to_string())]).await;

        let outcome = provider.create_charge(&request(payment)).await;
        let found = provider.find_by_key(&payment.downstream_key(), None).await.unwrap();

        let received = server.received_requests().await.unwrap();
        assert!(received.iter().all(|call| call.headers.get(STRIPE_ACCOUNT).is_none()), "{received:?}");
        assert!(matches!(outcome, SendOutcome::Charged(ref c) if c.account.is_none()), "{outcome:?}");
        assert_eq!(found[0].account, None);
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

        let charges = provider.find_by_key(&payment.downstream_key(), None).await.unwrap();

        assert_eq!(charges.len(), 1);
        assert_eq!((charges[0].id.as_str(), charges[0].status), ("pi_1", ChargeStatus::Succeeded));
        assert_eq!(charges[0].idempotency_key, payment.downstream_key().as_str());
    }

    #[tokio::test]
    async fn an_empty_search_proves_nothing() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate();
        search_returns(&server, payment, vec![]).await;

        let lookup = provider.search(payment, None).await;

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

        let charges = provider.find_by_key(&payment.downstream_key(), None).await.unwrap();

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
        let lookup = provider.lookup(payment, None).await;
        let by_key = provider.find_by_key(&payment.downstream_key(), None).await;

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

        let lookup = provider.lookup(payment, None).await;
        let by_key = provider.find_by_key(&payment.downstream_key(), None).await;

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
            // the result that allows a resend.
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

            let lookup = provider.lookup(payment, None).await;
            let by_key = provider.find_by_key(&payment.downstream_key(), None).await;
            let nightly = provider
                .list_charges(&ListCharges {
                    account: None,
                    created_gte: 0,
                    created_lt: 1,
                    starting_after: None,
                    limit: 10,
                })
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
    async fn a_lookup_that_runs_past_its_deadline_stops_and_proves_nothing() {
        let server = MockServer::start().await;
        let provider = StripeProvider::new(&StripeSettings {
            connect_timeout_ms: 500,
            request_timeout_ms: 500,
            lookup_deadline_ms: 1_000,
            ..settings(server.uri())
        })
        .unwrap();
        let payment = PaymentId::generate();
        search_returns(&server, payment, vec![]).await;
        // Every page of the window is slow and says more follow: five pages take twice the deadline.
        let other = PaymentId::generate().to_string();
        Mock::given(method("GET"))
            .and(path("/v1/payment_intents"))
            .respond_with(
                list(vec![intent("pi_9", "succeeded", &other), intent("pi_8", "succeeded", &other)], true)
                    .set_delay(std::time::Duration::from_millis(400)),
            )
            .mount(&server)
            .await;

        let lookup = provider.lookup(payment, None).await;

        assert!(matches!(lookup, Lookup::CantTell(CantTell::DeadlinePassed { ms: 1_000 })), "{lookup:?}");
        let pages = server.received_requests().await.unwrap().len() - 1;
        assert!(pages < 5, "the lookup stopped at its deadline, after {pages} of its 5 pages");
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

        let by_key = provider.find_by_key(&payment.downstream_key(), None).await;

        assert!(matches!(by_key, Err(LookupError::Inconclusive(ref why)) if why.contains("pi_1")), "{by_key:?}");
    }

    #[tokio::test]
    async fn the_nightly_list_reads_past_pages_of_unfinished_intents_and_keeps_them_apart() {
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
        let query = ListCharges { account: None, created_gte: 100, created_lt: 200, starting_after: None, limit: 2 };

        let page = provider.list_charges(&query).await.unwrap();

        assert_eq!(page.data.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["pi_4"]);
        assert!(page.has_more);
        let unfinished: Vec<(&str, &str)> =
            page.unfinished.iter().map(|u| (u.id.as_str(), u.status.as_str())).collect();
        assert_eq!(unfinished, [("pi_6", "processing"), ("pi_5", "requires_action"), ("pi_3", "processing")]);
    }

    #[tokio::test]
    async fn a_charge_is_retrieved_by_id_in_its_account_as_it_stands_now() {
        let (server, provider) = stripe().await;
        let payment = PaymentId::generate().to_string();
        let account = ProviderAccount::parse("acct_A").unwrap();
        for (id, status) in [("pi_done", "succeeded"), ("pi_busy", "processing")] {
            Mock::given(method("GET"))
                .and(path(format!("/v1/payment_intents/{id}")))
                .and(header(STRIPE_ACCOUNT, "acct_A"))
                .respond_with(ResponseTemplate::new(200).set_body_json(intent(id, status, &payment)))
                .mount(&server)
                .await;
        }
        Mock::given(method("GET"))
            .and(path("/v1/payment_intents/pi_gone"))
            .respond_with(ResponseTemplate::new(404).set_body_json(error(
                "invalid_request_error",
                Some("resource_missing"),
                "No such payment_intent: 'pi_gone'",
            )))
            .mount(&server)
            .await;

        let done = provider.retrieve("pi_done", Some(&account)).await.unwrap();
        let busy = provider.retrieve("pi_busy", Some(&account)).await.unwrap();
        let gone = provider.retrieve("pi_gone", Some(&account)).await.unwrap();

        let Retrieved::Final(charge) = done else { panic!("{done:?}") };
        assert_eq!((charge.status, charge.account.as_deref()), (ChargeStatus::Succeeded, Some("acct_A")));
        assert!(matches!(busy, Retrieved::Unfinished(ref u) if u.status == "processing"), "{busy:?}");
        assert_eq!(gone, Retrieved::Missing);
    }

    // Refunds.

    /// Stripe's Refunds API as its documentation describes it, in one account: the first response
    /// to a key is saved and replayed to a resend with the same parameters, other parameters under
    /// that key are an `idempotency_error`, and the list is filtered by intent and paged newest
    /// first. Mounted for `POST` and `GET /v1/refunds`.
    #[derive(Clone, Default)]
    struct Refunds {
        state: std::sync::Arc<std::sync::Mutex<RefundsHeld>>,
    }

    #[derive(Default)]
    struct RefundsHeld {
        /// Per key: the body first sent under it, and the response saved for it.
        by_key: BTreeMap<String, (Vec<u8>, Value)>,
        /// Every refund, oldest first.
        made: Vec<Value>,
    }

    impl Refunds {
        async fn mount(server: &MockServer) -> Self {
            let refunds = Self::default();
            Mock::given(path("/v1/refunds")).respond_with(refunds.clone()).mount(server).await;
            refunds
        }

        fn made(&self) -> Vec<Value> {
            self.state.lock().unwrap().made.clone()
        }
    }

    impl wiremock::Respond for Refunds {
        fn respond(&self, request: &Request) -> ResponseTemplate {
            let mut held = self.state.lock().unwrap();
            if request.method.as_str() == "GET" {
                let query: BTreeMap<String, String> = request.url.query_pairs().into_owned().collect();
                let mine: Vec<&Value> = held
                    .made
                    .iter()
                    .rev()
                    .filter(|r| Some(&r["payment_intent"]) == query.get("payment_intent").map(|pi| json!(pi)).as_ref())
                    .collect();
                let start = match query.get("starting_after") {
                    Some(after) => mine.iter().position(|r| r["id"] == json!(after)).map_or(mine.len(), |i| i + 1),
                    None => 0,
                };
                let limit: usize = query.get("limit").map_or(10, |l| l.parse().unwrap());
                let page: Vec<Value> = mine.iter().skip(start).take(limit).map(|r| (*r).clone()).collect();
                let has_more = mine.len() > start + limit;
                return ResponseTemplate::new(200).set_body_json(
                    json!({"object": "list", "url": "/v1/refunds", "has_more": has_more, "data": page}),
                );
            }
            let key =
                request.headers.get("Idempotency-Key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            if let Some((first, saved)) = held.by_key.get(&key) {
                return if *first == request.body {
                    ResponseTemplate::new(200).insert_header("Idempotent-Replayed", "true").set_body_json(saved.clone())
                } else {
                    ResponseTemplate::new(400).set_body_json(error(
                        "idempotency_error",
                        None,
                        "Keys for idempotent requests can only be used with the same parameters they were first used \
                         with.",
                    ))
                };
            }
            let form = form_of(request);
            let mut made =
                stripe_refund(&format!("re_{}", held.made.len() + 1), "succeeded", "", &form["payment_intent"]);
            made["amount"] = json!(form["amount"].parse::<i64>().unwrap());
            made["reason"] = form.get("reason").map_or(Value::Null, |r| json!(r));
            made["metadata"] = form
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix("metadata[")?.strip_suffix(']')?.to_owned(), json!(v))))
                .collect::<serde_json::Map<String, Value>>()
                .into();
            held.by_key.insert(key, (request.body.clone(), made.clone()));
            held.made.push(made.clone());
            ResponseTemplate::new(200).set_body_json(made)
        }
    }

    fn refund_request(refund: RefundId) -> RefundRequest {
        let merchant: BTreeMap<String, String> = [("order".to_owned(), "A-17".to_owned())].into();
        RefundRequest::for_refund(
            TenantId::generate(),
            PaymentId::generate(),
            refund,
            "pi_1".to_owned(),
            Amount::new(500).unwrap(),
            Currency::parse("EUR").unwrap(),
            Some("requested_by_customer".to_owned()),
            &merchant,
        )
    }

    fn refund_lookup(refund: RefundId) -> RefundLookup {
        RefundLookup { key: refund.downstream_key(), charge_id: "pi_1".to_owned(), account: None }
    }

    async fn respond_to_refund(server: &MockServer, status: u16, body: Value) {
        Mock::given(method("POST"))
            .and(path("/v1/refunds"))
            .respond_with(ResponseTemplate::new(status).set_body_json(body))
            .mount(server)
            .await;
    }

    fn refunds_page(data: Vec<Value>, has_more: bool) -> ResponseTemplate {
        ResponseTemplate::new(200)
            .set_body_json(json!({"object": "list", "url": "/v1/refunds", "has_more": has_more, "data": data}))
    }

    #[tokio::test]
    async fn a_refund_is_created_for_the_payment_intent_in_one_form_encoded_call_under_its_key() {
        let (server, provider) = stripe().await;
        let refunds = Refunds::mount(&server).await;
        let refund = RefundId::generate();
        let request = refund_request(refund);

        let outcome = provider.create_refund(&request).await;

        let received = server.received_requests().await.unwrap();
        assert_eq!(received.len(), 1);
        let sent = &received[0];
        let header_of = |name: &str| sent.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        assert_eq!((sent.method.as_str(), sent.url.path()), ("POST", "/v1/refunds"));
        assert_eq!(header_of("content-type").as_deref(), Some("application/x-www-form-urlencoded"));
        assert_eq!(header_of("idempotency-key"), Some(refund.downstream_key().as_str().to_owned()));
        assert_eq!(header_of("stripe-version").as_deref(), Some(VERSION));
        assert_eq!(header_of("authorization").as_deref(), Some("Bearer sk_test_oncepay"));
        assert_eq!(header_of(STRIPE_ACCOUNT), None);
        let form = form_of(sent);
        let field = |name: &str| form.get(name).map(String::as_str);
        assert_eq!(field("payment_intent"), Some("pi_1"));
        assert_eq!(field("amount"), Some("500"));
        assert_eq!(field("reason"), Some("requested_by_customer"));
        assert_eq!(field("metadata[order]"), Some("A-17"));
        assert_eq!(field("metadata[oncepay_refund_id]").map(str::to_owned), Some(refund.to_string()));
        assert!(field("metadata[oncepay_payment_id]").is_some() && field("metadata[oncepay_tenant_id]").is_some());
        assert_eq!(
            (field("charge"), field("currency")),
            (None, None),
            "the intent is named, and its currency is the refund's"
        );
        let RefundOutcome::Refunded(made) = outcome else { panic!("{outcome:?}") };
        assert_eq!((made.id.as_str(), made.status), ("re_1", RefundState::Succeeded));
        assert_eq!((made.charge.as_str(), made.amount, made.currency.as_str()), ("pi_1", 500, "EUR"));
        assert_eq!((made.idempotency_key.as_deref(), made.account.as_deref()), (None, None));
        assert_eq!(refunds.made().len(), 1);
    }

    #[tokio::test]
    async fn a_resend_under_the_same_key_sends_the_same_form_and_gets_the_same_refund() {
        let (server, provider) = stripe().await;
        let refunds = Refunds::mount(&server).await;
        let request = refund_request(RefundId::generate());

        let first = provider.create_refund(&request).await;
        let resend = provider.create_refund(&request).await;

        let received = server.received_requests().await.unwrap();
        assert_eq!(received[0].body, received[1].body, "a resend must send the very same parameters");
        assert!(matches!(first, RefundOutcome::Refunded(ref r) if r.id == "re_1"), "{first:?}");
        assert_eq!(resend, first);
        assert_eq!(refunds.made().len(), 1, "Stripe made one refund");
    }

    #[tokio::test]
    async fn a_key_reused_for_other_parameters_is_uncertain() {
        let (server, provider) = stripe().await;
        Refunds::mount(&server).await;
        let request = refund_request(RefundId::generate());
        let more = RefundRequest { amount: Amount::new(900).unwrap(), ..request.clone() };

        provider.create_refund(&request).await;
        let outcome = provider.create_refund(&more).await;

        assert_eq!(outcome, RefundOutcome::Uncertain(UncertainReason::KeyReused));
    }

    #[tokio::test]
    async fn a_refund_is_found_by_its_key_among_the_intents_refunds_and_none_under_another() {
        let (server, provider) = stripe().await;
        let refunds = Refunds::mount(&server).await;
        let (ours, never_sent) = (RefundId::generate(), RefundId::generate());
        // Ours first, then more than a page (two) of the intent's other refunds after it.
        provider.create_refund(&refund_request(ours)).await;
        for _ in 0..3 {
            provider.create_refund(&refund_request(RefundId::generate())).await;
        }
        let another_intent = RefundRequest { charge_id: "pi_2".into(), ..refund_request(RefundId::generate()) };
        provider.create_refund(&another_intent).await;

        let found = provider.find_refunds(&refund_lookup(ours)).await.unwrap();
        let none = provider.find_refunds(&refund_lookup(never_sent)).await.unwrap();

        assert_eq!(refunds.made().len(), 5);
        assert_eq!(found.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["re_1"]);
        assert_eq!(
            (found[0].status, found[0].charge.as_str(), found[0].account.as_deref()),
            (RefundState::Succeeded, "pi_1", None)
        );
        assert_eq!(found[0].refund_ref().map(|(_, r)| r), Some(ours));
        assert_eq!(none, []);
        let lists: Vec<Request> =
            server.received_requests().await.unwrap().into_iter().filter(|r| r.method.as_str() == "GET").collect();
        assert!(lists.iter().all(|r| r.url.query_pairs().any(|(k, v)| k == "payment_intent" && v == "pi_1")));
        assert!(
            lists.iter().any(|r| r.url.query_pairs().any(|(k, _)| k == "starting_after")),
            "the list was read past its first page"
        );
    }

    #[tokio::test]
    async fn a_refund_still_pending_is_unfinished() {
        let (server, provider) = stripe().await;
        let refund = RefundId::generate();
        respond_to_refund(&server, 200, stripe_refund("re_1", "pending", &refund.to_string(), "pi_1")).await;

        let outcome = provider.create_refund(&refund_request(refund)).await;

        assert!(
            matches!(outcome, RefundOutcome::Unfinished(ref r) if r.id == "re_1" && r.status == RefundState::Pending),
            "{outcome:?}"
        );
    }

    #[tokio::test]
    async fn a_failed_refund_is_failed_and_names_itself_as_proof() {
        let (server, provider) = stripe().await;
        let refund = RefundId::generate();
        respond_to_refund(&server, 200, stripe_refund("re_1", "failed", &refund.to_string(), "pi_1")).await;

        let outcome = provider.create_refund(&refund_request(refund)).await;

        assert_eq!(
            outcome,
            RefundOutcome::Failed {
                code: "expired_or_canceled_card".into(),
                message: "Stripe could not refund the payment (code expired_or_canceled_card).".into(),
                refund_id: Some("re_1".into()),
            }
        );
    }

    #[tokio::test]
    async fn a_refund_of_a_charge_already_refunded_is_failed_and_names_no_refund() {
        let (server, provider) = stripe().await;
        respond_to_refund(
            &server,
            400,
            error("invalid_request_error", Some("charge_already_refunded"), "Charge ch_3Mt has already been refunded."),
        )
        .await;

        let outcome = provider.create_refund(&refund_request(RefundId::generate())).await;

        assert_eq!(
            outcome,
            RefundOutcome::Failed {
                code: "provider_rejected".into(),
                message: "Stripe refused the refund as invalid (code charge_already_refunded).".into(),
                refund_id: None,
            }
        );
    }

    #[tokio::test]
    async fn a_refund_that_gets_no_response_in_time_or_a_server_error_is_uncertain() {
        let server = MockServer::start().await;
        let provider =
            StripeProvider::new(&StripeSettings { request_timeout_ms: 300, ..settings(server.uri()) }).unwrap();
        let slow = RefundId::generate();
        Mock::given(method("POST"))
            .and(header("Idempotency-Key", slow.downstream_key().as_str()))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(stripe_refund("re_1", "succeeded", &slow.to_string(), "pi_1"))
                    .set_delay(std::time::Duration::from_millis(1_000)),
            )
            .mount(&server)
            .await;
        respond_to_refund(&server, 500, error("api_error", None, "An unknown error occurred")).await;

        let timed_out = provider.create_refund(&refund_request(slow)).await;
        let failed = provider.create_refund(&refund_request(RefundId::generate())).await;

        assert_eq!(timed_out, RefundOutcome::Uncertain(UncertainReason::Timeout));
        assert_eq!(failed, RefundOutcome::Uncertain(UncertainReason::ServerError(500)));
    }

    #[tokio::test]
    async fn a_refund_that_cannot_connect_is_not_sent() {
        // A port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let provider = StripeProvider::new(&settings(format!("http://127.0.0.1:{port}"))).unwrap();

        let outcome = provider.create_refund(&refund_request(RefundId::generate())).await;

        assert_eq!(outcome, RefundOutcome::NotSent { reason: NotSentReason::ConnectFailed, retry_after: None });
    }

    #[tokio::test]
    async fn a_refund_for_a_connected_payment_is_made_and_found_in_its_account() {
        let (server, provider) = stripe().await;
        let refunds = Refunds::default();
        Mock::given(header(STRIPE_ACCOUNT, "acct_A"))
            .and(path("/v1/refunds"))
            .respond_with(refunds.clone())
            .mount(&server)
            .await;
        Mock::given(wiremock::matchers::any())
            .respond_with(ResponseTemplate::new(403).set_body_json(error(
                "invalid_request_error",
                None,
                "The provided key does not have access to account 'acct_…' (or that account does not exist).",
            )))
            .mount(&server)
            .await;
        let account = ProviderAccount::parse("acct_A").unwrap();
        let refund = RefundId::generate();

        let outcome =
            provider.create_refund(&RefundRequest { account: Some(account.clone()), ..refund_request(refund) }).await;
        let found = provider
            .find_refunds(&RefundLookup { account: Some(account.clone()), ..refund_lookup(refund) })
            .await
            .unwrap();
        let in_the_platforms = provider.create_refund(&refund_request(RefundId::generate())).await;

        let received = server.received_requests().await.unwrap();
        for call in &received[..2] {
            let named = call.headers.get(STRIPE_ACCOUNT).and_then(|v| v.to_str().ok());
            assert_eq!(named, Some("acct_A"), "{} {}", call.method, call.url);
        }
        assert!(
            matches!(outcome, RefundOutcome::Refunded(ref r) if r.account.as_deref() == Some("acct_A")),
            "{outcome:?}"
        );
        assert_eq!(
            found.iter().map(|r| (r.id.as_str(), r.account.as_deref())).collect::<Vec<_>>(),
            [("re_1", Some("acct_A"))]
        );
        assert_eq!(
            in_the_platforms,
            RefundOutcome::NotSent { reason: NotSentReason::Unauthorized(403), retry_after: None }
        );
        assert_eq!(refunds.made().len(), 1);
    }

    #[tokio::test]
    async fn in_connect_mode_a_refund_without_an_account_is_never_made_or_looked_up_in_the_platforms() {
        let server = MockServer::start().await;
        let provider =
            StripeProvider::new(&StripeSettings { mode: StripeMode::Connect, ..settings(server.uri()) }).unwrap();
        Refunds::mount(&server).await;
        let refund = RefundId::generate();

        let outcome = provider.create_refund(&refund_request(refund)).await;
        let found = provider.find_refunds(&refund_lookup(refund)).await;

        assert_eq!(outcome, RefundOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None });
        assert!(matches!(found, Err(LookupError::Inconclusive(_))), "{found:?}");
        assert!(server.received_requests().await.unwrap().is_empty(), "nothing reaches Stripe");
    }

    #[tokio::test]
    async fn a_refund_list_that_cannot_be_read_to_its_end_proves_nothing() {
        let refund = RefundId::generate();
        let other = RefundId::generate().to_string();
        let theirs = |id: &str| stripe_refund(id, "succeeded", &other, "pi_1");
        let ours = stripe_refund("re_1", "succeeded", &refund.to_string(), "pi_1").to_string();
        let naming_two = ours.replace(&refund.to_string(), &format!(r#"{other}","oncepay_refund_id":"{refund}"#));
        let label = |found: &Result<Vec<Refund>, LookupError>| match found {
            Ok(refunds) => format!("found {}", refunds.len()),
            Err(LookupError::Status(status)) => format!("HTTP {status}"),
            Err(LookupError::Unreadable(_)) => "unreadable".to_owned(),
            Err(other) => other.to_string(),
        };
        let second_pages: Vec<(&str, ResponseTemplate, &str)> = vec![
            ("a server error", ResponseTemplate::new(500).set_body_json(error("api_error", None, "oops")), "HTTP 500"),
            (
                "a rate limit",
                ResponseTemplate::new(429).set_body_json(error(
                    "invalid_request_error",
                    Some("rate_limit"),
                    "slow down",
                )),
                "HTTP 429",
            ),
            (
                "a refund naming two refunds, ours last",
                ResponseTemplate::new(200).set_body_raw(
                    format!(r#"{{"object":"list","url":"/v1/refunds","has_more":false,"data":[{naming_two}]}}"#),
                    "application/json",
                ),
                "unreadable",
            ),
            ("an empty page that promises more", refunds_page(vec![], true), "unreadable"),
            (
                "a refund of another intent",
                refunds_page(vec![stripe_refund("re_9", "succeeded", &other, "pi_2")], false),
                "unreadable",
            ),
        ];
        for (name, second_page, expected) in second_pages {
            let (server, provider) = stripe().await;
            Mock::given(method("GET"))
                .and(path("/v1/refunds"))
                .and(query_param("payment_intent", "pi_1"))
                .and(query_param("limit", "2"))
                .and(query_param_is_missing("starting_after"))
                .respond_with(refunds_page(vec![theirs("re_3"), theirs("re_2")], true))
                .mount(&server)
                .await;
            Mock::given(method("GET"))
                .and(path("/v1/refunds"))
                .and(query_param("starting_after", "re_2"))
                .respond_with(second_page)
                .mount(&server)
                .await;

            let found = provider.find_refunds(&refund_lookup(refund)).await;

            assert_eq!(label(&found), expected, "{name}");
        }
    }

    #[tokio::test]
    async fn the_nightly_refund_list_reads_a_window_of_a_connected_account_page_by_page() {
        let (server, provider) = stripe().await;
        let (ours, theirs) = (RefundId::generate().to_string(), RefundId::generate().to_string());
        let mut by_charge = stripe_refund("re_1", "succeeded", &theirs, "pi_1");
        by_charge["payment_intent"] = Value::Null;
        by_charge["metadata"] = json!({});
        Mock::given(method("GET"))
            .and(path("/v1/refunds"))
            .and(header(STRIPE_ACCOUNT, "acct_A"))
            .and(query_param("created[gte]", "100"))
            .and(query_param("created[lt]", "200"))
            .and(query_param("limit", "2"))
            .and(query_param_is_missing("payment_intent"))
            .and(query_param_is_missing("starting_after"))
            .respond_with(refunds_page(vec![stripe_refund("re_2", "pending", &ours, "pi_2"), by_charge], true))
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/refunds"))
            .and(header(STRIPE_ACCOUNT, "acct_A"))
            .and(query_param("starting_after", "re_1"))
            .respond_with(refunds_page(vec![stripe_refund("re_0", "failed", &ours, "pi_2")], false))
            .expect(1)
            .mount(&server)
            .await;
        let account = ProviderAccount::parse("acct_A").unwrap();
        let mut query =
            ListRefunds { account: Some(account), created_gte: 100, created_lt: 200, starting_after: None, limit: 2 };

        let first = provider.list_refunds(&query).await.unwrap();
        query.starting_after = first.data.last().map(|r| r.id.clone());
        let second = provider.list_refunds(&query).await.unwrap();

        let read = |page: &RefundPage| -> Vec<(String, RefundState, String, Option<String>)> {
            page.data.iter().map(|r| (r.id.clone(), r.status, r.charge.clone(), r.account.clone())).collect()
        };
        let acct = Some("acct_A".to_owned());
        assert_eq!(
            read(&first),
            [
                ("re_2".to_owned(), RefundState::Pending, "pi_2".to_owned(), acct.clone()),
                // A refund made on the dashboard by charge: no intent, no metadata of oncepay's.
                ("re_1".to_owned(), RefundState::Succeeded, "ch_3Mt".to_owned(), acct.clone()),
            ]
        );
        assert!(first.has_more);
        assert_eq!(first.data[0].refund_ref().map(|(_, r)| r.to_string()), Some(ours));
        assert_eq!((first.data[0].currency.as_str(), first.data[0].idempotency_key.as_deref()), ("EUR", None));
        assert_eq!(first.data[1].refund_ref(), None);
        assert_eq!(read(&second), [("re_0".to_owned(), RefundState::Failed, "pi_2".to_owned(), acct)]);
        assert!(!second.has_more);
    }

    #[tokio::test]
    async fn an_empty_page_of_refunds_that_promises_more_is_unreadable() {
        let (server, provider) = stripe().await;
        Mock::given(method("GET"))
            .and(path("/v1/refunds"))
            .respond_with(refunds_page(vec![], true))
            .mount(&server)
            .await;
        let query = ListRefunds { account: None, created_gte: 100, created_lt: 200, starting_after: None, limit: 2 };

        let page = provider.list_refunds(&query).await;

        assert!(matches!(page, Err(LookupError::Unreadable(_))), "{page:?}");
    }

    #[tokio::test]
    async fn a_refund_is_read_again_by_id_in_its_account_and_a_missing_one_is_none() {
        let (server, provider) = stripe().await;
        let refund = RefundId::generate().to_string();
        Mock::given(method("GET"))
            .and(path("/v1/refunds/re_1"))
            .and(header(STRIPE_ACCOUNT, "acct_A"))
            .respond_with(ResponseTemplate::new(200).set_body_json(stripe_refund("re_1", "succeeded", &refund, "pi_1")))
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/refunds/re_gone"))
            .respond_with(ResponseTemplate::new(404).set_body_json(error(
                "invalid_request_error",
                Some("resource_missing"),
                "No such refund: 're_gone'",
            )))
            .expect(1)
            .mount(&server)
            .await;
        let account = ProviderAccount::parse("acct_A").unwrap();

        let read = provider.retrieve_refund("re_1", Some(&account)).await.unwrap().unwrap();
        let gone = provider.retrieve_refund("re_gone", None).await.unwrap();
        let calls = server.received_requests().await.unwrap().len();
        let not_an_id = provider.retrieve_refund("../re_1", None).await;

        assert_eq!((read.id.as_str(), read.status, read.charge.as_str()), ("re_1", RefundState::Succeeded, "pi_1"));
        assert_eq!(read.account.as_deref(), Some("acct_A"));
        assert_eq!(gone, None);
        assert!(matches!(not_an_id, Err(LookupError::Inconclusive(_))), "{not_an_id:?}");
        assert_eq!(server.received_requests().await.unwrap().len(), calls, "nothing asked for a path that is no id");
    }

    #[tokio::test]
    async fn a_refund_lookup_past_its_page_budget_or_deadline_or_of_no_refund_or_intent_proves_nothing() {
        let server = MockServer::start().await;
        let provider = StripeProvider::new(&StripeSettings {
            connect_timeout_ms: 300,
            request_timeout_ms: 300,
            lookup_deadline_ms: 600,
            max_lookup_pages: 50,
            ..settings(server.uri())
        })
        .unwrap();
        let other = RefundId::generate().to_string();
        // Every page is slow and says more follow.
        Mock::given(method("GET"))
            .and(path("/v1/refunds"))
            .respond_with(
                refunds_page(
                    vec![
                        stripe_refund("re_9", "succeeded", &other, "pi_1"),
                        stripe_refund("re_8", "succeeded", &other, "pi_1"),
                    ],
                    true,
                )
                .set_delay(std::time::Duration::from_millis(200)),
            )
            .mount(&server)
            .await;
        let budget = StripeProvider::new(&StripeSettings { max_lookup_pages: 2, ..settings(server.uri()) }).unwrap();
        let payments_key =
            RefundLookup { key: PaymentId::generate().downstream_key(), ..refund_lookup(RefundId::generate()) };
        let no_intent = RefundLookup { charge_id: String::new(), ..refund_lookup(RefundId::generate()) };

        let past_deadline = provider.find_refunds(&refund_lookup(RefundId::generate())).await;
        let past_budget = budget.find_refunds(&refund_lookup(RefundId::generate())).await;
        let calls_before = server.received_requests().await.unwrap().len();
        let under_a_payments_key = provider.find_refunds(&payments_key).await;
        let of_no_intent = provider.find_refunds(&no_intent).await;

        assert!(
            matches!(past_deadline, Err(LookupError::Inconclusive(ref why)) if why.contains("600 ms")),
            "{past_deadline:?}"
        );
        assert!(
            matches!(past_budget, Err(LookupError::Inconclusive(ref why)) if why.contains("2 pages")),
            "{past_budget:?}"
        );
        assert!(matches!(under_a_payments_key, Err(LookupError::Inconclusive(_))), "{under_a_payments_key:?}");
        assert!(matches!(of_no_intent, Err(LookupError::Inconclusive(_))), "{of_no_intent:?}");
        assert_eq!(server.received_requests().await.unwrap().len(), calls_before, "neither is looked up at Stripe");
    }
}
