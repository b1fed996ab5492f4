//! Result tables written as GitHub-flavoured Markdown and as JSON.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{ReportError, Result};
use crate::io::{create_dir, write_atomic};

/// One result table: a slug naming its files, a title, a header, rows of already formatted
/// cells and notes printed as bullets under the table.
///
/// ```
/// use raptor_report::Table;
/// let table = Table {
///     slug: "sst2-accuracy".into(),
///     title: "SST-2 accuracy".into(),
///     columns: vec!["method".into(), "ε = 1".into()],
///     rows: vec![vec!["RAPTOR".into(), "81.2 ± 1.3".into()]],
///     notes: vec!["3 seeds".into()],
/// };
/// table.check()?;
/// assert_eq!(
///     table.to_markdown(),
///     "## SST-2 accuracy\n\n| method | ε = 1 |\n|---|---|\n| RAPTOR | 81.2 ± 1.3 |\n\n- 3 seeds\n"
/// );
/// # Ok::<(), raptor_report::ReportError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// File stem of the written files: lowercase ASCII letters, digits and `-`.
    pub slug: String,
    /// Heading of the Markdown table.
    pub title: String,
    /// Column headers.
    pub columns: Vec<String>,
    /// Rows of cells, each with `columns.len()` cells.
    pub rows: Vec<Vec<String>>,
    /// Notes printed as bullets under the table.
    pub notes: Vec<String>,
}

/// One Markdown table cell: `|` escaped, line breaks turned into spaces.
fn escape_cell(cell: &str) -> String {
    let mut out = String::with_capacity(cell.len());
    let mut chars = cell.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '|' => out.push_str("\\|"),
            '\r' => {
                if chars.peek() != Some(&'\n') {
                    out.push(' ');
                }
            }
            '\n' => out.push(' '),
            _ => out.push(c),
        }
    }
    out
}

/// A line of text (title, note) with line breaks turned into spaces.
fn one_line(text: &str) -> String {
    text.replace("\r\n", " ").replace(['\r', '\n'], " ")
}

fn markdown_row(out: &mut String, cells: &[String]) {
    out.push('|');
    for cell in cells {
        out.push(' ');
        out.push_str(&escape_cell(cell));
        out.push_str(" |");
    }
    out.push('\n');
}

impl Table {
    /// The table as Markdown: `## title`, a blank line, a GFM table (`|` in cells escaped as
    /// `\|`, line breaks as spaces), then, when there are notes, a blank line and one `- note`
    /// bullet per note. Ragged rows are printed as they are; [`Table::check`] rejects them.
    #[must_use]
    pub fn to_markdown(&self) -> String {
        let mut out = format!("## {}\n\n", one_line(&self.title));
        markdown_row(&mut out, &self.columns);
        out.push('|');
        for _ in &self.columns {
            out.push_str("---|");
        }
        out.push('\n');
        for row in &self.rows {
            markdown_row(&mut out, row);
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for note in &self.notes {
                out.push_str("- ");
                out.push_str(&one_line(note));
                out.push('\n');
            }
        }
        out
    }

    /// Checks the table: the slug is non-empty lowercase ASCII letters, digits and `-`; there
    /// is at least one column; every row has `columns.len()` cells.
    ///
    /// # Errors
    /// [`ReportError::InvalidTable`] saying what is wrong.
    pub fn check(&self) -> Result<()> {
        let invalid = |reason: String| ReportError::InvalidTable {
            slug: self.slug.clone(),
            reason,
        };
        if self.slug.is_empty() {
            return Err(invalid("empty slug".into()));
        }
        if let Some(c) = self
            .slug
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
        {
            return Err(invalid(format!(
                "slug character {c:?} is not one of [a-z0-9-]"
            )));
        }
        if self.columns.is_empty() {
            return Err(invalid("no columns".into()));
        }
        if let Some((i, row)) = self
            .rows
            .iter()
            .enumerate()
            .find(|(_, row)| row.len() != self.columns.len())
        {
            return Err(invalid(format!(
                "row {i} has {} cells, expected {} (one per column)",
                row.len(),
                self.columns.len()
            )));
        }
        Ok(())
    }

    /// Checks the table, creates `dir` when missing and writes `dir/<slug>.md`
    /// ([`Table::to_markdown`]) and `dir/<slug>.json` (pretty JSON of the table), each
    /// atomically (a temporary file renamed over the target).
    ///
    /// # Errors
    /// [`ReportError::InvalidTable`] from [`Table::check`], [`ReportError::Io`] when a folder
    /// or file cannot be written, [`ReportError::Json`] when serializing fails.
    pub fn write(&self, dir: &Path) -> Result<()> {
        self.check()?;
        create_dir(dir)?;
        let mut json = serde_json::to_string_pretty(self)?;
        json.push('\n');
        write_atomic(
            &dir.join(format!("{}.md", self.slug)),
            self.to_markdown().as_bytes(),
        )?;
        write_atomic(&dir.join(format!("{}.json", self.slug)), json.as_bytes())
    }
}
