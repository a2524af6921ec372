//! Operators as accounts: who they are ([`accounts`]), how they prove it ([`tokens`] for machines
//! and the CLI; the organisation's OpenID provider ([`oidc`]) or a local password ([`passwords`])
//! they set themselves with a one-time code ([`enrollment`]), then a [`sessions`] cookie, for
//! people in a browser, all within the [`limits`] on signing in), what their
//! role lets them do and which tenants they may see ([`Role`], [`Scope`]), the decisions that wait
//! for a second operator ([`proposals`]), an operator's refund of a payment ([`refunds`]), the trail
//! of everything they do ([`audit`]), what they see of customer data ([`masking`]), the operations
//! API that serves it all over HTTP ([`api`], answering with [`reports`]), and the CLI's client of
//! that API ([`client`]).
//!
//! The rules live here and in [`proposals`]; the dead-letter actions themselves stay in
//! [`crate::dead_letters::actions`] and [`crate::dead_letters::refunds`], which the API calls once
//! the rules allow it.

pub mod accounts;
pub mod api;
pub mod audit;
pub mod client;
pub mod enrollment;
pub mod limits;
pub mod masking;
pub mod oidc;
pub mod passwords;
pub mod proposals;
pub mod refunds;
pub mod reports;
pub mod sessions;
pub mod tokens;

use std::fmt;
use std::str::FromStr;

use oncepay_domain::ids::TenantId;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::dead_letters::actions::Operator;
use crate::operator_error::OperatorError;
use oncepay_store::stored_name::{self, UnknownName};

/// What an operator may do. Each role may do everything the roles before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, sqlx::Type)]
#[sqlx(type_name = "operator_role", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads dead letters, payments, proposals and the audit trail; customer data comes masked.
    Viewer,
    /// Retries dead letters, acknowledges conflicts, and proposes resolutions.
    Operator,
    /// Approves or rejects what other operators propose.
    Approver,
    /// Manages operators and their tokens.
    Admin,
}

impl Role {
    /// Every role, weakest first.
    pub const ALL: [Self; 4] = [Self::Viewer, Self::Operator, Self::Approver, Self::Admin];

    /// The name stored in `operators.role` and used in the API.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Operator => "operator",
            Self::Approver => "approver",
            Self::Admin => "admin",
        }
    }
}

impl FromStr for Role {
    type Err = UnknownName;

    fn from_str(text: &str) -> Result<Self, UnknownName> {
        stored_name::parse(&Self::ALL, Self::as_str, "operator role", text)
    }
}

/// The tenants an operator may see and act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every tenant, present and future.
    Every,
    /// Only these.
    Only(Vec<TenantId>),
}

impl Scope {
    /// Reads `operators.tenant_ids` (NULL: every tenant).
    pub fn from_column(tenant_ids: Option<Vec<Uuid>>) -> Self {
        tenant_ids.map_or(Self::Every, |ids| Self::Only(ids.into_iter().map(TenantId::from_uuid).collect()))
    }

    /// What `operators.tenant_ids` stores, and what the scoped queries take: `None` for every tenant.
    pub fn to_column(&self) -> Option<Vec<Uuid>> {
        match self {
            Self::Every => None,
            Self::Only(ids) => Some(ids.iter().map(|id| id.as_uuid()).collect()),
        }
    }

    /// Whether the operator may see `tenant`'s payments.
    pub fn allows(&self, tenant: TenantId) -> bool {
        match self {
            Self::Every => true,
            Self::Only(ids) => ids.contains(&tenant),
        }
    }
}

/// An operator's name: 1–63 of a-z 0-9 . _ -, starting with a letter or digit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OperatorName(String);

impl OperatorName {
    /// Checks a name.
    pub fn parse(name: &str) -> Result<Self, OperatorError> {
        let valid = (1..=63).contains(&name.len())
            && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if !valid {
            return Err(OperatorError::Invalid(format!(
                "operator name {name:?}: use 1 to 63 of a-z 0-9 . _ -, starting with a letter or digit"
            )));
        }
        Ok(Self(name.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OperatorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An operator who proved who they are: who acts, with which role, on which tenants.
#[derive(Debug, Clone)]
pub struct Account {
    /// Their id.
    pub operator_id: Uuid,
    /// Their name.
    pub name: String,
    /// Their role.
    pub role: Role,
    /// The tenants they may see.
    pub scope: Scope,
    /// Who made the credential this request acts with: who issued the token or set the password,
    /// or the operator themself for a sign-in at the OpenID provider.
    pub made_by: Uuid,
}

impl Account {
    /// How their actions are recorded on a payment (`operator:<name>`).
    pub fn actor(&self) -> Result<Operator, OperatorError> {
        Operator::parse(&self.name)
    }

    /// Refuses unless their role is at least `needed`.
    pub fn require(&self, needed: Role, to: &str) -> Result<(), OperatorError> {
        if self.role >= needed {
            return Ok(());
        }
        Err(OperatorError::Forbidden(format!(
            "{} is {} {}; to {to} takes the {} role or above",
            self.name,
            article(self.role),
            self.role.as_str(),
            needed.as_str()
        )))
    }

    /// Whether they may see `tenant`'s payments; an operator limited to other tenants is told
    /// `not_found`, exactly as if the payment did not exist.
    pub fn see(&self, tenant: TenantId, not_found: impl FnOnce() -> OperatorError) -> Result<(), OperatorError> {
        if self.scope.allows(tenant) { Ok(()) } else { Err(not_found()) }
    }
}

const fn article(role: Role) -> &'static str {
    match role {
        Role::Operator | Role::Approver | Role::Admin => "an",
        Role::Viewer => "a",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_ordered_weakest_first_and_read_back() {
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Approver && Role::Approver < Role::Admin);
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
            assert_eq!(serde_json::to_value(role).unwrap(), role.as_str());
        }
        assert!("root".parse::<Role>().is_err());
    }

    #[test]
    fn a_limited_scope_allows_only_its_tenants() {
        let mine = TenantId::generate();
        let scope = Scope::from_column(Some(vec![mine.as_uuid()]));
        assert!(scope.allows(mine));
        assert!(!scope.allows(TenantId::generate()));
        assert!(Scope::from_column(None).allows(TenantId::generate()));
    }

    #[test]
    fn operator_names_are_checked() {
        for good in ["alice", "bob.smith", "ops-1", "9lives"] {
            assert!(OperatorName::parse(good).is_ok(), "{good}");
        }
        for bad in ["", "Alice", "-x", ".x", "a b", "ä", &"a".repeat(64)] {
            assert!(OperatorName::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_role_below_the_one_needed_is_refused_with_both_named() {
        let viewer = Account {
            operator_id: Uuid::nil(),
            name: "vic".into(),
            role: Role::Viewer,
            scope: Scope::Every,
            made_by: Uuid::nil(),
        };
        let refused = viewer.require(Role::Operator, "retry a payment").unwrap_err();
        assert_eq!(refused.to_string(), "vic is a viewer; to retry a payment takes the operator role or above");
        assert!(viewer.require(Role::Viewer, "read").is_ok());
    }
}
