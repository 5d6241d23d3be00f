//! Structure-aware fuzzing of the trace processor's import: the input drives a generator that
//! writes `Trace`s whose packets follow Perfetto's schema (the `.proto` files of tachyon-protos,
//! which hold every field the importer reads), so that nearly every input reaches the
//! importer's logic instead of stopping at the protobuf framing.
//!
//! Values are drawn from small domains on purpose (sequence ids 0–3, uuids and iids 0–7, …) so
//! that packets refer to each other: interned names that exist or not, tracks whose parents
//! form chains, loops or dangling references, clocks that snapshots link or not. Besides those,
//! each scalar can be an extreme (0, ±1, the type's min and max, NaN, ±inf, empty and invalid
//! UTF-8 strings), a repeated field can repeat, a oneof can get several members, a field can
//! come with the wrong wire type, `compressed_packets` holds a generated trace (zlib), and the
//! file can end mid-packet. Both sorting modes import every trace; the database must answer
//! the queries `tachyon query` and `tachyon stats` run.
#![no_main]

use std::io::Write;
use std::sync::OnceLock;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use prost_reflect::{DescriptorPool, Kind, MessageDescriptor};
use tachyon_processor::{Options, SortMode, TraceProcessor};

fn packet_descriptor() -> &'static MessageDescriptor {
    static DESC: OnceLock<MessageDescriptor> = OnceLock::new();
    DESC.get_or_init(|| {
        let protos =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/tachyon-protos/protos");
        let fds = protox::compile([protos.join("perfetto/trace/trace.proto")], [&protos])
            .expect("compile tachyon-protos' schema");
        DescriptorPool::from_file_descriptor_set(fds)
            .expect("descriptor pool")
            .get_message_by_name("perfetto.protos.TracePacket")
            .expect("TracePacket")
    })
}

/// Nesting of generated messages (the schema is recursive: debug annotations, compressed
/// packets).
const MAX_DEPTH: u32 = 10;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, number: u32, wire: u8) {
    varint(out, ((number as u64) << 3) | wire as u64);
}

fn delimited(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    tag(out, number, 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// An integer from a small domain (so that ids collide) or an extreme.
fn integer(u: &mut Unstructured<'_>) -> Result<u64> {
    Ok(match u.int_in_range(0..=15u8)? {
        0..=6 => u.int_in_range(0..=7u64)?,
        7 => u.int_in_range(0..=3u64)? * 1000,
        8 => u64::MAX,
        9 => i64::MAX as u64,
        10 => i64::MIN as u64,
        11 => u32::MAX as u64,
        12 => i32::MIN as i64 as u64,
        13 => (-1i64) as u64,
        _ => u.arbitrary()?,
    })
}

fn double(u: &mut Unstructured<'_>) -> Result<f64> {
    Ok(match u.int_in_range(0..=9u8)? {
        0 => 0.0,
        1 => -0.0,
        2 => f64::NAN,
        3 => f64::INFINITY,
        4 => f64::NEG_INFINITY,
        5 => f64::MAX,
        6 => f64::MIN_POSITIVE,
        7 => u.int_in_range(0..=7u8)? as f64,
        _ => u.arbitrary()?,
    })
}

fn string(u: &mut Unstructured<'_>) -> Result<Vec<u8>> {
    const POOL: [&str; 8] = ["", "a", "b", "cat", "name", "main", "a.b", "debug"];
    Ok(match u.int_in_range(0..=9u8)? {
        0..=6 => POOL[u.choose_index(POOL.len())?].as_bytes().to_vec(),
        7 => vec![0xff, 0xfe, b'x'], // Not UTF-8.
        _ => u.arbitrary::<&[u8]>()?.to_vec(),
    })
}

fn zlib(bytes: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(bytes).expect("in memory");
    z.finish().expect("in memory")
}

/// Writes a message of type `desc`: a few fields chosen by the input, each once or more.
fn message(
    u: &mut Unstructured<'_>,
    desc: &MessageDescriptor,
    depth: u32,
    out: &mut Vec<u8>,
) -> Result<()> {
    let fields: Vec<_> = desc.fields().collect();
    if fields.is_empty() || depth > MAX_DEPTH {
        return Ok(());
    }
    let count = u.int_in_range(0..=fields.len().min(8))?;
    for _ in 0..count {
        let f = &fields[u.choose_index(fields.len())?];
        let repeats = if f.is_list() { u.int_in_range(1..=4)? } else { 1 };
        let n = f.number();
        // Now and then, the wrong wire type: decoders must refuse it, not misread it.
        if u.ratio(1, 40)? {
            match f.kind() {
                Kind::Message(_) | Kind::String | Kind::Bytes => {
                    tag(out, n, 0);
                    varint(out, integer(u)?);
                }
                _ => delimited(out, n, &string(u)?),
            }
            continue;
        }
        if f.is_packed() && u.arbitrary()? {
            let mut payload = Vec::new();
            for _ in 0..repeats {
                varint(&mut payload, integer(u)?);
            }
            delimited(out, n, &payload);
            continue;
        }
        for _ in 0..repeats {
            match f.kind() {
                Kind::Double => {
                    tag(out, n, 1);
                    out.extend_from_slice(&double(u)?.to_le_bytes());
                }
                Kind::Float => {
                    tag(out, n, 5);
                    out.extend_from_slice(&(double(u)? as f32).to_le_bytes());
                }
                Kind::Fixed64 | Kind::Sfixed64 => {
                    tag(out, n, 1);
                    out.extend_from_slice(&integer(u)?.to_le_bytes());
                }
                Kind::Fixed32 | Kind::Sfixed32 => {
                    tag(out, n, 5);
                    out.extend_from_slice(&(integer(u)? as u32).to_le_bytes());
                }
                Kind::Sint32 | Kind::Sint64 => {
                    let v = integer(u)? as i64;
                    tag(out, n, 0);
                    varint(out, ((v << 1) ^ (v >> 63)) as u64);
                }
                Kind::Enum(e) => {
                    let values: Vec<i32> = e.values().map(|v| v.number()).collect();
                    let v = if !values.is_empty() && !u.ratio(1, 8)? {
                        values[u.choose_index(values.len())?] as i64 as u64
                    } else {
                        integer(u)?
                    };
                    tag(out, n, 0);
                    varint(out, v);
                }
                Kind::Bool => {
                    tag(out, n, 0);
                    varint(out, u.int_in_range(0..=2)?);
                }
                Kind::Int32 | Kind::Int64 | Kind::Uint32 | Kind::Uint64 => {
                    tag(out, n, 0);
                    varint(out, integer(u)?);
                }
                Kind::String => delimited(out, n, &string(u)?),
                Kind::Bytes if f.name() == "compressed_packets" && depth < 2 => {
                    let inner = trace(u, depth + 1)?;
                    let payload = if u.ratio(1, 8)? {
                        u.arbitrary::<&[u8]>()?.to_vec()
                    } else {
                        zlib(&inner)
                    };
                    delimited(out, n, &payload);
                }
                Kind::Bytes => delimited(out, n, u.arbitrary::<&[u8]>()?),
                Kind::Message(m) => {
                    let mut inner = Vec::new();
                    message(u, &m, depth + 1, &mut inner)?;
                    delimited(out, n, &inner);
                }
            }
        }
    }
    Ok(())
}

/// A `Trace`: up to 48 packets.
fn trace(u: &mut Unstructured<'_>, depth: u32) -> Result<Vec<u8>> {
    let desc = packet_descriptor();
    let mut out = Vec::new();
    let packets = u.int_in_range(1..=48u32)?;
    for _ in 0..packets {
        if u.is_empty() {
            break;
        }
        let mut packet = Vec::new();
        message(u, desc, depth, &mut packet)?;
        delimited(&mut out, 1, &packet);
    }
    Ok(out)
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(mut bytes) = trace(&mut u, 0) else {
        return;
    };
    // A file cut short, now and then.
    if let Ok(true) = u.ratio(1, 16) {
        let keep = u.int_in_range(0..=bytes.len()).unwrap_or(bytes.len());
        bytes.truncate(keep);
    }
    for sort in [SortMode::Full, SortMode::Windowed] {
        let mut options = Options::with_sort(sort);
        options.max_inflated_bytes = 64 << 20;
        let tp = TraceProcessor::from_bytes(&bytes, &options).expect("a protobuf trace imports");
        tp.query("SELECT count(*), total(dur), max(depth) FROM slice")
            .expect("slice is queryable");
        tp.query("SELECT extract_arg(arg_set_id, 'debug.a') FROM slice")
            .expect("extract_arg works");
        tp.query("SELECT count(*) FROM thread JOIN process USING (upid)")
            .expect("thread and process are queryable");
        tp.query("SELECT count(*) FROM counter JOIN counter_track t ON t.id = track_id")
            .expect("counters are queryable");
        tp.zone_stats().expect("zone stats");
        tp.data_loss().expect("data loss");
    }
});
