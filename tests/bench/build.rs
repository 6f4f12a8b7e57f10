//! Generates the etcd wire subset used by the side-by-side benchmark (pure Rust: protox).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=etcd/rpc_subset.proto");
    let fds = protox::compile(["etcd/rpc_subset.proto"], ["etcd"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
