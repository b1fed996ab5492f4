//! Golden files: the JSON documents under `fixtures/` that reference implementations wrote
//! (each beside the script that regenerates it), read into `serde_json` values, and the arrays
//! in them.

use serde_json::Value;

use crate::paths::fixture;

/// The JSON document `fixtures/<relative>`.
///
/// # Panics
///
/// When the file cannot be read or is not JSON (the message names the file).
#[track_caller]
pub fn json(relative: &str) -> Value {
    let path = fixture(relative);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// The numbers of a JSON array, as `f64`.
///
/// # Panics
///
/// When `v` is not an array of numbers.
#[track_caller]
pub fn f64s(v: &Value) -> Vec<f64> {
    array(v)
        .iter()
        .map(|x| {
            x.as_f64()
                .unwrap_or_else(|| panic!("not a number in a golden array: {x}"))
        })
        .collect()
}

/// The strings of a JSON array.
///
/// # Panics
///
/// When `v` is not an array of strings.
#[track_caller]
pub fn strings(v: &Value) -> Vec<String> {
    array(v)
        .iter()
        .map(|x| {
            x.as_str()
                .unwrap_or_else(|| panic!("not a string in a golden array: {x}"))
                .to_string()
        })
        .collect()
}

#[track_caller]
fn array(v: &Value) -> &Vec<Value> {
    v.as_array()
        .unwrap_or_else(|| panic!("a golden array expected, found {v}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn arrays_convert() {
        assert_eq!(f64s(&json!([1, 2.5, -0.0])), [1.0, 2.5, -0.0]);
        assert_eq!(strings(&json!(["a", ""])), ["a", ""]);
        assert!(f64s(&json!([])).is_empty());
    }

    #[test]
    #[should_panic(expected = "not a number in a golden array: \"x\"")]
    fn a_string_is_not_a_number() {
        f64s(&json!([1, "x"]));
    }

    #[test]
    #[should_panic(expected = "a golden array expected, found {}")]
    fn an_object_is_not_an_array() {
        strings(&json!({}));
    }

    #[test]
    fn a_committed_golden_file_reads() {
        let doc = json("eval/real_data.json");
        assert!(doc["files"].is_object());
    }

    #[test]
    #[should_panic(expected = "reading ")]
    fn a_missing_file_panics_with_its_path() {
        json("no/such/file.json");
    }
}
