//! End-to-end harness: writers write into an `OwnedSmb`, a test service applies their commits to
//! a `tachyon_service::TraceBuffer` (ServiceView: acquire for reading, copy, free; then the
//! patches), reads the packets out and checks each one against what was written.
//!
//! Packets are generated from `(seed, seq)`, so the checker regenerates the expected packet from
//! the `timestamp` (= `seq`) and the seed field of what it reads; nothing written is kept.

// Shared by several test binaries, each using a part: unused items and `pub` in a private
// module are expected here.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::sync::Arc;

use protozero::{FieldValue, Message, ProtoDecoder};
use tachyon::backend::{
    CommitReceiver, CommitRequest, OwnedSmb, TraceWriter, WriterStats,
    PREVIOUS_PACKET_DROPPED_SMB_FULL,
};
use tachyon_abi::ChunkCopy;
use tachyon_protos::{TracePacketView, TraceView};
use tachyon_service::{
    ChunkToCopy, FillPolicy, PacketInfo, PacketWriter, ProducerIdentity, TraceBuffer,
};

/// The producer id the test service gives the (only) producer.
pub const PRODUCER: u16 = 1;
/// Field of the root packet holding the packet's seed (the writer's seed).
pub const SEED_FIELD: u32 = 5000;
/// TracePacket.previous_packet_dropped / first_packet_on_sequence / timestamp.
const PREVIOUS_PACKET_DROPPED: u32 = 42;
const FIRST_PACKET_ON_SEQUENCE: u32 = 87;
const TIMESTAMP: u32 = 8;
/// `tachyon_packets_dropped`: how many, on the packet after drops.
const TACHYON_PACKETS_DROPPED: u32 = 1900;

// === packet contents ===

/// A field of a generated packet.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    Varint(u32, u64),
    Bytes(u32, Vec<u8>),
    Nested(u32, Vec<Node>),
}

/// splitmix64.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Target payload size of packet `seq`: mostly small, sometimes up to `max_size` (≤ 64 KiB).
pub fn target_size(rng: &mut Rng, max_size: usize) -> usize {
    let max = max_size as u64;
    let size = match rng.below(100) {
        0..=59 => rng.below(48),
        60..=84 => 48 + rng.below(1024 - 48),
        85..=94 => 1024 + rng.below(8 * 1024 - 1024),
        _ => 8 * 1024 + rng.below(max.saturating_sub(8 * 1024).max(1)),
    };
    size.min(max) as usize
}

fn gen_nodes(rng: &mut Rng, budget: usize, depth: u32) -> Vec<Node> {
    let mut out = Vec::new();
    let mut left = budget as i64;
    while left > 0 {
        let field = 5001 + rng.below(8) as u32;
        match rng.below(10) {
            0..=2 => {
                let v = rng.next() >> rng.below(64);
                out.push(Node::Varint(field, v));
                left -= 6;
            }
            3..=5 => {
                let len = rng.below(left as u64 + 1) as usize;
                let fill = rng.next() as u8;
                let bytes = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
                out.push(Node::Bytes(field, bytes));
                left -= len as i64 + 4;
            }
            _ if depth < 5 => {
                let child = 1 + rng.below(left as u64) as usize;
                out.push(Node::Nested(field, gen_nodes(rng, child, depth + 1)));
                left -= child as i64 + 6;
            }
            _ => left -= 1,
        }
    }
    out
}

/// The fields of packet `seq` of a writer with `seed`.
pub fn packet_nodes(seed: u64, seq: u64, max_size: usize) -> Vec<Node> {
    let mut rng = Rng(seed ^ seq.wrapping_mul(0xA24B_AED4_963E_E407));
    let size = target_size(&mut rng, max_size);
    gen_nodes(&mut rng, size, 0)
}

pub fn write_nodes(msg: &mut Message<'_>, nodes: &[Node]) {
    for node in nodes {
        match node {
            Node::Varint(f, v) => msg.append_varint(*f, *v),
            Node::Bytes(f, b) => msg.append_bytes(*f, b),
            Node::Nested(f, children) => {
                let mut child = msg.begin_nested(*f);
                write_nodes(&mut child, children);
            }
        }
    }
}

/// Writes packet `seq` of a writer with `seed`. Returns whether the writer dropped it.
pub fn write_test_packet(writer: &mut TraceWriter, seed: u64, seq: u64, max_size: usize) -> bool {
    let nodes = packet_nodes(seed, seq, max_size);
    let mut handle = writer.new_trace_packet();
    handle.packet().set_timestamp(seq);
    {
        let mut msg = handle.message();
        msg.append_varint(SEED_FIELD, seed);
        write_nodes(&mut msg, &nodes);
    }
    let dropped = handle.is_dropped();
    drop(handle);
    dropped
}

fn check_nodes(bytes: &[u8], expected: &[Node], path: &str) -> Result<(), String> {
    let mut fields = ProtoDecoder::new(bytes);
    for (i, node) in expected.iter().enumerate() {
        let field = fields
            .next()
            .ok_or_else(|| format!("{path}[{i}]: missing"))?
            .map_err(|e| format!("{path}[{i}]: {e:?}"))?;
        match (node, field.value()) {
            (Node::Varint(f, v), FieldValue::Varint(got)) if field.id() == *f && got == *v => {}
            (Node::Bytes(f, b), FieldValue::Bytes(got)) if field.id() == *f && got == &b[..] => {}
            (Node::Nested(f, children), FieldValue::Bytes(got)) if field.id() == *f => {
                check_nodes(got, children, &format!("{path}[{i}]"))?
            }
            _ => {
                return Err(format!(
                    "{path}[{i}]: expected {node:?}, got field {} {:?}",
                    field.id(),
                    field.value()
                ))
            }
        }
    }
    match fields.next() {
        None => Ok(()),
        Some(extra) => Err(format!("{path}: unexpected trailing field {extra:?}")),
    }
}

/// What the checker expects of one packet besides its generated fields.
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    pub first_packet_on_sequence: bool,
    pub previous_packet_dropped: bool,
}

/// Checks a packet read out of the buffer: returns its `(seed, seq)`.
pub fn check_packet(
    bytes: &[u8],
    max_size: usize,
    expect: impl Fn(u64, u64) -> Expect,
) -> (u64, u64) {
    let view = TracePacketView::decode(bytes).expect("packet decodes");
    let seq = view.timestamp();
    let seed = ProtoDecoder::new(bytes)
        .find_field(SEED_FIELD)
        .expect("seed field")
        .as_u64();
    let e = expect(seed, seq);
    assert_eq!(
        view.first_packet_on_sequence(),
        e.first_packet_on_sequence,
        "first_packet_on_sequence of packet {seq} of writer {seed:#x}"
    );
    let dropped = view.previous_packet_dropped();
    if e.previous_packet_dropped {
        assert_eq!(
            dropped, PREVIOUS_PACKET_DROPPED_SMB_FULL,
            "packet {seq} after drops"
        );
        assert!(
            view.tachyon_packets_dropped() > 0,
            "packet {seq} after drops says how many"
        );
    } else {
        assert_eq!(dropped, 0, "packet {seq}: no drop before it");
        assert_eq!(view.tachyon_packets_dropped(), 0, "packet {seq}");
    }
    // The marks come first, then timestamp, seed and the generated fields.
    let mut d = ProtoDecoder::new(bytes);
    let mut rest_at = 0;
    for field in d.by_ref() {
        let field = field.expect("well-formed");
        match field.id() {
            FIRST_PACKET_ON_SEQUENCE | PREVIOUS_PACKET_DROPPED | TACHYON_PACKETS_DROPPED => {}
            TIMESTAMP => {}
            SEED_FIELD => break,
            other => panic!("packet {seq}: unexpected field {other} before the seed"),
        }
    }
    rest_at += d.offset();
    let nodes = packet_nodes(seed, seq, max_size);
    if let Err(e) = check_nodes(&bytes[rest_at..], &nodes, "packet") {
        panic!("packet {seq} of writer {seed:#x}: {e}");
    }
    (seed, seq)
}

// === the test service ===

/// A minimal service: one producer, one central buffer.
pub struct TestService {
    pub smb: Arc<OwnedSmb>,
    pub buffer: TraceBuffer,
    pub commits: u64,
    pub moves: u64,
    pub patches: u64,
}

impl TestService {
    /// A service with a central buffer of `buffer_size` bytes.
    pub fn new(smb: Arc<OwnedSmb>, buffer_size: usize, policy: FillPolicy) -> Self {
        TestService {
            smb,
            buffer: TraceBuffer::new(buffer_size, policy),
            commits: 0,
            moves: 0,
            patches: 0,
        }
    }

    /// Applies one commit: moves (take the chunk, copy it into the buffer), then patches.
    /// Everything a correct writer commits must succeed.
    pub fn apply(&mut self, req: &CommitRequest) {
        self.commits += 1;
        for mv in &req.chunks_to_move {
            assert_eq!(mv.target_buffer, 0);
            // `take_chunk` validated the header.
            let copy = take_chunk(&self.smb, mv.page, mv.chunk);
            let header = copy.header();
            // Every fragment the header counts parses.
            let fragments = copy
                .fragments()
                .collect::<Result<Vec<_>, _>>()
                .expect("fragments parse");
            assert_eq!(fragments.len(), header.packets.count() as usize);
            self.buffer.copy_chunk(&ChunkToCopy {
                producer: PRODUCER,
                writer: header.writer_id,
                chunk_id: header.chunk_id,
                num_fragments: header.packets.count(),
                flags: header.packets.flags().0,
                payload: copy.payload(),
                complete: true,
            });
            self.moves += 1;
        }
        for p in &req.chunks_to_patch {
            assert_eq!(p.target_buffer, 0);
            assert!(!p.patches.is_empty());
            for x in &p.patches {
                assert_ne!(x.data[0], 0, "a shipped patch is ready");
            }
            self.patches += p.patches.len() as u64;
            self.buffer.try_patch_chunk(
                PRODUCER,
                p.writer_id,
                p.chunk_id,
                &p.patches,
                p.has_more_patches,
            );
        }
    }

    /// Applies every commit queued in `commits` now.
    pub fn apply_queued(&mut self, commits: &CommitReceiver) {
        for c in commits.try_iter() {
            self.apply(&c);
        }
    }

    /// Reads everything out (last read of the session): `(info, packet bytes)` in read order.
    pub fn read_all(&mut self) -> Vec<(PacketInfo, Vec<u8>)> {
        let mut out = Vec::new();
        self.buffer
            .read_packets(true, |info, fragments| out.push((info, fragments.concat())));
        out
    }
}

/// A service thread applying every commit until the arbiter and its writers are gone; join it
/// for the service.
pub fn spawn_service(
    smb: Arc<OwnedSmb>,
    buffer_size: usize,
    commits: CommitReceiver,
) -> std::thread::JoinHandle<TestService> {
    std::thread::spawn(move || {
        let mut service = TestService::new(smb, buffer_size, FillPolicy::RingBuffer);
        while let Some(c) = commits.recv() {
            service.apply(&c);
        }
        service
    })
}

/// Takes a committed chunk out of the buffer as a service does: acquire for reading, copy
/// (which validates the header), free.
pub fn take_chunk(smb: &OwnedSmb, page: u32, chunk: u32) -> ChunkCopy {
    let view = smb.service();
    let c = view
        .try_acquire_chunk_for_reading(page as usize, chunk as usize)
        .expect("a committed chunk is Complete");
    let copy = c.copy().expect("a committed chunk copies");
    view.release_chunk_as_free(c).expect("free");
    copy
}

/// Per-writer bookkeeping of what was written.
#[derive(Clone, Debug, Default)]
pub struct Written {
    pub writer_id: u16,
    pub seed: u64,
    /// `dropped[seq]`: the writer reported the packet dropped.
    pub dropped: Vec<bool>,
    pub stats: WriterStats,
}

impl Written {
    fn expect(&self, seq: u64) -> Expect {
        Expect {
            first_packet_on_sequence: seq == 0,
            previous_packet_dropped: seq > 0 && self.dropped[seq as usize - 1],
        }
    }
}

/// Checks the read-out packets against what the writers wrote:
/// - every packet read is exactly a packet written and not reported dropped, in order per
///   sequence, with the right sequence marks;
/// - packets written = packets read + (dropped − dropped_marked) + packets the buffer lost,
///   exactly; and with a buffer big enough not to lose anything by itself, read = written −
///   dropped and the buffer's losses are exactly the marked drops.
///
/// Then writes the packets as a trace with `PacketWriter` and decodes it with the generated
/// views. Returns the number of packets read.
pub fn check_run(
    service: &mut TestService,
    written: &[Written],
    max_size: usize,
    lossless_buffer: bool,
) -> u64 {
    let packets = service.read_all();
    let by_seed: BTreeMap<u64, &Written> = written.iter().map(|w| (w.seed, w)).collect();
    let mut next_seq: BTreeMap<u16, u64> = BTreeMap::new();
    let mut read_per_writer: BTreeMap<u16, u64> = BTreeMap::new();
    let mut trace = Vec::new();
    let mut pw = PacketWriter::new();
    for (info, bytes) in &packets {
        assert_eq!(info.producer, PRODUCER);
        let (seed, seq) = check_packet(bytes, max_size, |seed, seq| by_seed[&seed].expect(seq));
        let w = by_seed[&seed];
        assert_eq!(
            info.writer, w.writer_id,
            "packet of writer {seed:#x} on another sequence"
        );
        assert!(
            !w.dropped[seq as usize],
            "a packet reported dropped was read"
        );
        let next = next_seq.entry(info.writer).or_insert(0);
        assert!(
            seq >= *next,
            "packet {seq} of writer {} out of order",
            info.writer
        );
        if lossless_buffer {
            // Nothing may be missing between two packets but packets the writer dropped.
            for s in *next..seq {
                assert!(
                    w.dropped[s as usize],
                    "packet {s} of writer {} was neither read nor dropped",
                    info.writer
                );
            }
        }
        *next = seq + 1;
        *read_per_writer.entry(info.writer).or_insert(0) += 1;
        assert!(pw.write_packet(
            *info,
            &[bytes],
            ProducerIdentity { pid: 42, uid: 7 },
            &mut trace
        ));
    }

    let read = packets.len() as u64;
    let total: u64 = written.iter().map(|w| w.stats.packets).sum();
    let dropped: u64 = written.iter().map(|w| w.stats.packets_dropped).sum();
    let marked: u64 = written.iter().map(|w| w.stats.packets_dropped_marked).sum();
    for w in written {
        assert_eq!(w.stats.packets, w.dropped.len() as u64);
        assert_eq!(
            w.stats.packets_dropped,
            w.dropped.iter().filter(|d| **d).count() as u64,
            "the writer's drop count is per packet"
        );
    }
    let losses = *service.buffer.losses();
    assert_eq!(
        total,
        read + (dropped - marked) + losses.total(),
        "written = read + unmarked drops + buffer losses (losses: {losses:?}, dropped {dropped}, \
         marked {marked})"
    );
    let stats = *service.buffer.stats();
    assert_eq!(stats.abi_violations, 0);
    assert_eq!(stats.patches_failed, 0);
    assert_eq!(stats.trace_writer_packet_loss, losses.writer_dropped);
    if lossless_buffer {
        assert_eq!(read, total - dropped);
        // Marked drops: sentinels (`writer_dropped`) or continuations that never came
        // (`incomplete`); nothing else is lost.
        assert_eq!(losses.total(), marked, "{losses:?}");
        assert_eq!(
            losses.writer_dropped + losses.incomplete,
            marked,
            "{losses:?}"
        );
    }

    // The trace decodes with the generated views: framing, sequence ids, contents.
    let trace_view = TraceView::decode(&trace).expect("trace decodes");
    let mut n = 0;
    let mut seq_ids = BTreeMap::new();
    for (packet, (info, bytes)) in trace_view.packet().zip(&packets) {
        let packet = packet.expect("packet decodes");
        assert!(packet.bytes().starts_with(bytes));
        let seq_id = packet.trusted_packet_sequence_id();
        assert!(seq_id > 1);
        assert_eq!(*seq_ids.entry(info.writer).or_insert(seq_id), seq_id);
        assert_eq!(packet.trusted_pid(), 42);
        let original = TracePacketView::decode(bytes).unwrap();
        assert_eq!(packet.timestamp(), original.timestamp());
        if original.previous_packet_dropped() != 0 {
            assert_eq!(
                packet.previous_packet_dropped() & PREVIOUS_PACKET_DROPPED_SMB_FULL,
                PREVIOUS_PACKET_DROPPED_SMB_FULL
            );
        }
        n += 1;
    }
    assert_eq!(n, read);
    read
}
