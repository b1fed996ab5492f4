//! The committed golden files of the accountant's tests: CSV under `fixtures/<folder>/`, with
//! `#` comment lines (the generating script and its versions) and a header row.

#![allow(clippy::panic)] // a broken fixture fails the test that reads it, naming the file

/// A golden file's header and rows.
pub struct Golden {
    head: csv::StringRecord,
    /// The data rows, in file order.
    pub rows: Vec<csv::StringRecord>,
}

impl Golden {
    /// Reads `fixtures/<folder>/golden.csv` of the repository.
    pub fn read(folder: &str) -> Self {
        let path = format!(
            "{}/../../fixtures/{folder}/golden.csv",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut rdr = csv::ReaderBuilder::new()
            .comment(Some(b'#'))
            .from_path(&path)
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let head = rdr.headers().unwrap().clone();
        let rows = rdr.records().map(|r| r.unwrap()).collect();
        Self { head, rows }
    }

    /// The index of column `name` (a missing column is a broken fixture).
    pub fn col(&self, name: &str) -> usize {
        self.head
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name} in {:?}", self.head))
    }
}
