//! Helpers shared by the processor's integration tests.

/// A `Trace` from protobuf text format, through tachyon-protos' schema.
pub(crate) fn text_trace(text: &str) -> Vec<u8> {
    let protos = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tachyon-protos/protos");
    let fds = protox::compile([protos.join("perfetto/trace/trace.proto")], [&protos]).unwrap();
    let desc = prost_reflect::DescriptorPool::from_file_descriptor_set(fds)
        .unwrap()
        .get_message_by_name("perfetto.protos.Trace")
        .unwrap();
    let msg = prost_reflect::DynamicMessage::parse_text_format(desc, text).unwrap();
    prost::Message::encode_to_vec(&msg)
}
