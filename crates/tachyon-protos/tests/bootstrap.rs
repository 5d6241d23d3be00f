//! The checked-in generated code is exactly what protozero-gen produces from the `.proto` files
//! today. If this fails, run `cargo xtask gen-protos` and commit the result.

use std::path::Path;

#[path = "../proto_files.rs"]
mod proto_files;

#[test]
fn generated_code_is_up_to_date() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let protos = crate_dir.join("protos");
    let files = proto_files::proto_files(&protos).expect("the protos directory reads");
    assert!(files.len() > 10, "found the .proto files");
    let generated = protozero_gen::Config::new()
        .layout(protozero_gen::Layout::SingleFile("protos.rs".into()))
        .generate_to_strings(&files, &[&protos])
        .expect("the .proto files generate");
    assert_eq!(generated.len(), 1);
    for file in generated {
        let path = crate_dir.join("src/generated").join(&file.name);
        let on_disk = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask gen-protos`", path.display()));
        assert!(
            on_disk == file.content,
            "{} is stale: run `cargo xtask gen-protos` and commit the result",
            path.display()
        );
    }
}
