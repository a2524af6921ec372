//! `GET /console/proposals`: proposals waiting for an approver and those decided, and how a page
//! lists one (the payment's page lists its own too).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use oncepay_domain::ids::PaymentId;
use uuid::Uuid;

use super::{done, failed, refused, when};
use crate::{Chrome, caller_or_sign_in, html};
use oncepay_ops::operators::api::{OperatorsState, connection};
use oncepay_ops::operators::proposals::{self, ProposalStatus, ProposalView, Proposed};

/// A proposal, as a page lists it.
pub(super) struct ProposalLine {
    pub(super) proposal_id: Uuid,
    /// The payment it is about; none for a proposal on a tenant.
    pub(super) payment_id: Option<PaymentId>,
    /// What it is about, in words.
    pub(super) about: String,
    pub(super) action: String,
    pub(super) reason: String,
    pub(super) status: ProposalStatus,
    pub(super) proposed_by: String,
    pub(super) proposed_at: String,
    pub(super) expires_at: String,
    /// Who decided, when and why.
    pub(super) decided: String,
    /// Whether it is the operator's own (they may withdraw it, not approve it).
    pub(super) own: bool,
    /// Whether the operator may collect the API key its approval made: their own, approved, and not
    /// collected yet.
    pub(super) collectable: bool,
}

impl ProposalLine {
    pub(super) fn of(proposal: ProposalView, operator: &str) -> Self {
        let action = proposal_action(&proposal);
        let decided = match (&proposal.decided_by, proposal.decided_at) {
            (Some(by), Some(at)) => {
                format!("{by}, {}: {}", when(at), proposal.decision_note.as_deref().unwrap_or_default())
            }
            _ => String::new(),
        };
        let own = proposal.proposed_by == operator;
        let issues_a_key = serde_json::from_value::<Proposed>(proposal.action.clone()).is_ok_and(|p| p.issues_a_key());
        let collectable =
            own && issues_a_key && proposal.status == ProposalStatus::Approved && proposal.key_collected_at.is_none();
        Self {
            proposal_id: proposal.proposal_id,
            payment_id: proposal.payment_id,
            about: proposal.about(),
            action,
            own,
            collectable,
            reason: proposal.reason,
            status: proposal.status,
            proposed_by: proposal.proposed_by,
            proposed_at: when(proposal.proposed_at),
            expires_at: when(proposal.expires_at),
            decided,
        }
    }
}

/// A proposal's action, in words; as stored, should it be one this version does not know.
fn proposal_action(proposal: &ProposalView) -> String {
    serde_json::from_value::<Proposed>(proposal.action.clone())
        .map_or_else(|_| proposal.action.to_string(), |proposed| proposed.to_string())
}

/// `GET /console/proposals`.
#[derive(Template)]
#[template(path = "proposals.html")]
struct ProposalsPage {
    chrome: Option<Chrome>,
    title: String,
    pending: Vec<ProposalLine>,
    decided: Vec<ProposalLine>,
}

/// `GET /console/proposals`: those waiting for an approver, then the latest decided.
pub(crate) async fn proposals(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    done(
        async {
            let caller = caller_or_sign_in(&state, &request).await?;
            let chrome = Chrome::of(&caller.account, "proposals").noticed_by(&request);
            let mut conn = connection(&state).await.map_err(refused(&chrome))?;
            let all = proposals::list(&mut conn, &caller.account.scope, None, None).await.map_err(failed(&chrome))?;
            let name = caller.account.name.as_str();
            let (pending, decided): (Vec<_>, Vec<_>) =
                all.into_iter().map(|p| ProposalLine::of(p, name)).partition(|p| p.status == ProposalStatus::Pending);
            let page = ProposalsPage { chrome: Some(chrome), title: "Proposals".into(), pending, decided };
            Ok(html(StatusCode::OK, &page))
        }
        .await,
    )
}
