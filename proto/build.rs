//! Generates the Rust types and tonic stubs in pure Rust: `protox` parses the .proto
//! files (no system `protoc`), `tonic-prost-build` writes the code.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "ftkv/v1/kv.proto",
        "ftkv/v1/maintenance.proto",
        "ftkv/v1/auth.proto",
        "ftkv/raft/v1/raft.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let file_descriptors = protox::compile(protos, ["."])?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("ftkv_descriptor.bin"),
        prost::Message::encode_to_vec(&file_descriptors),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(file_descriptors)?;
    Ok(())
}
