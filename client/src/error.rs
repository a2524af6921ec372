//! What can go wrong talking to the api, as types a caller can branch on.
//!
//! No message here ever contains the API key: it is only ever in a request header.

/// A failed request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A transport failure: alone, when the request could not even be built (not worth retrying);
    /// as the `last` of [`Error::GaveUp`] for a timeout or a refused, reset or dropped connection.
    #[error("could not talk to the oncepay api")]
    Http(#[source] reqwest::Error),
    /// The api responded with an error that retrying will not change.
    #[error("the oncepay api responded with {status}: {problem}")]
    Problem {
        /// The HTTP status.
        status: u16,
        /// The RFC 9457 details.
        problem: crate::Problem,
    },
    /// The api responded with success, but the body is not what the contract describes.
    #[error("could not read the oncepay api's response (status {status})")]
    Decode {
        /// The HTTP status of the response.
        status: u16,
        /// What did not parse.
        #[source]
        source: serde_json::Error,
    },
    /// Every attempt failed in a way worth retrying (transport, timeout, 409, 429, 5xx), until
    /// the attempts or the time ran out: no response now. The request may or may not have been
    /// accepted, and sending the same [`PaymentIntent`](crate::PaymentIntent) again later is safe.
    #[error("gave up after {attempts} attempt(s)")]
    GaveUp {
        /// Attempts made.
        attempts: u32,
        /// The last attempt's failure ([`Error::Http`] or [`Error::Problem`]).
        #[source]
        last: Box<Error>,
    },
}

impl Error {
    /// The HTTP status the api responded with, for this error or the last attempt behind it.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Http(_) => None,
            Self::Problem { status, .. } | Self::Decode { status, .. } => Some(*status),
            Self::GaveUp { last, .. } => last.status(),
        }
    }

    /// The api's problem details, for this error or the last attempt behind it.
    pub fn problem(&self) -> Option<&crate::Problem> {
        match self {
            Self::Problem { problem, .. } => Some(problem),
            Self::GaveUp { last, .. } => last.problem(),
            Self::Http(_) | Self::Decode { .. } => None,
        }
    }
}

/// A [`Client`](crate::Client) that cannot be built from what it was given.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The base URL is not an absolute `http` or `https` URL.
    #[error("the api base URL must be an absolute http(s) URL without credentials: {reason}")]
    InvalidBaseUrl {
        /// What is wrong with it (the URL itself is not repeated).
        reason: String,
    },
    /// The API key is empty or has characters a header cannot carry.
    #[error("the API key must be non-empty visible ASCII")]
    InvalidApiKey,
    /// The HTTP stack could not be set up.
    #[error("could not set up the HTTP client")]
    Http(#[source] reqwest::Error),
}
