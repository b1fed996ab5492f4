//! `raptor`: the command-line program of the raptor workspace.

use clap::{Parser, Subcommand};

// jemalloc serves every allocation of the process, libtorch's tensors included: its symbols
// are unprefixed, so the shared libraries' `malloc` and `free` resolve to it. glibc's allocator
// kept most of a MoE run's resident memory as free space inside its arenas (see
// `raptor_run::memory`); jemalloc returns unused pages by itself.
#[cfg(target_os = "linux")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Gives every jemalloc arena's unused pages back to the system now (the `purge` control over
/// all arenas, `MALLCTL_ARENAS_ALL` = 4096): what `raptor_run::memory::release_free_memory`
/// calls in this program.
#[cfg(target_os = "linux")]
fn release_jemalloc_pages() -> bool {
    const PURGE_ALL: &[u8] = b"arena.4096.purge\0";
    // SAFETY: the name is a NUL-terminated string; a purge reads and writes no caller memory
    // (every other pointer is null, the length 0), and jemalloc locks its arenas itself.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE_ALL.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    rc == 0
}

mod cli;
mod provision;
mod quickstart;

// The planted noise bugs are for the audit's tests and its measured table only: no build of
// the program may contain them (cargo's feature unification could switch them on in the
// library this program links; the library says whether it did).
const _: () = assert!(
    !raptor_train::PLANTED_FAULTS,
    "the raptor program is never built with raptor-train's `planted-faults` feature \
     (test/audit-only); run the audit table with \
     `cargo run -p raptor-audit --example audit_table --features planted-faults`"
);

/// Differentially private fine-tuning of Mixture-of-Experts and dense transformers.
#[derive(Debug, Parser)]
#[command(name = "raptor", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands. Each one's arguments and logic live in this program's `cli::<name>` or
/// `raptor_cli`.
#[derive(Debug, Subcommand)]
enum Command {
    /// Print the build information: versions (read, not written in), CUDA availability.
    Info {
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Run the reproduction tables: runs the `raptor-reproduce` program beside this one with
    /// the same arguments (`raptor reproduce --help` shows its flags).
    #[command(disable_help_flag = true)]
    Reproduce {
        /// The arguments of `raptor-reproduce` (e.g. `--quick --only accountant --out DIR`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Export a finished run's model: a Hugging Face folder, or for a LoRA run a PEFT adapter
    /// folder for its base checkpoint (`--merged`: the adapters merged into a Hugging Face
    /// folder).
    Export(cli::export::ExportArgs),
    /// Sparse upcycling: turn a dense Llama-style Hugging Face folder into a Mixtral-style MoE
    /// folder, or a BERT folder into a MoE-BERT folder (raptor's layout, `model.kind =
    /// "moe-bert"`): every layer's MLP copied into E experts, a new random router, seeded and
    /// frozen in training. Tokenizer files beside the checkpoint are copied.
    Upcycle(cli::upcycle::UpcycleArgs),
    /// Train privately from a config file or from a data file alone (`--data train.csv`:
    /// columns detected, pretrained backbone, documented defaults).
    Train(cli::train::TrainArgs),
    /// Write the config `raptor train --data <file>` would run, commented, to stdout.
    Init(cli::init::InitArgs),
    /// Evaluate a run folder on a data file.
    Eval(cli::train::EvalArgs),
    /// Audit a run config empirically: one training run with secret canaries, an ε lower bound
    /// beside the certified upper bound (`<run>/private/audit.json`).
    Audit(cli::audit::AuditArgs),
    /// `account`, `calibrate`, `plan` and `routing`: the libtorch-free subcommands of
    /// `raptor_cli` (also the `raptor-acct` program).
    #[command(flatten)]
    Acct(raptor_cli::Command),
}

fn main() {
    #[cfg(target_os = "linux")]
    raptor_run::memory::set_releaser(release_jemalloc_pages);
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info { json } => info(json),
        Command::Reproduce { args } => reproduce(&args),
        Command::Export(args) => cli::export::run_export(args),
        Command::Upcycle(args) => cli::upcycle::run_upcycle(args),
        Command::Train(args) => cli::train::run_train(args),
        Command::Init(args) => cli::init::run_init(args),
        Command::Eval(args) => cli::train::run_eval(args),
        Command::Audit(args) => cli::audit::run_audit(args),
        Command::Acct(command) => command.run().map_err(anyhow::Error::from),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(cli::EXIT_BAD_INPUT);
    }
}

/// `raptor reproduce`: replaces this process by the `raptor-reproduce` program found beside
/// this one (same folder), with the same arguments; its exit code is the command's. A missing
/// program is an error that says how to build it.
fn reproduce(args: &[std::ffi::OsString]) -> anyhow::Result<()> {
    let me = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("cannot find the path of this program: {e}"))?;
    let exe = me.with_file_name("raptor-reproduce");
    if !exe.is_file() {
        let release = me
            .parent()
            .and_then(|d| d.file_name())
            .is_some_and(|n| n == "release");
        anyhow::bail!(
            "`raptor reproduce` runs the `raptor-reproduce` program, which is not built: {} is \
             missing; build it with `cargo build{} -p raptor-reproduce` (or run `cargo xtask \
             reproduce`, which builds and runs it)",
            exe.display(),
            if release { " --release" } else { "" }
        );
    }
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(args);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt as _;
        // Only returns on failure.
        let err = cmd.exec();
        Err(anyhow::anyhow!("cannot run {}: {err}", exe.display()))
    }
    #[cfg(not(unix))]
    {
        let status = cmd
            .status()
            .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", exe.display()))?;
        std::process::exit(status.code().unwrap_or(1));
    }
}

/// Which libtorch build this program linked: `cuda` (libtorch_cuda.so linked, as `cargo xtask
/// setup` installs on a machine with an NVIDIA driver or with `--cuda`) or `cpu` (the CPU-only
/// install: no CUDA device can be used).
fn libtorch_build() -> &'static str {
    if raptor_models::CUDA_LINKED {
        "cuda"
    } else {
        "cpu"
    }
}

fn info(json: bool) -> anyhow::Result<()> {
    let libtorch = raptor_train::libtorch_version();
    let (available, devices) = (tch::Cuda::is_available(), tch::Cuda::device_count());
    if json {
        return cli::print_json(&serde_json::json!({
            "raptor": env!("CARGO_PKG_VERSION"),
            "tch": raptor_train::TCH_VERSION,
            "libtorch": libtorch,
            "cuda_linked": raptor_models::CUDA_LINKED,
            "libtorch_build": libtorch_build(),
            "cuda_available": available,
            "cuda_devices": devices,
        }));
    }
    println!("raptor {}", env!("CARGO_PKG_VERSION"));
    println!(
        "tch {} / libtorch {libtorch} (loaded)",
        raptor_train::TCH_VERSION
    );
    println!("libtorch build: {}", libtorch_build());
    println!("cuda linked: {}", raptor_models::CUDA_LINKED);
    println!("cuda available: {available}");
    println!("cuda devices: {devices}");
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The argument parser of `raptor` never panics on arbitrary command lines (fuzzing of the
    //! CLI's arguments, long runs in `docs/fuzzing.md`; the parsers of the files they name have
    //! their own harnesses). 2,000 cases by default; `RAPTOR_FUZZ_CASES=N` for a long run.
    use super::Cli;
    use clap::{CommandFactory, Parser};
    use proptest::prelude::*;
    use raptor_testkit::{argv, fuzz};

    #[test]
    fn the_command_definition_is_consistent() {
        Cli::command().debug_assert();
        let v = argv::vocabulary(&Cli::command());
        for w in [
            "train", "eval", "audit", "upcycle", "account", "init", "--config", "--resume",
            "--data", "--quiet",
        ] {
            assert!(v.iter().any(|x| x == w), "{w} missing from {v:?}");
        }
    }

    proptest! {
        #![proptest_config(fuzz::config(2000))]

        #[test]
        fn command_lines_never_panic(
            line in argv::command_lines("raptor", &Cli::command(), &["cpu", "cuda:7"], 0..12),
        ) {
            // An error (usage, help, version) or a parsed command: never a panic.
            let _ = Cli::try_parse_from(&line);
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod allocator_tests {
    //! The program's allocator is jemalloc, for libtorch's allocations too, and its free pages
    //! go back to the system when released.

    /// Resident bytes of this process.
    fn resident() -> u64 {
        raptor_run::memory::resident_bytes().unwrap_or(0)
    }

    #[test]
    fn shared_libraries_allocate_from_jemalloc() {
        // A shared library's `malloc` (libtorch's tensors) is the first `malloc` of the
        // process's global symbol lookup: it must be jemalloc's, not the C library's.
        // SAFETY: dlsym with a NUL-terminated name only looks the symbol up.
        let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
        assert!(!global.is_null());
        assert_eq!(
            global as usize,
            tikv_jemalloc_sys::malloc as *const () as usize,
            "`malloc` resolves to the C library's allocator, not jemalloc"
        );
    }

    #[test]
    fn released_pages_leave_the_resident_set() {
        let blocks: Vec<Vec<u8>> = (0..4096usize)
            .map(|i| vec![(i % 251) as u8 + 1; 64 * 1024])
            .collect();
        let full = resident();
        drop(blocks);
        let before = resident();
        assert!(
            super::release_jemalloc_pages(),
            "the purge control is known"
        );
        let after = resident();
        // 256 MiB were freed; at least half of it must leave the resident set (jemalloc may
        // already have returned some by itself, so compare with the resident set while full).
        assert!(
            full.saturating_sub(after) > 128 << 20,
            "resident {full} with the blocks, {before} after freeing, {after} after the purge"
        );
    }
}
