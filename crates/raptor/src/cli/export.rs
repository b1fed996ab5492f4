//! `raptor export`: a finished run's model as files other tools read.

use std::path::PathBuf;

use raptor_run::{ExportForm, Exported};

/// Export a finished run's model: a run without LoRA adapters as a Hugging Face folder
/// (`config.json` + `model.safetensors`) that `model.path` can start from; a LoRA run (the
/// one-command default) as a PEFT adapter folder (`adapter_config.json` +
/// `adapter_model.safetensors`, the head saved whole) for the base checkpoint, or with
/// `--merged` as a Hugging Face folder with the adapters merged in. Each folder has a
/// README.md that says how to load it. Nothing of the run's `private/` folder is read or
/// written.
#[derive(Debug, Clone, clap::Args)]
pub struct ExportArgs {
    /// The run folder.
    #[arg(long)]
    pub run: PathBuf,
    /// The folder to write.
    #[arg(long)]
    pub out: PathBuf,
    /// A LoRA run: merge the adapters into the base weights (W + scale·B·A) and write a plain
    /// Hugging Face folder (head included) instead of a PEFT adapter folder.
    #[arg(long)]
    pub merged: bool,
}

/// Runs `raptor export`.
pub fn run_export(args: ExportArgs) -> anyhow::Result<()> {
    let form = if args.merged {
        ExportForm::Merged
    } else {
        ExportForm::Adapter
    };
    let what = raptor_run::export_run_as(&args.run, &args.out, form)?;
    let (run, out) = (args.run.display(), args.out.display());
    match what {
        Exported::Full => {
            if args.merged {
                println!("note: {run} trained no LoRA adapters: --merged changes nothing");
            }
            println!("exported {run} to {out} (a Hugging Face folder)");
        }
        Exported::Adapter(r) => {
            println!(
                "exported {run} to {out}: a PEFT adapter (r {}, lora_alpha {}) on {} modules, {} saved whole; load it onto the base checkpoint (see {out}/README.md), or export with --merged for a folder that needs no PEFT",
                r.r,
                r.alpha,
                r.target_modules.len(),
                r.modules_to_save.join(", ")
            );
        }
        Exported::Merged(m) => println!(
            "exported {run} to {out}: a Hugging Face folder with {} LoRA adapters merged in (see {out}/README.md)",
            m.len()
        ),
    }
    Ok(())
}
