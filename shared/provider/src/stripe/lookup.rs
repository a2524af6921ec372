//! What a lookup of one payment at Stripe found: its charges, certainly none, or can't tell. Pure:
//! the client does the I/O and feeds the pages in.
//!
//! Stripe's objects do not carry the idempotency key, so a payment's intent is found by the metadata
//! oncepay puts on it. Search finds it quickly but is eventually consistent: a hit is evidence, a
//! miss proves nothing. The list API is consistent, so a list of the whole window since the payment
//! was created that shows no intent naming the payment proves there is none. Only that may conclude
//! [`Lookup::CertainlyNone`], the result that lets the reconciler resend.

use oncepay_domain::ids::PaymentId;

use crate::{Charge, ChargeStatus, LookupError};

use super::wire::{IntentStatus, ListPage, PaymentIntent, SearchPage, Settled};

/// What Stripe holds for one payment.
#[derive(Debug)]
pub enum Lookup {
    /// Final intents for the payment, as charges (normally one). A success anywhere means money moved.
    Found(Vec<Charge>),
    /// A consistent source shows no intent for the payment.
    CertainlyNone,
    /// Nothing either way can be concluded yet.
    CantTell(CantTell),
}

/// Why a lookup concluded nothing.
#[derive(Debug, thiserror::Error)]
pub enum CantTell {
    /// Search found nothing; search lags behind writes, so that proves nothing.
    #[error("Stripe's search found no intent for the payment, and search lags behind writes")]
    SearchMissed,
    /// Search could not be asked.
    #[error("Stripe's search failed: {0}")]
    SearchFailed(#[source] LookupError),
    /// An intent for the payment exists, but has not finished.
    #[error("intent {intent_id} for the payment has not finished (status {status:?})")]
    NotFinal {
        /// The intent.
        intent_id: String,
        /// Where it is.
        status: IntentStatus,
    },
    /// The list of the window could not be read to the end.
    #[error("the list of intents could not be read to the end: {0}")]
    ListFailed(#[source] LookupError),
    /// The window holds more intents than one lookup reads.
    #[error("the window holds more than {pages} pages of intents")]
    WindowTooLarge {
        /// How many pages were read.
        pages: u32,
    },
    /// The payment id carries no creation time, so there is no window to list.
    #[error("the payment id carries no creation time to start the list from")]
    NoWindow,
    /// The lookup did not finish within its deadline (`stripe.lookup_deadline_ms`).
    #[error("the lookup did not finish within {ms} ms")]
    DeadlinePassed {
        /// The deadline.
        ms: u128,
    },
}

/// The verdict of the intents seen for `payment`; `None` when none names it.
///
/// A success wins (money moved). Otherwise an intent that has not finished may still succeed, so
/// failures next to it prove nothing yet.
pub fn judge<'a>(intents: impl IntoIterator<Item = &'a PaymentIntent>, payment: PaymentId) -> Option<Lookup> {
    let mine: Vec<&PaymentIntent> = intents.into_iter().filter(|i| i.payment_id() == Some(payment)).collect();
    if mine.is_empty() {
        return None;
    }
    let mut charges = Vec::new();
    let mut pending = None;
    for intent in mine {
        match intent.settled_by_metadata() {
            Settled::Final(charge) => charges.push(*charge),
            Settled::NotFinal(status) => {
                pending.get_or_insert(CantTell::NotFinal { intent_id: intent.id.clone(), status });
            }
        }
    }
    match pending {
        Some(why) if !charges.iter().any(|c| c.status == ChargeStatus::Succeeded) => Some(Lookup::CantTell(why)),
        _ => Some(Lookup::Found(charges)),
    }
}

/// What one page of search results says about `payment`: a hit is evidence, a miss is nothing.
pub fn from_search(page: &SearchPage<PaymentIntent>, payment: PaymentId) -> Lookup {
    judge(&page.data, payment).unwrap_or(Lookup::CantTell(CantTell::SearchMissed))
}

/// A list of every intent created in a window, newest first, read page by page for one payment.
#[derive(Debug)]
pub struct WindowScan {
    payment: PaymentId,
    seen: Vec<PaymentIntent>,
    pages: u32,
    max_pages: u32,
}

/// What to do after a page.
#[derive(Debug)]
pub enum Step {
    /// Ask for the page after this intent id.
    Next(String),
    /// The scan is over.
    Done(Lookup),
}

impl WindowScan {
    /// A scan for `payment` that gives up after `max_pages` pages.
    pub fn new(payment: PaymentId, max_pages: u32) -> Self {
        Self { payment, seen: Vec::new(), pages: 0, max_pages }
    }

    /// Takes the next page. Only the last page of the window may conclude that there is no intent.
    pub fn page(&mut self, page: ListPage<PaymentIntent>) -> Step {
        self.pages += 1;
        let last = page.data.last().map(|i| i.id.clone());
        self.seen.extend(page.data.into_iter().filter(|i| i.payment_id() == Some(self.payment)));
        match last {
            Some(after) if page.has_more => {
                if self.pages >= self.max_pages {
                    Step::Done(Lookup::CantTell(CantTell::WindowTooLarge { pages: self.pages }))
                } else {
                    Step::Next(after)
                }
            }
            // `has_more` on an empty page gives no cursor to go on from: not the end of the window.
            None if page.has_more => Step::Done(Lookup::CantTell(CantTell::ListFailed(LookupError::Unreadable(
                "an empty page of intents said more would follow".to_owned(),
            )))),
            _ => Step::Done(judge(&self.seen, self.payment).unwrap_or(Lookup::CertainlyNone)),
        }
    }

    /// A page could not be read: the window was not seen whole.
    pub fn failed(self, error: LookupError) -> Lookup {
        Lookup::CantTell(CantTell::ListFailed(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stripe::wire::samples::{declined_intent, intent};

    const PAYMENT: &str = "0196a0c4-0000-7000-8000-0000000000aa";
    const OTHER: &str = "0196a0c4-0000-7000-8000-0000000000bb";

    fn payment() -> PaymentId {
        PAYMENT.parse().unwrap()
    }

    fn pi(id: &str, status: &str, payment: &str) -> PaymentIntent {
        serde_json::from_value(intent(id, status, payment)).unwrap()
    }

    fn label(lookup: &Lookup) -> String {
        match lookup {
            Lookup::Found(charges) => format!(
                "found {}",
                charges.iter().map(|c| format!("{}:{:?}", c.id, c.status)).collect::<Vec<_>>().join(",")
            ),
            Lookup::CertainlyNone => "none".into(),
            Lookup::CantTell(CantTell::NotFinal { intent_id, .. }) => format!("can't tell: {intent_id} not final"),
            Lookup::CantTell(other) => format!("can't tell: {other}"),
        }
    }

    #[test]
    fn intents_are_judged_for_their_payment_only() {
        let declined: PaymentIntent = serde_json::from_value(declined_intent("pi_d", PAYMENT)).unwrap();
        let cases: Vec<(&str, Vec<PaymentIntent>, Option<&str>)> = vec![
            ("nothing", vec![], None),
            ("another payment's success", vec![pi("pi_o", "succeeded", OTHER)], None),
            ("a success", vec![pi("pi_1", "succeeded", PAYMENT)], Some("found pi_1:Succeeded")),
            ("a decline", vec![declined.clone()], Some("found pi_d:Failed")),
            ("processing", vec![pi("pi_p", "processing", PAYMENT)], Some("can't tell: pi_p not final")),
            (
                "a decline next to one still processing",
                vec![declined.clone(), pi("pi_p", "processing", PAYMENT)],
                Some("can't tell: pi_p not final"),
            ),
            (
                "a success next to one still processing",
                vec![pi("pi_p", "processing", PAYMENT), pi("pi_1", "succeeded", PAYMENT)],
                Some("found pi_1:Succeeded"),
            ),
        ];
        for (name, intents, expected) in cases {
            assert_eq!(judge(&intents, payment()).as_ref().map(label).as_deref(), expected, "{name}");
        }
    }

    #[test]
    fn a_search_hit_is_found_and_a_miss_proves_nothing() {
        let hit = SearchPage { data: vec![pi("pi_1", "succeeded", PAYMENT)], has_more: false, next_page: None };
        let miss = SearchPage { data: vec![], has_more: false, next_page: None };

        assert_eq!(label(&from_search(&hit, payment())), "found pi_1:Succeeded");
        assert!(matches!(from_search(&miss, payment()), Lookup::CantTell(CantTell::SearchMissed)));
    }

    #[test]
    fn a_whole_window_without_the_payment_is_certainly_none() {
        let mut scan = WindowScan::new(payment(), 10);

        let first = scan.page(ListPage { data: vec![pi("pi_3", "succeeded", OTHER)], has_more: true });
        let Step::Next(after) = first else { panic!("{first:?}") };
        let last = scan.page(ListPage { data: vec![pi("pi_2", "succeeded", OTHER)], has_more: false });

        assert_eq!(after, "pi_3");
        assert!(matches!(last, Step::Done(Lookup::CertainlyNone)), "{last:?}");
    }

    #[test]
    fn an_intent_on_an_earlier_page_is_found_at_the_end_of_the_window() {
        let mut scan = WindowScan::new(payment(), 10);

        scan.page(ListPage { data: vec![pi("pi_1", "succeeded", PAYMENT)], has_more: true });
        let last = scan.page(ListPage { data: vec![], has_more: false });

        assert!(matches!(last, Step::Done(Lookup::Found(ref c)) if c.len() == 1 && c[0].id == "pi_1"), "{last:?}");
    }

    #[test]
    fn a_window_larger_than_the_page_budget_proves_nothing() {
        let mut scan = WindowScan::new(payment(), 2);

        scan.page(ListPage { data: vec![pi("pi_3", "succeeded", OTHER)], has_more: true });
        let second = scan.page(ListPage { data: vec![pi("pi_2", "succeeded", OTHER)], has_more: true });

        assert!(matches!(second, Step::Done(Lookup::CantTell(CantTell::WindowTooLarge { pages: 2 }))), "{second:?}");
    }

    #[test]
    fn an_empty_page_that_promises_more_is_not_the_end_of_the_window() {
        let mut scan = WindowScan::new(payment(), 10);

        let step = scan.page(ListPage { data: vec![], has_more: true });

        assert!(matches!(step, Step::Done(Lookup::CantTell(CantTell::ListFailed(_)))), "{step:?}");
    }
}
