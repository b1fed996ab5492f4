//! `raptor init --data train.csv > run.toml`: the config `raptor train --data train.csv` would
//! run, as commented TOML for editing (what was detected and assumed in the header).

use anyhow::Context as _;

use super::train::QuickArgs;

/// Write the config of a one-command run, commented, to stdout.
#[derive(Debug, Clone, clap::Args)]
pub struct InitArgs {
    /// The data and the choices of `raptor train --data` (`--data` is required here).
    #[command(flatten)]
    pub quick: QuickArgs,
}

/// Runs `raptor init`.
///
/// # Errors
/// No `--data`, or the errors of [`QuickArgs::resolve`].
pub fn run_init(a: InitArgs) -> anyhow::Result<()> {
    let Some(data) = a.quick.data.clone() else {
        anyhow::bail!("give --data <train.csv> (raptor init writes the config of that data)");
    };
    let mut r = a.quick.resolve(&data, false)?;
    // Absolute data paths: the file may be written anywhere.
    let abs = |p: &std::path::Path| {
        std::fs::canonicalize(p).with_context(|| format!("cannot resolve {}", p.display()))
    };
    r.config.data.train = abs(&r.config.data.train)?;
    if let Some(v) = r.config.data.validation.clone() {
        r.config.data.validation = Some(abs(&v)?);
    }
    print!("{}", crate::quickstart::commented_toml(&r)?);
    Ok(())
}
