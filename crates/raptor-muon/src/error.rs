//! The crate's error type.

/// Everything that can go wrong in raptor-muon. Bad input is reported, never silently accepted.
#[derive(Debug, thiserror::Error)]
pub enum MuonError {
    /// A matrix with no rows or no columns.
    #[error("empty matrix: {rows} x {cols} (Newton-Schulz needs at least one row and one column)")]
    EmptyMatrix {
        /// Number of rows given.
        rows: usize,
        /// Number of columns given.
        cols: usize,
    },
    /// A buffer whose length does not match the declared shape.
    #[error("{what}: length {len} does not match the shape {rows} x {cols}")]
    ShapeMismatch {
        /// Which argument.
        what: &'static str,
        /// Its length.
        len: usize,
        /// Declared rows.
        rows: usize,
        /// Declared columns.
        cols: usize,
    },
    /// A NaN or infinity in an input.
    #[error("{what}: non-finite value {value} at flat index {index}")]
    NonFinite {
        /// Which argument.
        what: &'static str,
        /// Row-major (or column-major for faer inputs) flat index of the first offending entry.
        index: usize,
        /// The offending value.
        value: f32,
    },
    /// A hyper-parameter outside its valid range.
    #[error("invalid hyper-parameter {name} = {value}: {reason}")]
    InvalidHyperParameter {
        /// Parameter name.
        name: &'static str,
        /// The value given (as f64).
        value: f64,
        /// What the valid range is.
        reason: &'static str,
    },
    /// A Newton–Schulz schedule name that is not one of `sym/par`, `sym/seq`, `full/par`,
    /// `full/seq`.
    #[error("unknown Newton-Schulz schedule {value:?} (expected sym|full / par|seq)")]
    InvalidSchedule {
        /// The text given.
        value: String,
    },
    /// An SVD in the reference code did not converge.
    #[error("SVD did not converge ({rows} x {cols})")]
    SvdFailed {
        /// Rows of the matrix.
        rows: usize,
        /// Columns of the matrix.
        cols: usize,
    },
    /// A libtorch call failed (tch backend only).
    #[cfg(feature = "tch")]
    #[error("libtorch: {0}")]
    Tch(#[from] tch::TchError),
    /// A tensor argument of the wrong rank or dtype (tch backend only).
    #[cfg(feature = "tch")]
    #[error("tensor {what}: {reason} (got shape {shape:?}, kind {kind:?})")]
    BadTensor {
        /// Which argument.
        what: &'static str,
        /// What was expected.
        reason: &'static str,
        /// Shape given.
        shape: Vec<i64>,
        /// Element kind given.
        kind: tch::Kind,
    },
}

/// Check that every entry of `data` is finite.
pub(crate) fn check_finite(what: &'static str, data: &[f32]) -> Result<(), MuonError> {
    match data.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(index) => Err(MuonError::NonFinite {
            what,
            index,
            value: data[index],
        }),
    }
}

/// Check `rows x cols` is non-empty and matches `len`.
pub(crate) fn check_shape(
    what: &'static str,
    len: usize,
    rows: usize,
    cols: usize,
) -> Result<(), MuonError> {
    if rows == 0 || cols == 0 {
        return Err(MuonError::EmptyMatrix { rows, cols });
    }
    if rows.checked_mul(cols) != Some(len) {
        return Err(MuonError::ShapeMismatch {
            what,
            len,
            rows,
            cols,
        });
    }
    Ok(())
}

/// Check a finite hyper-parameter against `ok`.
pub(crate) fn check_param(
    name: &'static str,
    value: f64,
    ok: bool,
    reason: &'static str,
) -> Result<(), MuonError> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(MuonError::InvalidHyperParameter {
            name,
            value,
            reason,
        })
    }
}
