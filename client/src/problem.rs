//! RFC 9457 problem details, as the api returns every error, read back into a type. Reading a
//! problem never fails.

use std::fmt;

use reqwest::StatusCode;
use serde::{Deserialize, Serialize};

/// The `type` of a problem that says nothing beyond its HTTP status (RFC 9457 §4.2.1).
pub const ABOUT_BLANK: &str = "about:blank";

/// What the api says went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// A stable URI naming the kind of problem, e.g.
    /// `https://oncepay.dev/problems/idempotency-key-reused`; branch on this.
    #[serde(rename = "type", default = "about_blank")]
    pub type_uri: String,
    /// A short summary of the kind.
    #[serde(default)]
    pub title: String,
    /// The HTTP status, as the api put it in the body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// What went wrong with this request.
    #[serde(default)]
    pub detail: String,
    /// For an invalid request: each field that is wrong.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
}

/// One field the api rejected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldError {
    /// The JSON field, e.g. `amount` or `metadata.order`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

fn about_blank() -> String {
    ABOUT_BLANK.to_owned()
}

impl Problem {
    /// Reads the body of an error response with `status`.
    ///
    /// A body that is not a problem document (a proxy's HTML page, an empty body) becomes type
    /// `about:blank` with the status's reason phrase as its title, which is what RFC 9457 says
    /// such a response means.
    pub(crate) fn from_response(status: StatusCode, body: &[u8]) -> Self {
        serde_json::from_slice(body).unwrap_or_else(|_| Self {
            type_uri: about_blank(),
            title: status.canonical_reason().unwrap_or("Unexpected status").to_owned(),
            status: Some(status.as_u16()),
            detail: String::new(),
            errors: Vec::new(),
        })
    }

    /// The last segment of the `type` URI (`idempotency-key-reused`), the stable name of the kind.
    pub fn kind(&self) -> &str {
        self.type_uri.rsplit('/').next().unwrap_or(&self.type_uri)
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.title.is_empty() { self.kind() } else { &self.title })?;
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        for (i, error) in self.errors.iter().enumerate() {
            let separator = if i == 0 { " (" } else { "; " };
            write!(f, "{separator}{}: {}", error.field, error.message)?;
        }
        if !self.errors.is_empty() {
            f.write_str(")")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_document_is_read_with_its_field_errors() {
        let body = br#"{
            "type": "https://oncepay.dev/problems/invalid-request",
            "title": "Invalid request",
            "status": 400,
            "detail": "2 fields are invalid",
            "errors": [
                {"field": "amount", "message": "must be at least 1"},
                {"field": "currency", "message": "must be three upper-case letters"}
            ]
        }"#;

        let problem = Problem::from_response(StatusCode::BAD_REQUEST, body);

        assert_eq!(problem.kind(), "invalid-request");
        assert_eq!(problem.status, Some(400));
        assert_eq!(problem.errors.len(), 2);
        assert_eq!(
            problem.to_string(),
            "Invalid request: 2 fields are invalid (amount: must be at least 1; currency: must be three upper-case letters)"
        );
    }

    #[test]
    fn a_body_that_is_not_a_problem_becomes_about_blank_with_the_reason_phrase() {
        for body in [&b"<html>bad gateway</html>"[..], b"", b"[1, 2]"] {
            let problem = Problem::from_response(StatusCode::BAD_GATEWAY, body);

            assert_eq!(problem.type_uri, ABOUT_BLANK);
            assert_eq!(problem.title, "Bad Gateway");
            assert_eq!(problem.status, Some(502));
            assert_eq!(problem.to_string(), "Bad Gateway");
        }
    }

    #[test]
    fn missing_members_take_their_rfc_9457_defaults() {
        let problem = Problem::from_response(StatusCode::CONFLICT, br#"{"detail": "busy"}"#);

        assert_eq!(problem.type_uri, ABOUT_BLANK);
        assert_eq!(problem.to_string(), "about:blank: busy");
    }
}
