//! Configuration: the settings pieces every binary shares, and the one loader.
//!
//! A binary's settings are read once, in `main`, from three layers, later ones winning:
//! 1. the defaults the binary embeds (a TOML file in its crate, which also documents every key);
//! 2. a TOML file named by `--config` or `ONCEPAY_CONFIG`, if any;
//! 3. environment variables `ONCEPAY_<SECTION>__<KEY>` (e.g. `ONCEPAY_DATABASE__MAX_CONNECTIONS=8`),
//!    and `DATABASE_URL` for `database.url`; never `ONCEPAY_CONFIG` nor the tests' `ONCEPAY_TEST_*`.
//!
//! Secrets are `secrecy` types, so they never appear in `Debug` output. Nothing else in oncepay reads
//! the environment.

use std::path::{Path, PathBuf};

use figment::Figment;
use figment::error::{Actual, Kind};
use figment::providers::{Env, Format, Toml};
use secrecy::SecretString;
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// How to reach PostgreSQL.
#[derive(Debug, Clone, Deserialize)]
pub struct DatabaseSettings {
    /// A `postgres://` URL.
    pub url: SecretString,
    /// Pool size. The database is CPU-bound: a few connections per core serve best.
    pub max_connections: u32,
    /// How long a request may wait for a pooled connection before the store counts as unavailable.
    pub acquire_timeout_ms: u64,
    /// PostgreSQL `statement_timeout` for every connection of the pool.
    pub statement_timeout_ms: u64,
    /// A PEM file of the certificate authorities that may sign the server's certificate. Set, every
    /// connection is TLS and checks the server's certificate and name (`sslmode=verify-full`) unless
    /// the URL asks for `verify-ca`; unset, the URL's `sslmode` decides (`prefer` when it names none).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// Where a binary listens for HTTP.
#[derive(Debug, Clone, Deserialize)]
pub struct HttpSettings {
    /// Interface to bind, e.g. `127.0.0.1` or `0.0.0.0`.
    pub host: String,
    /// Port to bind; 0 picks a free one (tests).
    pub port: u16,
    /// The api's and the reconciler's operations endpoints (`/healthz`, `/readyz`, `/metrics`) on a
    /// port of their own, on `host`, so they need not be exposed with the public endpoints; unset
    /// serves them on `port`. The worker serves only these endpoints, on `port`.
    #[serde(default)]
    pub ops_port: Option<u16>,
}

/// Logs and traces.
#[derive(Debug, Clone, Deserialize)]
pub struct TelemetrySettings {
    /// `json` (one object per line, for production) or `text` (readable, for a terminal).
    pub log_format: LogFormat,
    /// A `tracing` filter, e.g. `info` or `info,oncepay_worker=debug`.
    pub log_filter: String,
    /// OTLP/HTTP collector base URL, e.g. `http://127.0.0.1:4318`; none means no export.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

/// Loads settings: embedded defaults, then the optional file, then the environment.
pub fn load<T: DeserializeOwned>(defaults_toml: &str, file: Option<&Path>) -> Result<T, Box<figment::Error>> {
    let mut figment = Figment::new().merge(Toml::string(defaults_toml));
    if let Some(file) = file {
        if !file.exists() {
            return Err(Box::new(figment::Error::from(format!("config file {} does not exist", file.display()))));
        }
        figment = figment.merge(Toml::file_exact(file));
    }
    // `ONCEPAY_CONFIG` names the file, and `ONCEPAY_TEST_*` are the test command's (the RabbitMQ node
    // the tests use), which every process a test starts inherits: neither is a setting.
    let setting = |key: &figment::value::UncasedStr| {
        key != "CONFIG" && !key.as_str().get(..5).is_some_and(|start| start.eq_ignore_ascii_case("TEST_"))
    };
    figment = figment.merge(Env::prefixed("ONCEPAY_").filter(setting).split("__"));
    // DATABASE_URL overrides `database.url` only for binaries that have a database: the simulator,
    // started from a shell or test that exports it, must not grow a `database` section it rejects.
    if figment.contains("database") {
        figment = figment.merge(Env::raw().only(&["DATABASE_URL"]).map(|_| "database.url".into()));
    }
    figment.extract().map_err(|error| Box::new(without_values(error)))
}

/// The same errors, with every offending text value replaced by what kind of value it was.
///
/// `main` prints the error, and a secret pasted into the wrong variable is as likely as a mistyped
/// port: the error names the key and what was expected, never what was found.
fn without_values(error: figment::Error) -> figment::Error {
    let redact = |actual: &mut Actual| {
        if matches!(actual, Actual::Str(_) | Actual::Char(_) | Actual::Bytes(_) | Actual::Other(_)) {
            *actual = Actual::Other("a value (not shown)".into());
        }
    };
    let errors: Vec<figment::Error> = error
        .into_iter()
        .map(|mut error| {
            match &mut error.kind {
                Kind::InvalidType(actual, _)
                | Kind::InvalidValue(actual, _)
                | Kind::Unsupported(actual)
                | Kind::UnsupportedKey(actual, _) => redact(actual),
                _ => {}
            }
            error
        })
        .collect();
    // `chain` puts its argument in front: rebuild from the last error, so the order is kept.
    let mut errors = errors.into_iter().rev();
    let last = errors.next().unwrap_or_else(|| figment::Error::from("invalid configuration".to_owned()));
    errors.fold(last, figment::Error::chain)
}

#[cfg(test)]
// figment's `Jail` fixes the closure's error type to its own, large `figment::Error`.
#[allow(clippy::result_large_err)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct Example {
        database: DatabaseSettings,
        http: HttpSettings,
    }

    const DEFAULTS: &str = r#"
        [database]
        url = "postgres://localhost/oncepay"
        max_connections = 8
        acquire_timeout_ms = 2000
        statement_timeout_ms = 5000
        [http]
        host = "127.0.0.1"
        port = 8080
    "#;

    #[test]
    fn files_override_defaults_and_the_environment_overrides_files() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("oncepay.toml", "[http]\nport = 9000\n[database]\nmax_connections = 4\n")?;
            jail.set_env("ONCEPAY_DATABASE__MAX_CONNECTIONS", "16");
            jail.set_env("DATABASE_URL", "postgres://elsewhere/db");

            let settings: Example = load(DEFAULTS, Some(Path::new("oncepay.toml"))).map_err(|e| e.to_string())?;

            assert_eq!(settings.http.port, 9000);
            assert_eq!(settings.http.host, "127.0.0.1");
            assert_eq!(settings.database.max_connections, 16);
            assert_eq!(settings.database.url.expose_secret(), "postgres://elsewhere/db");
            Ok(())
        });
    }

    #[test]
    fn the_variables_the_test_launcher_writes_are_the_ones_read_here() {
        figment::Jail::expect_with(|jail| {
            let spec = oncepay_devkit::process::Spec::new("api", "oncepay-api", "logs")
                .port(9100)
                .setting("database.max_connections", "12");
            for (variable, value) in &spec.env {
                jail.set_env(variable, value);
            }

            let settings: Example = load(DEFAULTS, None).map_err(|e| e.to_string())?;

            assert_eq!(settings.http.port, 9100);
            assert_eq!(settings.database.max_connections, 12);
            Ok(())
        });
    }

    /// The settings of a binary without a database (the simulator), which refuse what they lack.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct NoDatabase {
        http: HttpSettings,
    }

    #[test]
    fn the_tests_own_variables_are_never_settings() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("ONCEPAY_TEST_AMQP_URL", "amqp://127.0.0.1:5672/%2f");

            let settings: NoDatabase =
                load("[http]\nhost = \"127.0.0.1\"\nport = 8090\n", None).map_err(|e| e.to_string())?;

            assert_eq!(settings.http.port, 8090);
            Ok(())
        });
    }

    #[test]
    fn database_url_is_ignored_by_settings_without_a_database() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("DATABASE_URL", "postgres://elsewhere/db");

            let settings: NoDatabase =
                load("[http]\nhost = \"127.0.0.1\"\nport = 8090\n", None).map_err(|e| e.to_string())?;

            assert_eq!(settings.http.port, 8090);
            Ok(())
        });
    }

    #[test]
    fn a_named_file_that_does_not_exist_is_an_error() {
        let result: Result<Example, _> = load(DEFAULTS, Some(Path::new("/nonexistent/oncepay.toml")));
        assert!(result.is_err());
    }

    #[test]
    fn a_value_that_does_not_parse_is_named_by_its_key_and_never_quoted() {
        for (variable, key) in
            [("ONCEPAY_HTTP__PORT", "PORT"), ("ONCEPAY_DATABASE__MAX_CONNECTIONS", "MAX_CONNECTIONS")]
        {
            figment::Jail::expect_with(|jail| {
                jail.set_env(variable, "sk_live_pasted_into_the_wrong_variable");

                let error = load::<Example>(DEFAULTS, None).unwrap_err();

                let message = error.to_string();
                assert!(message.contains(key) && message.contains("expected"), "{message}");
                assert!(!message.contains("sk_live"), "{message}");
                assert!(!format!("{error:?}").contains("sk_live"), "{error:?}");
                Ok(())
            });
        }
    }

    #[test]
    fn secrets_do_not_show_in_debug_output() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("DATABASE_URL", "postgres://user:hunter2@db/oncepay");
            let settings: Example = load(DEFAULTS, None).map_err(|e| e.to_string())?;
            assert!(!format!("{settings:?}").contains("hunter2"));
            Ok(())
        });
    }
}
