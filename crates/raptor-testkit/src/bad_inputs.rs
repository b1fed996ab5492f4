//! The corpus of nasty inputs of a crate's readers: `fixtures/bad-inputs/<crate>/` holds the
//! files and `expected.tsv`, a header line, then one line per file with three tab-separated
//! columns — the file name, how to read it (which reader, or a reader setting; the crate's test
//! gives it its meaning) and a text the error message must contain. A `README.md` says what the
//! folder is for.
//!
//! [`check`] reads every listed file with the crate's reader and asserts that each gives an
//! error (never a panic, never a silent result) whose message contains the expected text, and
//! that every file of the folder is listed exactly once:
//!
//! ```no_run
//! use raptor_testkit::bad_inputs;
//!
//! # fn read_table(_: &std::path::Path) -> Result<(), String> { Err(String::new()) }
//! bad_inputs::check("raptor-data", |input| match input.setting.as_str() {
//!     "table" => read_table(&input.path),
//!     other => panic!("unknown reader {other}"),
//! });
//! ```

use std::collections::BTreeSet;
use std::fmt::Display;
use std::path::PathBuf;

use crate::paths::fixture;

/// The files of the folder that are not inputs.
const NOT_INPUTS: [&str; 2] = ["expected.tsv", "README.md"];

/// One listed input of a corpus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadInput {
    /// The file name, as listed (relative to the corpus folder).
    pub file: String,
    /// Its path.
    pub path: PathBuf,
    /// The second column: which reader reads it, or the setting it is read with.
    pub setting: String,
    /// The text the error message must contain.
    pub expected: String,
}

impl BadInput {
    /// The message of the error `result` must be, after checking that it contains
    /// [`BadInput::expected`].
    ///
    /// # Panics
    ///
    /// When `result` is `Ok`, or its error's message does not contain the expected text.
    #[track_caller]
    pub fn expect_error<T, E: Display>(&self, result: Result<T, E>) -> String {
        let msg = match result {
            Ok(_) => panic!(
                "{}: read without an error (expected one containing {:?})",
                self.file, self.expected
            ),
            Err(e) => e.to_string(),
        };
        assert!(
            msg.contains(&self.expected),
            "{}: {msg:?} does not contain {:?}",
            self.file,
            self.expected
        );
        msg
    }
}

/// The folder of `krate`'s corpus: `fixtures/bad-inputs/<krate>/`.
pub fn dir(krate: &str) -> PathBuf {
    fixture("bad-inputs").join(krate)
}

/// The inputs listed in `krate`'s `expected.tsv`, in its order, after checking that every file
/// of the folder (but `expected.tsv` and `README.md`) is listed exactly once and every listed
/// file exists.
///
/// # Panics
///
/// When the folder or `expected.tsv` cannot be read, a line does not have three columns, or the
/// listing and the folder disagree.
#[track_caller]
pub fn corpus(krate: &str) -> Vec<BadInput> {
    let dir = dir(krate);
    let table_path = dir.join("expected.tsv");
    let table = std::fs::read_to_string(&table_path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", table_path.display()));
    let mut inputs = Vec::new();
    let mut listed = BTreeSet::new();
    for line in table.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let cols: Vec<&str> = line.split('\t').collect();
        let [file, setting, expected] = cols[..] else {
            panic!("bad line in {}: {line:?}", table_path.display());
        };
        assert!(
            listed.insert(file.to_string()),
            "{file} is listed twice in {}",
            table_path.display()
        );
        let path = dir.join(file);
        assert!(
            path.is_file(),
            "{file} is listed in {} but missing",
            table_path.display()
        );
        inputs.push(BadInput {
            file: file.to_string(),
            path,
            setting: setting.to_string(),
            expected: expected.to_string(),
        });
    }
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        let name = entry.file_name().to_string_lossy().into_owned();
        if !NOT_INPUTS.contains(&name.as_str()) {
            assert!(
                listed.contains(&name),
                "{name} is not in {}",
                table_path.display()
            );
        }
    }
    inputs
}

/// Reads every input of `krate`'s [`corpus`] with `read` and checks its error
/// ([`BadInput::expect_error`]); returns the inputs with their messages, for further checks.
///
/// # Panics
///
/// As [`corpus`] and [`BadInput::expect_error`].
#[track_caller]
pub fn check<T, E: Display>(
    krate: &str,
    mut read: impl FnMut(&BadInput) -> Result<T, E>,
) -> Vec<(BadInput, String)> {
    let inputs = corpus(krate);
    assert!(!inputs.is_empty(), "no inputs listed for {krate}");
    let mut checked = Vec::with_capacity(inputs.len());
    for input in inputs {
        let msg = input.expect_error(read(&input));
        checked.push((input, msg));
    }
    checked
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> BadInput {
        BadInput {
            file: "f.csv".into(),
            path: PathBuf::from("f.csv"),
            setting: "table".into(),
            expected: "line 3".into(),
        }
    }

    #[test]
    fn an_error_with_the_text_passes_and_gives_its_message() {
        let r: Result<(), String> = Err("f.csv: line 3: bad".into());
        assert_eq!(input().expect_error(r), "f.csv: line 3: bad");
    }

    #[test]
    #[should_panic(expected = "f.csv: read without an error")]
    fn a_success_fails() {
        input().expect_error(Ok::<(), String>(()));
    }

    #[test]
    #[should_panic(expected = "does not contain \"line 3\"")]
    fn another_error_fails() {
        input().expect_error(Err::<(), _>("line 4"));
    }

    #[test]
    fn the_corpora_list_their_files() {
        for krate in ["raptor-data", "raptor-models", "raptor-routing"] {
            let inputs = corpus(krate);
            assert!(!inputs.is_empty(), "{krate}");
            assert!(
                inputs
                    .iter()
                    .all(|i| i.path.is_file() && !i.expected.is_empty())
            );
        }
    }
}
