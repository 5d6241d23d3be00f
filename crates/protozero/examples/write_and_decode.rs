//! Writes a small trace-like message with protozero — nested messages, a packed field, a
//! message spread over several small buffers — then decodes it back and prints what it finds.
//!
//! Run: `cargo run -p protozero --example write_and_decode`

use protozero::{Field, HeapBuffered, ProtoDecoder, WireType};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 16-byte heap slices, so the message below crosses several buffer boundaries.
    let mut buf = HeapBuffered::with_slice_sizes(16, 16);
    {
        // Shaped like a TracePacket carrying a TrackEvent (field numbers from Perfetto).
        let mut packet = buf.root_message();
        packet.append_uint64(8, 1_000_000); // timestamp
        let mut event = packet.begin_nested(11); // track_event
        event.append_uint64(11, 42); // track_uuid
        event.append_string(23, "compile_shader"); // name
        event.append_packed_varint(31, [3u64, 5, 8]); // extra_counter_track_uuids, packed
        let mut annotation = event.begin_nested(4); // debug_annotations
        annotation.append_string(10, "shader"); // name
        annotation.append_string(6, "blur.frag"); // string_value
    } // nested messages are finalized (their sizes written) as they go out of scope

    let bytes = buf.serialize()?;
    println!("wrote {} bytes:", bytes.len());
    println!("{}", hex(&bytes));
    println!();
    print_message(&bytes, 0)?;
    Ok(())
}

/// Prints every field, recursing into length-delimited fields that decode as messages.
fn print_message(bytes: &[u8], depth: usize) -> Result<(), protozero::DecodeError> {
    for field in ProtoDecoder::new(bytes) {
        let field = field?;
        let indent = "  ".repeat(depth);
        match field.wire_type() {
            WireType::LengthDelimited if looks_like_message(&field) => {
                println!("{indent}{} {{", field.id());
                print_message(field.as_bytes(), depth + 1)?;
                println!("{indent}}}");
            }
            WireType::LengthDelimited => match field.as_str() {
                Ok(s) if s.chars().all(|c| !c.is_control()) => {
                    println!("{indent}{}: {s:?}", field.id())
                }
                _ => println!("{indent}{}: bytes [{}]", field.id(), hex(field.as_bytes())),
            },
            _ => println!("{indent}{}: {}", field.id(), field.as_u64()),
        }
    }
    Ok(())
}

/// A schema-less guess, good enough for a demo: a payload that parses completely as fields
/// and is not printable text.
fn looks_like_message(field: &Field<'_>) -> bool {
    let printable = field
        .as_str()
        .is_ok_and(|s| s.chars().all(|c| !c.is_control()));
    !printable && ProtoDecoder::new(field.as_bytes()).all(|f| f.is_ok())
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}
