//! The toy run of the trainer tests: a tiny Switch encoder trained from scratch with the bytes
//! tokenizer on the toy data shipped in `examples/toy` (the tests of `raptor-train` and of the
//! `raptor` program both use it).

use crate::paths::workspace_root;

/// The TOML of a toy run of `method` at ε = 8 whose `[train]` table holds `train_lines`.
pub fn toy_config(method: &str, train_lines: &str) -> String {
    let toy = workspace_root().join("examples/toy");
    format!(
        r#"[data]
train = "{}"
validation = "{}"
public = "{}"
max_length = 40

[model]
kind = "switch"
tokenizer = "bytes"
d_model = 32
layers = 4
heads = 2
d_ff = 64
experts = 4

[method]
name = "{method}"

[privacy]
epsilon = 8.0

[train]
{train_lines}
"#,
        toy.join("train.csv").display(),
        toy.join("valid.csv").display(),
        toy.join("public.csv").display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_toy_config_names_existing_files_and_the_method() {
        let t = toy_config("raptor", "steps = 3");
        assert!(t.contains("name = \"raptor\"") && t.contains("steps = 3"));
        for f in ["train.csv", "valid.csv", "public.csv"] {
            assert!(
                workspace_root().join("examples/toy").join(f).is_file(),
                "{f}"
            );
        }
    }
}
