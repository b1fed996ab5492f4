//! xtask placeholder (filled below).
fn main() {}
