//! A client library and CLI for the oncepay API
//!
//! Scaffolding: the binary is being built; see the open issues.

fn main() {}
