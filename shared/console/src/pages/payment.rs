//! `GET /console/payments/{id}`: a payment, its dead letter, proposals, refunds, events to the
//! merchant and timeline, and on demand the provider's charges beside the ledger. Opening it is
//! recorded in the audit trail.

use std::str::FromStr;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use oncepay_domain::ids::{PaymentId, RefundId};
use oncepay_domain::money::format_amount;
use oncepay_domain::status::PaymentStatus;
use oncepay_http::problem::{Problem, ProblemType};
use oncepay_provider::{Charge, ConfiguredProvider, PaymentProvider};
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use super::dead_letters::DeadRefundLine;
use super::proposal_list::ProposalLine;
use super::{done, failed, refused, when};
use crate::provider_view::{self, Ours};
use crate::queries::{self, Happened};
use crate::{Chrome, caller_or_sign_in, html, visible_tenants};
use oncepay_ops::dead_letters::refunds as dead_refunds;
use oncepay_ops::operators::api::{OperatorsState, connection, query};
use oncepay_ops::operators::audit::{self, Entry, Outcome};
use oncepay_ops::operators::proposals::{self, ProposalStatus};
use oncepay_ops::operators::refunds as operator_refunds;
use oncepay_ops::operators::{Role, masking};

/// A label and a value on a payment's page.
struct Fact {
    label: &'static str,
    value: String,
}

/// What the provider holds for a payment, asked on demand.
struct ProviderView {
    charges: Vec<Charge>,
    contradictions: Vec<String>,
    /// Why the provider could not be asked.
    error: Option<String>,
}

impl ProviderView {
    /// A charge's amount as people read money.
    fn amount_of(&self, charge: &Charge) -> String {
        format_amount(charge.amount, &charge.currency)
    }
}

/// One line of a payment's timeline.
struct TimelineLine {
    at: String,
    source: &'static str,
    by: String,
    what: String,
}

impl From<Happened> for TimelineLine {
    fn from(happened: Happened) -> Self {
        Self { at: when(happened.at), source: happened.source, by: happened.by, what: happened.what }
    }
}

/// An event the payment's changes sent the merchant.
struct EventLine {
    event_id: Uuid,
    event_type: String,
    created_at: String,
    /// How its deliveries stand, in words.
    deliveries: String,
}

impl From<queries::PaymentEvent> for EventLine {
    fn from(event: queries::PaymentEvent) -> Self {
        let deliveries = if event.delivered + event.pending + event.dead_lettered == 0 {
            "no endpoint took it".to_owned()
        } else {
            format!("{} delivered, {} waiting, {} dead-lettered", event.delivered, event.pending, event.dead_lettered)
        };
        Self { event_id: event.event_id, event_type: event.event_type, created_at: when(event.created_at), deliveries }
    }
}

/// The payment's open dead letter.
struct OpenEntry {
    kind: String,
    reason: String,
    since: String,
}

/// One of the payment's refunds.
struct RefundLine {
    refund_id: RefundId,
    amount: String,
    status: String,
    provider_refund_id: String,
    requested_by: String,
    created_at: String,
    /// Why it failed, when it did.
    failure: String,
}

impl From<operator_refunds::RefundView> for RefundLine {
    fn from(refund: operator_refunds::RefundView) -> Self {
        Self {
            refund_id: refund.refund_id,
            amount: format_amount(refund.amount.minor_units(), refund.currency.as_str()),
            status: refund.status.as_str().to_owned(),
            provider_refund_id: refund.provider_refund_id.unwrap_or_default(),
            requested_by: refund.requested_by,
            created_at: when(refund.created_at),
            failure: refund.failure.unwrap_or_default(),
        }
    }
}

/// The reasons a refund may give, for the form's list: the provider's words and what they say.
const REFUND_REASONS: [(&str, &str); 3] = [
    ("duplicate", "charged twice for one thing"),
    ("fraudulent", "the charge was fraudulent"),
    ("requested_by_customer", "the customer asked for it"),
];

/// `GET /console/payments/{id}`.
#[derive(Template)]
#[template(path = "payment.html")]
struct PaymentPage {
    chrome: Option<Chrome>,
    title: String,
    payment_id: PaymentId,
    /// Its tenant's name.
    tenant: String,
    facts: Vec<Fact>,
    open_entry: Option<OpenEntry>,
    pending: Option<ProposalLine>,
    proposals: Vec<ProposalLine>,
    timeline: Vec<TimelineLine>,
    /// The events its changes sent the merchant, in order.
    events: Vec<EventLine>,
    /// Whether the operator may replay them.
    replays: bool,
    provider: Option<ProviderView>,
    /// Whether the payment succeeded, and so has a list of refunds.
    refundable_payment: bool,
    /// Its refunds, oldest first.
    refunds: Vec<RefundLine>,
    /// What is left to refund, when anything is: as people read it, and in minor units.
    left_to_refund: Option<(String, i64)>,
    /// The reasons a refund may give.
    refund_reasons: &'static [(&'static str, &'static str)],
    /// Its refunds automation gave up on, for an operator to resend or settle.
    dead_refunds: Vec<DeadRefundLine>,
    /// Its final refunds a provider's report contradicts, for an operator to acknowledge.
    refund_conflicts: Vec<DeadRefundLine>,
}

#[derive(Debug, Default, Deserialize)]
struct PaymentQuery {
    /// `ask`: fetch the provider's view now.
    provider: Option<String>,
    notice: Option<String>,
}

/// A payment's id from a URL; a payment that cannot exist is not found.
pub(crate) fn payment_id_of(text: &str) -> Result<PaymentId, Problem> {
    PaymentId::from_str(text).map_err(|_| Problem::new(ProblemType::NotFound, format!("there is no payment {text:?}")))
}

fn no_payment(payment_id: PaymentId) -> Problem {
    Problem::new(ProblemType::NotFound, format!("there is no payment {payment_id}"))
}

/// `GET /console/payments/{id}[?provider=ask]`: the payment, its dead letters, proposals and
/// timeline, and, when asked, the provider's charges for it beside the ledger.
pub(crate) async fn payment(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
) -> HttpResponse {
    done(
        async {
            let caller = caller_or_sign_in(&state, &request).await?;
            let asked: PaymentQuery = query(&request).unwrap_or_default();
            let chrome = Chrome::of(&caller.account, "dead-letters").noticed(asked.notice.as_deref());
            let fail = refused(&chrome);
            let payment_id = payment_id_of(&path).map_err(&fail)?;
            let visible: Vec<Uuid> =
                visible_tenants(&state, &caller).await.map_err(&fail)?.iter().map(|t| t.tenant_id.as_uuid()).collect();
            let mut conn = connection(&state).await.map_err(&fail)?;
            let payment = queries::payment(&mut conn, &visible, payment_id)
                .await
                .map_err(failed(&chrome))?
                .ok_or_else(|| fail(no_payment(payment_id)))?;
            let (timeline, dead_letters) =
                queries::timeline(&mut conn, payment.tenant_id, payment_id).await.map_err(failed(&chrome))?;
            let events =
                queries::payment_events(&mut conn, payment.tenant_id, payment_id).await.map_err(failed(&chrome))?;
            let proposals = proposals::list(&mut conn, &caller.account.scope, Some(payment_id), None)
                .await
                .map_err(failed(&chrome))?;
            let refunds = operator_refunds::of_payment(&mut conn, payment.tenant_id, payment_id)
                .await
                .map_err(failed(&chrome))?;
            let tenant = [payment.tenant_id.as_uuid()];
            let (refund_conflicts, dead_refunds): (Vec<_>, Vec<_>) =
                dead_refunds::list(&mut conn, Some(&tenant), Some(payment_id))
                    .await
                    .map_err(failed(&chrome))?
                    .into_iter()
                    .map(DeadRefundLine::from)
                    .partition(DeadRefundLine::conflict);
            let masked = caller.account.role == Role::Viewer;
            let read = Entry::new("payment.read", Outcome::Done)
                .payment(payment.tenant_id, payment_id)
                .detail(json!({ "customer_data": if masked { "masked" } else { "shown" }, "via": "console" }));
            audit::record(&mut conn, &caller.actor(), &read).await.map_err(failed(&chrome))?;
            drop(conn);
            let provider = if asked.provider.as_deref() == Some("ask") {
                Some(provider_view(&state, &payment, payment_id).await)
            } else {
                None
            };
            let facts = facts(&payment, masked);
            let name = caller.account.name.as_str();
            let proposals: Vec<ProposalLine> = proposals.into_iter().map(|p| ProposalLine::of(p, name)).collect();
            let (pending, proposals): (Vec<_>, Vec<_>) =
                proposals.into_iter().partition(|p| p.status == ProposalStatus::Pending);
            let open_entry = dead_letters.into_iter().find(|d| d.resolved_at.is_none()).map(|d| OpenEntry {
                kind: d.kind,
                reason: d.reason,
                since: when(d.created_at),
            });
            let page = PaymentPage {
                chrome: Some(chrome.clone()),
                title: format!("Payment {payment_id}"),
                payment_id,
                tenant: payment.tenant.clone(),
                facts,
                open_entry,
                pending: pending.into_iter().next(),
                proposals,
                timeline: timeline.into_iter().map(TimelineLine::from).collect(),
                events: events.into_iter().map(EventLine::from).collect(),
                replays: chrome.can_act(),
                provider,
                refundable_payment: refunds.status == PaymentStatus::Succeeded,
                left_to_refund: (refunds.status == PaymentStatus::Succeeded && refunds.left() > 0)
                    .then(|| (format_amount(refunds.left(), refunds.currency.as_str()), refunds.left())),
                refunds: refunds.refunds.into_iter().map(RefundLine::from).collect(),
                refund_reasons: &REFUND_REASONS,
                dead_refunds,
                refund_conflicts,
            };
            Ok(html(StatusCode::OK, &page))
        }
        .await,
    )
}

fn facts(payment: &queries::Payment, masked: bool) -> Vec<Fact> {
    let mask = |text: &str| if masked { masking::reference(text) } else { text.to_owned() };
    let mut facts = vec![
        Fact { label: "Tenant", value: payment.tenant.clone() },
        Fact { label: "Status", value: payment.status.as_str().to_owned() },
        Fact { label: "Amount", value: format_amount(payment.amount.minor_units(), payment.currency.as_str()) },
        Fact { label: "Customer reference", value: mask(&payment.customer_id) },
        Fact {
            label: "Idempotency-Key",
            value: payment.idempotency_key.clone().unwrap_or_else(|| "(reaped after its retention)".into()),
        },
        Fact { label: "Accepted", value: when(payment.created_at) },
        Fact { label: "Last changed", value: when(payment.updated_at) },
        Fact { label: "Sends", value: payment.send_attempts.to_string() },
    ];
    if let Some(first) = payment.first_sent_at {
        facts.push(Fact { label: "First sent", value: when(first) });
    }
    if let Some(method) = &payment.payment_method {
        facts.push(Fact { label: "Payment method", value: mask(method) });
    }
    if !masked {
        if let Some(description) = &payment.description {
            facts.push(Fact { label: "Description", value: description.clone() });
        }
        if payment.metadata.as_object().is_some_and(|m| !m.is_empty()) {
            facts.push(Fact { label: "Metadata", value: payment.metadata.to_string() });
        }
    }
    if let Some(account) = &payment.provider_account {
        facts.push(Fact { label: "Provider account", value: account.to_string() });
    }
    if let Some(charge) = &payment.provider_charge_id {
        facts.push(Fact { label: "Provider charge", value: charge.clone() });
    }
    match (&payment.booked_charge, payment.booked_amount, &payment.booked_currency) {
        (Some(charge), Some(amount), Some(currency)) => {
            facts.push(Fact {
                label: "Ledger",
                value: format!("{} booked with charge {charge}", format_amount(amount, currency)),
            });
        }
        _ => facts.push(Fact { label: "Ledger", value: "no charge booked".into() }),
    }
    if let (Some(code), Some(message)) = (&payment.failure_code, &payment.failure_message) {
        facts.push(Fact { label: "Failure", value: format!("{code}: {message}") });
    }
    if payment.status == PaymentStatus::Succeeded {
        let money = |minor_units: i64| format_amount(minor_units, payment.currency.as_str());
        facts.push(Fact {
            label: "Refunded",
            value: format!(
                "{} of {} ({} promised back, counting refunds not yet final)",
                money(payment.refunded),
                money(payment.amount.minor_units()),
                money(payment.refunds_reserved)
            ),
        });
    }
    facts
}

/// Asks the provider for the payment's charges now, and compares them with the ledger.
async fn provider_view(state: &OperatorsState, payment: &queries::Payment, payment_id: PaymentId) -> ProviderView {
    let asked = async {
        let provider = ConfiguredProvider::new(&state.provider).map_err(|error| format!("{error:#}"))?;
        provider
            .find_by_key(&payment_id.downstream_key(), payment.provider_account.as_ref())
            .await
            .map_err(|error| error.to_string())
    };
    match asked.await {
        Ok(charges) => {
            let booked = match (&payment.booked_charge, payment.booked_amount, &payment.booked_currency) {
                (Some(charge), Some(amount), Some(currency)) => Some((charge.as_str(), amount, currency.as_str())),
                _ => None,
            };
            let ours = Ours {
                status: payment.status,
                amount: payment.amount.minor_units(),
                currency: payment.currency.as_str(),
                booked,
            };
            let contradictions = provider_view::contradictions(&ours, &charges);
            ProviderView { charges, contradictions, error: None }
        }
        Err(error) => {
            tracing::warn!(error, "the console cannot ask the provider about a payment");
            ProviderView {
                charges: Vec::new(),
                contradictions: Vec::new(),
                error: Some("the provider cannot be asked now; the reconciler's log has the cause".into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use oncepay_domain::refund::RefundReason;

    use super::*;

    #[test]
    fn the_refund_forms_list_offers_every_reason_the_intake_knows() {
        let offered: Vec<&str> = REFUND_REASONS.iter().map(|(value, _)| *value).collect();
        let known: Vec<&str> = RefundReason::ALL.iter().map(|reason| reason.as_str()).collect();
        assert_eq!(offered, known);
    }
}
