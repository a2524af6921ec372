//! Development plumbing that is not part of oncepay itself: a throwaway PostgreSQL cluster
//! ([`pg::Cluster`]), a throwaway Citus cluster of three of them ([`citus::CitusCluster`]), either
//! one as the server oncepay runs on ([`server::Server`]), a throwaway RabbitMQ node
//! ([`rabbitmq::Node`]), supervised child processes ([`process::Child`]) started with oncepay's
//! settings by name ([`process::Spec::setting`]), localstripe and a real OpenID provider as two of
//! them ([`localstripe`], [`oidc`]), chromedriver and headless Chromium for the console's browser
//! tests ([`browser`]), one way to give each server a port that no other test process is given
//! ([`ports::reserve`]), and one way to wait for what they do ([`wait::wait_until`]), for the
//! tasks, the tests and the benchmarks. They need PostgreSQL's binaries installed (and Citus, for a
//! Citus cluster; RabbitMQ's, for a node), but no running server and no Docker engine.

pub mod browser;
pub mod citus;
pub mod localstripe;
pub mod oidc;
pub mod pg;
pub mod ports;
pub mod process;
pub mod rabbitmq;
pub mod server;
pub mod wait;
pub mod workspace;
