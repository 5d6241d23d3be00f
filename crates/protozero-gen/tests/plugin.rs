//! The `protoc-gen-protozero` binary: fed `CodeGeneratorRequest`s built here (descriptors from
//! protox), it must produce exactly the library's output, and answer bad input with an error
//! response rather than a crash. When `protoc` is on PATH, it is also run as a real plugin.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use prost::Message as _;
use prost_types::compiler::{CodeGeneratorRequest, CodeGeneratorResponse};
use protozero_gen::{GeneratedFile, Layout};

const PLUGIN: &str = env!("CARGO_BIN_EXE_protoc-gen-protozero");

/// Runs the plugin binary with `stdin`; it must exit successfully with a response.
fn run_plugin(stdin: &[u8]) -> CodeGeneratorResponse {
    let mut child = Command::new(PLUGIN)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "plugin failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    CodeGeneratorResponse::decode(out.stdout.as_slice()).expect("a response")
}

fn request(parameter: &str, files: &[&str]) -> CodeGeneratorRequest {
    CodeGeneratorRequest {
        file_to_generate: files.iter().map(|s| s.to_string()).collect(),
        parameter: Some(parameter.into()),
        proto_file: common::descriptor_set().file,
        ..Default::default()
    }
}

fn files_of(response: CodeGeneratorResponse) -> Vec<GeneratedFile> {
    assert_eq!(response.error, None);
    assert_eq!(response.supported_features, Some(1), "proto3 optional");
    response
        .file
        .into_iter()
        .map(|f| GeneratedFile {
            name: f.name.unwrap(),
            content: f.content.unwrap(),
        })
        .collect()
}

#[test]
fn plugin_output_is_the_library_output() {
    let per_package = run_plugin(&request("", common::PROTOS).encode_to_vec());
    assert_eq!(files_of(per_package), common::generate(Layout::PerPackage));

    let single = run_plugin(&request("layout=single:single.rs", common::PROTOS).encode_to_vec());
    assert_eq!(
        files_of(single),
        common::generate(Layout::SingleFile("single.rs".into()))
    );
}

#[test]
fn garbage_stdin_is_an_error_response() {
    let response = run_plugin(b"\xff\xff\xff\xff garbage");
    let error = response.error.expect("an error");
    assert!(error.contains("CodeGeneratorRequest"), "{error}");
    assert!(response.file.is_empty());
}

#[test]
fn empty_stdin_generates_nothing() {
    let response = run_plugin(b"");
    assert_eq!(response.error, None);
    assert!(response.file.is_empty());
}

/// One damage done to a descriptor: which field of which message, and what to change.
#[derive(Clone, Debug)]
enum Damage {
    Number(i32),
    Type(i32),
    Label(i32),
    TypeName(String),
    Default(String),
    Name(String),
    OneofIndex(i32),
    DropMessage,
    DropEnumValues,
}

fn damage() -> impl proptest::strategy::Strategy<Value = Damage> {
    use proptest::prelude::*;
    prop_oneof![
        any::<i32>().prop_map(Damage::Number),
        (-1i32..20).prop_map(Damage::Type),
        (-1i32..5).prop_map(Damage::Label),
        prop_oneof![
            Just(".pz.common.Point".to_owned()),
            Just(".pz.common.Color".to_owned()),
            ".{0,8}"
        ]
        .prop_map(Damage::TypeName),
        prop_oneof![Just("nan".to_owned()), Just("\\777".to_owned()), ".{0,8}"]
            .prop_map(Damage::Default),
        prop_oneof![
            Just("self".to_owned()),
            Just(String::new()),
            Just("_".to_owned()),
            "[a-zA-Z_ ]{0,6}"
        ]
        .prop_map(Damage::Name),
        (-1i32..4).prop_map(Damage::OneofIndex),
        Just(Damage::DropMessage),
        Just(Damage::DropEnumValues),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 128, ..Default::default() })]

    /// Damaged descriptors (bad numbers, types, labels, type names, defaults, names, missing
    /// messages, empty enums) get files or an error response, never a panic; and the same for
    /// damaged bytes. (In process, for speed: the binary only moves bytes.)
    #[test]
    fn damaged_requests_never_panic(
        damages in proptest::collection::vec(
            (proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<proptest::sample::Index>(), damage()),
            1..4,
        ),
        flip in proptest::option::of((proptest::prelude::any::<proptest::sample::Index>(), 1u8..)),
    ) {
        let mut req = request("", common::PROTOS);
        for (file, field, d) in damages {
            let file = &mut req.proto_file[file.index(4)];
            if file.message_type.is_empty() {
                continue;
            }
            let mi = field.index(file.message_type.len());
            let m = &mut file.message_type[mi];
            if let Damage::DropMessage = d {
                file.message_type.remove(mi);
                continue;
            }
            if let Damage::DropEnumValues = d {
                for e in &mut m.enum_type {
                    e.value.clear();
                }
                continue;
            }
            if m.field.is_empty() {
                continue;
            }
            let fi = field.index(m.field.len());
            let f = &mut m.field[fi];
            match d {
                Damage::Number(n) => f.number = Some(n),
                Damage::Type(t) => f.r#type = Some(t),
                Damage::Label(l) => f.label = Some(l),
                Damage::TypeName(t) => f.type_name = Some(t),
                Damage::Default(v) => f.default_value = Some(v),
                Damage::Name(n) => f.name = Some(n),
                Damage::OneofIndex(i) => f.oneof_index = Some(i),
                Damage::DropMessage | Damage::DropEnumValues => unreachable!(),
            }
        }
        let mut bytes = req.encode_to_vec();
        if let Some((at, x)) = flip {
            let i = at.index(bytes.len());
            bytes[i] ^= x;
        }
        for input in [req.encode_to_vec(), bytes] {
            let response =
                CodeGeneratorResponse::decode(protozero_gen::plugin::respond(&input).as_slice())
                    .unwrap();
            if response.error.is_none() {
                for f in &response.file {
                    proptest::prop_assert!(f.content().starts_with(protozero_gen::HEADER));
                }
            }
        }
    }
}

#[test]
fn a_group_field_is_an_error_response() {
    let fds = protox::Compiler::new([common::proto_dir()])
        .unwrap()
        .include_imports(true)
        .open_files(["group.proto"])
        .unwrap()
        .file_descriptor_set();
    let req = CodeGeneratorRequest {
        file_to_generate: vec!["group.proto".into()],
        proto_file: fds.file,
        ..Default::default()
    };
    let error = run_plugin(&req.encode_to_vec()).error.expect("an error");
    assert!(error.contains("pz.group.WithGroup.result"), "{error}");
}

#[test]
fn an_unknown_parameter_is_an_error_response() {
    let response = run_plugin(&request("colour=blue", common::PROTOS).encode_to_vec());
    assert!(response.error.unwrap().contains("colour=blue"));
}

fn protoc_available() -> bool {
    match Command::new("protoc").arg("--version").output() {
        Ok(out) if out.status.success() => true,
        _ => {
            println!("note: `protoc` is not on PATH; skipping the real-protoc test (CI installs protobuf-compiler)");
            false
        }
    }
}

/// Runs `protoc` with the plugin into a fresh directory and returns what it wrote.
fn run_protoc(name: &str, opt: Option<&str>) -> Vec<GeneratedFile> {
    let out = std::env::temp_dir().join(format!("protozero-gen-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let mut cmd = Command::new("protoc");
    cmd.arg(format!("--plugin=protoc-gen-protozero={PLUGIN}"))
        .arg(format!("--protozero_out={}", out.display()))
        .arg(format!("-I{}", common::proto_dir().display()));
    if let Some(opt) = opt {
        cmd.arg(format!("--protozero_opt={opt}"));
    }
    cmd.args(common::PROTOS);
    let status = cmd.output().unwrap();
    assert!(
        status.status.success(),
        "protoc failed: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let mut files: Vec<GeneratedFile> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            GeneratedFile {
                name: path.file_name().unwrap().to_str().unwrap().to_owned(),
                content: std::fs::read_to_string(&path).unwrap(),
            }
        })
        .collect();
    files.sort_by(|a, b| a.name.cmp(&b.name));
    std::fs::remove_dir_all(&out).unwrap();
    files
}

#[test]
fn real_protoc_with_the_plugin_matches_the_library() {
    if !protoc_available() {
        return;
    }
    assert_eq!(
        run_protoc("per-package", None),
        common::generate(Layout::PerPackage)
    );
    assert_eq!(
        run_protoc("single", Some("layout=single:single.rs")),
        common::generate(Layout::SingleFile("single.rs".into()))
    );
}

#[test]
fn real_protoc_reports_a_group_error() {
    if !protoc_available() {
        return;
    }
    let out = std::env::temp_dir().join(format!("protozero-gen-group-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let result = Command::new("protoc")
        .arg(format!("--plugin=protoc-gen-protozero={PLUGIN}"))
        .arg(format!("--protozero_out={}", out.display()))
        .arg(format!("-I{}", common::proto_dir().display()))
        .arg("group.proto")
        .output()
        .unwrap();
    assert!(!result.status.success());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("pz.group.WithGroup.result"), "{stderr}");
    let _ = std::fs::remove_dir_all(Path::new(&out));
}
