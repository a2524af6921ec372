//! The provider's idempotency memory: for each key, the parameters it was first used with and, once
//! decided, the response to replay.
//!
//! Invariants: a key is either in flight (its first request is still being processed: duplicates
//! get 409) or decided (duplicates get the stored response, byte for byte); a key in flight is
//! never forgotten. A key used with other parameters is refused (422) whatever its state; charges and
//! refunds share the store, so a key first used for one kind is "other parameters" for the other,
//! never a replay of it. The store holds responses as opaque bytes; it creates nothing and knows
//! nothing of HTTP.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use oncepay_provider::wire::{CreateCharge, CreateRefund};
use serde::Serialize;

/// What a key was first used for: its request's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Params {
    /// A `POST /v1/charges` body.
    Charge(CreateCharge),
    /// A `POST /v1/refunds` body.
    Refund(CreateRefund),
}

/// An HTTP response (status and JSON body); a decided key replays its stored ones byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The status code.
    pub status: u16,
    /// The JSON body.
    pub body: Bytes,
}

impl StoredResponse {
    /// `value` as a JSON response with `status`.
    pub fn json(status: u16, value: &impl Serialize) -> Self {
        let body = serde_json::to_vec(value).unwrap_or_else(|error| {
            // The protocol's types are plain structs with string keys; this cannot happen.
            tracing::error!(error = %error, "cannot encode a response");
            b"{}".to_vec()
        });
        Self { status, body: body.into() }
    }
}

/// What a decided key remembers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The real response (201, 402, or a refund's 400 refusal).
    pub response: StoredResponse,
    /// The injected 500 that went out instead, if one did (replayed when `replay_stored_5xx`).
    pub injected_error: Option<StoredResponse>,
}

/// What a request with a key may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key is new (or was forgotten): the caller now holds it in flight and must decide it.
    Fresh,
    /// The first request with this key is still being processed.
    InFlight,
    /// The key was used with other parameters.
    Reused,
    /// The key was decided: replay.
    Decided(Decided),
}

/// The keys the provider remembers. A decided key is forgotten `window` after its first request
/// arrived, or at once by [`KeyStore::forget_decided`].
#[derive(Debug)]
pub struct KeyStore {
    window: Duration,
    entries: HashMap<String, Entry>,
    /// Decided keys, the one whose window ends first on top.
    expiries: BinaryHeap<Reverse<Expiry>>,
    next_generation: u64,
}

#[derive(Debug)]
struct Entry {
    params: Params,
    state: State,
    /// When its first request arrived: its window starts then.
    claimed_at: Instant,
    /// Tells this entry from an earlier one under the same key, whose expiry may still be queued.
    generation: u64,
}

#[derive(Debug)]
enum State {
    InFlight,
    Decided(Decided),
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Expiry {
    at: Instant,
    generation: u64,
    key: String,
}

impl KeyStore {
    /// An empty store that remembers decided keys for `window`.
    pub fn new(window: Duration) -> Self {
        Self { window, entries: HashMap::new(), expiries: BinaryHeap::new(), next_generation: 0 }
    }

    /// Looks `key` up for a request with `params`; a fresh key is taken in flight.
    pub fn claim(&mut self, key: &str, params: &Params, now: Instant) -> Claim {
        self.forget_expired(now);
        match self.entries.get(key) {
            Some(entry) if entry.params != *params => Claim::Reused,
            Some(Entry { state: State::InFlight, .. }) => Claim::InFlight,
            Some(Entry { state: State::Decided(decided), .. }) => Claim::Decided(decided.clone()),
            None => {
                let generation = self.next_generation;
                self.next_generation += 1;
                let entry = Entry { params: params.clone(), state: State::InFlight, claimed_at: now, generation };
                self.entries.insert(key.to_owned(), entry);
                Claim::Fresh
            }
        }
    }

    /// Records the response of a key this caller claimed fresh. Its window started at its claim, as
    /// Stripe prunes a key a day after its first use however long the charge took; so a key whose
    /// window ended while it was in flight is forgotten as soon as it is decided.
    pub fn decide(&mut self, key: &str, decided: Decided, now: Instant) {
        if let Some(entry) = self.entries.get_mut(key)
            && matches!(entry.state, State::InFlight)
        {
            entry.state = State::Decided(decided);
            let at = entry.claimed_at + self.window;
            self.expiries.push(Reverse(Expiry { at, generation: entry.generation, key: key.to_owned() }));
        }
        self.forget_expired(now);
    }

    /// Forgets every decided key now, as if their windows had passed; returns how many.
    pub fn forget_decided(&mut self) -> usize {
        let before = self.entries.len();
        self.entries.retain(|_, entry| matches!(entry.state, State::InFlight));
        self.expiries.clear();
        before - self.entries.len()
    }

    fn forget_expired(&mut self, now: Instant) {
        while let Some(Reverse(expiry)) = self.expiries.peek() {
            if expiry.at > now {
                break;
            }
            if self.entries.get(&expiry.key).is_some_and(|e| e.generation == expiry.generation) {
                self.entries.remove(&expiry.key);
            }
            self.expiries.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn params(amount: i64) -> Params {
        Params::Charge(CreateCharge {
            amount,
            currency: "EUR".into(),
            customer: "cus".into(),
            metadata: BTreeMap::new(),
            payment_method: None,
        })
    }

    fn refund(amount: i64) -> Params {
        Params::Refund(CreateRefund { charge: "ch_1".into(), amount, reason: None, metadata: BTreeMap::new() })
    }

    fn decided(status: u16) -> Decided {
        Decided { response: StoredResponse { status, body: Bytes::from_static(b"{}") }, injected_error: None }
    }

    const WINDOW: Duration = Duration::from_secs(60);

    #[test]
    fn a_key_goes_from_fresh_to_in_flight_to_decided() {
        let mut store = KeyStore::new(WINDOW);
        let t0 = Instant::now();

        assert_eq!(store.claim("k", &params(1), t0), Claim::Fresh);
        assert_eq!(store.claim("k", &params(1), t0), Claim::InFlight);
        assert_eq!(store.claim("k", &params(2), t0), Claim::Reused);
        store.decide("k", decided(201), t0);
        assert_eq!(store.claim("k", &params(1), t0), Claim::Decided(decided(201)));
        assert_eq!(store.claim("k", &params(2), t0), Claim::Reused);
    }

    #[test]
    fn a_key_used_for_one_kind_is_reused_for_the_other_never_replayed() {
        let mut store = KeyStore::new(WINDOW);
        let t0 = Instant::now();
        store.claim("charged", &params(1), t0);
        store.decide("charged", decided(201), t0);
        store.claim("refunded", &refund(1), t0);

        assert_eq!(store.claim("charged", &refund(1), t0), Claim::Reused);
        assert_eq!(store.claim("refunded", &params(1), t0), Claim::Reused);
        assert_eq!(store.claim("refunded", &refund(1), t0), Claim::InFlight);
        store.decide("refunded", decided(402), t0);
        assert_eq!(store.claim("refunded", &refund(1), t0), Claim::Decided(decided(402)));
        assert_eq!(store.claim("refunded", &refund(2), t0), Claim::Reused);
    }

    #[test]
    fn a_decided_key_is_forgotten_when_its_window_ends() {
        let mut store = KeyStore::new(WINDOW);
        let t0 = Instant::now();
        store.claim("k", &params(1), t0);
        store.decide("k", decided(201), t0);

        let before_end = store.claim("k", &params(1), t0 + WINDOW - Duration::from_millis(1));
        let at_end = store.claim("k", &params(2), t0 + WINDOW);

        assert_eq!(before_end, Claim::Decided(decided(201)));
        assert_eq!(at_end, Claim::Fresh, "a forgotten key is new again, even with other parameters");
    }

    #[test]
    fn a_keys_window_starts_at_its_first_request_not_at_its_response() {
        let mut store = KeyStore::new(WINDOW);
        let t0 = Instant::now();
        store.claim("k", &params(1), t0);
        // Decided long after it arrived (a slow charge).
        store.decide("k", decided(201), t0 + Duration::from_secs(45));

        let before_end = store.claim("k", &params(1), t0 + WINDOW - Duration::from_millis(1));
        let at_end = store.claim("k", &params(1), t0 + WINDOW);

        assert_eq!(before_end, Claim::Decided(decided(201)));
        assert_eq!(at_end, Claim::Fresh, "forgotten a window after the first request, as a real provider does");
    }

    #[test]
    fn an_old_expiry_does_not_forget_the_key_used_again() {
        let mut store = KeyStore::new(WINDOW);
        let t0 = Instant::now();
        store.claim("k", &params(1), t0);
        store.decide("k", decided(201), t0);
        store.forget_decided();
        store.claim("k", &params(1), t0 + Duration::from_secs(30));
        store.decide("k", decided(402), t0 + Duration::from_secs(30));

        let claim = store.claim("k", &params(1), t0 + WINDOW);

        assert_eq!(claim, Claim::Decided(decided(402)));
    }

    #[test]
    fn forgetting_keeps_keys_in_flight_and_a_zero_window_remembers_nothing() {
        let mut store = KeyStore::new(Duration::ZERO);
        let t0 = Instant::now();
        store.claim("busy", &params(1), t0);
        store.claim("done", &params(1), t0);
        store.decide("done", decided(201), t0);

        assert_eq!(store.claim("done", &params(1), t0), Claim::Fresh);
        assert_eq!(store.forget_decided(), 0, "both keys are in flight now");
        assert_eq!(store.claim("busy", &params(1), t0), Claim::InFlight);
    }
}
