//! `protoc-gen-protozero`: the protoc plugin. Reads a `CodeGeneratorRequest` from stdin and
//! writes a `CodeGeneratorResponse` to stdout; see `protozero_gen::plugin`.
//!
//! ```sh
//! protoc --plugin=protoc-gen-protozero=PATH --protozero_out=OUT_DIR \
//!        --protozero_opt=layout=single:trace.rs  file.proto
//! ```
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut request = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut request) {
        eprintln!("protoc-gen-protozero: cannot read stdin: {e}");
        return ExitCode::FAILURE;
    }
    let response = protozero_gen::plugin::respond(&request);
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_all(&response).and_then(|()| stdout.flush()) {
        eprintln!("protoc-gen-protozero: cannot write stdout: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
