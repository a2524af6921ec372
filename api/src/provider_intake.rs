//! What intake needs to know of the provider the workers charge through, before a payment or a
//! refund is accepted: what that provider could never charge or refund, refused with a 400 naming
//! the field, and which provider account the payment is charged to.
//!
//! The simulator takes every valid payment, in oncepay's own account. Stripe refuses more than its
//! metadata limits, amounts below its minimum charge and some currencies, and refunds beyond its
//! metadata limits ([`oncepay_provider::stripe::limits`]). In connect mode each payment is charged
//! in its tenant's connected account, fixed at acceptance: a tenant without one is refused, and so
//! is a payment that names no payment method (the platform's default means nothing in a merchant's
//! account). The api only needs to know which provider and mode the workers use, not how to reach
//! them.

use oncepay_domain::money::Currency;
use oncepay_domain::payment_request::{FieldError, PaymentRequest};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_domain::refund::{RefundReason, RefundRequest};
use oncepay_provider::ProviderKind;
use oncepay_provider::stripe::{StripeMode, limits};
use serde::Deserialize;

use crate::errors::ApiError;

/// `[provider]`, as far as intake needs it.
#[derive(Debug, Clone, Deserialize)]
pub struct ProviderIntakeSettings {
    /// Which provider the workers charge through: `simulator` or `stripe`.
    #[serde(default)]
    pub kind: ProviderKind,
    /// The Stripe account's settlement currency (`EUR`, say): Stripe's minimum charge is checked for
    /// payments in it. Unset, minimums are left to Stripe.
    #[serde(default)]
    pub stripe_settlement_currency: Option<String>,
    /// `[provider.stripe]`, as far as intake needs it; required when `kind` is `stripe`.
    #[serde(default)]
    pub stripe: Option<StripeIntakeSettings>,
}

/// `[provider.stripe]`, as far as intake needs it: the other keys are the worker's and the
/// reconciler's, and are left alone here.
#[derive(Debug, Clone, Deserialize)]
pub struct StripeIntakeSettings {
    /// Connect or direct, as for every process.
    pub mode: StripeMode,
}

/// The provider's rules at intake.
#[derive(Debug, Clone, Copy)]
pub struct ProviderIntake {
    kind: ProviderKind,
    connect: bool,
    settlement: Option<Currency>,
}

impl ProviderIntake {
    /// The rules `settings` call for; an unreadable settlement currency, or Stripe without its mode,
    /// is a configuration error.
    pub fn new(settings: &ProviderIntakeSettings) -> anyhow::Result<Self> {
        let settlement = match &settings.stripe_settlement_currency {
            Some(code) => Some(Currency::parse(code).map_err(|error| {
                anyhow::anyhow!("provider.stripe_settlement_currency {code:?} is not a currency: {error}")
            })?),
            None => None,
        };
        let connect = match (settings.kind, &settings.stripe) {
            (ProviderKind::Simulator, _) => false,
            (ProviderKind::Stripe, Some(stripe)) => stripe.mode == StripeMode::Connect,
            (ProviderKind::Stripe, None) => anyhow::bail!(
                "provider.kind is \"stripe\" but provider.stripe.mode is not set: set it to \"connect\" (each \
                 tenant charges its own connected account) or \"direct\" (every tenant charges one account), the \
                 same as for the worker and the reconciler"
            ),
        };
        Ok(Self { kind: settings.kind, connect, settlement })
    }

    /// The provider account `request` is to be charged to, given its tenant's (`None`: oncepay's
    /// own); or why the provider could never charge it. Nothing here reads or writes the store.
    pub fn admit(
        &self,
        request: &PaymentRequest,
        tenant_account: Option<&ProviderAccount>,
    ) -> Result<Option<ProviderAccount>, ApiError> {
        let field = |field: &str, message: String| {
            ApiError::InvalidFields(vec![FieldError { field: field.to_owned(), message }])
        };
        match self.kind {
            ProviderKind::Simulator => Ok(None),
            ProviderKind::Stripe => {
                limits::check_payment(request.amount, request.currency, &request.metadata, self.settlement)
                    .map_err(|error| field(error.field(), error.to_string()))?;
                if !self.connect {
                    return Ok(None);
                }
                let account = tenant_account.ok_or(ApiError::NoProviderAccount)?;
                if request.payment_method.is_none() {
                    return Err(field(
                        "payment_method",
                        "is required: payments are charged in your own Stripe account, which has no default payment \
                         method here"
                            .to_owned(),
                    ));
                }
                Ok(Some(account.clone()))
            }
        }
    }

    /// Why the provider could never make `request`, if it could not: Stripe's metadata limits (the
    /// amount is checked against the payment by the store). Nothing here reads or writes the store.
    pub fn admit_refund(&self, request: &RefundRequest) -> Result<(), ApiError> {
        match self.kind {
            ProviderKind::Simulator => Ok(()),
            ProviderKind::Stripe => limits::check_refund(&request.metadata, request.reason.map(RefundReason::as_str))
                .map_err(|error| {
                    ApiError::InvalidFields(vec![FieldError {
                        field: error.field().to_owned(),
                        message: error.to_string(),
                    }])
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn request(amount: i64, currency: &str, metadata_keys: usize) -> PaymentRequest {
        let metadata: serde_json::Map<String, serde_json::Value> =
            (0..metadata_keys).map(|i| (format!("k{i}"), json!("v"))).collect();
        PaymentRequest::from_json(&json!({
            "amount": amount, "currency": currency, "customer_id": "cus_1", "metadata": metadata,
            "payment_method": "pm_card_visa"
        }))
        .unwrap()
    }

    fn intake(kind: ProviderKind, mode: Option<StripeMode>, settlement: Option<&str>) -> ProviderIntake {
        let settings = ProviderIntakeSettings {
            kind,
            stripe_settlement_currency: settlement.map(str::to_owned),
            stripe: mode.map(|mode| StripeIntakeSettings { mode }),
        };
        ProviderIntake::new(&settings).unwrap()
    }

    fn refused_fields(result: Result<Option<ProviderAccount>, ApiError>) -> Option<Vec<String>> {
        match result {
            Ok(_) => None,
            Err(ApiError::InvalidFields(errors)) => Some(errors.into_iter().map(|e| e.field).collect()),
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_simulator_takes_every_valid_payment_in_oncepays_own_account() {
        let account = ProviderAccount::parse("acct_1").unwrap();
        let simulator = intake(ProviderKind::Simulator, None, Some("EUR"));

        assert_eq!(simulator.admit(&request(1, "EUR", 50), Some(&account)).unwrap(), None);
    }

    #[test]
    fn stripe_refusals_name_the_field() {
        let stripe = intake(ProviderKind::Stripe, Some(StripeMode::Direct), Some("EUR"));
        let cases = [
            ("an ordinary payment", request(1999, "EUR", 3), None),
            ("below the minimum in the settlement currency", request(10, "EUR", 0), Some("amount")),
            ("below the minimum in another currency", request(10, "USD", 0), None),
            ("too much metadata with oncepay's own keys", request(1999, "EUR", 49), Some("metadata")),
        ];
        for (name, request, refused) in cases {
            let fields = refused_fields(stripe.admit(&request, None));
            assert_eq!(fields, refused.map(|f| vec![f.to_owned()]), "{name}");
        }
    }

    #[test]
    fn in_direct_mode_every_payment_is_charged_in_oncepays_own_account() {
        let account = ProviderAccount::parse("acct_1").unwrap();
        let direct = intake(ProviderKind::Stripe, Some(StripeMode::Direct), None);
        let without_method = PaymentRequest { payment_method: None, ..request(1999, "EUR", 0) };

        assert_eq!(direct.admit(&request(1999, "EUR", 0), Some(&account)).unwrap(), None);
        assert_eq!(direct.admit(&without_method, None).unwrap(), None, "the default payment method may stand in");
    }

    #[test]
    fn in_connect_mode_a_payment_is_charged_in_its_tenants_account_and_needs_one() {
        let account = ProviderAccount::parse("acct_1").unwrap();
        let connect = intake(ProviderKind::Stripe, Some(StripeMode::Connect), None);
        let without_method = PaymentRequest { payment_method: None, ..request(1999, "EUR", 0) };

        assert_eq!(connect.admit(&request(1999, "EUR", 0), Some(&account)).unwrap(), Some(account.clone()));
        assert!(matches!(connect.admit(&request(1999, "EUR", 0), None), Err(ApiError::NoProviderAccount)));
        assert_eq!(refused_fields(connect.admit(&without_method, Some(&account))), Some(vec!["payment_method".into()]));
    }

    #[test]
    fn settings_that_cannot_work_are_refused_at_start() {
        let unreadable = ProviderIntakeSettings {
            kind: ProviderKind::Stripe,
            stripe_settlement_currency: Some("euro".into()),
            stripe: Some(StripeIntakeSettings { mode: StripeMode::Direct }),
        };
        let no_mode =
            ProviderIntakeSettings { kind: ProviderKind::Stripe, stripe_settlement_currency: None, stripe: None };

        assert!(ProviderIntake::new(&unreadable).is_err());
        assert!(ProviderIntake::new(&no_mode).unwrap_err().to_string().contains("provider.stripe.mode"));
    }
}
