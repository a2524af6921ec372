//! [`HttpProvider`]: the provider protocol over HTTP, with reqwest.
//!
//! Every call has a connect timeout and an overall timeout, so no call can hang a worker, and carries
//! the current W3C trace context. Charge and refund requests carry the downstream idempotency key,
//! and share one path from sending to classifying. The protocol has no provider accounts: a payment
//! charged to one (or its refund) is never sent here, and never looked up.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use tracing::instrument;

use oncepay_domain::ids::DownstreamKey;
use oncepay_domain::provider_ref::ProviderAccount;

use crate::outcome::Unsettled;
use crate::settings::ProviderSettings;
use crate::transport::{client, read_json, retry_after, trace_headers};
use crate::wire::{Charge, ChargePage, CreateCharge, CreateRefund, Refund, RefundPage};
use crate::{
    ChargeRequest, ListCharges, ListRefunds, LookupError, NotSentReason, PaymentProvider, RefundLookup, RefundOutcome,
    RefundRequest, Retrieved, SendOutcome, UncertainReason,
};

/// The most objects (charges, refunds) a lookup by idempotency key expects to see.
const KEY_LOOKUP_LIMIT: u32 = 100;

/// A listing's page read for a lookup by key: what follows the data is all that matters.
#[derive(Debug, serde::Deserialize)]
struct Listing<T> {
    data: Vec<T>,
    has_more: bool,
}

/// A provider reached over HTTP. Cheap to clone: clones share one connection pool.
#[derive(Debug, Clone)]
pub struct HttpProvider {
    client: reqwest::Client,
    base_url: String,
    api_key: SecretString,
}

impl HttpProvider {
    /// Builds the client.
    pub fn new(settings: &ProviderSettings) -> Result<Self, reqwest::Error> {
        Ok(Self {
            client: client(settings.connect_timeout_ms, settings.request_timeout_ms)?,
            base_url: settings.base_url.trim_end_matches('/').to_owned(),
            api_key: settings.api_key.clone(),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<T, LookupError> {
        let request = self
            .client
            .get(self.url(path))
            .bearer_auth(self.api_key.expose_secret())
            .headers(trace_headers())
            .query(query);
        read_json(request).await
    }

    /// The object `id` of the collection at `path` (`/v1/charges/`), or `None` when the provider has
    /// none under that id (404).
    async fn get_by_id<T: serde::de::DeserializeOwned>(&self, path: &str, id: &str) -> Result<Option<T>, LookupError> {
        // Sent as one path segment, whatever it holds.
        let mut url = reqwest::Url::parse(&self.url(path))
            .map_err(|e| LookupError::Unreadable(format!("the provider's base URL: {e}")))?;
        url.path_segments_mut()
            .map_err(|()| LookupError::Unreadable("the provider's base URL cannot take a path".to_owned()))?
            .pop_if_empty()
            .push(id);
        let request = self.client.get(url).bearer_auth(self.api_key.expose_secret()).headers(trace_headers());
        match read_json::<T>(request).await {
            Ok(found) => Ok(Some(found)),
            Err(LookupError::Status(404)) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Every object a listing at `path` holds for one idempotency key (with `filters` besides).
    /// A key normally has one; the page is large so that a misbehaving provider's extras are seen
    /// rather than cut off, and a truncated listing is an error, not a result.
    async fn find_with_key<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        key: &DownstreamKey,
        filters: &[(&str, String)],
    ) -> Result<Vec<T>, LookupError> {
        let mut query = filters.to_vec();
        query.extend([("idempotency_key", key.as_str().to_owned()), ("limit", KEY_LOOKUP_LIMIT.to_string())]);
        let page: Listing<T> = self.get_json(path, &query).await?;
        if page.has_more {
            return Err(LookupError::Unreadable(format!(
                "more than {KEY_LOOKUP_LIMIT} objects for one idempotency key"
            )));
        }
        Ok(page.data)
    }

    /// POSTs a create under `key` and classifies what comes back with `classify` (status,
    /// `Retry-After`, body, key); a call that got no response is classified as for every create.
    async fn create<O: From<Unsettled>>(
        &self,
        path: &str,
        key: &DownstreamKey,
        body: &impl serde::Serialize,
        classify: impl FnOnce(u16, Option<Duration>, &[u8], &str) -> O,
    ) -> O {
        let sent = self
            .client
            .post(self.url(path))
            .bearer_auth(self.api_key.expose_secret())
            .header("Idempotency-Key", key.as_str())
            .headers(trace_headers())
            .json(body)
            .send()
            .await;
        match sent {
            Err(error) => Unsettled::from_transport_error(&error).into(),
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_after = retry_after(response.headers());
                match response.bytes().await {
                    Ok(body) => classify(status, retry_after, &body, key.as_str()),
                    // The status line arrived and the body broke off: the request was certainly sent,
                    // and for a success the object exists.
                    Err(_) if status < 300 => Unsettled::Uncertain(UncertainReason::ConnectionLost).into(),
                    Err(_) => classify(status, retry_after, b"", key.as_str()),
                }
            }
        }
    }
}

/// Why a call in a provider account is refused: the simulator's protocol has no accounts.
fn no_accounts(account: &ProviderAccount) -> String {
    format!("the simulator's protocol has no provider accounts, so nothing can be asked of account {account}")
}

impl PaymentProvider for HttpProvider {
    #[instrument(name = "provider.create_charge", skip_all, fields(provider.outcome))]
    async fn create_charge(&self, request: &ChargeRequest) -> SendOutcome {
        if let Some(account) = &request.account {
            tracing::error!(error = no_accounts(account), "a payment charged to a provider account was not sent");
            return SendOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None };
        }
        let body = CreateCharge {
            amount: request.amount.minor_units(),
            currency: request.currency.as_str().to_owned(),
            customer: request.customer.clone(),
            metadata: request.metadata.clone(),
            payment_method: request.payment_method.clone(),
        };
        let outcome = self.create("/v1/charges", &request.downstream_key, &body, SendOutcome::from_response).await;
        tracing::Span::current().record("provider.outcome", outcome.class());
        outcome
    }

    #[instrument(name = "provider.find_by_key", skip_all)]
    async fn find_by_key(
        &self,
        key: &DownstreamKey,
        account: Option<&ProviderAccount>,
    ) -> Result<Vec<Charge>, LookupError> {
        if let Some(account) = account {
            return Err(LookupError::Inconclusive(no_accounts(account)));
        }
        self.find_with_key("/v1/charges", key, &[]).await
    }

    #[instrument(name = "provider.retrieve", skip_all)]
    async fn retrieve(&self, id: &str, account: Option<&ProviderAccount>) -> Result<Retrieved, LookupError> {
        if let Some(account) = account {
            return Err(LookupError::Inconclusive(no_accounts(account)));
        }
        Ok(self.get_by_id::<Charge>("/v1/charges/", id).await?.map_or(Retrieved::Missing, Retrieved::Final))
    }

    #[instrument(name = "provider.list_charges", skip_all)]
    async fn list_charges(&self, query: &ListCharges) -> Result<ChargePage, LookupError> {
        if let Some(account) = &query.account {
            return Err(LookupError::Inconclusive(no_accounts(account)));
        }
        let params = window(query.created_gte, query.created_lt, query.starting_after.as_deref(), query.limit);
        self.get_json("/v1/charges", &params).await
    }

    #[instrument(name = "provider.create_refund", skip_all, fields(provider.outcome))]
    async fn create_refund(&self, request: &RefundRequest) -> RefundOutcome {
        if let Some(account) = &request.account {
            tracing::error!(error = no_accounts(account), "a refund in a provider account was not sent");
            return RefundOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None };
        }
        // The protocol takes the currency from the charge; the settlement compares the refund's.
        let body = CreateRefund {
            charge: request.charge_id.clone(),
            amount: request.amount.minor_units(),
            reason: request.reason.clone(),
            metadata: request.metadata.clone(),
        };
        let outcome = self.create("/v1/refunds", &request.downstream_key, &body, RefundOutcome::from_response).await;
        tracing::Span::current().record("provider.outcome", outcome.class());
        outcome
    }

    #[instrument(name = "provider.find_refunds", skip_all)]
    async fn find_refunds(&self, lookup: &RefundLookup) -> Result<Vec<Refund>, LookupError> {
        if let Some(account) = &lookup.account {
            return Err(LookupError::Inconclusive(no_accounts(account)));
        }
        self.find_with_key::<Refund>("/v1/refunds", &lookup.key, &[("charge", lookup.charge_id.clone())]).await
    }

    #[instrument(name = "provider.list_refunds", skip_all)]
    async fn list_refunds(&self, query: &ListRefunds) -> Result<RefundPage, LookupError> {
        if let Some(account) = &query.account {
            return Err(LookupError::Inconclusive(no_accounts(account)));
        }
        let params = window(query.created_gte, query.created_lt, query.starting_after.as_deref(), query.limit);
        self.get_json("/v1/refunds", &params).await
    }

    #[instrument(name = "provider.retrieve_refund", skip_all)]
    async fn retrieve_refund(
        &self,
        id: &str,
        account: Option<&ProviderAccount>,
    ) -> Result<Option<Refund>, LookupError> {
        if let Some(account) = account {
            return Err(LookupError::Inconclusive(no_accounts(account)));
        }
        self.get_by_id("/v1/refunds/", id).await
    }
}

/// The query of a listing by creation time: `created_gte <= created < created_lt`, `limit` a page,
/// after `starting_after`.
fn window(created_gte: i64, created_lt: i64, starting_after: Option<&str>, limit: u32) -> Vec<(&'static str, String)> {
    let mut params = vec![
        ("created_gte", created_gte.to_string()),
        ("created_lt", created_lt.to_string()),
        ("limit", limit.to_string()),
    ];
    if let Some(after) = starting_after {
        params.push(("starting_after", after.to_owned()));
    }
    params
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;
    use wiremock::matchers::{body_partial_json, header, method, path, query_param};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
    use oncepay_domain::money::{Amount, Currency};

    use super::*;
    use crate::ProviderKind;

    fn settings(base_url: String) -> ProviderSettings {
        ProviderSettings {
            base_url,
            api_key: SecretString::from("sk_test"),
            connect_timeout_ms: 500,
            request_timeout_ms: 500,
            key_window_secs: 86_400,
            key_window_margin_secs: 3_600,
            kind: ProviderKind::Simulator,
            stripe: None,
        }
    }

    fn request() -> ChargeRequest {
        let request = ChargeRequest::for_payment(
            TenantId::generate(),
            PaymentId::generate(),
            Amount::new(1999).unwrap(),
            Currency::parse("EUR").unwrap(),
            "cus_1".into(),
            &BTreeMap::new(),
        );
        ChargeRequest { payment_method: Some("pm_card_visa".into()), ..request }
    }

    fn charge_json(key: &str) -> serde_json::Value {
        json!({"id": "ch_1", "status": "succeeded", "amount": 1999, "currency": "EUR", "customer": "cus_1",
               "idempotency_key": key, "created": 1_763_800_000})
    }

    #[tokio::test]
    async fn a_charge_is_sent_with_the_downstream_key_and_a_201_is_charged() {
        let server = MockServer::start().await;
        let request = request();
        Mock::given(method("POST"))
            .and(path("/v1/charges"))
            .and(header("Idempotency-Key", request.downstream_key.as_str()))
            .and(header("Authorization", "Bearer sk_test"))
            .and(body_partial_json(json!({"amount": 1999, "payment_method": "pm_card_visa"})))
            .respond_with(ResponseTemplate::new(201).set_body_json(charge_json(request.downstream_key.as_str())))
            .expect(1)
            .mount(&server)
            .await;
        let provider = HttpProvider::new(&settings(server.uri())).unwrap();

        let outcome = provider.create_charge(&request).await;

        assert!(matches!(outcome, SendOutcome::Charged(ref c) if c.id == "ch_1"), "{outcome:?}");
    }

    #[tokio::test]
    async fn a_response_later_than_the_timeout_is_uncertain() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(201).set_delay(Duration::from_secs(2)))
            .mount(&server)
            .await;
        let provider = HttpProvider::new(&settings(server.uri())).unwrap();

        let outcome = provider.create_charge(&request()).await;

        assert_eq!(outcome, SendOutcome::Uncertain(UncertainReason::Timeout));
    }

    #[tokio::test]
    async fn a_refused_connection_is_not_sent() {
        // Bind and drop a listener to get a port nobody listens on.
        let port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let provider = HttpProvider::new(&settings(format!("http://127.0.0.1:{port}"))).unwrap();

        let outcome = provider.create_charge(&request()).await;

        assert_eq!(outcome, SendOutcome::NotSent { reason: NotSentReason::ConnectFailed, retry_after: None });
    }

    #[tokio::test]
    async fn a_connection_reset_after_the_request_was_read_is_uncertain() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buffer = vec![0u8; 4096];
            let _ = socket.read(&mut buffer).await;
            // Read the request, then vanish without a word.
            drop(socket);
        });
        let provider = HttpProvider::new(&settings(format!("http://127.0.0.1:{port}"))).unwrap();

        let outcome = provider.create_charge(&request()).await;

        assert_eq!(outcome, SendOutcome::Uncertain(UncertainReason::ConnectionLost));
    }

    #[tokio::test]
    async fn lookups_by_key_and_by_window_read_the_listing() {
        let server = MockServer::start().await;
        let request = request();
        Mock::given(method("GET"))
            .and(path("/v1/charges"))
            .and(query_param("idempotency_key", request.downstream_key.as_str()))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!({"data": [charge_json(request.downstream_key.as_str())], "has_more": false})),
            )
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/charges"))
            .and(query_param("created_gte", "10"))
            .and(query_param("created_lt", "20"))
            .and(query_param("starting_after", "ch_0"))
            .and(query_param("limit", "2"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [], "has_more": false})))
            .mount(&server)
            .await;
        let provider = HttpProvider::new(&settings(server.uri())).unwrap();

        let found = provider.find_by_key(&request.downstream_key, None).await.unwrap();
        let page = provider
            .list_charges(&ListCharges {
                account: None,
                created_gte: 10,
                created_lt: 20,
                starting_after: Some("ch_0".into()),
                limit: 2,
            })
            .await
            .unwrap();

        assert_eq!(found.len(), 1);
        assert_eq!(found[0].idempotency_key, request.downstream_key.as_str());
        assert!(page.data.is_empty());
    }

    #[tokio::test]
    async fn nothing_is_asked_in_a_provider_account_the_protocol_does_not_have() {
        let server = MockServer::start().await;
        let provider = HttpProvider::new(&settings(server.uri())).unwrap();
        let account = ProviderAccount::parse("acct_1").unwrap();
        let request = ChargeRequest { account: Some(account.clone()), ..request() };
        let list = ListCharges {
            account: Some(account.clone()),
            created_gte: 10,
            created_lt: 20,
            starting_after: None,
            limit: 2,
        };

        let outcome = provider.create_charge(&request).await;
        let found = provider.find_by_key(&request.downstream_key, Some(&account)).await;
        let page = provider.list_charges(&list).await;

        assert_eq!(outcome, SendOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None });
        assert!(matches!(found, Err(LookupError::Inconclusive(_))), "{found:?}");
        assert!(matches!(page, Err(LookupError::Inconclusive(_))), "{page:?}");
        assert!(server.received_requests().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_lookup_whose_body_names_a_member_twice_is_unreadable() {
        let key = PaymentId::generate().downstream_key();
        let charge = charge_json(key.as_str()).to_string();
        let cases = [
            // Which of two charges, which payment, whether more follow: each reader may say another.
            charge
                .replace(r#""created""#, r#""metadata":{"oncepay_payment_id":"a","oncepay_payment_id":"b"},"created""#),
            charge.replace(r#""id":"ch_1""#, r#""id":"ch_1","note":1,"note":2"#),
        ]
        .map(|charge| format!(r#"{{"data":[{charge}],"has_more":false}}"#))
        .into_iter()
        .chain([r#"{"data":[],"has_more":false,"has_more":true}"#.to_owned()]);
        for body in cases {
            let server = MockServer::start().await;
            Mock::given(method("GET"))
                .respond_with(ResponseTemplate::new(200).set_body_raw(body.clone(), "application/json"))
                .mount(&server)
                .await;
            let provider = HttpProvider::new(&settings(server.uri())).unwrap();

            let found = provider.find_by_key(&key, None).await;
            let page = provider
                .list_charges(&ListCharges {
                    account: None,
                    created_gte: 0,
                    created_lt: 1,
                    starting_after: None,
                    limit: 10,
                })
                .await;

            assert!(matches!(found, Err(LookupError::Unreadable(_))), "{body}: {found:?}");
            assert!(matches!(page, Err(LookupError::Unreadable(_))), "{body}: {page:?}");
        }
    }

    #[tokio::test]
    async fn a_charge_is_retrieved_by_id_and_a_missing_one_is_missing() {
        let server = MockServer::start().await;
        let key = PaymentId::generate().downstream_key();
        Mock::given(method("GET"))
            .and(path("/v1/charges/ch_1"))
            .respond_with(ResponseTemplate::new(200).set_body_json(charge_json(key.as_str())))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/charges/ch_gone"))
            .respond_with(
                ResponseTemplate::new(404)
                    .set_body_json(json!({"error": {"code": "resource_missing", "message": "No such charge."}})),
            )
            .mount(&server)
            .await;
        let provider = HttpProvider::new(&settings(server.uri())).unwrap();

        let found = provider.retrieve("ch_1", None).await.unwrap();
        let gone = provider.retrieve("ch_gone", None).await.unwrap();

        assert!(matches!(found, Retrieved::Final(ref charge) if charge.id == "ch_1"), "{found:?}");
        assert_eq!(gone, Retrieved::Missing);
    }

    fn refund_request() -> RefundRequest {
        RefundRequest::for_refund(
            TenantId::generate(),
            PaymentId::generate(),
            RefundId::generate(),
            "ch_1".into(),
            Amount::new(500).unwrap(),
            Currency::parse("EUR").unwrap(),
            Some("requested_by_customer".into()),
            &BTreeMap::new(),
        )
    }

    fn refund_json(key: &str, status: &str) -> serde_json::Value {
        json!({"id": "re_1", "status": status, "charge": "ch_1", "amount": 500, "currency": "EUR",
               "idempotency_key": key, "created": 1_763_800_000})
    }

    fn lookup(request: &RefundRequest) -> RefundLookup {
        RefundLookup { key: request.downstream_key.clone(), charge_id: request.charge_id.clone(), account: None }
    }

    #[tokio::test]
    async fn a_refund_is_sent_with_its_downstream_key_and_a_201_is_refunded() {
        let server = MockServer::start().await;
        let request = refund_request();
        let key = request.downstream_key.as_str();
        Mock::given(method("POST"))
            .and(path("/v1/refunds"))
            .and(header("Idempotency-Key", key))
            .and(header("Authorization", "Bearer sk_test"))
            .and(body_partial_json(json!({"charge": "ch_1", "amount": 500, "reason": "requested_by_customer"})))
            .respond_with(ResponseTemplate::new(201).set_body_json(refund_json(key, "succeeded")))
            .expect(1)
            .mount(&server)
            .await;
        let provider = HttpProvider::new(&settings(server.uri())).unwrap();

        let outcome = provider.create_refund(&request).await;

        assert!(matches!(outcome, RefundOutcome::Refunded(ref r) if r.id == "re_1"), "{outcome:?}");
        let sent: serde_json::Value =
            serde_json::from_slice(&server.received_requests().await.unwrap()[0].body).unwrap();
        assert_eq!(
            sent["metadata"][crate::metadata_keys::REFUND_ID],
            request.downstream_key.refund_id().unwrap().to_string()
        );
        assert_eq!(sent.get("currency"), None, "the protocol takes the currency from the charge");
    }

    #[tokio::test]
    async fn a_refund_is_classified_as_a_charge_is_when_the_response_is_late_or_lost() {
        let late = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(201).set_delay(Duration::from_secs(2)))
            .mount(&late)
            .await;
        let port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let late = HttpProvider::new(&settings(late.uri())).unwrap();
        let refused = HttpProvider::new(&settings(format!("http://127.0.0.1:{port}"))).unwrap();

        let timed_out = late.create_refund(&refund_request()).await;
        let not_sent = refused.create_refund(&refund_request()).await;

        assert_eq!(timed_out, RefundOutcome::Uncertain(UncertainReason::Timeout));
        assert_eq!(not_sent, RefundOutcome::NotSent { reason: NotSentReason::ConnectFailed, retry_after: None });
    }

    #[tokio::test]
    async fn refunds_are_found_by_charge_and_key() {
        let server = MockServer::start().await;
        let request = refund_request();
        let key = request.downstream_key.as_str();
        Mock::given(method("GET"))
            .and(path("/v1/refunds"))
            .and(query_param("charge", "ch_1"))
            .and(query_param("idempotency_key", key))
            .and(query_param("limit", "100"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!({"data": [refund_json(key, "failed")], "has_more": false})),
            )
            .expect(1)
            .mount(&server)
            .await;
        let provider = HttpProvider::new(&settings(server.uri())).unwrap();

        let found = provider.find_refunds(&lookup(&request)).await.unwrap();

        assert_eq!(found.len(), 1);
        assert_eq!((found[0].id.as_str(), found[0].status), ("re_1", crate::RefundState::Failed));
    }

    #[tokio::test]
    async fn a_refund_lookup_that_fails_is_cut_short_or_names_a_member_twice_is_an_error() {
        let key = RefundId::generate().downstream_key();
        let refund = refund_json(key.as_str(), "succeeded").to_string();
        let cases = [
            (200, format!(r#"{{"data":[{refund}],"has_more":true}}"#), "unreadable"),
            (200, r#"{"data":[],"has_more":false,"has_more":true}"#.to_owned(), "unreadable"),
            (
                200,
                format!(
                    r#"{{"data":[{}],"has_more":false}}"#,
                    refund.replace(r#""amount":500"#, r#""amount":500,"amount":5"#)
                ),
                "unreadable",
            ),
            (503, String::new(), "status"),
            (404, String::new(), "status"),
        ];
        for (status, body, error) in cases {
            let server = MockServer::start().await;
            Mock::given(method("GET"))
                .respond_with(ResponseTemplate::new(status).set_body_raw(body.clone(), "application/json"))
                .mount(&server)
                .await;
            let provider = HttpProvider::new(&settings(server.uri())).unwrap();
            let lookup = RefundLookup { key: key.clone(), charge_id: "ch_1".into(), account: None };

            let found = provider.find_refunds(&lookup).await;

            let class = match found {
                Err(LookupError::Unreadable(_)) => "unreadable",
                Err(LookupError::Status(_)) => "status",
                _ => "other",
            };
            assert_eq!(class, error, "HTTP {status} {body}: {found:?}");
        }
    }

    #[tokio::test]
    async fn no_refund_is_asked_or_looked_up_in_a_provider_account() {
        let server = MockServer::start().await;
        let provider = HttpProvider::new(&settings(server.uri())).unwrap();
        let account = ProviderAccount::parse("acct_1").unwrap();
        let request = RefundRequest { account: Some(account.clone()), ..refund_request() };
        let list = ListRefunds {
            account: Some(account.clone()),
            created_gte: 10,
            created_lt: 20,
            starting_after: None,
            limit: 2,
        };

        let outcome = provider.create_refund(&request).await;
        let found = provider.find_refunds(&RefundLookup { account: Some(account.clone()), ..lookup(&request) }).await;
        let page = provider.list_refunds(&list).await;
        let read = provider.retrieve_refund("re_1", Some(&account)).await;

        assert_eq!(outcome, RefundOutcome::NotSent { reason: NotSentReason::LocalError, retry_after: None });
        assert!(matches!(found, Err(LookupError::Inconclusive(_))), "{found:?}");
        assert!(matches!(page, Err(LookupError::Inconclusive(_))), "{page:?}");
        assert!(matches!(read, Err(LookupError::Inconclusive(_))), "{read:?}");
        assert!(server.received_requests().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn refunds_are_listed_by_window_and_read_again_by_id() {
        let server = MockServer::start().await;
        let key = RefundId::generate().downstream_key();
        Mock::given(method("GET"))
            .and(path("/v1/refunds"))
            .and(query_param("created_gte", "10"))
            .and(query_param("created_lt", "20"))
            .and(query_param("starting_after", "re_0"))
            .and(query_param("limit", "2"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!({"data": [refund_json(key.as_str(), "pending")], "has_more": true})),
            )
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/refunds/re_1"))
            .respond_with(ResponseTemplate::new(200).set_body_json(refund_json(key.as_str(), "succeeded")))
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/refunds/re_gone"))
            .respond_with(
                ResponseTemplate::new(404)
                    .set_body_json(json!({"error": {"code": "resource_missing", "message": "No such refund."}})),
            )
            .mount(&server)
            .await;
        let provider = HttpProvider::new(&settings(server.uri())).unwrap();
        let query = ListRefunds {
            account: None,
            created_gte: 10,
            created_lt: 20,
            starting_after: Some("re_0".into()),
            limit: 2,
        };

        let page = provider.list_refunds(&query).await.unwrap();
        let read = provider.retrieve_refund("re_1", None).await.unwrap();
        let gone = provider.retrieve_refund("re_gone", None).await.unwrap();

        assert!(page.has_more);
        assert_eq!(
            page.data.iter().map(|r| (r.id.as_str(), r.status)).collect::<Vec<_>>(),
            [("re_1", crate::RefundState::Pending)]
        );
        assert_eq!(read.map(|r| (r.id, r.status)), Some(("re_1".to_owned(), crate::RefundState::Succeeded)));
        assert_eq!(gone, None);
    }

    #[tokio::test]
    async fn a_failing_lookup_is_an_error_not_an_empty_result() {
        let server = MockServer::start().await;
        Mock::given(method("GET")).respond_with(ResponseTemplate::new(503)).mount(&server).await;
        let provider = HttpProvider::new(&settings(server.uri())).unwrap();

        let result = provider.find_by_key(&PaymentId::generate().downstream_key(), None).await;

        assert!(matches!(result, Err(LookupError::Status(503))), "{result:?}");
    }
}
