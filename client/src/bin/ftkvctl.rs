//! `ftkvctl`: command-line client of an ftkv cluster (etcdctl-like). See `ftkvctl --help` and
//! the module docs of `ftkv_client::cli` for the commands, output formats and exit codes.

fn main() {
    std::process::exit(ftkv_client::cli::main());
}
