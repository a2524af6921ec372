//! Reads a name stored in a text column back into the enum that wrote it.
//!
//! Each such enum spells its names once, in its `as_str`, lists itself in `ALL`, and parses rows
//! with [`parse`]; a name this build does not know is an error, never a default.

/// A name in a column that this build does not know.
#[derive(Debug, thiserror::Error)]
#[error("{text:?} is not a known {what}")]
pub struct UnknownName {
    what: &'static str,
    text: String,
}

/// The one of `all` whose stored name is `text`; `what` names the column's idea in the error.
pub fn parse<T: Copy>(
    all: &[T],
    name: fn(T) -> &'static str,
    what: &'static str,
    text: &str,
) -> Result<T, UnknownName> {
    all.iter().copied().find(|&value| name(value) == text).ok_or_else(|| UnknownName { what, text: text.to_owned() })
}
