//! `ftkvctl`: command-line client of an ftkv cluster. See `ftkvctl --help`.
fn main() {}
