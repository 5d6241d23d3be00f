//! Hostile producers (issue 6, section 6): malformed, oversized and truncated frames, requests
//! before binding, lying commits, garbage in the SMB, commits into another session. Each is
//! disconnected or has its chunks discarded, everything is counted, and a well-behaved producer
//! beside it loses nothing while the daemon keeps serving.

mod support;

use std::io::{Read as _, Write};
use std::os::unix::net::UnixStream;

use support::*;
use tachyon_abi::{encode_fragment_header, ChunkState, ChunkToPatch, CommitRequest, Patch};
use tachyon_ipc::rpc::{Frame, Msg};
use tachyon_traced::Consumer;

/// Sends `bytes` and expects the daemon to hang up.
fn expect_hang_up(mut s: UnixStream, bytes: &[u8]) {
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    // The daemon may hang up before everything is written.
    let _ = s.write_all(bytes);
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue, // e.g. a bind reply before the violation
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("the daemon did not hang up: {e}"),
        }
    }
}

fn framed(body: &[u8]) -> Vec<u8> {
    tachyon_ipc::frame::frame(body).unwrap()
}

fn invoke(service_id: u32, method_id: u32, args: &[u8]) -> Vec<u8> {
    framed(
        &Frame {
            request_id: 1,
            msg: Msg::InvokeMethod {
                service_id,
                method_id,
                args,
                drop_reply: false,
            },
        }
        .encode(),
    )
}

fn bind() -> Vec<u8> {
    framed(
        &Frame {
            request_id: 0,
            msg: Msg::BindService {
                service_name: "ProducerPort",
            },
        }
        .encode(),
    )
}

#[test]
fn malformed_frames_disconnect_only_their_sender() {
    let (_dir, daemon) = daemon("malformed");
    let mut good = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    consumer
        .enable_tracing(&Config::simple(256, "test.source").encode(), None)
        .unwrap();
    let (_, buffer) = good.wait_start();
    let c = good.write_chunk(1, &[packet(1, 0)], true);
    good.commit(&[c], buffer);

    let sock = daemon.producer_socket();
    // A body that is not an IPCFrame.
    expect_hang_up(raw_producer(sock), &framed(&[0xff; 16]));
    // A length prefix far beyond the frame limit.
    expect_hang_up(raw_producer(sock), &u32::MAX.to_le_bytes());
    // A zero length prefix.
    expect_hang_up(raw_producer(sock), &0u32.to_le_bytes());
    // A method before binding.
    expect_hang_up(raw_producer(sock), &invoke(1, 1, &[]));
    // A bound connection calling another service id.
    let mut bytes = bind();
    bytes.extend(invoke(7, 1, &[]));
    expect_hang_up(raw_producer(sock), &bytes);
    // A reply, which only the daemon sends.
    let reply = framed(
        &Frame {
            request_id: 3,
            msg: Msg::InvokeMethodReply {
                success: true,
                has_more: false,
                reply: &[],
            },
        }
        .encode(),
    );
    expect_hang_up(raw_producer(sock), &reply);
    // A malformed request: InitializeConnection whose args are not protobuf.
    let mut bytes = bind();
    bytes.extend(invoke(1, 1, &[0x0a, 0x7f]));
    expect_hang_up(raw_producer(sock), &bytes);
    // A frame cut short by the hang-up.
    let mut s = raw_producer(sock);
    s.write_all(&100u32.to_le_bytes()).unwrap();
    s.write_all(&[0x08; 10]).unwrap();
    drop(s);

    wait_until("every bad connection to be dropped", || {
        let s = daemon.stats();
        s.protocol_errors >= 8 && s.producers_connected == 1
    });
    let s = daemon.stats();
    assert!(s.frames_rejected >= 5, "{s:?}");

    // The good producer is untouched and the daemon still serves it.
    let c = good.write_chunk(1, &[packet(2, 0), packet(3, 0)], true);
    good.commit(&[c], buffer);
    consumer.disable_tracing().unwrap();
    consumer.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();
    let mut trace = Vec::new();
    consumer.read_buffers(&mut trace).unwrap();
    assert_eq!(timestamps(&trace), [1, 2, 3]);
}

#[test]
fn lying_commits_and_smb_garbage_are_discarded_and_counted() {
    let (_dir, daemon) = daemon("lying-commits");
    let mut good = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let mut bad = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    consumer
        .enable_tracing(&Config::simple(256, "test.source").encode(), None)
        .unwrap();
    let (_, buffer) = good.wait_start();
    let (_, bad_buffer) = bad.wait_start();
    assert_eq!(buffer, bad_buffer);
    let c = good.write_chunk(1, &[packet(1, 0)], true);
    good.commit(&[c], buffer);

    // Pages and chunks out of range, a chunk never completed, a free chunk.
    let never_completed = bad.write_chunk(1, &[packet(900, 0)], false);
    let lies = [(100_000, 0), (0, 13), never_completed, (15, 3)];
    bad.commit(&lies, buffer);
    // A chunk whose fragment claims more bytes than the chunk has.
    let mut garbage = encode_fragment_header(5000).unwrap().to_vec();
    garbage.extend([0x08, 0x01]);
    let g = bad.write_raw_chunk(2, 1, &garbage);
    bad.commit(&[g], buffer);
    // A buffer id no session has.
    let orphan = bad.write_chunk(3, &[packet(901, 0)], true);
    bad.commit(&[orphan], 4242);
    // Patches for chunks that do not exist, and into an unknown buffer.
    bad.commit_request(&CommitRequest {
        chunks_to_patch: vec![
            ChunkToPatch {
                target_buffer: buffer,
                writer_id: 9,
                chunk_id: 77,
                patches: vec![Patch {
                    offset: 0,
                    data: [1, 2, 3, 4],
                }],
                has_more_patches: false,
            },
            ChunkToPatch {
                target_buffer: 4243,
                writer_id: 9,
                chunk_id: 77,
                patches: vec![Patch {
                    offset: 0,
                    data: [1, 2, 3, 4],
                }],
                has_more_patches: false,
            },
        ],
        ..CommitRequest::default()
    });
    wait_until("the commits to be handled", || daemon.stats().commits >= 5);
    assert_eq!(bad.chunk_state(orphan), ChunkState::Free);
    let st = daemon.stats();
    assert_eq!(
        (st.chunks_discarded, st.patches_discarded),
        (1, 1),
        "{st:?}"
    );
    assert_eq!(bad.chunk_state(never_completed), ChunkState::BeingWritten);
    assert_eq!(bad.chunk_state(g), ChunkState::Free, "copied, then freed");

    // A CommitData that is not protobuf: disconnected.
    bad.caller
        .invoke("CommitData", &[0x0a, 0x05, 0x08], None, true)
        .unwrap();
    wait_until("the liar to be dropped", || {
        daemon.stats().producers_connected == 1
    });
    assert!(daemon.stats().protocol_errors >= 1);

    let c = good.write_chunk(1, &[packet(2, 0)], true);
    good.commit(&[c], buffer);
    consumer.disable_tracing().unwrap();
    consumer.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();
    let mut trace = Vec::new();
    consumer.read_buffers(&mut trace).unwrap();
    // The liar's one honest-looking packet in a never-completed chunk was scraped when it was
    // dropped (it is its own data); nothing else of it got in.
    let ts = timestamps(&trace);
    assert_eq!(
        ts.iter().copied().filter(|t| *t < 900).collect::<Vec<_>>(),
        [1, 2]
    );
    assert!(!ts.contains(&901));
    let s = stats(&trace_stats(&trace));
    // Out of range ×2, not Complete ×2 (being written, free).
    assert_eq!(s.chunks_discarded, 4, "{s:?}");
    assert_eq!(
        s.buffers[0].3, 1,
        "one ABI violation (the oversized fragment)"
    );
    assert!(s.patches_discarded == 0 && s.buffers.len() == 1);
}

#[test]
fn a_producer_cannot_write_into_a_session_it_is_not_in() {
    let (_dir, daemon) = daemon("cross-session");
    let only = |name: &str| Behaviour {
        data_sources: vec![name.into()],
        ..Behaviour::default()
    };
    let mut x = FakeProducer::connect(daemon.producer_socket(), only("a.source"));
    let mut y = FakeProducer::connect(daemon.producer_socket(), only("b.source"));
    let mut both = FakeProducer::connect(
        daemon.producer_socket(),
        Behaviour {
            data_sources: vec!["a.source".into(), "b.source".into()],
            ..Behaviour::default()
        },
    );
    let mut ca = Consumer::connect(daemon.consumer_socket()).unwrap();
    ca.enable_tracing(&Config::simple(128, "a.source").encode(), None)
        .unwrap();
    let mut cb = Consumer::connect(daemon.consumer_socket()).unwrap();
    cb.enable_tracing(&Config::simple(128, "b.source").encode(), None)
        .unwrap();
    let (_, buf_a) = x.wait_start();
    let (_, buf_b) = y.wait_start();
    assert_ne!(buf_a, buf_b, "sessions get distinct global buffer ids");
    let (_, t1) = both.wait_start();
    let (_, t2) = both.wait_start();
    let mut targets = [t1, t2];
    targets.sort_unstable();
    let mut expected = [buf_a, buf_b];
    expected.sort_unstable();
    assert_eq!(targets, expected, "one instance per session");

    // Legitimate writes.
    let c = x.write_chunk(1, &[packet(1, 0)], true);
    x.commit(&[c], buf_a);
    let c = y.write_chunk(1, &[packet(2, 0)], true);
    y.commit(&[c], buf_b);
    let c = both.write_chunk(1, &[packet(3, 0)], true);
    both.commit(&[c], buf_a);
    let c = both.write_chunk(2, &[packet(4, 0)], true);
    both.commit(&[c], buf_b);
    // X aims at B's buffer: refused, freed, counted; B's data is untouched.
    let intruder = x.write_chunk(2, &[packet(666, 0)], true);
    x.commit(&[intruder], buf_b);
    x.commit_request(&CommitRequest {
        chunks_to_move: vec![],
        chunks_to_patch: vec![ChunkToPatch {
            target_buffer: buf_b,
            writer_id: 1,
            chunk_id: 0,
            patches: vec![Patch {
                offset: 0,
                data: [0xff; 4],
            }],
            has_more_patches: false,
        }],
        flush_request_id: None,
    });
    wait_until("the intruding chunk to be freed", || {
        x.chunk_state(intruder) == ChunkState::Free
    });
    // The patch request is a frame of its own, applied after the move's: wait for it too.
    wait_until("the intruding patch to be refused", || {
        daemon.stats().patches_discarded > 0
    });
    assert_eq!(daemon.stats().chunks_discarded, 1);
    assert_eq!(daemon.stats().patches_discarded, 1);
    // A chunk being written by `both`, never committed: ambiguous (it is in two sessions), so
    // no session gets it; X's uncommitted one goes to A (X is only in A).
    both.write_chunk(7, &[packet(5, 0)], false);
    x.write_chunk(3, &[packet(6, 0)], false);

    for c in [&mut ca, &mut cb] {
        c.disable_tracing().unwrap();
        c.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();
    }
    let read = |c: &mut Consumer| {
        let mut t = Vec::new();
        c.read_buffers(&mut t).unwrap();
        let mut ts = timestamps(&t);
        ts.sort_unstable();
        ts
    };
    assert_eq!(read(&mut ca), [1, 3, 6]);
    assert_eq!(read(&mut cb), [2, 4]);
}

#[test]
fn producers_beyond_the_limit_are_refused() {
    let (_dir, daemon) = daemon_with("limit", |c| c.max_producers = 2);
    let _a = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let _b = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    expect_hang_up(raw_producer(daemon.producer_socket()), &bind());
    wait_until("the refusal to be counted", || {
        daemon.stats().producers_refused == 1
    });
    assert_eq!(daemon.stats().producers_connected, 2);
}

#[test]
fn duplicate_and_excess_data_sources_are_refused() {
    let (_dir, daemon) = daemon("registrations");
    let names: Vec<String> = (0..70).map(|i| format!("ds.{i}")).collect();
    // The fake producer asserts success of the IPC call; refusals come in the response.
    let _p = FakeProducer::connect(
        daemon.producer_socket(),
        Behaviour {
            data_sources: names.iter().cloned().chain(["ds.0".to_owned()]).collect(),
            ..Behaviour::default()
        },
    );
    let s = daemon.stats();
    assert_eq!(s.data_sources_registered, 64);
    assert_eq!(s.requests_refused, 70 - 64 + 1);
}
