//! Tachyon's procedural macros. Use them through the `tachyon` crate, which re-exports them:
//! `#[tachyon::instrument]`.
//!
//! [`macro@instrument`] records a zone (a slice on the calling thread's track) around every
//! call of a function, named after the function:
//!
//! ```
//! #[tachyon::instrument]
//! fn parse(input: &str) -> usize {
//!     input.split_whitespace().count()
//! }
//!
//! struct Cache;
//!
//! impl Cache {
//!     /// Loads an entry.
//!     #[tachyon::instrument(category = "io", name = "cache load", args(key, len = key.len()))]
//!     fn load(&self, key: &str) -> Result<u64, std::num::ParseIntError> {
//!         let n: u64 = key.parse()?; // `?` and `return` end the zone like any exit
//!         Ok(n + parse("a b c") as u64)
//!     }
//! }
//!
//! tachyon::start(tachyon::Config::in_memory())?;
//! assert_eq!(Cache.load("39")?, 42);
//! let report = tachyon::shutdown()?.expect("a session was running");
//! assert!(!report.trace.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod expand;
mod options;

use proc_macro::TokenStream;

/// Records a zone around each call of the function: `#[tachyon::instrument]`.
///
/// The function is kept as written (attributes, doc comments, visibility, generics, `where`
/// clauses, `impl Trait` returns, receivers); its body gains one first statement,
///
/// ```text
/// let __tachyon_zone = ::tachyon::zone!("category", "name", "arg" = expr, ...);
/// ```
///
/// so the zone begins when the function is entered and ends when it returns, however it
/// returns (the end of the body, `return`, `?`, a panic unwinding): the guard is a local. The
/// name is a string literal made at compile time: the zone is a `tachyon::zone!` with a static
/// name (a callsite check when tracing is off; the name interned once per sequence when on).
/// A method's zone is named after the method alone (`load`, not `Cache::load`): use `name` to
/// qualify it. The source location recorded with the zone is the attribute's line.
///
/// # Options
///
/// Comma-separated, each at most once:
///
/// | option | meaning | default |
/// |---|---|---|
/// | `name = "text"` | the zone's name | the function's name |
/// | `category = "text"` | the zone's category (filtered by the session's config) | none |
/// | `args(a, b, key = expr, "key" = expr)` | recorded as the zone's arguments | none |
/// | `fields(...)` | the same as `args(...)` | |
/// | `crate = path` | where the `tachyon` crate is (when renamed) | `::tachyon` |
///
/// In `args`, a bare name records the parameter of that name (a binding of a parameter's
/// pattern also counts); `key = expr` records any expression over the parameters (`self`
/// included: `id = self.id`). Values are taken by reference and must implement
/// `tachyon::ArgValue` (integers, floats, `bool`, `char`, `str`, `String`, references to and
/// `Option`s of these); they are evaluated only when the zone records.
///
/// ```
/// #[tachyon::instrument(category = "net", args(peer, bytes = payload.len()))]
/// fn send(peer: &str, payload: &[u8]) -> usize {
///     payload.len()
/// }
/// # send("10.0.0.2", b"hi");
/// ```
///
/// # Not supported
///
/// - **`async fn`** is rejected. A zone is a slice on the thread's track, and a future is
///   polled in pieces, on any thread, between other tasks: a zone held across `.await` would
///   swallow whatever else the thread runs while the future waits, and end on whichever thread
///   finishes it. Instrument the synchronous functions the future calls, or give the
///   operation its own track (`tachyon::Track::new_async` with `tachyon::begin!`), whose slices
///   may end on any thread. (A plain `fn` returning `impl Future` is accepted: its zone covers
///   the creation of the future only.)
/// - **`const fn`** is rejected: recording happens at run time.
/// - A declaration without a body (in a trait): put the attribute on the implementations.
///
/// Mistakes in the attribute are compile errors pointing at the offending tokens.
#[proc_macro_attribute]
pub fn instrument(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::instrument(attr.into(), item.into()).into()
}
