//! Compiles the golden generated code (`golden_code`) and exercises it: hand-written checks
//! of the API and of edge cases (`behaviour`), and property tests against prost-reflect in
//! both directions (`roundtrip`, with random messages from `arb`), and against protozero's
//! generic decoder on hostile input (`generic`).

#[path = "../common/mod.rs"]
mod common;

mod arb;
mod behaviour;
mod generic;
pub mod golden_code;
mod roundtrip;
mod zero_alloc;
