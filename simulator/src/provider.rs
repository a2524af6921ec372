//! The simulated provider: the protocol's operations (create, look up, list charges and refunds)
//! over the ledger and the idempotency memory, with the faults applied, plus the control operations
//! tests use (plant a charge, forget keys, read the ground truth).
//!
//! Invariants: at most one charge or refund per idempotency key while the key is remembered; an
//! object is written to the ledger and its webhook queued before any response about it (or the
//! injected absence of one) goes out; a key claimed fresh is always decided, whatever fault
//! follows, so it never stays in flight. Charges and refunds take one path through the faults and
//! the key store ([`Provider::create`]). This module knows nothing of HTTP beyond the status codes
//! of its responses.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use oncepay_provider::wire::{
    Charge, ChargePage, ChargeStatus, CreateCharge, CreateRefund, ErrorBody, ErrorDetail, Refund, RefundPage,
    RefundState,
};
use tokio_util::sync::CancellationToken;

use crate::clock::{pause, unix_now};
use crate::control::{GroundTruth, PlantCharge, RefundTruth};
use crate::dice::Dice;
use crate::faults::{AfterCreate, CreatePlan, Creating, Faults, SharedFaults};
use crate::idempotency::{Claim, Decided, KeyStore, Params, StoredResponse};
use crate::ledger::{Ledger, ListQuery, RefundNotWritten, UnknownCursor, Unrefundable};
use crate::webhooks::Notifier;

/// Why a charge is declined: code and message, picked by the dice (and the message of a declined
/// payment method's code).
const DECLINE_REASONS: [(&str, &str); 3] = [
    ("card_declined", "The card was declined."),
    ("insufficient_funds", "The card has insufficient funds."),
    ("expired_card", "The card has expired."),
];

/// Why a refund fails: code (its `failure_reason`) and message, picked by the dice; Stripe's codes.
const REFUND_FAILURES: [(&str, &str); 3] = [
    ("expired_or_canceled_card", "The card was canceled or has expired, so the refund failed."),
    ("lost_or_stolen_card", "The card was reported lost or stolen, so the refund failed."),
    ("declined", "The card issuer declined the refund."),
];

/// How a create request (a charge or a refund) ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateResponse {
    /// An HTTP response.
    Send {
        /// Status and body.
        response: StoredResponse,
        /// Whether it is the stored response of an earlier request.
        replayed: bool,
    },
    /// No response at all: the connection must be closed.
    DropConnection,
    /// 429 with `Retry-After`, before anything happened.
    RateLimited {
        /// Seconds.
        retry_after_secs: u64,
    },
}

/// What making the object of a create did, once its key was claimed fresh.
enum Made {
    /// The object exists and its webhook is queued: its real response (201 or 402).
    Created(StoredResponse),
    /// Nothing was made: the request was refused (a refund its charge cannot take), with this
    /// response.
    Refused(StoredResponse),
}

/// The provider.
pub struct Provider {
    // Held only for in-memory work, never across an `.await`.
    books: Mutex<Books>,
    faults: SharedFaults,
    dice: Dice,
    webhooks: Notifier,
    shutdown: CancellationToken,
}

struct Books {
    ledger: Ledger,
    // One store for charge and refund keys: a key of one kind is "other parameters" for the other.
    keys: KeyStore,
}

impl Provider {
    /// A provider with empty books.
    pub fn new(
        key_window: Duration,
        faults: SharedFaults,
        dice: Dice,
        webhooks: Notifier,
        shutdown: CancellationToken,
    ) -> Self {
        let books = Books { ledger: Ledger::default(), keys: KeyStore::new(key_window) };
        Self { books: Mutex::new(books), faults, dice, webhooks, shutdown }
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        // Every mutation under the lock is a single insert or update, so a panic elsewhere cannot
        // leave the books half-changed.
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `POST /v1/charges` with `key` and `params` (both already validated). Callers must run it to
    /// completion (the HTTP layer spawns it), so a client that hangs up cannot leave a key in
    /// flight.
    #[tracing::instrument(name = "provider.create_charge", skip_all, fields(charge.id, sim.fault))]
    pub async fn create_charge(&self, key: String, params: CreateCharge) -> CreateResponse {
        let claimed = Params::Charge(params.clone());
        self.create(Creating::Charge, key, claimed, |key, plan, faults| {
            let declined = faults.declined_code(params.payment_method.as_deref());
            let (charge, response) = self.make_charge(key, &params, plan, declined);
            tracing::Span::current().record("charge.id", charge.id.as_str());
            self.webhooks.charge_settled(&reported(&charge, plan));
            metrics::counter!("oncepay_simulator_charges_total", "status" => status_label(charge.status)).increment(1);
            Made::Created(response)
        })
        .await
    }

    /// `POST /v1/refunds` with `key` and `params` (both already validated), under the same
    /// idempotency and faults as a charge. A refund its charge cannot take (unknown, not succeeded,
    /// or beyond what is left) is refused with a 400 and nothing is made; the check and the write
    /// are one step under the books' lock, so concurrent refunds cannot together exceed a charge.
    /// Callers must run it to completion, as a charge.
    #[tracing::instrument(name = "provider.create_refund", skip_all, fields(refund.id, sim.fault))]
    pub async fn create_refund(&self, key: String, params: CreateRefund) -> CreateResponse {
        let claimed = Params::Refund(params.clone());
        self.create(Creating::Refund, key, claimed, |key, plan, _| self.make_refund(key, &params, plan)).await
    }

    /// The path every create takes: the faults before anything, the key claimed, the latency and
    /// the hang before, `make`, then the faults after. `make` runs at most once, only with the key
    /// claimed fresh, and the key is always decided afterwards.
    async fn create(
        &self,
        what: Creating,
        key: String,
        params: Params,
        make: impl FnOnce(&str, &CreatePlan, &Faults) -> Made,
    ) -> CreateResponse {
        let faults = self.faults.get();
        let latency = Duration::from_millis(faults.latency_ms);
        let reasons = match what {
            Creating::Charge => DECLINE_REASONS.len(),
            Creating::Refund => REFUND_FAILURES.len(),
        };
        let plan = self.dice.with(|rng| CreatePlan::draw(&faults, what, reasons, rng));
        match what {
            Creating::Charge => self.books().ledger.count_post(&key),
            Creating::Refund => self.books().ledger.count_refund_post(&key),
        }

        if let Some(refused) = self.fail_before(&plan, &faults, latency).await {
            return refused;
        }
        let claim = self.books().keys.claim(&key, &params, Instant::now());
        match claim {
            Claim::Fresh => {}
            Claim::InFlight => {
                self.pause(latency).await;
                let body = error_body("idempotency_key_in_use", "A request with this key is being processed.", None);
                return send(false, StoredResponse::json(409, &body));
            }
            Claim::Reused => {
                self.pause(latency).await;
                let message = "This key was used with other parameters.";
                return send(false, StoredResponse::json(422, &error_body("idempotency_key_reused", message, None)));
            }
            Claim::Decided(decided) => {
                self.pause(latency).await;
                return self.replay(decided, &plan);
            }
        }

        // The key is ours and in flight: the latency is the provider's processing time.
        self.pause(latency).await;
        if plan.hang_before {
            // Still in flight, and nothing made yet: a lookup meanwhile finds nothing.
            record_fault("hang_before");
            self.pause(Duration::from_millis(faults.hang_before_ms)).await;
        }
        let response = match make(&key, &plan, &faults) {
            Made::Created(response) => response,
            Made::Refused(response) => {
                // Nothing exists for the faults after creating to act on.
                self.decide(&key, response.clone(), None);
                return send(false, response);
            }
        };
        self.after_making(what, &key, response, &plan, &faults).await
    }

    /// The faults that strike before anything happens, after the latency: a 500, or a 429.
    async fn fail_before(&self, plan: &CreatePlan, faults: &Faults, latency: Duration) -> Option<CreateResponse> {
        if plan.error_before {
            self.pause(latency).await;
            record_fault("error_before");
            return Some(send(false, server_error("The provider failed before doing anything.")));
        }
        if plan.rate_limited {
            self.pause(latency).await;
            record_fault("rate_limited");
            return Some(CreateResponse::RateLimited { retry_after_secs: faults.rate_limit_retry_after_secs });
        }
        None
    }

    /// The response to a resend of a decided key: the stored one, or the injected 500 that went out
    /// instead of it (under `replay_stored_5xx`), or a refusal (under `refuse_resend`).
    fn replay(&self, decided: Decided, plan: &CreatePlan) -> CreateResponse {
        if plan.refuse_resend && decided.response.status == 201 {
            // A resend of a key that charged, refused as a real provider's checks that run before
            // its idempotency layer would refuse it: the charge stands, and this response says
            // nothing of it.
            record_fault("refuse_resend");
            let message = "No such payment method: it was detached from its customer.";
            return send(false, StoredResponse::json(400, &error_body("resource_missing", message, None)));
        }
        let response = match decided.injected_error {
            Some(error) if self.faults.get().replay_stored_5xx => {
                record_fault("replay_stored_5xx");
                error
            }
            _ => decided.response,
        };
        send(true, response)
    }

    /// The faults that strike once the object exists and `response` is its real response: none, a
    /// 500, a hang, or a dropped connection. Each decides the key.
    async fn after_making(
        &self,
        what: Creating,
        key: &str,
        response: StoredResponse,
        plan: &CreatePlan,
        faults: &Faults,
    ) -> CreateResponse {
        if plan.after != AfterCreate::Respond {
            record_fault(plan.after.label());
        }
        match plan.after {
            AfterCreate::Respond => {
                self.decide(key, response.clone(), None);
                send(false, response)
            }
            AfterCreate::ServerError => {
                let error = server_error(match what {
                    Creating::Charge => "The provider failed after creating the charge.",
                    Creating::Refund => "The provider failed after creating the refund.",
                });
                self.decide(key, response, Some(error.clone()));
                send(false, error)
            }
            AfterCreate::Hang => {
                // Still in flight while hanging: a duplicate meanwhile gets 409.
                self.pause(Duration::from_millis(faults.hang_ms)).await;
                self.decide(key, response.clone(), None);
                send(false, response)
            }
            AfterCreate::DropConnection => {
                self.decide(key, response, None);
                CreateResponse::DropConnection
            }
        }
    }

    /// Makes the refund, failed if the plan says so, and queues its webhook; or refuses it, making
    /// nothing, when its charge cannot take it.
    fn make_refund(&self, key: &str, params: &CreateRefund, plan: &CreatePlan) -> Made {
        let failure = plan.decline.then(|| REFUND_FAILURES[plan.decline_reason % REFUND_FAILURES.len()]);
        let refused = |why: Unrefundable| {
            tracing::info!(refund.refused = why.code(), "refund refused");
            Made::Refused(StoredResponse::json(400, &error_body(why.code(), &why.to_string(), None)))
        };
        let refund = {
            // Checked and written under one lock: no other refund of the charge can come between.
            let mut books = self.books();
            let currency = match books.ledger.refundable(&params.charge, params.amount) {
                Ok(charge) => charge.currency.clone(),
                Err(why) => return refused(why),
            };
            loop {
                let refund = Refund {
                    id: self.dice.token("re_"),
                    status: if failure.is_some() { RefundState::Failed } else { RefundState::Succeeded },
                    charge: params.charge.clone(),
                    amount: params.amount,
                    currency: currency.clone(),
                    idempotency_key: Some(key.to_owned()),
                    created: unix_now(),
                    metadata: params.metadata.clone(),
                    failure_reason: failure.map(|(code, _)| code.to_owned()),
                    // The protocol has no provider accounts.
                    account: None,
                };
                match books.ledger.insert_refund(refund.clone()) {
                    Ok(()) => break refund,
                    // A 24-character id repeats essentially never; when it does, draw another.
                    Err(RefundNotWritten::DuplicateId(_)) => {}
                    Err(RefundNotWritten::Unrefundable(why)) => return refused(why),
                }
            }
        };
        if plan.malformed {
            record_fault("malformed");
        }
        tracing::Span::current().record("refund.id", refund.id.as_str());
        let shown = reported_refund(&refund, plan);
        self.webhooks.refund_settled(&shown);
        metrics::counter!("oncepay_simulator_refunds_total", "status" => refund_status_label(refund.status))
            .increment(1);
        Made::Created(match failure {
            None => StoredResponse::json(201, &shown),
            Some((code, message)) => {
                let mut body = error_body(code, message, None);
                body.error.refund = Some(refund.id);
                StoredResponse::json(402, &body)
            }
        })
    }

    /// Makes the charge: declined with `declined`'s code if given (a declined payment method), else
    /// as the plan drew it.
    fn make_charge(
        &self,
        key: &str,
        params: &CreateCharge,
        plan: &CreatePlan,
        declined: Option<&str>,
    ) -> (Charge, StoredResponse) {
        let (status, failure) = if let Some(code) = declined {
            record_fault("declined_payment_method");
            (ChargeStatus::Failed, Some((code.to_owned(), decline_message(code).to_owned())))
        } else if plan.decline {
            let (code, message) = DECLINE_REASONS[plan.decline_reason % DECLINE_REASONS.len()];
            (ChargeStatus::Failed, Some((code.to_owned(), message.to_owned())))
        } else {
            (ChargeStatus::Succeeded, None)
        };
        if plan.mismatch && status == ChargeStatus::Succeeded {
            record_fault("mismatch");
        }
        if plan.malformed {
            record_fault("malformed");
        }
        let charge = self.insert(|id| Charge {
            id,
            status,
            // The mismatch fault really takes more money than asked: the ledger says so too.
            amount: params.amount.saturating_add(i64::from(plan.mismatch && status == ChargeStatus::Succeeded)),
            currency: params.currency.clone(),
            customer: params.customer.clone(),
            idempotency_key: key.to_owned(),
            created: unix_now(),
            metadata: params.metadata.clone(),
            failure_code: failure.as_ref().map(|(code, _)| code.clone()),
            failure_message: failure.as_ref().map(|(_, message)| message.clone()),
            payment_method: params.payment_method.clone(),
            // The protocol has no provider accounts.
            account: None,
        });
        let response = match &failure {
            None => StoredResponse::json(201, &reported(&charge, plan)),
            Some((code, message)) => StoredResponse::json(402, &error_body(code, message, Some(charge.id.clone()))),
        };
        (charge, response)
    }

    /// Writes the charge `make` builds around a fresh id.
    fn insert(&self, make: impl Fn(String) -> Charge) -> Charge {
        loop {
            let charge = make(self.dice.token("ch_"));
            // A 24-character id repeats essentially never; when it does, draw another.
            if self.books().ledger.insert(charge.clone()).is_ok() {
                return charge;
            }
        }
    }

    fn decide(&self, key: &str, response: StoredResponse, injected_error: Option<StoredResponse>) {
        self.books().keys.decide(key, Decided { response, injected_error }, Instant::now());
    }

    async fn pause(&self, duration: Duration) {
        // A shutdown cuts injected delays short: the response goes out at once.
        pause(duration, &self.shutdown).await;
    }

    /// Whether this lookup gets a 503 (the lookup-error fault).
    pub fn lookup_fails(&self) -> bool {
        let faults = self.faults.get();
        let fails = self.dice.with(|rng| rand::Rng::random::<f64>(rng) < faults.lookup_error_rate);
        if fails {
            record_fault("lookup_error");
        }
        fails
    }

    /// `GET /v1/charges/{id}`.
    pub async fn charge(&self, id: &str) -> Option<Charge> {
        self.pause(Duration::from_millis(self.faults.get().latency_ms)).await;
        self.books().ledger.get(id).cloned()
    }

    /// `GET /v1/charges?…`.
    pub async fn list(&self, query: &ListQuery) -> Result<ChargePage, UnknownCursor> {
        self.pause(Duration::from_millis(self.faults.get().latency_ms)).await;
        self.books().ledger.list(query)
    }

    /// Puts a charge in the ledger as if it had been made, and queues its webhook.
    pub fn plant(&self, plant: PlantCharge) -> Charge {
        let key = plant.idempotency_key.clone().unwrap_or_else(|| self.dice.token("planted_"));
        let failed = plant.status == ChargeStatus::Failed;
        let charge = self.insert(|id| Charge {
            id,
            status: plant.status,
            amount: plant.amount,
            currency: plant.currency.clone(),
            customer: plant.customer.clone(),
            idempotency_key: key.clone(),
            created: plant.created.unwrap_or_else(unix_now),
            metadata: plant.metadata.clone(),
            failure_code: failed.then(|| plant.failure_code.clone().unwrap_or_else(|| "card_declined".to_owned())),
            failure_message: failed
                .then(|| plant.failure_message.clone().unwrap_or_else(|| "The card was declined.".to_owned())),
            payment_method: None,
            account: None,
        });
        tracing::info!(charge.id = %charge.id, "charge planted");
        self.webhooks.charge_settled(&charge);
        charge
    }

    /// Forgets every decided idempotency key now; returns how many.
    pub fn forget_keys(&self) -> usize {
        self.books().keys.forget_decided()
    }

    /// Every charge and every key's history.
    pub fn ground_truth(&self) -> GroundTruth {
        self.books().ledger.ground_truth()
    }

    /// `GET /v1/refunds/{id}`.
    pub async fn refund(&self, id: &str) -> Option<Refund> {
        self.pause(Duration::from_millis(self.faults.get().latency_ms)).await;
        self.books().ledger.refund(id).cloned()
    }

    /// `GET /v1/refunds?…`, of `charge` if given.
    pub async fn list_refunds(&self, query: &ListQuery, charge: Option<&str>) -> Result<RefundPage, UnknownCursor> {
        self.pause(Duration::from_millis(self.faults.get().latency_ms)).await;
        self.books().ledger.list_refunds(query, charge)
    }

    /// Every refund and every refund key's history.
    pub fn refund_truth(&self) -> RefundTruth {
        self.books().ledger.refund_truth()
    }
}

/// The message of a decline `code`: the simulator's own for the codes it draws, else a generic one.
fn decline_message(code: &str) -> &'static str {
    DECLINE_REASONS
        .iter()
        .find(|(known, _)| *known == code)
        .map_or("The payment method was declined.", |(_, message)| message)
}

/// How the response and the webhook report `charge`: as it is, or with a lower-case currency under
/// the malformed fault (the ledger keeps it right).
fn reported(charge: &Charge, plan: &CreatePlan) -> Charge {
    if plan.malformed { Charge { currency: charge.currency.to_lowercase(), ..charge.clone() } } else { charge.clone() }
}

/// How the response and the webhook report `refund`, as [`reported`] does a charge.
fn reported_refund(refund: &Refund, plan: &CreatePlan) -> Refund {
    if plan.malformed { Refund { currency: refund.currency.to_lowercase(), ..refund.clone() } } else { refund.clone() }
}

fn send(replayed: bool, response: StoredResponse) -> CreateResponse {
    CreateResponse::Send { response, replayed }
}

fn record_fault(fault: &'static str) {
    tracing::Span::current().record("sim.fault", fault);
    tracing::info!("fault injected");
    metrics::counter!("oncepay_simulator_faults_total", "fault" => fault).increment(1);
}

const fn status_label(status: ChargeStatus) -> &'static str {
    match status {
        ChargeStatus::Succeeded => "succeeded",
        ChargeStatus::Failed => "failed",
    }
}

const fn refund_status_label(status: RefundState) -> &'static str {
    match status {
        RefundState::Pending => "pending",
        RefundState::Succeeded => "succeeded",
        RefundState::Failed => "failed",
        RefundState::Canceled => "canceled",
    }
}

/// The protocol's error body.
pub fn error_body(code: &str, message: &str, charge: Option<String>) -> ErrorBody {
    ErrorBody { error: ErrorDetail { code: code.to_owned(), message: message.to_owned(), charge, refund: None } }
}

fn server_error(message: &str) -> StoredResponse {
    StoredResponse::json(500, &error_body("server_error", message, None))
}
