//! `raptor account / calibrate / plan / routing`: the `raptor` program embeds raptor-cli's
//! subcommands, so it runs raptor-cli's own CLI cases (one copy of them, on both programs).

#[path = "../../raptor-cli/tests/cli.rs"]
mod cases;
