//! The HTTP intake: authenticates tenants, accepts payment requests idempotently, serves their status
