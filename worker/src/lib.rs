//! Drains the outbox and asks the provider to charge, at most once per payment
