//! Compiles the golden generated code (`golden_code`) and exercises it: hand-written checks
//! of the API and of edge cases (`behaviour`), and property tests against prost-reflect in
//! both directions (`roundtrip`, with random messages from `arb`).

#[path = "../common/mod.rs"]
mod common;

mod arb;
mod behaviour;
pub mod golden_code;
mod roundtrip;
mod zero_alloc;
