//! The protoc plugin protocol: a `CodeGeneratorRequest` in, a `CodeGeneratorResponse` out.
//!
//! The `protoc-gen-protozero` binary only moves bytes between stdin/stdout and [`respond`]; all
//! the logic is here, where tests can reach it.

use prost::Message as _;
use prost_types::compiler::code_generator_response::{Feature, File};
use prost_types::compiler::{CodeGeneratorRequest, CodeGeneratorResponse};
use prost_types::FileDescriptorSet;

use crate::{generate, Options};

/// Answers an encoded `CodeGeneratorRequest` with an encoded `CodeGeneratorResponse`.
///
/// Never fails and never panics on bad input: a request that does not decode, an unknown
/// parameter or a schema the generator rejects all become a response with `error` set, which
/// protoc prints (protoc expects a plugin to exit 0 in that case).
pub fn respond(request: &[u8]) -> Vec<u8> {
    let response = match CodeGeneratorRequest::decode(request) {
        Ok(request) => handle(&request),
        Err(e) => error_response(format!(
            "protoc-gen-protozero: bad CodeGeneratorRequest: {e}"
        )),
    };
    response.encode_to_vec()
}

/// Generates the files a request asks for.
pub fn handle(request: &CodeGeneratorRequest) -> CodeGeneratorResponse {
    let result = Options::from_parameter(request.parameter()).and_then(|opts| {
        let fds = FileDescriptorSet {
            file: request.proto_file.clone(),
        };
        generate(&fds, &request.file_to_generate, &opts)
    });
    match result {
        Ok(files) => CodeGeneratorResponse {
            supported_features: Some(Feature::Proto3Optional as u64),
            file: files
                .into_iter()
                .map(|f| File {
                    name: Some(f.name),
                    content: Some(f.content),
                    ..File::default()
                })
                .collect(),
            ..CodeGeneratorResponse::default()
        },
        Err(e) => error_response(e.to_string()),
    }
}

fn error_response(error: String) -> CodeGeneratorResponse {
    CodeGeneratorResponse {
        error: Some(error),
        supported_features: Some(Feature::Proto3Optional as u64),
        ..CodeGeneratorResponse::default()
    }
}
