//! Benchmarks oncepay against raw PostgreSQL running the same SQL
