//! [`HttpProvider`]: the provider protocol over HTTP, with reqwest.
//!
//! Every call has a connect timeout and an overall timeout, so no call can hang a worker, and carries
//! the current W3C trace context. Charge requests carry the downstream idempotency key. The protocol
//! has no provider accounts: a payment charged to one is never sent here, and never looked up.

use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use secrecy::{ExposeSecret, SecretString};
use tracing::instrument;

use oncepay_domain::ids::DownstreamKey;
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_domain::strict_json;
use oncepay_service::telemetry;

use crate::configured::ProviderSettings;
use crate::wire::{Charge, ChargePage, CreateCharge};
use crate::{
    ChargeRequest, ListCharges, LookupError, NotSentReason, PaymentProvider, Retrieved, SendOutcome, UncertainReason,
};

/// The most charges a lookup by idempotency key expects to see.
const KEY_LOOKUP_LIMIT: u32 = 100;

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
}

/// A client for a provider's API: TLS through rustls, and both timeouts on every call, so no call can
/// hang a worker.
pub(crate) fn client(connect_timeout_ms: u64, request_timeout_ms: u64) -> Result<reqwest::Client, reqwest::Error> {
    oncepay_service::tls::install_provider();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(connect_timeout_ms))
        .timeout(Duration::from_millis(request_timeout_ms))
        .build()
}

/// Sends a lookup and reads its JSON: anything but a 200 with a readable body is an error, never an
/// empty result. Read strictly: a body that names a member twice is unreadable, never last-wins.
pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    request: reqwest::RequestBuilder,
) -> Result<T, LookupError> {
    let response = request.send().await.map_err(LookupError::Transport)?;
    let status = response.status().as_u16();
    if status != 200 {
        return Err(LookupError::Status(status));
    }
    let body = response.bytes().await.map_err(LookupError::Transport)?;
    strict_json::from_slice(&body).map_err(|e| LookupError::Unreadable(e.to_string()))
}

/// The current W3C trace context, as request headers.
pub(crate) fn trace_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in telemetry::current_trace_headers() {
        if let (Ok(name), Ok(value)) =
            (reqwest::header::HeaderName::from_bytes(name.as_bytes()), reqwest::header::HeaderValue::from_str(&value))
        {
            headers.insert(name, value);
        }
    }
    headers
}

/// Why a call in a provider account is refused: the simulator's protocol has no accounts.
fn no_accounts(account: &ProviderAccount) -> String {
    format!("the simulator's protocol has no provider accounts, so nothing can be asked of account {account}")
}

/// A `Retry-After` in seconds, if the response carries one.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
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
        let sent = self
            .client
            .post(self.url("/v1/charges"))
            .bearer_auth(self.api_key.expose_secret())
            .header("Idempotency-Key", request.downstream_key.as_str())
            .headers(trace_headers())
            .json(&body)
            .send()
            .await;
        let outcome = match sent {
            Err(error) => SendOutcome::from_transport_error(&error),
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_after = retry_after(response.headers());
                match response.bytes().await {
                    Ok(body) => SendOutcome::from_response(status, retry_after, &body, request.downstream_key.as_str()),
                    // The status line arrived and the body broke off: the request was certainly sent,
                    // and for a success the charge exists.
                    Err(_) if status < 300 => SendOutcome::Uncertain(UncertainReason::ConnectionLost),
                    Err(_) => SendOutcome::from_response(status, retry_after, b"", request.downstream_key.as_str()),
                }
            }
        };
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
        // A key normally has one charge; the page is large so that a misbehaving provider's extra
        // charges are seen rather than cut off, and a truncated listing is an error, not a result.
        let page: ChargePage = self
            .get_json(
                "/v1/charges",
                &[("idempotency_key", key.as_str().to_owned()), ("limit", KEY_LOOKUP_LIMIT.to_string())],
            )
            .await?;
        if page.has_more {
            return Err(LookupError::Unreadable(format!(
                "more than {KEY_LOOKUP_LIMIT} charges for one idempotency key"
            )));
        }
        Ok(page.data)
    }

    #[instrument(name = "provider.retrieve", skip_all)]
    async fn retrieve(&self, id: &str, account: Option<&ProviderAccount>) -> Result<Retrieved, LookupError> {
        if let Some(account) = account {
            return Err(LookupError::Inconclusive(no_accounts(account)));
        }
        // Sent as one path segment, whatever it holds.
        let mut url = reqwest::Url::parse(&self.url("/v1/charges/"))
            .map_err(|e| LookupError::Unreadable(format!("the provider's base URL: {e}")))?;
        url.path_segments_mut()
            .map_err(|()| LookupError::Unreadable("the provider's base URL cannot take a path".to_owned()))?
            .pop_if_empty()
            .push(id);
        let request = self.client.get(url).bearer_auth(self.api_key.expose_secret()).headers(trace_headers());
        match read_json::<Charge>(request).await {
            Ok(charge) => Ok(Retrieved::Final(charge)),
            Err(LookupError::Status(404)) => Ok(Retrieved::Missing),
            Err(error) => Err(error),
        }
    }

    #[instrument(name = "provider.list_charges", skip_all)]
    async fn list_charges(&self, query: &ListCharges) -> Result<ChargePage, LookupError> {
        if let Some(account) = &query.account {
            return Err(LookupError::Inconclusive(no_accounts(account)));
        }
        let mut params = vec![
            ("created_gte", query.created_gte.to_string()),
            ("created_lt", query.created_lt.to_string()),
            ("limit", query.limit.to_string()),
        ];
        if let Some(after) = &query.starting_after {
            params.push(("starting_after", after.clone()));
        }
        self.get_json("/v1/charges", &params).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;
    use wiremock::matchers::{body_partial_json, header, method, path, query_param};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use oncepay_domain::ids::{PaymentId, TenantId};
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

    #[tokio::test]
    async fn a_failing_lookup_is_an_error_not_an_empty_result() {
        let server = MockServer::start().await;
        Mock::given(method("GET")).respond_with(ResponseTemplate::new(503)).mount(&server).await;
        let provider = HttpProvider::new(&settings(server.uri())).unwrap();

        let result = provider.find_by_key(&PaymentId::generate().downstream_key(), None).await;

        assert!(matches!(result, Err(LookupError::Status(503))), "{result:?}");
    }
}
