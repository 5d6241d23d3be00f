//! ProtoZero for Rust: a zero-copy, zero-allocation protobuf **writer** that serializes
//! straight into scattered buffers, and a separate zero-copy **decoder**.
//!
//! This is the first stone of Tachyon: every trace packet is written with it, directly into
//! the shared memory chunks of the tracing service. It follows Perfetto's ProtoZero design:
//!
//! - **Append-only.** A [`Message`] has no fields to fill and serialize later; each
//!   `append_*` call encodes one field into the buffer at once. There is no readback and no
//!   schema check (setting a field twice writes it twice).
//! - **Scattered buffers.** The [`ScatteredStreamWriter`] writes into whatever contiguous
//!   ranges its [`Delegate`] hands out. The in-buffer write is an inlined bounds check and a
//!   copy; crossing into the next buffer is a cold path.
//! - **Sizes back-filled.** A nested message reserves 4 bytes for its length (a redundant
//!   varint, `87 80 80 00` for 7) and fills them in when it ends — compacted to the canonical
//!   1-byte length when the message is at most 127 bytes and still contiguous. When the
//!   buffer holding a size field has been handed off, the size goes to a *patch* slot the
//!   delegate provides instead.
//! - **Nesting checked by the compiler.** A nested message mutably borrows its parent, so the
//!   parent cannot be written while the child is open; dropping the child finalizes it.
//! - **No allocation on the write path.** [`StaticBuffered`] writes into a caller's slice and
//!   reports a too-small buffer as an [`Error`]; [`HeapBuffered`] grows on the heap.
//! - **A separate decoder.** [`ProtoDecoder`] iterates fields of untrusted bytes without
//!   allocating or panicking; [`TypedDecoder`] indexes a message's fields by slot; generated
//!   views keep theirs in `gen_support::Slots`, filled by one pass dispatching on whole tags.
//!
//! ```
//! use protozero::{HeapBuffered, ProtoDecoder};
//!
//! // message TestMsg { string str_val = 1; int32 int_val = 2; repeated TestMsg nested = 3; }
//! let mut buf = HeapBuffered::new();
//! {
//!     let mut msg = buf.root_message();
//!     let mut nested = msg.begin_nested(3);
//!     nested.append_string(1, "foo");
//!     nested.append_int32(2, 42);
//! }
//! let bytes = buf.serialize()?;
//! assert_eq!(bytes, [0x1a, 0x07, 0x0a, 0x03, 0x66, 0x6f, 0x6f, 0x10, 0x2a]);
//!
//! let nested = ProtoDecoder::new(&bytes).find_field(3).unwrap();
//! let str_val = nested.as_message().find_field(1).unwrap();
//! assert_eq!(str_val.as_str().unwrap(), "foo");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Big-endian hosts work, but the crate is written and measured for little-endian ones.
#![deny(missing_docs)]

mod buffers;
pub mod decoder;
pub mod gen_support;
mod message;
pub mod wire;
mod writer;

pub use buffers::{
    HeapBuffered, StaticBuffered, DEFAULT_INITIAL_SLICE_SIZE, DEFAULT_MAX_SLICE_SIZE,
};
pub use decoder::{
    DecodeError, Field, FieldValue, PackedFixed32, PackedFixed64, PackedVarints, ProtoDecoder,
    RepeatedFields, RepeatedFixed32, RepeatedFixed64, RepeatedVarints, TypedDecoder,
};
pub use message::{Message, MessageWriter};
pub use wire::WireType;
pub use writer::{
    ContiguousMemoryRange, Delegate, Error, ScatteredStreamWriter, MAX_NESTING_DEPTH,
};
