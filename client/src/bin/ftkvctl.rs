//! `ftkvctl`: command-line client of an ftkv cluster (etcdctl-like). See `ftkvctl --help` and
//! the module docs of `ftkv_client::cli` for the commands, output formats and exit codes.

// `bench put` allocates per request; mimalloc costs less CPU than glibc malloc for that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(ftkv_client::cli::main());
}
