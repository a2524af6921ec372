//! What a lookup of one payment at Stripe found: its charges, certainly none, or can't tell. Pure:
//! the client does the I/O and feeds the pages in.
//!
//! Stripe's objects do not carry the idempotency key, so a payment's intent is found by the metadata
//! oncepay puts on it. Search finds it quickly but is eventually consistent: a hit is evidence, a
//! miss proves nothing. The list API is consistent, so a list of the whole window since the payment
//! was created that shows no intent naming the payment proves there is none. Only that may conclude
//! [`Lookup::CertainlyNone`], the result that lets the reconciler resend.
//!
//! A refund is found the same way, by the metadata naming it, in the consistent list of its
//! PaymentIntent's refunds ([`RefundScan`]); only that list read to its end may show none.

use oncepay_domain::ids::{PaymentId, RefundId};

use crate::{Charge, ChargeStatus, LookupError};

use super::wire::{IntentStatus, ListPage, PaymentIntent, SearchPage, Settled, StripeRefund};

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

/// The list of every refund of one PaymentIntent (`GET /v1/refunds?payment_intent=…`), newest
/// first, read page by page for one oncepay refund. Refunds made while it reads go to the front of
/// the list, before its cursor, so the ones it has not read yet stay where they were.
#[derive(Debug)]
pub struct RefundScan {
    refund: RefundId,
    payment_intent: String,
    found: Vec<StripeRefund>,
    pages: u32,
    max_pages: u32,
}

/// What to do after a page of refunds.
#[derive(Debug)]
pub enum RefundStep {
    /// Ask for the page after this refund id.
    Next(String),
    /// The scan is over: the refunds made for the oncepay refund (none is proof), or why the list
    /// proves nothing.
    Done(Result<Vec<StripeRefund>, LookupError>),
}

impl RefundScan {
    /// A scan of `payment_intent`'s refunds for `refund` that gives up after `max_pages` pages.
    pub fn new(refund: RefundId, payment_intent: &str, max_pages: u32) -> Self {
        Self { refund, payment_intent: payment_intent.to_owned(), found: Vec::new(), pages: 0, max_pages }
    }

    /// Takes the next page. Only the last page of the list may conclude that there is none.
    pub fn page(&mut self, page: ListPage<StripeRefund>) -> RefundStep {
        self.pages += 1;
        // A refund of another intent in a list filtered by this one: the list is not what was asked
        // for, so its end proves nothing.
        if let Some(stray) =
            page.data.iter().find(|r| r.payment_intent.as_ref().is_some_and(|pi| pi.id() != self.payment_intent))
        {
            return RefundStep::Done(Err(LookupError::Unreadable(format!(
                "the list of {}'s refunds holds {}, a refund of another intent",
                self.payment_intent, stray.id
            ))));
        }
        let last = page.data.last().map(|r| r.id.clone());
        self.found.extend(page.data.into_iter().filter(|r| r.refund_id() == Some(self.refund)));
        match last {
            Some(after) if page.has_more => {
                if self.pages >= self.max_pages {
                    RefundStep::Done(Err(LookupError::Inconclusive(format!(
                        "the intent has more than {} pages of refunds",
                        self.pages
                    ))))
                } else {
                    RefundStep::Next(after)
                }
            }
            // `has_more` on an empty page gives no cursor to go on from: not the end of the list.
            None if page.has_more => RefundStep::Done(Err(LookupError::Unreadable(
                "an empty page of refunds said more would follow".to_owned(),
            ))),
            _ => RefundStep::Done(Ok(std::mem::take(&mut self.found))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stripe::wire::samples::{declined_intent, intent, refund};

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

    const REFUND: &str = "0196a0c4-0000-7000-8000-0000000000cc";
    const OTHER_REFUND: &str = "0196a0c4-0000-7000-8000-0000000000dd";

    fn re(id: &str, refund_id: &str, payment_intent: &str) -> StripeRefund {
        serde_json::from_value(refund(id, "succeeded", refund_id, payment_intent)).unwrap()
    }

    fn refunds(data: Vec<StripeRefund>, has_more: bool) -> ListPage<StripeRefund> {
        ListPage { data, has_more }
    }

    /// The steps a scan takes through `pages`, one per page.
    fn scan_label(max_pages: u32, pages: Vec<ListPage<StripeRefund>>) -> String {
        let mut scan = RefundScan::new(REFUND.parse().unwrap(), "pi_1", max_pages);
        let mut steps = Vec::new();
        for page in pages {
            match scan.page(page) {
                RefundStep::Next(after) => steps.push(format!("after {after}")),
                RefundStep::Done(Ok(found)) => {
                    let ids: Vec<&str> = found.iter().map(|r| r.id.as_str()).collect();
                    steps.push(format!("found [{}]", ids.join(",")));
                }
                RefundStep::Done(Err(LookupError::Inconclusive(_))) => steps.push("inconclusive".into()),
                RefundStep::Done(Err(LookupError::Unreadable(_))) => steps.push("unreadable".into()),
                RefundStep::Done(Err(other)) => steps.push(format!("{other}")),
            }
        }
        steps.join(", ")
    }

    #[test]
    fn a_refund_list_read_to_its_end_finds_the_refund_or_proves_there_is_none() {
        let cases: Vec<(&str, u32, Vec<ListPage<StripeRefund>>, &str)> = vec![
            ("no refunds at all", 5, vec![refunds(vec![], false)], "found []"),
            (
                "only other refunds of the intent",
                5,
                vec![
                    refunds(vec![re("re_2", OTHER_REFUND, "pi_1")], true),
                    refunds(vec![re("re_1", OTHER_REFUND, "pi_1")], false),
                ],
                "after re_2, found []",
            ),
            (
                "ours on the first page",
                5,
                vec![refunds(vec![re("re_2", OTHER_REFUND, "pi_1"), re("re_1", REFUND, "pi_1")], false)],
                "found [re_1]",
            ),
            (
                "ours on an earlier page, found at the end",
                5,
                vec![
                    refunds(vec![re("re_2", REFUND, "pi_1")], true),
                    refunds(vec![re("re_1", OTHER_REFUND, "pi_1")], false),
                ],
                "after re_2, found [re_2]",
            ),
            (
                "two of ours (a key Stripe forgot)",
                5,
                vec![refunds(vec![re("re_2", REFUND, "pi_1"), re("re_1", REFUND, "pi_1")], false)],
                "found [re_2,re_1]",
            ),
            (
                "more pages than the budget",
                2,
                vec![
                    refunds(vec![re("re_3", OTHER_REFUND, "pi_1")], true),
                    refunds(vec![re("re_2", OTHER_REFUND, "pi_1")], true),
                ],
                "after re_3, inconclusive",
            ),
            ("an empty page that promises more", 5, vec![refunds(vec![], true)], "unreadable"),
            (
                "a refund of another intent in the list",
                5,
                vec![refunds(vec![re("re_9", OTHER_REFUND, "pi_2"), re("re_1", REFUND, "pi_1")], false)],
                "unreadable",
            ),
        ];
        for (name, max_pages, pages, expected) in cases {
            assert_eq!(scan_label(max_pages, pages), expected, "{name}");
        }
    }
}
