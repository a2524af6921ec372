//! A client library and CLI for the oncepay API
