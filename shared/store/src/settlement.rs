//! The one place that turns a provider's charge into a settlement, for the worker, the reconciler and
//! operators alike. Pure: no I/O.
//!
//! A charge settles a payment only if it is that payment's charge: made in the provider account the
//! payment is charged to, under its downstream key, for the amount and currency it asked for.
//! Anything else is evidence for an operator ([`Unsettled::Mismatch`]), never a success.

use time::OffsetDateTime;

use oncepay_domain::ids::PaymentId;
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_domain::status::Transition;
use oncepay_provider::{Charge, ChargeStatus};

use crate::transitions::Settlement;

/// The failure code when the provider declined without giving one.
const DECLINED: &str = "declined";

/// The failure message when the provider declined without giving one.
const DECLINED_MESSAGE: &str = "The provider declined the charge.";

/// What a payment asked the provider to charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    /// The payment; its downstream key is the one its charge must carry.
    pub payment_id: PaymentId,
    /// The provider account it is charged to (`None`: oncepay's own); its charge must be there.
    pub account: Option<ProviderAccount>,
    /// The amount it asked for.
    pub amount: Amount,
    /// In this currency.
    pub currency: Currency,
}

/// Why a charge does not settle a payment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsettled {
    /// The charge is not what the payment asked for: another key, amount or currency.
    #[error("{0}")]
    Mismatch(String),
    /// The charge cannot be booked as the provider reported it (no id, an amount or currency the
    /// ledger refuses, an impossible time). It proves nothing either way: the caller keeps looking and
    /// counts the attempt.
    #[error("{0}")]
    Unbookable(String),
}

/// Whether `charge` is held by the provider account the payment is charged to (`None`: oncepay's
/// own). A charge in any other account is another merchant's, or the platform's: it says nothing
/// about this payment, whatever its metadata or key name.
pub fn same_account(asked: &Asked, charge: &Charge) -> bool {
    charge.account.as_deref() == asked.account.as_ref().map(ProviderAccount::as_str)
}

/// The settlement `charge` proves for the payment that `asked`.
pub fn settlement_of(asked: &Asked, charge: &Charge) -> Result<Settlement, Unsettled> {
    let account = asked.account.as_ref().map(ProviderAccount::as_str);
    if !same_account(asked, charge) {
        let name =
            |account: Option<&str>| account.map_or("oncepay's own account".to_owned(), |a| format!("account {a}"));
        return Err(Unsettled::Mismatch(format!(
            "charge {:?} is in the provider's {}, but the payment is charged to the provider's {}",
            charge.id,
            name(charge.account.as_deref()),
            name(account),
        )));
    }
    let key = asked.payment_id.downstream_key();
    if charge.idempotency_key != key.as_str() {
        return Err(Unsettled::Mismatch(format!(
            "charge {:?} was made under the key {:?}, not under this payment's key {key}",
            charge.id, charge.idempotency_key
        )));
    }
    match charge.status {
        ChargeStatus::Succeeded => success(asked, &charge.id, charge.amount, &charge.currency, charge.created),
        ChargeStatus::Failed => {
            same_terms(asked, &charge.id, charge.amount, &charge.currency)?;
            Ok(declined(charge.failure_code.as_deref(), charge.failure_message.as_deref(), Some(&charge.id)))
        }
    }
}

/// The settlement of a succeeded charge, as the provider reported it or an operator read it off the
/// provider: `amount` minor units of `currency`, created at `created` (Unix seconds).
pub fn success(
    asked: &Asked,
    charge_id: &str,
    amount: i64,
    currency: &str,
    created: i64,
) -> Result<Settlement, Unsettled> {
    let unbookable = |why: String| Unsettled::Unbookable(format!("charge {charge_id:?} cannot be booked: {why}"));
    if charge_id.trim().is_empty() {
        return Err(unbookable("it has no id".to_owned()));
    }
    let booked = Amount::new(amount).map_err(|e| unbookable(format!("its amount {amount} {e}")))?;
    let booked_currency =
        Currency::parse(currency).map_err(|e| unbookable(format!("its currency {currency:?} {e}")))?;
    let charged_at = OffsetDateTime::from_unix_timestamp(created)
        .map_err(|_| unbookable(format!("its creation time {created} is not a date")))?;
    same_terms(asked, charge_id, amount, currency)?;
    Ok(Settlement::Succeeded { charge_id: charge_id.to_owned(), amount: booked, currency: booked_currency, charged_at })
}

/// The move a settlement the provider proved makes: `Charged` for a success, `Declined` otherwise.
pub const fn transition_of(settlement: &Settlement) -> Transition {
    match settlement {
        Settlement::Succeeded { .. } => Transition::Charged,
        Settlement::Failed { .. } => Transition::Declined,
    }
}

/// The settlement of a decline, with the provider's code and message, blanks filled in.
pub fn declined(code: Option<&str>, message: Option<&str>, charge_id: Option<&str>) -> Settlement {
    let given = |text: Option<&str>| text.map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned);
    Settlement::Failed {
        code: given(code).unwrap_or_else(|| DECLINED.to_owned()),
        message: given(message).unwrap_or_else(|| DECLINED_MESSAGE.to_owned()),
        charge_id: given(charge_id),
    }
}

fn same_terms(asked: &Asked, charge_id: &str, amount: i64, currency: &str) -> Result<(), Unsettled> {
    if amount != asked.amount.minor_units() || currency != asked.currency.as_str() {
        return Err(Unsettled::Mismatch(format!(
            "charge {charge_id:?} is for {amount} {currency}, but the payment asked for {} {}",
            asked.amount, asked.currency
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use oncepay_provider::fixtures;

    use super::*;

    fn asked() -> Asked {
        crate::fixtures::asked(1999)
    }

    fn charge(asked: &Asked, status: ChargeStatus) -> Charge {
        Charge {
            currency: asked.currency.as_str().into(),
            ..fixtures::charge(asked.payment_id, "ch_1", status, asked.amount.minor_units())
        }
    }

    fn label(result: &Result<Settlement, Unsettled>) -> &'static str {
        match result {
            Ok(Settlement::Succeeded { .. }) => "succeeded",
            Ok(Settlement::Failed { .. }) => "failed",
            Err(Unsettled::Mismatch(_)) => "mismatch",
            Err(Unsettled::Unbookable(_)) => "unbookable",
        }
    }

    #[test]
    fn each_charge_settles_only_the_payment_it_matches() {
        let asked = asked();
        let other_key = PaymentId::generate().downstream_key().as_str().to_owned();
        let succeeded = || charge(&asked, ChargeStatus::Succeeded);
        let failed = || charge(&asked, ChargeStatus::Failed);
        let cases: Vec<(&str, Charge, &str)> = vec![
            ("the charge asked for", succeeded(), "succeeded"),
            ("a decline", failed(), "failed"),
            ("another amount", Charge { amount: 1998, ..succeeded() }, "mismatch"),
            ("another currency", Charge { currency: "USD".into(), ..succeeded() }, "mismatch"),
            ("another payment's key", Charge { idempotency_key: other_key.clone(), ..succeeded() }, "mismatch"),
            ("no key", Charge { idempotency_key: String::new(), ..succeeded() }, "mismatch"),
            ("a decline under another key", Charge { idempotency_key: other_key, ..failed() }, "mismatch"),
            ("a decline of another amount", Charge { amount: 5, ..failed() }, "mismatch"),
            ("a charge in a connected account", Charge { account: Some("acct_B".into()), ..succeeded() }, "mismatch"),
            ("a decline in a connected account", Charge { account: Some("acct_B".into()), ..failed() }, "mismatch"),
            ("no id", Charge { id: " ".into(), ..succeeded() }, "unbookable"),
            ("nothing charged", Charge { amount: 0, ..succeeded() }, "unbookable"),
            ("less than nothing", Charge { amount: -1999, ..succeeded() }, "unbookable"),
            ("a lower-case currency", Charge { currency: "eur".into(), ..succeeded() }, "unbookable"),
            ("no time", Charge { created: i64::MAX, ..succeeded() }, "unbookable"),
        ];
        for (name, charge, expected) in cases {
            assert_eq!(label(&settlement_of(&asked, &charge)), expected, "{name}");
        }
        let connected = Asked { account: Some(ProviderAccount::parse("acct_A").unwrap()), ..asked.clone() };
        let in_account = |account: Option<&str>| Charge { account: account.map(str::to_owned), ..succeeded() };
        let cases = [
            ("its account", in_account(Some("acct_A")), "succeeded"),
            ("another connected account", in_account(Some("acct_B")), "mismatch"),
            ("oncepay's own account", in_account(None), "mismatch"),
        ];
        for (name, charge, expected) in cases {
            assert_eq!(label(&settlement_of(&connected, &charge)), expected, "{name}");
        }
    }

    #[test]
    fn a_success_books_the_charge_as_the_provider_reported_it() {
        let asked = asked();

        let settled = settlement_of(&asked, &charge(&asked, ChargeStatus::Succeeded)).unwrap();

        assert_eq!(
            settled,
            Settlement::Succeeded {
                charge_id: "ch_1".into(),
                amount: Amount::new(1999).unwrap(),
                currency: Currency::parse("EUR").unwrap(),
                charged_at: OffsetDateTime::from_unix_timestamp(1_763_800_000).unwrap(),
            }
        );
    }

    #[test]
    fn a_decline_keeps_the_providers_words_and_fills_in_blanks() {
        let asked = asked();
        let blank = Charge {
            id: String::new(),
            failure_code: Some(" ".into()),
            failure_message: Some(String::new()),
            ..charge(&asked, ChargeStatus::Failed)
        };
        let worded = Charge {
            failure_code: Some("card_declined".into()),
            failure_message: Some("Insufficient funds".into()),
            ..charge(&asked, ChargeStatus::Failed)
        };

        assert_eq!(
            settlement_of(&asked, &blank).unwrap(),
            Settlement::Failed { code: DECLINED.into(), message: DECLINED_MESSAGE.into(), charge_id: None }
        );
        assert_eq!(
            settlement_of(&asked, &worded).unwrap(),
            Settlement::Failed {
                code: "card_declined".into(),
                message: "Insufficient funds".into(),
                charge_id: Some("ch_1".into())
            }
        );
    }
}
