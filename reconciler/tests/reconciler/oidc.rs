//! Signing in at a real OpenID provider (`oidc-provider` from npm under Node, started per test by
//! `oncepay_devkit::oidc`): the authorization code flow with PKCE through the operations API, and
//! the ID token checks, each refusal leaving nobody signed in.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::JwkSet;
use oncepay_devkit::oidc::{Client, OidcProvider};
use oncepay_ops::operators::oidc::{self, OidcSettings};
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use reqwest::{StatusCode, Url};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::support::Ops;

const SECRET: &str = "a-client-secret-for-the-tests";
const CALLBACK: &str = "/v1/session/oidc/callback";

/// A client that follows no redirect by itself.
fn browser() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// The `name=value` of every `Set-Cookie` of a response.
fn cookies_of(response: &reqwest::Response) -> Vec<String> {
    response
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .map(|value| value.to_str().unwrap().split(';').next().unwrap().to_owned())
        .collect()
}

/// Signs `login` in at the provider from its authorization URL `authorize`, as a browser would (the
/// provider's own cookies kept between its pages); the URL it sends the browser back to.
async fn through_provider(authorize: &str, login: &str) -> Url {
    let http = browser();
    let mut jar: Vec<String> = Vec::new();
    let mut url = Url::parse(authorize).unwrap();
    let provider = url.origin();
    for _ in 0..6 {
        let request = if url.path().starts_with("/interaction/") {
            http.post(url.clone()).form(&[("prompt", "login"), ("login", login), ("password", "any")])
        } else {
            http.get(url.clone())
        };
        let response = request.header(COOKIE, jar.join("; ")).send().await.unwrap();
        for cookie in cookies_of(&response) {
            let name = cookie.split('=').next().unwrap().to_owned();
            jar.retain(|kept| !kept.starts_with(&format!("{name}=")));
            jar.push(cookie);
        }
        let location = response.headers().get(LOCATION).unwrap_or_else(|| panic!("no redirect from {url}"));
        url = url.join(location.to_str().unwrap()).unwrap();
        if url.origin() != provider {
            return url;
        }
    }
    panic!("the provider never sent the browser back");
}

/// What a sign-in through the operations API ends with.
struct SignedIn {
    status: StatusCode,
    body: Value,
    session: Option<String>,
    /// The way back from the provider, and the state cookie the browser held, to replay them.
    callback: Url,
    state_cookie: String,
}

/// Starts a sign-in at the API: where it sends the browser, and the state cookie it sets.
async fn begin(ops: &Ops) -> (String, String) {
    let response = browser().get(format!("{}/v1/session/oidc", ops.url)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let state_cookie = cookies_of(&response).into_iter().find(|c| c.starts_with("oncepay_oidc_state=")).unwrap();
    (response.headers()[LOCATION].to_str().unwrap().to_owned(), state_cookie)
}

/// Goes back to the API's callback with `state_cookie`.
async fn back(callback: &Url, state_cookie: &str) -> (StatusCode, Value, Option<String>) {
    let response = browser().get(callback.clone()).header(COOKIE, state_cookie).send().await.unwrap();
    let status = response.status();
    let session = cookies_of(&response)
        .into_iter()
        .find_map(|c| c.strip_prefix("oncepay_session=").filter(|value| !value.is_empty()).map(str::to_owned));
    (status, response.json().await.unwrap(), session)
}

async fn sign_in(ops: &Ops, login: &str) -> SignedIn {
    let (authorize, state_cookie) = begin(ops).await;
    let callback = through_provider(&authorize, login).await;
    let (status, body, session) = back(&callback, &state_cookie).await;
    SignedIn { status, body, session, callback, state_cookie }
}

/// The provider with oncepay's client and one other, and the operations API using it.
async fn provider_and_api(pool: &PgPool, named: Option<&str>) -> (OidcProvider, Ops) {
    let logs = tempfile::tempdir().unwrap().keep();
    // The API's address is known once it listens; the provider must know it first: a fixed port
    // would collide, so the provider allows any callback on loopback by listing this one below.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let api_port = listener.local_addr().unwrap().port();
    drop(listener);
    let oncepay = Client {
        client_id: "oncepay".into(),
        client_secret: SECRET.into(),
        redirect_uris: vec![format!("http://127.0.0.1:{api_port}{CALLBACK}")],
    };
    let other = Client {
        client_id: "other".into(),
        client_secret: SECRET.into(),
        redirect_uris: vec!["http://127.0.0.1:9/other".into()],
    };
    let provider = OidcProvider::start(&[oncepay, other], named, &logs).await.unwrap();
    let issuer = provider.url();
    let ops = Ops::start_on(pool, api_port, |url| {
        Some(OidcSettings {
            issuer,
            client_id: "oncepay".into(),
            client_secret: SECRET.to_owned().into(),
            redirect_uri: format!("{url}{CALLBACK}"),
        })
    })
    .await;
    (provider, ops)
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_operator_linked_to_an_identity_signs_in_at_the_provider_and_nobody_else_does(pool: PgPool) {
    let (_provider, ops) = provider_and_api(&pool, None).await;
    let body = json!({"name": "alice", "role": "approver", "oidc_subject": "alice@example.com", "reason": "joined"});
    let (created, _) = ops.post(&ops.admin, "/v1/operators", body).await;

    let alice = sign_in(&ops, "alice@example.com").await;
    let stranger = sign_in(&ops, "mallory@example.com").await;
    let me = browser()
        .get(format!("{}/v1/me", ops.url))
        .header(COOKIE, format!("oncepay_session={}", alice.session.clone().unwrap()))
        .send()
        .await
        .unwrap();

    assert_eq!(created, StatusCode::CREATED);
    assert_eq!(alice.status, StatusCode::OK, "{}", alice.body);
    assert_eq!(alice.body["name"], "alice");
    assert_eq!(me.status(), StatusCode::OK);
    assert_eq!(me.json::<Value>().await.unwrap()["name"], "alice");
    assert_eq!(stranger.status, StatusCode::UNAUTHORIZED);
    assert!(stranger.session.is_none());
    assert!(stranger.body["detail"].as_str().unwrap().contains("no operator is linked"), "{}", stranger.body);
    let trail: Vec<(String, String, Option<String>)> = sqlx::query!(
        "SELECT operator_name, outcome, detail->>'method' AS method FROM operator_audit
         WHERE action = 'session.sign_in' ORDER BY audit_id"
    )
    .map(|r| (r.operator_name, r.outcome, r.method))
    .fetch_all(&pool)
    .await
    .unwrap();
    let row = |name: &str, outcome: &str| (name.to_owned(), outcome.to_owned(), Some("oidc".to_owned()));
    assert_eq!(trail, vec![row("alice", "done"), row("(OpenID sign-in)", "refused")]);
    let refused = sqlx::query_scalar!(
        "SELECT detail->>'subject' FROM operator_audit WHERE action = 'session.sign_in' AND outcome = 'refused'"
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(refused.as_deref(), Some("mallory@example.com"), "the identity the provider vouched for");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_replayed_code_or_state_and_a_state_from_another_browser_sign_nobody_in(pool: PgPool) {
    let (_provider, ops) = provider_and_api(&pool, None).await;
    let body = json!({"name": "alice", "role": "viewer", "oidc_subject": "alice", "reason": "joined"});
    ops.post(&ops.admin, "/v1/operators", body).await;
    let first = sign_in(&ops, "alice").await;

    // The same way back again: its state is used up.
    let (replayed, replay_body, replay_session) = back(&first.callback, &first.state_cookie).await;
    // The used code with a fresh sign-in's state: the provider refuses the code.
    let (_, fresh_cookie) = begin(&ops).await;
    let fresh_state = fresh_cookie.strip_prefix("oncepay_oidc_state=").unwrap();
    let mut stolen = first.callback.clone();
    let code = first.callback.query_pairs().find(|(k, _)| k == "code").unwrap().1.into_owned();
    stolen.query_pairs_mut().clear().append_pair("code", &code).append_pair("state", fresh_state);
    let (code_again, code_body, _) = back(&stolen, &fresh_cookie).await;
    // A way back carrying a state this browser did not start (login CSRF).
    let (authorize, _) = begin(&ops).await;
    let attackers = through_provider(&authorize, "alice").await;
    let (_, victims_cookie) = begin(&ops).await;
    let (forced, forced_body, forced_session) = back(&attackers, &victims_cookie).await;

    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!((replayed, replay_session), (StatusCode::UNAUTHORIZED, None), "{replay_body}");
    assert!(replay_body["detail"].as_str().unwrap().contains("used already"), "{replay_body}");
    assert_eq!(code_again, StatusCode::UNAUTHORIZED, "{code_body}");
    assert!(code_body["detail"].as_str().unwrap().contains("refused the sign-in's code"), "{code_body}");
    assert_eq!((forced, forced_session), (StatusCode::UNAUTHORIZED, None), "{forced_body}");
    let sessions: i64 =
        sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM operator_sessions"#).fetch_one(&pool).await.unwrap();
    assert_eq!(sessions, 1, "only the first sign-in opened a session");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_provider_that_names_another_issuer_is_not_trusted(pool: PgPool) {
    let (_provider, ops) = provider_and_api(&pool, Some("https://login.elsewhere.example")).await;

    let response = browser().get(format!("{}/v1/session/oidc", ops.url)).send().await.unwrap();

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = response.json().await.unwrap();
    assert!(body["detail"].as_str().unwrap().contains("not the configured issuer"), "{body}");
    let pending: i64 =
        sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM oidc_sign_ins"#).fetch_one(&pool).await.unwrap();
    assert_eq!(pending, 0);
}

/// An ID token the provider issued to the client `other` for `login`, with `nonce`, and the
/// provider's published keys.
async fn token_for_other(provider: &OidcProvider, login: &str, nonce: &str) -> (String, JwkSet) {
    let verifier = "a-verifier-of-at-least-forty-three-characters-long";
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    let authorize = Url::parse_with_params(
        &format!("{}/auth", provider.url()),
        [
            ("client_id", "other"),
            ("response_type", "code"),
            ("scope", "openid"),
            ("redirect_uri", "http://127.0.0.1:9/other"),
            ("state", "s"),
            ("nonce", nonce),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
        ],
    )
    .unwrap();
    let back = through_provider(authorize.as_str(), login).await;
    let code = back.query_pairs().find(|(k, _)| k == "code").unwrap().1.into_owned();
    let token: Value = browser()
        .post(format!("{}/token", provider.url()))
        .basic_auth("other", Some(SECRET))
        .form(&[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("redirect_uri", "http://127.0.0.1:9/other"),
            ("code_verifier", verifier),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let keys = browser().get(format!("{}/jwks", provider.url())).send().await.unwrap().json().await.unwrap();
    (token["id_token"].as_str().unwrap().to_owned(), keys)
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_id_token_for_another_client_tampered_expired_or_of_another_sign_in_is_refused(pool: PgPool) {
    let (provider, _ops) = provider_and_api(&pool, None).await;
    let (token, keys) = token_for_other(&provider, "alice", "nonce-1").await;
    let issuer = provider.url();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let check = |token: &str, issuer: &str, audience: &str, nonce: &str, now: i64| {
        oidc::validate(token, &keys, issuer, audience, nonce, now).map(|claims| claims.sub).map_err(|e| e.to_string())
    };
    let parts: Vec<&str> = token.split('.').collect();
    let mut claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    claims["sub"] = json!("root");
    let forged = format!("{}.{}.{}", parts[0], URL_SAFE_NO_PAD.encode(claims.to_string()), parts[2]);
    let mut signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
    signature[0] ^= 1;
    let bad_signature = format!("{}.{}.{}", parts[0], parts[1], URL_SAFE_NO_PAD.encode(signature));
    let unsigned = format!("{}.{}.", URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#), parts[1]);

    assert_eq!(check(&token, &issuer, "other", "nonce-1", now), Ok("alice".to_owned()), "the control");
    for (what, refused) in [
        ("another audience", check(&token, &issuer, "oncepay", "nonce-1", now)),
        ("another issuer", check(&token, "https://login.elsewhere.example", "other", "nonce-1", now)),
        ("another sign-in", check(&token, &issuer, "other", "nonce-2", now)),
        ("expired", check(&token, &issuer, "other", "nonce-1", now + 2 * 3600)),
        ("a changed claim", check(&forged, &issuer, "other", "nonce-1", now)),
        ("a changed signature", check(&bad_signature, &issuer, "other", "nonce-1", now)),
        ("no signature", check(&unsigned, &issuer, "other", "nonce-1", now)),
    ] {
        assert!(refused.is_err(), "{what}: {refused:?}");
    }
}
