//! What the generator refuses, and how it says so: an [`Error`] naming the offending element,
//! never a panic.

mod common;

use prost_types::{
    field_descriptor_proto::{Label, Type},
    DescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet,
};
use protozero_gen::{generate, Config, Error, Layout, Options};

fn generate_sources(files: &[(&str, &str)]) -> Result<Vec<protozero_gen::GeneratedFile>, Error> {
    let fds = common::compile_sources(files).expect("the test schema parses");
    let names: Vec<String> = files.iter().map(|(n, _)| n.to_string()).collect();
    generate(&fds, &names, &Options::default())
}

#[test]
fn a_group_field_is_unsupported_and_named() {
    let err = Config::new()
        .generate_to_strings(&["group.proto"], &[common::proto_dir()])
        .unwrap_err();
    match &err {
        Error::Unsupported { element, reason } => {
            assert_eq!(element, "pz.group.WithGroup.result");
            assert!(reason.contains("group"), "{reason}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    assert!(err.to_string().starts_with("pz.group.WithGroup.result: "));
}

#[test]
fn a_field_number_beyond_the_decoder_limit_is_unsupported() {
    let err = generate_sources(&[(
        "big.proto",
        "syntax = \"proto3\"; package big; message M { int32 huge = 16777216; }",
    )])
    .unwrap_err();
    assert!(
        matches!(&err, Error::Unsupported { element, .. } if element == "big.M.huge"),
        "{err:?}"
    );
}

#[test]
fn editions_are_unsupported() {
    let fds = FileDescriptorSet {
        file: vec![FileDescriptorProto {
            name: Some("e.proto".into()),
            syntax: Some("editions".into()),
            ..Default::default()
        }],
    };
    let err = generate(&fds, &["e.proto".into()], &Options::default()).unwrap_err();
    assert!(matches!(err, Error::Unsupported { ref element, .. } if element == "e.proto"));
}

#[test]
fn missing_files_and_types_are_invalid_descriptors() {
    let fds = common::descriptor_set();
    let err = generate(&fds, &["nope.proto".into()], &Options::default()).unwrap_err();
    assert!(matches!(err, Error::InvalidDescriptor(_)), "{err:?}");

    let dangling = FileDescriptorSet {
        file: vec![FileDescriptorProto {
            name: Some("d.proto".into()),
            package: Some("d".into()),
            message_type: vec![DescriptorProto {
                name: Some("M".into()),
                field: vec![FieldDescriptorProto {
                    name: Some("x".into()),
                    number: Some(1),
                    label: Some(Label::Optional as i32),
                    r#type: Some(Type::Message as i32),
                    type_name: Some(".d.Missing".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let err = generate(&dangling, &["d.proto".into()], &Options::default()).unwrap_err();
    match err {
        Error::InvalidDescriptor(msg) => assert!(msg.contains("d.M.x"), "{msg}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn parse_errors_come_from_protox() {
    let dir = common::proto_dir();
    let err = Config::new()
        .generate_to_strings(&["does/not/exist.proto"], &[dir])
        .unwrap_err();
    assert!(matches!(err, Error::Parse(_)), "{err:?}");
}

#[test]
fn files_without_a_package() {
    let src = "syntax = \"proto3\"; message Top { Inner inner = 1; message Inner {} }";
    let files = generate_sources(&[("top.proto", src)]).unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].name, "_.rs");
    assert!(files[0].content.contains("pub struct Top<'w>"));
    assert!(files[0].content.contains("-> top::Inner<'_>"));
    let fds = common::compile_sources(&[("top.proto", src)]).unwrap();
    let single = generate(
        &fds,
        &["top.proto".into()],
        &Options::new().layout(Layout::SingleFile("all.rs".into())),
    )
    .unwrap();
    // No package module around the items.
    assert_eq!(single[0].name, "all.rs");
    assert!(single[0].content.contains("\npub struct Top<'w>"));
}

#[test]
fn compile_protos_writes_files_and_leaves_unchanged_ones_alone() {
    let out = std::env::temp_dir().join(format!("protozero-gen-out-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let written = Config::new()
        .out_dir(&out)
        .compile_protos(common::PROTOS, &[common::proto_dir()])
        .unwrap();
    assert_eq!(written.len(), 3);
    let expected = common::generate(Layout::PerPackage);
    for f in &expected {
        assert_eq!(
            std::fs::read_to_string(out.join(&f.name)).unwrap(),
            f.content
        );
    }
    // Backdate the files, so that a rewrite shows whatever the file system's mtime resolution.
    let long_ago = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    let mtime = |p: &std::path::Path| std::fs::metadata(p).unwrap().modified().unwrap();
    for path in &written {
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(long_ago).unwrap();
        assert_eq!(mtime(path), long_ago);
    }
    Config::new()
        .out_dir(&out)
        .compile_protos(common::PROTOS, &[common::proto_dir()])
        .unwrap();
    for path in &written {
        assert_eq!(mtime(path), long_ago, "{} was rewritten", path.display());
    }
    std::fs::remove_dir_all(&out).unwrap();
}
