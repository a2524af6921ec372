//! The faults the simulator injects: their settings ([`Faults`]), run-time changes
//! ([`FaultsPatch`]), and the decisions drawn for one create request, a charge or a refund
//! ([`CreatePlan`]), or one webhook event ([`WebhookPlan`]).
//!
//! Charges and refunds go through the same faults, but for three: a refund fails at
//! `refund_failure_rate` rather than `decline_rate`, and neither `mismatch_rate` (a refund beyond
//! what was asked could exceed its charge) nor `refuse_resend_rate` (a detached payment method)
//! applies to refunds.
//!
//! Invariants: every rate is a finite probability in `[0, 1]`, and the three "after" faults (5xx,
//! hang, drop) are exclusive outcomes of one draw, so their rates sum to at most 1; every declined
//! payment method has a decline code. A plan makes the same draws, in the same order, whatever it
//! decides, so a seed replays the same decisions for the same sequence of requests. This module
//! decides; it performs nothing (no sleeping, no I/O).

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use rand::Rng;
use serde::{Deserialize, Serialize};

/// Declares every fault once, and from that list makes [`Faults`] (with its `Default`: no random
/// fault at all, durations at their documented defaults, Stripe's test methods declined),
/// [`FaultsPatch`] (each field optional), and the code that applies a patch and lists the rates to
/// check.
macro_rules! faults {
    (
        rates { $( $(#[doc = $rate_doc:expr])* $rate:ident: f64 = $rate_default:expr, )* }
        settings { $( $(#[doc = $doc:expr])* $name:ident: $ty:ty = $default:expr, )* }
    ) => {
        /// Every fault, as configured in `[faults]` and served at `/_sim/faults`.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct Faults {
            $( $(#[doc = $rate_doc])* pub $rate: f64, )*
            $( $(#[doc = $doc])* pub $name: $ty, )*
        }

        impl Default for Faults {
            fn default() -> Self {
                Self { $( $rate: $rate_default, )* $( $name: $default, )* }
            }
        }

        /// A partial change of the faults (`POST /_sim/faults`): absent keys keep their value. Each
        /// field means what the same field of [`Faults`] means.
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct FaultsPatch {
            $( #[serde(default, skip_serializing_if = "Option::is_none")] pub $rate: Option<f64>, )*
            $( #[serde(default, skip_serializing_if = "Option::is_none")] pub $name: Option<$ty>, )*
        }

        impl Faults {
            /// Every rate, by its key.
            fn rates(&self) -> Vec<(&'static str, f64)> {
                vec![ $( (stringify!($rate), self.$rate), )* ]
            }

            /// Sets what `patch` names.
            fn apply(&mut self, patch: &FaultsPatch) {
                $( if let Some(value) = patch.$rate { self.$rate = value; } )*
                $( if let Some(value) = patch.$name.clone() { self.$name = value; } )*
            }
        }
    };
}

faults! {
    // Probabilities in [0, 1], each checked by `Faults::validate`.
    rates {
        /// Fraction of new charges declined (402, a failed charge exists).
        decline_rate: f64 = 0.0,
        /// Fraction of new refunds that fail (402, a failed refund exists).
        refund_failure_rate: f64 = 0.0,
        /// Fraction of charge and refund POSTs that get a 500 before anything happens.
        error_before_rate: f64 = 0.0,
        /// Fraction of new charges and refunds that get a 500 after they were created.
        error_after_rate: f64 = 0.0,
        /// Fraction of new charges and refunds whose response waits `hang_ms`, the key in flight
        /// meanwhile.
        hang_after_rate: f64 = 0.0,
        /// Fraction of new charges and refunds after which the connection is closed with no
        /// response.
        drop_after_rate: f64 = 0.0,
        /// Fraction of webhook events never delivered.
        webhook_drop_rate: f64 = 0.0,
        /// Fraction of webhook events delivered twice.
        webhook_duplicate_rate: f64 = 0.0,
        /// Fraction of charge and refund POSTs that get a 429 before anything happens.
        rate_limit_rate: f64 = 0.0,
        /// Fraction of lookups (`GET /v1/charges…`, `GET /v1/refunds…`) that get a 503.
        lookup_error_rate: f64 = 0.0,
        /// Fraction of new charges and refunds made only after `hang_before_ms`, the key in flight
        /// meanwhile (a lookup then finds nothing, and the object appears later).
        hang_before_rate: f64 = 0.0,
        /// Fraction of new succeeded charges that take one minor unit more than asked.
        mismatch_rate: f64 = 0.0,
        /// Fraction of new charges and refunds whose response and webhook report a lower-case
        /// currency.
        malformed_rate: f64 = 0.0,
        /// Fraction of repeated requests with the key of a succeeded charge that get a 400 instead of
        /// the charge's response, as when the payment method was detached since: the charge stands.
        refuse_resend_rate: f64 = 0.0,
    }
    // Durations and switches.
    settings {
        /// Added to every `/v1` response; for a new charge or refund, spent while its key is in
        /// flight.
        latency_ms: u64 = 0,
        /// How long a hang drawn by `hang_after_rate` lasts.
        hang_ms: u64 = 30_000,
        /// Whether a repeated key gets the injected 500-after again, not the charge's response.
        replay_stored_5xx: bool = false,
        /// Delay before the first delivery attempt of each webhook event.
        webhook_delay_ms: u64 = 0,
        /// Whether consecutive events are delivered swapped.
        webhook_reorder: bool = false,
        /// How long an event waits for a successor to swap with before it goes alone.
        webhook_reorder_hold_ms: u64 = 1_000,
        /// The `Retry-After` of the 429s drawn by `rate_limit_rate`, in seconds.
        rate_limit_retry_after_secs: u64 = 30,
        /// How long a charge drawn by `hang_before_rate` waits before it is made.
        hang_before_ms: u64 = 10_000,
        /// Payment methods whose charges are always declined, each with its decline code. A patch
        /// replaces the whole map.
        declined_payment_methods: BTreeMap<String, String> = stripe_test_declines(),
    }
}

/// Stripe's test payment methods that decline, with the decline code Stripe gives, so a client
/// written against Stripe's test mode sees the same outcomes here.
fn stripe_test_declines() -> BTreeMap<String, String> {
    [("pm_card_chargeDeclined", "card_declined"), ("pm_card_chargeDeclinedInsufficientFunds", "insufficient_funds")]
        .into_iter()
        .map(|(method, code)| (method.to_owned(), code.to_owned()))
        .collect()
}

/// Faults that cannot be in force together, or a rate that is not a probability.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidFaults {
    /// A rate outside `[0, 1]` or not a number.
    #[error("faults.{name} must be a probability in [0, 1], not {value}")]
    Rate {
        /// The key.
        name: &'static str,
        /// What it was set to.
        value: f64,
    },
    /// The exclusive "after" faults add up to more than certainty.
    #[error("error_after_rate + hang_after_rate + drop_after_rate must be at most 1, not {0}")]
    AfterRatesExceedOne(f64),
    /// A declined payment method without a decline code: a failed payment must say why.
    #[error("faults.declined_payment_methods.{0} needs a decline code, e.g. \"card_declined\"")]
    NoDeclineCode(String),
}

impl Faults {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), InvalidFaults> {
        for (name, value) in self.rates() {
            if !(0.0..=1.0).contains(&value) {
                return Err(InvalidFaults::Rate { name, value });
            }
        }
        let after = self.error_after_rate + self.hang_after_rate + self.drop_after_rate;
        if after > 1.0 {
            return Err(InvalidFaults::AfterRatesExceedOne(after));
        }
        if let Some((method, _)) = self.declined_payment_methods.iter().find(|(_, code)| code.trim().is_empty()) {
            return Err(InvalidFaults::NoDeclineCode(method.clone()));
        }
        Ok(())
    }

    /// The decline code for a charge of `payment_method`, if that method is declined.
    pub fn declined_code(&self, payment_method: Option<&str>) -> Option<&str> {
        payment_method.and_then(|method| self.declined_payment_methods.get(method)).map(String::as_str)
    }

    /// These faults with `patch` applied, if the result is valid.
    pub fn patched(&self, patch: &FaultsPatch) -> Result<Self, InvalidFaults> {
        let mut next = self.clone();
        next.apply(patch);
        next.validate()?;
        Ok(next)
    }
}

/// The faults in force, shared by everything that injects them and changed at run time.
#[derive(Debug, Clone)]
pub struct SharedFaults(Arc<RwLock<Faults>>);

impl SharedFaults {
    /// Starts with `faults` (already validated).
    pub fn new(faults: Faults) -> Self {
        Self(Arc::new(RwLock::new(faults)))
    }

    /// A snapshot: one request decides everything with the faults of one instant.
    pub fn get(&self) -> Faults {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Applies `patch` if the result is valid, and returns the faults now in force.
    pub fn update(&self, patch: &FaultsPatch) -> Result<Faults, InvalidFaults> {
        let mut faults = self.0.write().unwrap_or_else(PoisonError::into_inner);
        *faults = faults.patched(patch)?;
        Ok(faults.clone())
    }
}

/// What happens once a new charge or refund exists, before its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterCreate {
    /// The response goes out.
    Respond,
    /// A 500 goes out instead.
    ServerError,
    /// The response goes out after the hang.
    Hang,
    /// The connection is closed with no response.
    DropConnection,
}

impl AfterCreate {
    /// A label for metrics and logs.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Respond => "none",
            Self::ServerError => "error_after",
            Self::Hang => "hang_after",
            Self::DropConnection => "drop_after",
        }
    }
}

/// What a create request makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Creating {
    /// `POST /v1/charges`.
    Charge,
    /// `POST /v1/refunds`.
    Refund,
}

/// The fault decisions for one `POST /v1/charges` or `POST /v1/refunds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreatePlan {
    /// Respond 500 before anything happens.
    pub error_before: bool,
    /// Respond 429 before anything happens.
    pub rate_limited: bool,
    /// Make the charge only after `hang_before_ms`.
    pub hang_before: bool,
    /// Charge one minor unit more than asked, if the charge succeeds. Never for a refund.
    pub mismatch: bool,
    /// Report the object with a lower-case currency in its response and webhook.
    pub malformed: bool,
    /// Decline the charge, or fail the refund, if one is created.
    pub decline: bool,
    /// Which decline (or refund failure) reason, an index into the simulator's list.
    pub decline_reason: usize,
    /// What follows the creation, if one happens.
    pub after: AfterCreate,
    /// Refuse a repeated request with a 400 if its key's charge succeeded. Never for a refund.
    pub refuse_resend: bool,
}

impl CreatePlan {
    /// Draws the decisions for creating `what`. `reasons` is how many decline (or refund failure)
    /// reasons exist (≥ 1).
    pub fn draw(faults: &Faults, what: Creating, reasons: usize, rng: &mut impl Rng) -> Self {
        let charge = what == Creating::Charge;
        let decline_rate = if charge { faults.decline_rate } else { faults.refund_failure_rate };
        let error_before = rng.random::<f64>() < faults.error_before_rate;
        let rate_limited = rng.random::<f64>() < faults.rate_limit_rate;
        let hang_before = rng.random::<f64>() < faults.hang_before_rate;
        let mismatch = rng.random::<f64>() < faults.mismatch_rate && charge;
        let malformed = rng.random::<f64>() < faults.malformed_rate;
        let decline = rng.random::<f64>() < decline_rate;
        let decline_reason = rng.random_range(0..reasons.max(1));
        let after_draw = rng.random::<f64>();
        let after = if after_draw < faults.error_after_rate {
            AfterCreate::ServerError
        } else if after_draw < faults.error_after_rate + faults.hang_after_rate {
            AfterCreate::Hang
        } else if after_draw < faults.error_after_rate + faults.hang_after_rate + faults.drop_after_rate {
            AfterCreate::DropConnection
        } else {
            AfterCreate::Respond
        };
        let refuse_resend = rng.random::<f64>() < faults.refuse_resend_rate && charge;
        Self {
            error_before,
            rate_limited,
            hang_before,
            mismatch,
            malformed,
            decline,
            decline_reason,
            after,
            refuse_resend,
        }
    }
}

/// The fault decisions for one webhook event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WebhookPlan {
    /// Never deliver it.
    pub drop: bool,
    /// Deliver it twice.
    pub duplicate: bool,
}

impl WebhookPlan {
    /// Draws the decisions.
    pub fn draw(faults: &Faults, rng: &mut impl Rng) -> Self {
        let drop = rng.random::<f64>() < faults.webhook_drop_rate;
        let duplicate = rng.random::<f64>() < faults.webhook_duplicate_rate;
        Self { drop, duplicate }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn out_of_bounds_faults_are_refused() {
        let cases: [(FaultsPatch, bool); 8] = [
            (FaultsPatch { decline_rate: Some(0.5), ..Default::default() }, true),
            (FaultsPatch { decline_rate: Some(1.5), ..Default::default() }, false),
            (FaultsPatch { webhook_drop_rate: Some(-0.1), ..Default::default() }, false),
            (FaultsPatch { error_before_rate: Some(f64::NAN), ..Default::default() }, false),
            (
                FaultsPatch {
                    error_after_rate: Some(0.5),
                    hang_after_rate: Some(0.3),
                    drop_after_rate: Some(0.2),
                    ..Default::default()
                },
                true,
            ),
            (FaultsPatch { error_after_rate: Some(0.6), drop_after_rate: Some(0.6), ..Default::default() }, false),
            (
                FaultsPatch {
                    declined_payment_methods: Some(BTreeMap::from([("pm_x".into(), "do_not_honor".into())])),
                    ..Default::default()
                },
                true,
            ),
            (
                FaultsPatch {
                    declined_payment_methods: Some(BTreeMap::from([("pm_x".into(), " ".into())])),
                    ..Default::default()
                },
                false,
            ),
        ];
        for (patch, valid) in cases {
            assert_eq!(Faults::default().patched(&patch).is_ok(), valid, "{patch:?}");
        }
    }

    #[test]
    fn a_patch_changes_only_what_it_names() {
        let patched = Faults::default()
            .patched(&FaultsPatch { latency_ms: Some(7), webhook_reorder: Some(true), ..Default::default() })
            .unwrap();

        assert_eq!(patched, Faults { latency_ms: 7, webhook_reorder: true, ..Faults::default() });
    }

    #[test]
    fn stripes_declining_test_methods_are_declined_by_default_and_nothing_else_is() {
        let faults = Faults::default();

        assert_eq!(faults.declined_code(Some("pm_card_chargeDeclined")), Some("card_declined"));
        assert_eq!(faults.declined_code(Some("pm_card_chargeDeclinedInsufficientFunds")), Some("insufficient_funds"));
        assert_eq!(faults.declined_code(Some("pm_card_visa")), None);
        assert_eq!(faults.declined_code(Some("pm_card_chargedeclined")), None, "references are case-sensitive");
        assert_eq!(faults.declined_code(None), None);
    }

    #[test]
    fn certain_and_impossible_rates_decide_every_time() {
        let mut rng = StdRng::seed_from_u64(1);
        let never = Faults::default();
        let always = Faults { error_before_rate: 1.0, decline_rate: 1.0, drop_after_rate: 1.0, ..Faults::default() };
        for _ in 0..1000 {
            let plan = CreatePlan::draw(&never, Creating::Charge, 3, &mut rng);
            assert!(!plan.error_before && !plan.decline && plan.after == AfterCreate::Respond);
            let plan = CreatePlan::draw(&always, Creating::Charge, 3, &mut rng);
            assert!(plan.error_before && plan.decline && plan.after == AfterCreate::DropConnection);
            assert!(plan.decline_reason < 3);
        }
    }

    #[test]
    fn a_refund_fails_at_its_own_rate_and_is_never_mismatched_or_refused_on_resend() {
        let mut rng = StdRng::seed_from_u64(3);
        let faults = Faults {
            decline_rate: 1.0,
            mismatch_rate: 1.0,
            refuse_resend_rate: 1.0,
            error_after_rate: 1.0,
            ..Faults::default()
        };
        let failing = Faults { refund_failure_rate: 1.0, ..Faults::default() };
        for _ in 0..1000 {
            let refund = CreatePlan::draw(&faults, Creating::Refund, 3, &mut rng);
            assert!(!refund.decline && !refund.mismatch && !refund.refuse_resend, "{refund:?}");
            assert_eq!(refund.after, AfterCreate::ServerError, "the shared faults apply to refunds");
            let charge = CreatePlan::draw(&faults, Creating::Charge, 3, &mut rng);
            assert!(charge.decline && charge.mismatch && charge.refuse_resend, "{charge:?}");
            assert!(CreatePlan::draw(&failing, Creating::Refund, 3, &mut rng).decline);
            assert!(!CreatePlan::draw(&failing, Creating::Charge, 3, &mut rng).decline);
        }
    }

    #[test]
    fn the_after_faults_split_one_draw_by_their_rates() {
        let faults = Faults { error_after_rate: 0.2, hang_after_rate: 0.3, drop_after_rate: 0.1, ..Faults::default() };
        let mut rng = StdRng::seed_from_u64(7);
        let mut counts = [0u32; 4];
        for _ in 0..20_000 {
            let index = match CreatePlan::draw(&faults, Creating::Charge, 1, &mut rng).after {
                AfterCreate::ServerError => 0,
                AfterCreate::Hang => 1,
                AfterCreate::DropConnection => 2,
                AfterCreate::Respond => 3,
            };
            counts[index] += 1;
        }
        // Expected 4000 / 6000 / 2000 / 8000; ±5 % of 20,000 is far beyond sampling noise at this size.
        for (count, expected) in counts.iter().zip([4000, 6000, 2000, 8000]) {
            assert!(count.abs_diff(expected) < 1000, "{counts:?}");
        }
    }

    #[test]
    fn a_seed_replays_the_same_decisions() {
        let faults = Faults { decline_rate: 0.5, error_after_rate: 0.5, webhook_drop_rate: 0.5, ..Faults::default() };
        let run = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..100)
                .map(|_| {
                    (CreatePlan::draw(&faults, Creating::Charge, 3, &mut rng), WebhookPlan::draw(&faults, &mut rng))
                })
                .collect::<Vec<_>>()
        };

        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }
}
