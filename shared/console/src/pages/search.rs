//! What the search (a form, `crate::forms`) shows: the payments it found.

use askama::Template;
use oncepay_domain::ids::PaymentId;

use crate::Chrome;

/// A payment the search found.
pub(crate) struct FoundLine {
    pub(crate) payment_id: PaymentId,
    pub(crate) matched: String,
    pub(crate) tenant: String,
    pub(crate) status: String,
    pub(crate) amount: String,
    pub(crate) created_at: String,
}

/// What a search found.
#[derive(Template)]
#[template(path = "search.html")]
pub(crate) struct SearchPage {
    pub(crate) chrome: Option<Chrome>,
    pub(crate) title: String,
    pub(crate) asked: String,
    pub(crate) found: Vec<FoundLine>,
}
