//! How the binaries connect to PostgreSQL (`db::connect_options`), against real servers. TLS
//! (`database.ca_file`) against a server that refuses plain TCP, with a certificate authority and a
//! server certificate for `localhost` made here: the connection is encrypted and checked, and a
//! server the CA did not sign, or a name the certificate does not carry, is refused. And no
//! connection compiles its statements with JIT.

// The helpers below are test code too; clippy's test allowance only covers `#[test]` functions.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use oncepay_devkit::pg::{Cluster, Durability, Tls};
use oncepay_service::config::DatabaseSettings;
use oncepay_store::db;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use sqlx::{Connection, PgConnection};

/// A certificate authority, as a PEM file for `database.ca_file`.
struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Authority {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        Self { issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap() }
    }

    /// A server certificate for `localhost` and its key, both PEM.
    fn server_certificate(&self) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let certificate =
            CertificateParams::new(vec!["localhost".to_owned()]).unwrap().signed_by(&key, &self.issuer).unwrap();
        (certificate.pem(), key.serialize_pem())
    }

    fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.issuer.pem()).unwrap();
        path
    }
}

fn settings(url: String, ca_file: Option<PathBuf>) -> DatabaseSettings {
    DatabaseSettings {
        url: url.into(),
        max_connections: 1,
        acquire_timeout_ms: 5_000,
        statement_timeout_ms: 5_000,
        ca_file,
    }
}

/// Connects as the binaries do, and says whether the connection is encrypted.
async fn connect(settings: &DatabaseSettings) -> Result<bool, sqlx::Error> {
    let options = db::connect_options(settings, "oncepay-tls-test")?;
    let mut connection = PgConnection::connect_with(&options).await?;
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetch_one(&mut connection).await
}

/// Asserts the connection was refused for its certificate, for `why` (rustls's name of the reason).
fn assert_certificate_refused(result: &Result<bool, sqlx::Error>, why: &str) {
    let error = format!("{result:?}");
    assert!(error.contains("InvalidCertificate") && error.contains(why), "refused for {why}, not: {error}");
}

#[tokio::test]
async fn with_a_ca_file_every_connection_is_tls_and_checks_the_server() {
    let authority = Authority::new();
    let (certificate_pem, key_pem) = authority.server_certificate();
    let cluster =
        Cluster::start_with_tls(Durability::Fast, &Tls { certificate_pem: &certificate_pem, key_pem: &key_pem })
            .await
            .unwrap();
    let files = tempfile::tempdir().unwrap();
    let ca_file = authority.write(files.path(), "ca.pem");
    let by_name = format!("postgres://postgres@localhost:{}/postgres", cluster.port());
    let by_address = cluster.url("postgres");

    let encrypted = connect(&settings(by_name.clone(), Some(ca_file.clone()))).await.unwrap();
    assert!(encrypted, "a connection with a CA file is TLS");

    // The server takes TLS only, so without a CA file and with TLS turned off nothing connects.
    let plain = connect(&settings(format!("{by_name}?sslmode=disable"), None)).await;
    assert!(plain.is_err(), "the server must refuse plain TCP: {plain:?}");

    // Signed by another authority: refused, even though the URL asked for no check.
    let stranger = Authority::new().write(files.path(), "stranger.pem");
    let refused = connect(&settings(format!("{by_name}?sslmode=require"), Some(stranger))).await;
    assert_certificate_refused(&refused, "BadSignature");

    // The certificate names `localhost`, not 127.0.0.1: refused by name, unless the URL settles
    // for the authority alone.
    let misnamed = connect(&settings(by_address.clone(), Some(ca_file.clone()))).await;
    assert_certificate_refused(&misnamed, "NotValidForName");
    let by_authority = connect(&settings(format!("{by_address}?sslmode=verify-ca"), Some(ca_file))).await.unwrap();
    assert!(by_authority);
}

#[test]
fn a_ca_file_that_is_not_there_is_a_clear_error() {
    let error =
        db::connect_options(&settings("postgres://localhost/x".to_owned(), Some("/nowhere/ca.pem".into())), "t")
            .unwrap_err();
    assert!(error.to_string().contains("database.ca_file /nowhere/ca.pem"), "{error}");
}

/// Every connection the binaries make runs without JIT compilation (`db::connect_options`): a
/// claim whose plan looks expensive spent longer compiling than running.
#[tokio::test]
async fn every_connection_runs_without_jit() {
    let cluster = Cluster::start(Durability::Fast).await.unwrap();
    let options = db::connect_options(&settings(cluster.url("postgres"), None), "oncepay-jit-test").unwrap();
    let mut connection = PgConnection::connect_with(&options).await.unwrap();

    let jit: String = sqlx::query_scalar("SHOW jit").fetch_one(&mut connection).await.unwrap();

    assert_eq!(jit, "off");
}
