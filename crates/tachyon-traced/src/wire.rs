//! The messages the daemon writes: producer commands (`GetAsyncCommandResponse`) and consumer
//! replies, encoded with the generated writers; and the one rewrite it does on a consumer's
//! bytes, the `DataSourceConfig` handed to a producer.

use protozero::{HeapBuffered, ProtoDecoder};
use tachyon_protos::{
    get_async_command_response, DataSourceConfig, EnableTracingResponse, GetAsyncCommandResponse,
    GetTraceStatsResponse, ReadBuffersResponse,
};

/// Encodes a `GetAsyncCommandResponse` filled by `f`.
fn command(f: impl FnOnce(&mut GetAsyncCommandResponse<'_>)) -> Vec<u8> {
    let mut buf = HeapBuffered::new();
    f(&mut buf.root());
    buf.serialize().expect("heap buffers do not fail")
}

/// `setup_tracing{shared_buffer_page_size_kb}` (the SMB descriptor travels with the frame).
pub(crate) fn setup_tracing(page_size_kb: u32) -> Vec<u8> {
    command(|c| {
        c.set_setup_tracing()
            .set_shared_buffer_page_size_kb(page_size_kb)
    })
}

/// `start_data_source{new_instance_id, config}` with `config` already encoded.
pub(crate) fn start_data_source(instance_id: u64, config: &[u8]) -> Vec<u8> {
    command(|c| {
        let mut s: get_async_command_response::StartDataSource<'_> = c.set_start_data_source();
        s.set_new_instance_id(instance_id);
        s.message().append_bytes(
            get_async_command_response::StartDataSource::CONFIG_FIELD_NUMBER,
            config,
        );
    })
}

/// `stop_data_source{instance_id}`.
pub(crate) fn stop_data_source(instance_id: u64) -> Vec<u8> {
    command(|c| c.set_stop_data_source().set_instance_id(instance_id))
}

/// `flush{data_source_ids, request_id}`.
pub(crate) fn flush(instance_ids: &[u64], request_id: u64) -> Vec<u8> {
    command(|c| {
        let mut f = c.set_flush();
        for id in instance_ids {
            f.add_data_source_ids(*id);
        }
        f.set_request_id(request_id);
    })
}

/// `clear_incremental_state{data_source_ids}`.
pub(crate) fn clear_incremental_state(instance_ids: &[u64]) -> Vec<u8> {
    command(|c| {
        let mut f = c.set_clear_incremental_state();
        for id in instance_ids {
            f.add_data_source_ids(*id);
        }
    })
}

/// The `DataSourceConfig` a producer receives: the consumer's, with `target_buffer` replaced by
/// the global buffer id and `tracing_session_id` by the daemon's session id. Every other field
/// is copied byte for byte (unknown ones included). The consumer's bytes were parsed once
/// already (`SessionConfig::from_trace_config`); should they stop parsing, the copy stops there.
pub(crate) fn rewrite_data_source_config(
    config: &[u8],
    global_buffer: u16,
    session: u64,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(config.len() + 16);
    let mut decoder = ProtoDecoder::new(config);
    loop {
        let start = decoder.offset();
        match decoder.read_field() {
            Ok(Some(field)) => {
                let id = field.id();
                if id != DataSourceConfig::TARGET_BUFFER_FIELD_NUMBER
                    && id != DataSourceConfig::TRACING_SESSION_ID_FIELD_NUMBER
                {
                    out.extend_from_slice(&config[start..decoder.offset()]);
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
    let mut buf = HeapBuffered::new();
    {
        let mut m: DataSourceConfig<'_> = buf.root();
        m.set_target_buffer(global_buffer as u32);
        m.set_tracing_session_id(session);
    }
    out.extend_from_slice(&buf.serialize().expect("heap buffers do not fail"));
    out
}

/// `EnableTracingResponse{disabled: true, error?}`: the deferred reply that ends a session.
pub(crate) fn enable_tracing_response(error: Option<&str>) -> Vec<u8> {
    let mut buf = HeapBuffered::new();
    {
        let mut r: EnableTracingResponse<'_> = buf.root();
        r.set_disabled(true);
        if let Some(e) = error {
            r.set_error(e);
        }
    }
    buf.serialize().expect("heap buffers do not fail")
}

/// `GetTraceStatsResponse{trace_stats}` around an encoded `TraceStats`.
pub(crate) fn trace_stats_response(trace_stats: &[u8]) -> Vec<u8> {
    let mut buf = HeapBuffered::new();
    {
        let mut r: GetTraceStatsResponse<'_> = buf.root();
        r.message()
            .append_bytes(GetTraceStatsResponse::TRACE_STATS_FIELD_NUMBER, trace_stats);
    }
    buf.serialize().expect("heap buffers do not fail")
}

/// A `TraceStats` with only service-wide counters (no session).
pub(crate) fn service_trace_stats(w: &tachyon_service::ServiceWideStats) -> Vec<u8> {
    let mut buf = HeapBuffered::new();
    w.write_to(&mut buf.root());
    buf.serialize().expect("heap buffers do not fail")
}

/// Budget of one `ReadBuffersResponse`: the frame around it (request id, flags, the reply's
/// tag and length) must stay within 128 KiB.
pub(crate) const MAX_READ_RESPONSE: usize = tachyon_ipc::frame::MAX_FRAME_SIZE - 512;
/// Largest slice of packet data in one `ReadBuffersResponse.Slice` (Perfetto: 128 KiB − 512;
/// here a little less, so that a slice alone fits a response).
pub(crate) const MAX_SLICE: usize = MAX_READ_RESPONSE - 64;
/// Bytes a slice costs beside its data, at most: the `slices` tag and length, the `data` tag and
/// length, `last_slice_for_packet`.
const SLICE_OVERHEAD: usize = 1 + 3 + 1 + 3 + 2;

/// Cuts `Trace.packet` records (the daemon's read-out) into `ReadBuffersResponse`s: each
/// packet becomes one or more slices, the last with `last_slice_for_packet`, and each response
/// stays under [`MAX_READ_RESPONSE`] bytes.
pub(crate) fn read_buffers_responses(records: &[u8]) -> Vec<Vec<u8>> {
    let mut slices: Vec<(&[u8], bool)> = Vec::new();
    for field in ProtoDecoder::new(records).map_while(Result::ok) {
        let packet = field.as_bytes();
        if packet.is_empty() {
            slices.push((packet, true));
            continue;
        }
        let mut chunks = packet.chunks(MAX_SLICE).peekable();
        while let Some(c) = chunks.next() {
            slices.push((c, chunks.peek().is_none()));
        }
    }
    let mut out = Vec::new();
    let mut start = 0;
    let mut size = 0;
    for (i, (data, _)) in slices.iter().enumerate() {
        let cost = data.len() + SLICE_OVERHEAD;
        if i > start && size + cost > MAX_READ_RESPONSE {
            out.push(encode_slices(&slices[start..i]));
            start = i;
            size = 0;
        }
        size += cost;
    }
    if start < slices.len() {
        out.push(encode_slices(&slices[start..]));
    }
    out
}

fn encode_slices(slices: &[(&[u8], bool)]) -> Vec<u8> {
    let mut buf = HeapBuffered::new();
    {
        let mut r: ReadBuffersResponse<'_> = buf.root();
        for (data, last) in slices {
            let mut s = r.add_slices();
            s.set_data(data);
            if *last {
                s.set_last_slice_for_packet(true);
            }
        }
    }
    buf.serialize().expect("heap buffers do not fail")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tachyon_protos::{DataSourceConfigView, ReadBuffersResponseView};

    #[test]
    fn data_source_config_gets_the_global_buffer_and_keeps_the_rest() {
        let mut buf = HeapBuffered::new();
        {
            let mut c: DataSourceConfig<'_> = buf.root();
            c.set_name("track_event");
            c.set_target_buffer(1);
            c.set_tracing_session_id(77);
            c.message().append_string(9999, "unknown");
        }
        let original = buf.serialize().unwrap();
        let rewritten = rewrite_data_source_config(&original, 300, 5);
        let v = DataSourceConfigView::decode(&rewritten).unwrap();
        assert_eq!(v.name().unwrap(), "track_event");
        assert_eq!(v.target_buffer(), 300);
        assert_eq!(v.tracing_session_id(), 5);
        assert_eq!(
            ProtoDecoder::new(&rewritten)
                .map_while(Result::ok)
                .filter(|f| f.id() == 2)
                .count(),
            1
        );
        assert!(ProtoDecoder::new(&rewritten).find_field(9999).is_some());
    }

    #[test]
    fn large_packets_are_sliced_and_responses_stay_within_a_frame() {
        let mut records = Vec::new();
        let small = vec![0x40u8, 0x01];
        let big = vec![7u8; 300_000];
        for p in [&small, &big, &small] {
            tachyon_service::write_record(&mut records, &[p]);
        }
        let responses = read_buffers_responses(&records);
        let mut packets = Vec::new();
        let mut current = Vec::new();
        for r in &responses {
            assert!(r.len() <= MAX_READ_RESPONSE, "{}", r.len());
            let frame = tachyon_ipc::rpc::method_reply(u64::MAX, true, true, r);
            assert!(frame.len() <= tachyon_ipc::frame::MAX_FRAME_SIZE);
            let v = ReadBuffersResponseView::decode(r).unwrap();
            for s in v.slices() {
                let s = s.unwrap();
                assert!(s.data().len() <= MAX_SLICE);
                current.extend_from_slice(s.data());
                if s.last_slice_for_packet() {
                    packets.push(std::mem::take(&mut current));
                }
            }
        }
        assert_eq!(packets, vec![small.clone(), big, small]);
        assert!(read_buffers_responses(&[]).is_empty());
    }
}
