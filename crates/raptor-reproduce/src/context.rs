//! What every part of `raptor-reproduce` reads: the run's [`Context`], its [`Profile`] and
//! the sizes each part keeps per profile ([`ProfileScale`], with the named [`Schedule`],
//! [`Dims`] and [`RouterSchedule`]). The parts import this module; only the driver imports the
//! parts.

use raptor_train::config::DeviceSpec;
use std::path::PathBuf;

/// Everything a part needs to know about the run.
#[derive(Debug, Clone)]
pub struct Context {
    /// Repository root (fixtures are read from `<root>/fixtures`).
    pub root: PathBuf,
    /// Output folder (`results/` by default).
    pub out: PathBuf,
    /// The sizes the parts run at.
    pub profile: Profile,
    /// Per-user cache (prepared corpora, tokenizers, pretrained models); None: the default
    /// (`$RAPTOR_CACHE_DIR`, `$XDG_CACHE_HOME/raptor` or `~/.cache/raptor`).
    pub cache: Option<PathBuf>,
    /// Folder holding the data-to-text files (`e2e/`, `dart/`).
    pub d2t_data: PathBuf,
    /// Device of the training runs (`cpu`, `cuda`, `cuda:N`).
    pub device: DeviceSpec,
    /// The `raptor-reproduce` program, to run the training grid in parallel worker processes
    /// (its hidden subcommand `run-one`); None: one run after another in
    /// this process.
    pub exe: Option<PathBuf>,
    /// Worker processes at once (each with one libtorch thread).
    pub workers: usize,
    /// Print the tables as one JSON array on stdout instead of Markdown.
    pub json: bool,
}

pub use raptor_report::Table;

/// The sizes of a reproduction: each training part (`paper`, `dpmuon`, `backbones`) has a
/// `Scale` per profile, the building-block parts a smaller and a larger setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// `--quick`: tiny models and a few updates (the tests of this driver).
    Quick,
    /// The default: every part's design (public pretraining, public proxy, positive control,
    /// paired seeds, diagnostics) at sizes that fit about half an hour on 2 CPU cores: fewer
    /// seeds, records and updates, so its intervals are wide.
    Small,
    /// `--standard`: the evidence grids behind the README's tables (5 paired seeds; hours on
    /// 2 CPU cores, resumable).
    Standard,
    /// `--full`: the paper-sized grid (larger models, every record; a GPU).
    Full,
}

impl Profile {
    /// The profile the flags name (`--quick`, `--standard`, `--full`; none: [`Profile::Small`]).
    pub fn from_flags(quick: bool, standard: bool, full: bool) -> Self {
        match (quick, standard, full) {
            (true, _, _) => Self::Quick,
            (_, _, true) => Self::Full,
            (_, true, _) => Self::Standard,
            _ => Self::Small,
        }
    }

    /// The profile's name, as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Quick => "quick",
            Self::Small => "default",
            Self::Standard => "standard",
            Self::Full => "full",
        }
    }
}

/// The sizes of one part under each [`Profile`]: a constructor per profile, and the choice
/// between them ([`ProfileScale::for_profile`]), so that every part reads its profile the same
/// way.
pub trait ProfileScale: Sized {
    /// `--quick`: tiny models and a few updates (the tests of this driver).
    fn quick() -> Self;
    /// No profile flag: the part's design at sizes that fit the default reproduction's budget.
    fn small() -> Self;
    /// `--standard`: the evidence grid behind the README's tables.
    fn standard() -> Self;
    /// `--full`: the paper-sized setting (a GPU or a long CPU run).
    fn full() -> Self;

    /// The sizes of `profile`.
    fn for_profile(profile: Profile) -> Self {
        match profile {
            Profile::Quick => Self::quick(),
            Profile::Small => Self::small(),
            Profile::Standard => Self::standard(),
            Profile::Full => Self::full(),
        }
    }
}

impl Context {
    /// Whether this is the test profile (`--quick`).
    pub fn quick(&self) -> bool {
        self.profile == Profile::Quick
    }
}

/// An optimizer's schedule in a profile: how many updates, of which (expected) batch, at which
/// learning rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Updates.
    pub updates: u64,
    /// Expected batch (records per update; capped at the records there are).
    pub batch: f64,
    /// Learning rate.
    pub lr: f64,
}

/// Sizes of a transformer built from scratch in a profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dims {
    /// Model width (d_model).
    pub width: i64,
    /// Blocks.
    pub blocks: i64,
    /// Attention heads.
    pub heads: i64,
    /// Feed-forward size.
    pub ffn: i64,
    /// Experts per sparse layer (0 for a dense model).
    pub experts: i64,
}

/// Router training toward a public partition in a profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouterSchedule {
    /// Adam steps.
    pub steps: usize,
    /// Learning rate.
    pub lr: f64,
    /// Public records read at most (0: all).
    pub max_records: usize,
}
