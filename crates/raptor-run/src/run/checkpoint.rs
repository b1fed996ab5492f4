//! Checkpoints: the trainable parameters and the optimizer state as safetensors named by
//! update, `state.json` (their SHA-256 and the update counter: the commit point) and the ledger.
//! The ledger is written after each update's releases are charged and before they are applied,
//! so after a crash the ledger can only be ahead of the parameters (it over-counts, never
//! under-counts).
//!
//! A run folder that holds a `buffer-tap.json` ([`BUFFER_TAP_FILE`]: `{"every": k,
//! "max_matrices": n}`) when training starts also keeps what Newton–Schulz orthogonalized at
//! every k-th update for the first n Muon matrices, with its per-entry noise std, under
//! `diagnostics/buffers-<update>.{safetensors,json}` (released momentum buffers: post-processing
//! of the noised gradients; [`raptor_optim::BufferTap`]).

#[allow(clippy::wildcard_imports)]
use super::*;

/// State saved with a checkpoint. It names the tensor files of its checkpoint (written under
/// names that carry the update, so the set `state.json` points at is always complete: a crash
/// between files leaves the previous state pointing at the previous files) and their SHA-256.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CheckpointState {
    update: u64,
    optim: OptimScalars,
    resumed: u32,
    trainable_file: String,
    trainable_sha256: String,
    optimizer_file: String,
    optimizer_sha256: String,
}

/// The file of a run folder that asks training to keep Muon inputs (see the module docs).
pub const BUFFER_TAP_FILE: &str = "buffer-tap.json";

#[derive(Deserialize)]
pub(crate) struct TapRequest {
    every: u64,
    max_matrices: usize,
}

/// The buffer tap a run folder asks for, if any.
pub(crate) fn buffer_tap(dir: &Path) -> Result<Option<raptor_optim::BufferTap>> {
    let path = dir.join(BUFFER_TAP_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = std::fs::read(&path).map_err(io(&path))?;
    let r: TapRequest = serde_json::from_slice(&bytes)
        .map_err(|e| RunError::Run(format!("{}: {e}", path.display())))?;
    Ok(Some(raptor_optim::BufferTap::new(r.every, r.max_matrices)))
}

/// One kept Muon input as listed in `diagnostics/buffers-<update>.json` (its tensor, under the
/// same name, is in the `.safetensors` file beside it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BufferSampleInfo {
    /// The parameter.
    pub name: String,
    /// The matrix's optimizer step (1-based).
    pub step: u64,
    /// Per-entry noise std of the kept input.
    pub noise_std: f64,
    /// Whether that step applied DP-MuonBC's correction.
    pub corrected: bool,
}

pub(crate) fn save_buffer_samples(
    dir: &Path,
    update: u64,
    kept: &[raptor_optim::BufferSample],
) -> Result<()> {
    let d = dir.join("diagnostics");
    std::fs::create_dir_all(&d).map_err(io(&d))?;
    let tensors: Vec<(String, tch::Tensor)> = kept
        .iter()
        .map(|k| (k.name.clone(), k.input.shallow_clone()))
        .collect();
    let info: Vec<BufferSampleInfo> = kept
        .iter()
        .map(|k| BufferSampleInfo {
            name: k.name.clone(),
            step: k.step,
            noise_std: k.noise_std,
            corrected: k.corrected,
        })
        .collect();
    write_safetensors(
        d.join(format!("buffers-{update:06}.safetensors")),
        &tensors,
        None,
    )?;
    write_atomic(
        &d.join(format!("buffers-{update:06}.json")),
        &serde_json::to_vec_pretty(&info)?,
    )
}

pub(crate) fn save_checkpoint(dir: &Path, trainer: &Trainer<'_>, resumed: u32) -> Result<()> {
    let ck = dir.join("checkpoint");
    std::fs::create_dir_all(&ck).map_err(io(&ck))?;
    let vars = trainer.model().var_store().variables();
    let mut params: Vec<(String, tch::Tensor)> = Vec::new();
    for p in trainer.plan().params() {
        if let Some(t) = vars.get(&p) {
            params.push((p, t.f_detach()?.f_contiguous()?));
        }
    }
    let update = trainer.update();
    let (tname, oname) = (
        format!("trainable-{update}.safetensors"),
        format!("optimizer-{update}.safetensors"),
    );
    let tmp = ck.join(format!("{tname}.tmp"));
    write_safetensors(&tmp, &params, None)?;
    let (ots, scalars) = trainer.optimizers().export()?;
    let otmp = ck.join(format!("{oname}.tmp"));
    write_safetensors(&otmp, &ots, None)?;
    let mut sums = Vec::new();
    for f in [&tmp, &otmp] {
        std::fs::File::open(f)
            .and_then(|h| h.sync_all())
            .map_err(io(f))?;
        sums.push(sha256_hex(&std::fs::read(f).map_err(io(f))?));
    }
    std::fs::rename(&tmp, ck.join(&tname)).map_err(io(&tmp))?;
    std::fs::rename(&otmp, ck.join(&oname)).map_err(io(&otmp))?;
    let state = CheckpointState {
        update,
        optim: scalars,
        resumed,
        trainable_file: tname.clone(),
        trainable_sha256: sums[0].clone(),
        optimizer_file: oname.clone(),
        optimizer_sha256: sums[1].clone(),
    };
    // The state is the commit point: once it is renamed into place, the older files are unused.
    write_checked_json(&ck.join("state.json"), &state)?;
    if let Ok(entries) = std::fs::read_dir(&ck) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            // Completed files only: a `.tmp` is never left by this process (it is renamed or the
            // write failed and the error is reported).
            let ours = (name.starts_with("trainable-") || name.starts_with("optimizer-"))
                && name.ends_with(".safetensors");
            if ours && name != tname && name != oname {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok(())
}

/// The state of a run folder's checkpoint, if it has one (verified).
pub(crate) fn checkpoint_state(dir: &Path) -> Result<Option<CheckpointState>> {
    let p = dir.join("checkpoint").join("state.json");
    if !p.exists() {
        return Ok(None);
    }
    read_checked_json(&p).map(Some)
}

/// The trainable tensors of a run folder's checkpoint (checksum verified).
pub fn checkpoint_tensors(dir: &Path) -> Result<Vec<(String, tch::Tensor)>> {
    let st = checkpoint_state(dir)?.ok_or_else(|| {
        RunError::Run(format!(
            "{} has no checkpoint (no checkpoint/state.json)",
            dir.display()
        ))
    })?;
    read_checked_tensors(
        &dir.join("checkpoint").join(&st.trainable_file),
        &st.trainable_sha256,
    )
}

pub(crate) fn load_trainable(dir: &Path, model: &dyn raptor_models::Model) -> Result<()> {
    let path = dir.join("checkpoint");
    let vars = model.var_store().variables();
    for (name, t) in checkpoint_tensors(dir)? {
        let v = vars.get(&name).ok_or_else(|| {
            RunError::Run(format!("{}: unknown parameter {name}", path.display()))
        })?;
        if v.size() != t.size() {
            return Err(RunError::Run(format!(
                "{}: {name} has shape {:?}, the model {:?}",
                path.display(),
                t.size(),
                v.size()
            )));
        }
        tch::no_grad(|| {
            v.shallow_clone()
                .f_copy_(&t.f_to_kind(v.kind())?.f_to(v.device())?)
        })?;
    }
    Ok(())
}

/// Where a run starts: from scratch, or from its folder's last checkpoint and ledger.
pub(crate) struct Resume {
    /// How many times the run was resumed before (0 for a fresh run).
    pub(crate) resumed: u32,
    /// The first update to run.
    pub(crate) start_update: u64,
    /// The releases already charged (possibly ahead of the checkpoint: ε only over-counts).
    pub(crate) ledger: Ledger,
    /// The optimizer state to restore.
    pub(crate) optimizer: Option<(Vec<(String, tch::Tensor)>, OptimScalars)>,
}

impl Resume {
    pub(crate) fn fresh() -> Self {
        Self {
            resumed: 0,
            start_update: 0,
            ledger: Ledger::new(),
            optimizer: None,
        }
    }
}

/// Reads a run folder's checkpoint (trainable parameters into `model`, optimizer state) and its
/// ledger, every file checked against its checksum; notes a ledger ahead of the checkpoint.
pub(crate) fn read_resume(
    dir: &Path,
    model: &dyn raptor_models::Model,
    notes: &mut Vec<String>,
) -> Result<Resume> {
    let mut r = Resume::fresh();
    if let Some(st) = checkpoint_state(dir)? {
        load_trainable(dir, model)?;
        let opath = dir.join("checkpoint").join(&st.optimizer_file);
        r.optimizer = Some((
            read_checked_tensors(&opath, &st.optimizer_sha256)?,
            st.optim,
        ));
        r.start_update = st.update;
        r.resumed = st.resumed + 1;
    }
    let lpath = dir.join("checkpoint").join("ledger.json");
    if lpath.exists() {
        r.ledger = read_checked_json(&lpath)?;
    }
    if r.ledger.len() > r.start_update {
        notes.push(format!(
            "resumed at update {}; the ledger already held {} steps (releases charged before a stop are kept: ε only over-counts)",
            r.start_update,
            r.ledger.len()
        ));
    }
    Ok(r)
}
