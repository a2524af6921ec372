//! What the configured provider could never accept, refused at intake with a 400 naming the field,
//! so the payment is never accepted only to fail later.
//!
//! The simulator takes every valid payment. Stripe refuses more than its metadata limits, amounts
//! below its minimum charge and some currencies ([`oncepay_provider::stripe::limits`]). The api only
//! needs to know which provider the workers charge through (`[provider]` `kind`), not how to reach it.

use oncepay_domain::money::Currency;
use oncepay_domain::payment_request::{FieldError, PaymentRequest};
use oncepay_provider::ProviderKind;
use oncepay_provider::stripe::limits;
use serde::Deserialize;

/// `[provider]`, as far as intake needs it.
#[derive(Debug, Clone, Deserialize)]
pub struct ProviderLimitsSettings {
    /// Which provider the workers charge through: `simulator` or `stripe`.
    #[serde(default)]
    pub kind: ProviderKind,
    /// The Stripe account's settlement currency (`EUR`, say): Stripe's minimum charge is checked for
    /// payments in it. Unset, minimums are left to Stripe.
    #[serde(default)]
    pub stripe_settlement_currency: Option<String>,
}

/// The checks for the configured provider.
#[derive(Debug, Clone, Copy)]
pub struct ProviderLimits {
    kind: ProviderKind,
    settlement: Option<Currency>,
}

impl ProviderLimits {
    /// The checks `settings` call for; an unreadable settlement currency is a configuration error.
    pub fn new(settings: &ProviderLimitsSettings) -> anyhow::Result<Self> {
        let settlement = match &settings.stripe_settlement_currency {
            Some(code) => Some(Currency::parse(code).map_err(|error| {
                anyhow::anyhow!("provider.stripe_settlement_currency {code:?} is not a currency: {error}")
            })?),
            None => None,
        };
        Ok(Self { kind: settings.kind, settlement })
    }

    /// Refuses `request` if the provider could never charge it, naming the field.
    pub fn check(&self, request: &PaymentRequest) -> Result<(), Vec<FieldError>> {
        match self.kind {
            ProviderKind::Simulator => Ok(()),
            ProviderKind::Stripe => {
                limits::check_payment(request.amount, request.currency, &request.metadata, self.settlement)
                    .map_err(|error| vec![FieldError { field: error.field().to_owned(), message: error.to_string() }])
            }
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
        PaymentRequest::from_json(
            &json!({"amount": amount, "currency": currency, "customer_id": "cus_1", "metadata": metadata}),
        )
        .unwrap()
    }

    fn limits(kind: ProviderKind, settlement: Option<&str>) -> ProviderLimits {
        let settings = ProviderLimitsSettings { kind, stripe_settlement_currency: settlement.map(str::to_owned) };
        ProviderLimits::new(&settings).unwrap()
    }

    #[test]
    fn the_simulator_takes_every_valid_payment() {
        assert!(limits(ProviderKind::Simulator, Some("EUR")).check(&request(1, "EUR", 50)).is_ok());
    }

    #[test]
    fn stripe_refusals_name_the_field() {
        let stripe = limits(ProviderKind::Stripe, Some("EUR"));
        let cases = [
            ("an ordinary payment", request(1999, "EUR", 3), None),
            ("below the minimum in the settlement currency", request(10, "EUR", 0), Some("amount")),
            ("below the minimum in another currency", request(10, "USD", 0), None),
            ("too much metadata with oncepay's own keys", request(1999, "EUR", 49), Some("metadata")),
        ];
        for (name, request, refused) in cases {
            let fields: Option<Vec<String>> =
                stripe.check(&request).err().map(|errors| errors.into_iter().map(|e| e.field).collect());
            assert_eq!(fields, refused.map(|f| vec![f.to_owned()]), "{name}");
        }
    }

    #[test]
    fn a_settlement_currency_that_is_not_one_is_refused_at_start() {
        let settings =
            ProviderLimitsSettings { kind: ProviderKind::Stripe, stripe_settlement_currency: Some("euro".into()) };
        assert!(ProviderLimits::new(&settings).is_err());
    }
}
