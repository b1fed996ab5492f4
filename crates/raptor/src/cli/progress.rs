//! What `raptor train` shows while it works, on stderr (stdout keeps the summary or the JSON):
//!
//! - at start: the records, the label set, the model, q, σ per stream, the planned ε and δ, the
//!   number of updates, a time estimate from a short probe, and why the run may not learn;
//! - during: on a terminal, a progress bar (update k of T, ε spent so far, updates per second,
//!   time left; the private loss only with `--show-private-loss`, marked as not private); not on
//!   a terminal, one plain line every 5 % of the updates (and at the first and last);
//! - nothing of either with `--quiet`.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use raptor_run::launch::StartInfo;
use raptor_train::trainer::UpdateMetrics;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Nothing.
    Quiet,
    /// A live bar (stderr is a terminal).
    Bar,
    /// Plain lines (stderr is a file or a pipe).
    Lines,
}

impl Mode {
    /// `Quiet` when asked, else a bar on a terminal and lines elsewhere.
    pub fn detect(quiet: bool) -> Self {
        if quiet {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            Mode::Bar
        } else {
            Mode::Lines
        }
    }
}

/// Seconds as `1h02m`, `3m05s` or `42s`.
pub fn duration(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "?".into();
    }
    let s = s.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The start summary, one fact per line (what [`Reporter::start`] prints).
pub fn start_lines(info: &StartInfo) -> Vec<String> {
    let p = &info.privacy;
    let mut out = Vec::new();
    out.push(format!(
        "{} run {} ({})",
        if info.resuming {
            "resuming"
        } else {
            "starting"
        },
        info.dir.display(),
        info.method
    ));
    out.push(format!("  model: {}", info.model));
    out.push(format!(
        "  records: {} training, {} validation; {} trainable parameters",
        info.train_records, info.validation_records, info.trainable_parameters
    ));
    if let Some(l) = &info.labels {
        out.push(format!("  labels ({}): {}", l.len(), l.join(", ")));
    }
    if p.private {
        let sigmas: Vec<String> = p
            .sigmas
            .iter()
            .map(|(k, v)| format!("{k} {v:.4}"))
            .collect();
        out.push(format!(
            "  privacy: epsilon {} (planned {:.4}), delta {:e}; q = {:.4} (expected batch {:.0} of {}); sigma per stream: {}",
            p.epsilon,
            p.planned_epsilon,
            p.delta,
            p.q,
            p.expected_batch,
            p.records,
            sigmas.join(", ")
        ));
    } else {
        out.push(format!(
            "  privacy: none (a non-private reference method); expected batch {:.0}",
            p.expected_batch
        ));
    }
    let phases: Vec<String> = p
        .phase_updates
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    out.push(format!(
        "  updates: {}{}",
        p.updates,
        if phases.len() > 1 {
            format!(" ({})", phases.join(", "))
        } else {
            String::new()
        }
    ));
    if let Some(e) = &info.estimate {
        let per_update = if e.later_seconds_per_update < e.seconds_per_update {
            format!(
                "{} per update at first, {} once the frozen-prefix cache holds the records",
                duration(e.seconds_per_update),
                duration(e.later_seconds_per_update)
            )
        } else {
            format!("{} per update", duration(e.seconds_per_update))
        };
        out.push(format!(
            "  time: about {} ({per_update}; probe: the run's update over synthetic records of {} tokens, {:.1} ms per record; {} tokens is the expected longest record of a micro-batch, computed from the private records' lengths without noise: shown here only, never written to the run's record; re-estimated from the measured updates while training)",
            duration(e.total_seconds),
            e.padded_length,
            1e3 * e.step_seconds_per_record,
            e.padded_length,
        ));
    }
    if let Some(m) = &info.memory {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let mut more = String::new();
        if m.cache_bytes > 0 {
            more += &format!(
                " + the frozen-prefix cache, at most {:.0} MiB",
                mib(m.cache_bytes)
            );
        }
        if m.state_bytes >= 1 << 20 {
            more += &format!(
                " + {:.0} MiB of optimizer state for the trainable parameters",
                mib(m.state_bytes)
            );
        }
        out.push(format!(
            "  memory: about {:.0} MiB at the peak expected ({:.0} MiB resident now + {:.1} MiB per record of a micro-batch of {}, measured by the probe{more})",
            mib(m.peak_bytes),
            mib(m.resident_bytes),
            mib(m.per_record_bytes),
            m.micro_batch,
        ));
    }
    if let Some(p) = &info.prefix_cache {
        out.push(format!("  {}", p.describe()));
    }
    if !info.prepare_seconds.is_empty() {
        let total: f64 = info.prepare_seconds.iter().map(|(_, s)| s).sum();
        let parts: Vec<String> = info
            .prepare_seconds
            .iter()
            .map(|(name, s)| format!("{name} {}", duration(*s)))
            .collect();
        out.push(format!(
            "  prepared in {}: {}",
            duration(total),
            parts.join(", ")
        ));
    }
    for w in &info.warnings {
        out.push(format!("  warning: {w}"));
    }
    out
}

/// Updates the time left is estimated over: the mean of the last ones measured (the first
/// updates fill the frozen-prefix cache and run slower than the later ones).
pub const RATE_WINDOW: usize = 10;

/// Seconds left for `remaining` updates at the mean of the last [`RATE_WINDOW`] update times
/// in `recent` (NaN when none was measured).
pub fn seconds_left(recent: &[f64], remaining: u64) -> f64 {
    let w = &recent[recent.len().saturating_sub(RATE_WINDOW)..];
    if w.is_empty() {
        return f64::NAN;
    }
    remaining as f64 * w.iter().sum::<f64>() / w.len() as f64
}

/// What the progress shows about ε: the certified ε spent so far (when computed) against the
/// planned one, or not private.
pub fn epsilon_text(private: bool, spent: Option<f64>, planned: f64) -> String {
    match (private, spent) {
        (false, _) => "not private".into(),
        (true, Some(e)) => format!("eps spent {e:.3} of {planned:.3} planned"),
        (true, None) => format!("eps planned {planned:.3}"),
    }
}

/// Shows a run's start and progress.
pub struct Reporter {
    mode: Mode,
    show_loss: bool,
    bar: indicatif::ProgressBar,
    started: Instant,
    last_line_pct: Option<u64>,
    eps: Option<f64>,
    private: bool,
    planned_eps: f64,
    last_update: Option<Instant>,
    recent: Vec<f64>,
}

impl Reporter {
    /// A reporter in `mode`; `show_loss` adds the private batch loss, marked as not private.
    pub fn new(mode: Mode, show_loss: bool) -> Self {
        let bar = if mode == Mode::Bar {
            let b = indicatif::ProgressBar::new(0);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "[{elapsed_precise}] {bar:30} update {pos}/{len}  {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        } else {
            indicatif::ProgressBar::hidden()
        };
        Self {
            mode,
            show_loss,
            bar,
            started: Instant::now(),
            last_line_pct: None,
            eps: None,
            private: true,
            planned_eps: f64::NAN,
            last_update: None,
            recent: Vec::new(),
        }
    }

    /// A message before the run starts (fetching, detection), unless quiet.
    pub fn note(&self, line: &str) {
        if self.mode != Mode::Quiet {
            eprintln!("{line}");
        }
    }

    /// Prints the start summary and starts the clock.
    pub fn start(&mut self, info: &StartInfo) {
        self.private = info.privacy.private;
        self.planned_eps = info.privacy.planned_epsilon;
        if self.mode != Mode::Quiet {
            let mut err = std::io::stderr().lock();
            for l in start_lines(info) {
                let _ = writeln!(err, "{l}");
            }
        }
        self.started = Instant::now();
        self.last_update = Some(self.started);
    }

    /// One update done (`eps`: the certified ε spent so far when it was computed).
    pub fn update(&mut self, done: u64, total: u64, m: &UpdateMetrics, eps: Option<f64>) {
        if eps.is_some() {
            self.eps = eps;
        }
        let now = Instant::now();
        if let Some(last) = self.last_update {
            self.recent.push(now.duration_since(last).as_secs_f64());
            if self.recent.len() > RATE_WINDOW {
                self.recent.remove(0);
            }
        }
        self.last_update = Some(now);
        let elapsed = self.started.elapsed().as_secs_f64();
        let left = seconds_left(&self.recent, total.saturating_sub(done));
        let rate = if left.is_finite() && !self.recent.is_empty() {
            self.recent.len() as f64 / self.recent.iter().sum::<f64>().max(1e-9)
        } else {
            0.0
        };
        let eps_text = epsilon_text(self.private, self.eps, self.planned_eps);
        let loss_text = if self.show_loss {
            format!("  private batch loss {:.4} (not private)", m.loss)
        } else {
            String::new()
        };
        match self.mode {
            Mode::Quiet => {}
            Mode::Bar => {
                self.bar.set_length(total);
                self.bar.set_position(done);
                self.bar.set_message(format!(
                    "{eps_text}  {rate:.2} updates/s  left {}{loss_text}",
                    duration(left)
                ));
            }
            Mode::Lines => {
                let pct = (done * 100).checked_div(total).unwrap_or(100);
                let due = match self.last_line_pct {
                    None => true,
                    Some(last) => pct >= last + 5 || done == total,
                };
                if due {
                    self.last_line_pct = Some(pct);
                    eprintln!(
                        "update {done}/{total} ({pct}%)  {eps_text}  {rate:.2} updates/s  elapsed {}  left {}{loss_text}",
                        duration(elapsed),
                        duration(left)
                    );
                }
            }
        }
    }

    /// Clears the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Time left follows the recent updates, not the slower first ones; ε shows the plan
    /// from the first update.
    #[test]
    fn time_left_follows_the_recent_updates_and_epsilon_shows_the_plan() {
        assert!(seconds_left(&[], 5).is_nan());
        // Twelve updates: two slow ones (cache filling) then ten at 1 s: 1 s each from here.
        let mut recent = vec![9.0, 9.0];
        recent.extend([1.0; 10]);
        assert_eq!(seconds_left(&recent, 30), 30.0);
        assert_eq!(seconds_left(&[2.0, 4.0], 3), 9.0);
        assert_eq!(epsilon_text(true, None, 7.996), "eps planned 7.996");
        assert_eq!(
            epsilon_text(true, Some(0.81234), 7.996),
            "eps spent 0.812 of 7.996 planned"
        );
        assert_eq!(epsilon_text(false, None, f64::INFINITY), "not private");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(42.4), "42s");
        assert_eq!(duration(185.0), "3m05s");
        assert_eq!(duration(3720.0), "1h02m");
        assert_eq!(duration(f64::NAN), "?");
    }
}
