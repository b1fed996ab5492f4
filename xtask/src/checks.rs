//! Repository checks of `cargo xtask test` that need no build: the repository stands alone (code
//! and docs cite nothing outside it), the workspace layout is the documented one, and test support
//! stays in dev-dependencies.
//!
//! - [`stand_alone`]: no tracked text file cites a tracker entry by number, a section of the
//!   project's planning document, or research and design notes kept outside the repository (the
//!   exact patterns are the ones `line_citations` matches, listed with examples in this file's
//!   tests). Cite a paper (authors or title, year, section) or a file of the repository instead,
//!   or write down what the citation stood for.
//! - [`layout`]: the workspace members are exactly the folders under `crates/` that hold a
//!   `Cargo.toml`, plus `xtask` and `benches`; each `crates/<name>` holds the package `<name>`.
//!   `benches/` is the one exception to "folder name = package name": the owner's top-level
//!   layout (`Cargo.toml, crates, xtask, benches, fixtures, README.md`) names it `benches`, and
//!   its package is `raptor-benches`.
//! - [`test_support_is_dev_only`]: the test-support crates ([`TEST_SUPPORT`], the
//!   `raptor-testkit` kit) are `[dev-dependencies]` entries of the members that use them, never a
//!   normal or build dependency.
//! - [`used_dependencies`]: every dependency a member declares is named in its Rust code
//!   (sources, tests, benches, examples, build script), or has a `#` comment on the line above
//!   it saying why it is there without being named (a feature it switches on, a build-script
//!   variable it provides).
//! - [`crate_maps`]: ARCHITECTURE.md's code map has a row for every workspace member and for
//!   nothing else; README.md's crate table a row for every member under `crates/`.
//! - [`typed_streams`]: no Rust source (`src/` of every member) reads a stream, clip group or routed
//!   expert back out of a string (`sigmas.get(`, `sigmas["…"]`, `starts_with("expert`,
//!   `strip_prefix("expert`, a routed-expert layer parsed from a parameter name): the private
//!   step's streams, groups and experts are types (`Stream`, `GroupId`, `ExpertId`), and which
//!   expert owns a parameter is answered by `raptor_models::roles::RoleIndex` alone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// This file: it spells out the patterns it looks for, in its docs and its tests.
const SELF_PATH: &str = "xtask/src/checks.rs";

/// Files larger than this are data, not prose (golden files, checkpoints): not read.
const MAX_TEXT_BYTES: u64 = 4 << 20;

/// The top-level folders that are workspace members besides `crates/*`, with their package
/// names. `benches` is the explicit exception to "folder name = package name".
const TOP_LEVEL_MEMBERS: [(&str, &str); 2] = [("xtask", "xtask"), ("benches", "raptor-benches")];

/// One citation of something outside the repository: where, and the text that matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Citation {
    /// 1-based line number.
    pub line: usize,
    /// The matched text (for the message).
    pub text: String,
}

/// The citations of outside material in `text`, line by line.
pub fn outside_citations(text: &str) -> Vec<Citation> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        for text in line_citations(line) {
            found.push(Citation { line: i + 1, text });
        }
    }
    found
}

/// The names of outside documents that count as citations. Each is written in two pieces, so
/// that this file, which must name them to find them, does not itself cite them.
const OUTSIDE_DOCUMENTS: [&str; 5] = [
    concat!("SP", "EC §"),
    concat!("SP", "EC.md"),
    concat!("TRAINER", "-DESIGN"),
    concat!("PIPELINE", "-DESIGN"),
    concat!("shared", "/spec"),
];
/// Research notes named as such (lower case), written in two pieces as above.
const RESEARCH_NOTES: &str = concat!("research", " notes");
/// The prefix of a research note's file name (`<prefix><name>.md`), written in two pieces.
const RESEARCH_PREFIX: &str = concat!("research", "-");

/// The citations in one line (see the module docs for what counts).
fn line_citations(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    // Case-sensitive names of the outside documents.
    for name in OUTSIDE_DOCUMENTS {
        if line.contains(name) {
            out.push(name.to_string());
        }
    }
    let lower = line.to_lowercase();
    if lower.contains(RESEARCH_NOTES) {
        out.push(RESEARCH_NOTES.to_string());
    }
    // a research note's file name: `RESEARCH_PREFIX` + name + `.md`
    let mut from = 0;
    while let Some(pos) = lower[from..].find(RESEARCH_PREFIX) {
        let start = from + pos;
        let rest = &lower[start + RESEARCH_PREFIX.len()..];
        let name_len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(rest.len());
        if name_len > 0 && rest[name_len..].starts_with(".md") {
            out.push(line_slice(
                line,
                &lower,
                start,
                RESEARCH_PREFIX.len() + name_len + 3,
            ));
        }
        from = start + RESEARCH_PREFIX.len();
    }
    // `issue N`, `issues N`, `issue #N`, `issue-N`, `issue # N` with N a number (any case)
    let mut from = 0;
    while let Some(pos) = lower[from..].find("issue") {
        let start = from + pos;
        from = start + "issue".len();
        // A word of its own: not the tail of another word ("tissue").
        let before = lower[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric()) {
            continue;
        }
        let mut rest = &lower[from..];
        if let Some(r) = rest.strip_prefix('s') {
            rest = r;
        }
        let Some(r) = rest.strip_prefix([' ', '-']) else {
            continue;
        };
        let r = r.strip_prefix('#').unwrap_or(r).trim_start_matches(' ');
        let digits = r.chars().take_while(char::is_ascii_digit).count();
        if digits > 0 {
            let len = lower.len() - start - (r.len() - digits);
            out.push(line_slice(line, &lower, start, len));
        }
    }
    out
}

/// `len` bytes of the line from `start`, as found in its lower-cased copy (lower-casing can
/// change byte lengths outside ASCII: then the lower-cased text is reported).
fn line_slice(line: &str, lower: &str, start: usize, len: usize) -> String {
    let original = if line.len() == lower.len() {
        line.get(start..start + len)
    } else {
        None
    };
    original
        .unwrap_or_else(|| &lower[start..start + len])
        .to_string()
}

/// The text files of the repository to check: those git tracks or would track (untracked files
/// that are not ignored), or, without git, every file outside the build and result folders.
fn repository_files(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let git = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output();
    if let Ok(out) = git
        && out.status.success()
    {
        return Ok(out
            .stdout
            .split(|&b| b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| PathBuf::from(String::from_utf8_lossy(p).into_owned()))
            .collect());
    }
    let mut files = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(root.join(&rel))
            .with_context(|| format!("reading {}", root.join(&rel).display()))?
        {
            let entry = entry?;
            let name = entry.file_name();
            let path = rel.join(&name);
            if entry.file_type()?.is_dir() {
                let skip = [".git", "target", "results", "runs", "__pycache__", ".venv"];
                if !skip.iter().any(|s| name == *s) {
                    stack.push(path);
                }
            } else {
                files.push(path);
            }
        }
    }
    Ok(files)
}

/// Fails, naming every place, when a text file of the repository cites material outside it.
pub fn stand_alone(root: &Path) -> anyhow::Result<()> {
    eprintln!(
        "\n==> stand-alone: no citations of issues, SPEC sections or notes outside the repository"
    );
    let mut problems = Vec::new();
    let mut checked = 0usize;
    for rel in repository_files(root)? {
        let rel_str = rel.to_string_lossy().replace('\\', "/");
        if rel_str == SELF_PATH || rel_str == "Cargo.lock" {
            continue;
        }
        let path = root.join(&rel);
        let Ok(meta) = std::fs::metadata(&path) else {
            continue; // listed by git but deleted in the work tree
        };
        if !meta.is_file() || meta.len() > MAX_TEXT_BYTES {
            continue;
        }
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let Ok(text) = String::from_utf8(bytes) else {
            continue; // binary
        };
        checked += 1;
        for c in outside_citations(&text) {
            problems.push(format!("{rel_str}:{}: {}", c.line, c.text));
        }
    }
    if !problems.is_empty() {
        bail!(
            "{} citation(s) of material outside the repository (issues, SPEC sections, research or \
             design notes); write down what they stand for, or cite a paper or a file of the \
             repository instead:\n  {}",
            problems.len(),
            problems.join("\n  ")
        );
    }
    eprintln!("    {checked} text files: none");
    Ok(())
}

/// The dependencies declared in a member's `Cargo.toml` text: (section, name, whether the line
/// above it is a `#` comment). Sections: `[dependencies]`, `[dev-dependencies]`,
/// `[build-dependencies]` and their `[target.….…]` forms.
pub fn declared_dependencies(manifest: &str) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    let mut section: Option<String> = None;
    let mut previous_comment = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            let name = t.trim_matches(|c| c == '[' || c == ']').to_string();
            let deps = name.ends_with("dependencies") && !name.starts_with("workspace");
            section = deps.then_some(name);
            previous_comment = false;
            continue;
        }
        if let Some(sec) = &section
            && !t.is_empty()
            && !t.starts_with('#')
        {
            let name: String = t
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push((sec.clone(), name, previous_comment));
            }
        }
        previous_comment = t.starts_with('#');
    }
    out
}

/// Whether `code` names the crate `ident` (as a whole identifier).
fn names_ident(code: &str, ident: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(ident).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + ident.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The unexplained unused dependencies of one member: `manifest` its `Cargo.toml`, `code` all
/// its Rust files joined.
pub fn unused_dependencies(manifest: &str, code: &str) -> Vec<String> {
    declared_dependencies(manifest)
        .into_iter()
        .filter(|(_, name, commented)| !commented && !names_ident(code, &name.replace('-', "_")))
        .map(|(section, name, _)| format!("{name} ({section})"))
        .collect()
}

/// Fails, naming each, when a member declares a dependency its code never names and no comment
/// explains.
pub fn used_dependencies(root: &Path) -> anyhow::Result<()> {
    eprintln!("\n==> dependencies: each one named in its member's code, or explained");
    let files = repository_files(root)?;
    let mut problems = Vec::new();
    let members = workspace_members(root)?;
    for m in &members {
        let manifest = std::fs::read_to_string(root.join(&m.dir).join("Cargo.toml"))
            .with_context(|| format!("reading {}/Cargo.toml", m.dir))?;
        let prefix = format!("{}/", m.dir);
        let mut code = String::new();
        for rel in &files {
            let r = rel.to_string_lossy().replace('\\', "/");
            if r.starts_with(&prefix) && r.ends_with(".rs") {
                code.push_str(&std::fs::read_to_string(root.join(rel)).unwrap_or_default());
                code.push('\n');
            }
        }
        for d in unused_dependencies(&manifest, &code) {
            problems.push(format!("{}: {d}", m.dir));
        }
    }
    if !problems.is_empty() {
        bail!(
            "{} dependenc(ies) not named in their member's code; remove them, or say on the line \
             above why they are needed:\n  {}",
            problems.len(),
            problems.join("\n  ")
        );
    }
    eprintln!("    {} members: none unused", members.len());
    Ok(())
}

/// The package names of the rows of a Markdown table whose first cell starts with a code span,
/// plain (`` | `name` | ``), linked (`` | [`name`](…) | ``) or with a folder in front
/// (`` | `benches/` (package `name`) | ``): the last code span of the first cell.
pub fn table_packages(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|l| {
            let cell = l.strip_prefix("| ")?.split(" |").next()?;
            if !(cell.starts_with('`') || cell.starts_with("[`")) {
                return None;
            }
            let spans: Vec<&str> = cell.split('`').skip(1).step_by(2).collect();
            spans.last().map(|s| s.trim_end_matches('/').to_string())
        })
        .collect()
}

/// What the code maps miss or list in excess: `architecture` and `readme` the two files,
/// `members` every member (package, folder).
pub fn crate_map_problems(architecture: &str, readme: &str, members: &[Member]) -> Vec<String> {
    let mut problems = Vec::new();
    let arch = table_packages(architecture);
    let all: BTreeSet<String> = members.iter().map(|m| m.name.clone()).collect();
    for m in all.difference(&arch) {
        problems.push(format!(
            "ARCHITECTURE.md: no code-map row for the member {m}"
        ));
    }
    for m in arch
        .iter()
        .filter(|m| m.starts_with("raptor") || *m == "xtask")
    {
        if !all.contains(m) {
            problems.push(format!(
                "ARCHITECTURE.md: a row for {m}, which is no member"
            ));
        }
    }
    let listed = table_packages(readme);
    for m in members.iter().filter(|m| m.dir.starts_with("crates/")) {
        if !listed.contains(&m.name) {
            problems.push(format!("README.md: no crate-table row for {}", m.name));
        }
    }
    problems
}

/// Fails when ARCHITECTURE.md's code map or README.md's crate table and the workspace members
/// disagree.
pub fn crate_maps(root: &Path) -> anyhow::Result<()> {
    eprintln!("\n==> code maps: ARCHITECTURE.md and README.md list the workspace members");
    let read =
        |f: &str| std::fs::read_to_string(root.join(f)).with_context(|| format!("reading {f}"));
    let members = workspace_members(root)?;
    let problems = crate_map_problems(&read("ARCHITECTURE.md")?, &read("README.md")?, &members);
    if !problems.is_empty() {
        bail!(
            "the code maps disagree with the workspace:\n  {}",
            problems.join("\n  ")
        );
    }
    eprintln!("    {} members: all listed", members.len());
    Ok(())
}

/// What is wrong with one member's `ARCHITECTURE.md` (`text`), given the `.rs` files under the
/// member's source folder (`sources`, relative to the member, e.g. `src/run/mod.rs`) and
/// whether a path relative to the member exists (`exists`). The format: a `## Code map`
/// section whose bullets name paths in backticks (a folder entry ends in `/` and covers every
/// file under it), then a `## Invariants` section with at least one bullet. Every source file
/// must be covered and every named path must exist.
pub fn architecture_problems(
    text: &str,
    sources: &[String],
    exists: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    let section = |heading: &str| -> Option<Vec<&str>> {
        let mut lines = text.lines().skip_while(|l| l.trim() != heading);
        lines.next()?;
        Some(lines.take_while(|l| !l.starts_with("## ")).collect())
    };
    let Some(map) = section("## Code map") else {
        return vec!["no `## Code map` section".into()];
    };
    match section("## Invariants") {
        None => problems.push("no `## Invariants` section".into()),
        Some(inv) if !inv.iter().any(|l| l.starts_with("- ")) => {
            problems.push("the `## Invariants` section has no bullet".into());
        }
        Some(_) => {}
    }
    // The path each code-map bullet names: its first backticked text.
    let mut named: Vec<String> = Vec::new();
    for l in map.iter().filter(|l| l.starts_with("- ")) {
        let Some(rest) = l.split('`').nth(1) else {
            problems.push(format!("code-map entry without a path in backticks: {l}"));
            continue;
        };
        if !exists(rest) {
            problems.push(format!("the code map names {rest}, which does not exist"));
        }
        named.push(rest.to_string());
    }
    for f in sources {
        let covered = named
            .iter()
            .any(|n| n == f || (n.ends_with('/') && f.starts_with(n.as_str())));
        if !covered {
            problems.push(format!("{f} is in no code-map entry"));
        }
    }
    problems
}

/// The `.rs` files under `dir`, relative to `base`, with `/` separators, sorted.
fn rust_files_under(base: &Path, dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(base).unwrap_or(&path);
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Fails when a member (every crate, and `benches`) lacks an `ARCHITECTURE.md` whose code map
/// covers its source files and whose invariants section is there (see
/// [`architecture_problems`]).
pub fn crate_architecture(root: &Path) -> anyhow::Result<()> {
    eprintln!("\n==> per-crate ARCHITECTURE.md: a code map covering the sources, invariants");
    let mut problems = Vec::new();
    let members = workspace_members(root)?;
    let mut checked = 0usize;
    for m in members.iter().filter(|m| m.dir != "xtask") {
        let dir = root.join(&m.dir);
        let doc = dir.join("ARCHITECTURE.md");
        let Ok(text) = std::fs::read_to_string(&doc) else {
            problems.push(format!("{}: no ARCHITECTURE.md", m.dir));
            continue;
        };
        // A crate's sources are under src/; the benches member's are its bench files.
        let src = if dir.join("src").is_dir() {
            dir.join("src")
        } else {
            dir.join("benches")
        };
        let sources = rust_files_under(&dir, &src)?;
        let exists = |p: &str| dir.join(p).exists();
        for p in architecture_problems(&text, &sources, &exists) {
            problems.push(format!("{}/ARCHITECTURE.md: {p}", m.dir));
        }
        checked += 1;
    }
    if !problems.is_empty() {
        bail!("per-crate ARCHITECTURE.md:\n  {}", problems.join("\n  "));
    }
    eprintln!("    {checked} members: every source file mapped, invariants stated");
    Ok(())
}

/// Code patterns that read a stream, a clip group or a routed expert back out of a string.
const STRING_STREAM_PATTERNS: [&str; 8] = [
    "sigmas.get(",
    "sigmas[\"",
    "starts_with(\"expert",
    "strip_prefix(\"expert",
    "starts_with(\"shared",
    ".get(\"experts\")",
    "fn routed_expert_layer",
    "parse::<usize>().ok().map(|l| ExpertId",
];

/// Every line of `text` (1-based number, trimmed line) that reads a stream or an expert back
/// out of a string.
pub fn stream_name_parsing(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| STRING_STREAM_PATTERNS.iter().any(|p| l.contains(p)))
        .map(|(i, l)| (i + 1, l.trim().to_string()))
        .collect()
}

/// The lines of `code` (1-based number, trimmed) outside comments that name the identifier
/// `Method` (the config's method enum).
pub fn names_method(code: &str) -> Vec<(usize, String)> {
    code.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .filter(|(_, l)| {
            l.match_indices("Method").any(|(i, _)| {
                let before = l[..i].chars().next_back();
                let after = l[i + "Method".len()..].chars().next();
                let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                !ident(before) && !ident(after)
            })
        })
        .map(|(i, l)| (i + 1, l.trim().to_string()))
        .collect()
}

/// Fails when the trainer branches on the method: every method is a plan (phases of releases
/// over clip groups) and the trainer (`raptor-train/src/trainer/`, every file of it) runs any
/// plan the same way, so it must not name the config's `Method`.
pub fn methods_are_plans(root: &Path) -> anyhow::Result<()> {
    eprintln!("\n==> methods are plans: the trainer does not name the config's Method");
    let dir = "crates/raptor-train/src/trainer";
    let mut files: Vec<String> = std::fs::read_dir(root.join(dir))
        .with_context(|| format!("reading {dir}"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rs"))
        .map(|n| format!("{dir}/{n}"))
        .collect();
    files.sort();
    if !files.iter().any(|f| f.ends_with("/mod.rs")) {
        bail!("{dir}/mod.rs is missing: the check must read the trainer");
    }
    let mut lines = Vec::new();
    for rel in &files {
        let code =
            std::fs::read_to_string(root.join(rel)).with_context(|| format!("reading {rel}"))?;
        lines.extend(
            names_method(&code)
                .iter()
                .map(|(n, l)| format!("{rel}:{n}: {l}")),
        );
    }
    if !lines.is_empty() {
        bail!(
            "the trainer names the method (turn the difference into the plan instead):\n  {}",
            lines.join("\n  ")
        );
    }
    eprintln!("    {dir}/ ({} files): no", files.len());
    Ok(())
}

/// Fails, naming every place, when Rust code of the workspace parses a stream, group or expert
/// name back from a string.
pub fn typed_streams(root: &Path) -> anyhow::Result<()> {
    eprintln!("\n==> typed streams: no stream, clip group or routed expert parsed from a string");
    let mut problems = Vec::new();
    let mut checked = 0usize;
    for rel in repository_files(root)? {
        let rel_str = rel.to_string_lossy().replace('\\', "/");
        // Library and program code; tests of string-keyed APIs (raptor-models' caller-named
        // clip groups) may name groups by strings.
        let code = rel_str.contains("/src/") || rel_str.starts_with("src/");
        if rel_str == SELF_PATH || !rel_str.ends_with(".rs") || !code {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(&rel)) else {
            continue;
        };
        checked += 1;
        for (line, code) in stream_name_parsing(&text) {
            problems.push(format!("{rel_str}:{line}: {code}"));
        }
    }
    if !problems.is_empty() {
        bail!(
            "{} place(s) read a stream, clip group or routed expert back from a string; use \
             streams::{{Stream, Sigmas, GroupId}} and raptor_models::roles::{{ExpertId, RoleIndex}}:\n  {}",
            problems.len(),
            problems.join("\n  ")
        );
    }
    eprintln!("    {checked} Rust files: none");
    Ok(())
}

/// One workspace member as `cargo metadata` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Package name.
    pub name: String,
    /// Its folder relative to the workspace root, with `/` separators.
    pub dir: String,
}

/// What is wrong with the layout: the workspace `members` against the folders under `crates/`
/// that hold a `Cargo.toml` (`crate_dirs`, names only). Empty when it is right.
pub fn layout_problems(members: &[Member], crate_dirs: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut expected: BTreeSet<String> = crate_dirs.iter().map(|d| format!("crates/{d}")).collect();
    for (dir, _) in TOP_LEVEL_MEMBERS {
        expected.insert(dir.to_string());
    }
    let actual: BTreeSet<String> = members.iter().map(|m| m.dir.clone()).collect();
    for dir in expected.difference(&actual) {
        problems.push(format!("{dir} is not a workspace member"));
    }
    for dir in actual.difference(&expected) {
        problems.push(format!(
            "workspace member {dir} is neither a folder under crates/ nor one of the top-level \
             members (xtask, benches)"
        ));
    }
    for m in members {
        let want = match m.dir.strip_prefix("crates/") {
            Some(folder) => Some(folder),
            None => TOP_LEVEL_MEMBERS
                .iter()
                .find(|(dir, _)| *dir == m.dir)
                .map(|(_, package)| *package),
        };
        if let Some(want) = want
            && m.name != want
        {
            problems.push(format!(
                "{} holds the package {}, expected {want}",
                m.dir, m.name
            ));
        }
    }
    problems
}

/// `cargo metadata --no-deps` of the workspace at `root`.
fn metadata(root: &Path) -> anyhow::Result<serde_json::Value> {
    let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(root)
        .output()
        .context("cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).context("parsing cargo metadata")
}

/// The workspace members from `cargo metadata` (names and folders relative to `root`).
fn workspace_members(root: &Path) -> anyhow::Result<Vec<Member>> {
    let meta = metadata(root)?;
    let root_dir = PathBuf::from(
        meta["workspace_root"]
            .as_str()
            .context("cargo metadata has no workspace_root")?,
    );
    let packages = meta["packages"]
        .as_array()
        .context("cargo metadata has no packages")?;
    let mut members = Vec::new();
    for p in packages {
        let name = p["name"].as_str().context("a package without a name")?;
        let manifest = PathBuf::from(
            p["manifest_path"]
                .as_str()
                .context("a package without a manifest path")?,
        );
        let dir = manifest
            .parent()
            .and_then(|d| d.strip_prefix(&root_dir).ok())
            .with_context(|| format!("{} is outside the workspace", manifest.display()))?;
        members.push(Member {
            name: name.to_string(),
            dir: dir.to_string_lossy().replace('\\', "/"),
        });
    }
    Ok(members)
}

/// Fails when the workspace members are not the crate folders plus `xtask` and `benches`, or a
/// folder does not hold the package it should (see the module docs).
pub fn layout(root: &Path) -> anyhow::Result<()> {
    eprintln!("\n==> layout: workspace members = crates/* + xtask + benches, folder = package");
    let mut crate_dirs = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).context("reading crates/")? {
        let entry = entry?;
        if entry.path().join("Cargo.toml").is_file() {
            crate_dirs.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    crate_dirs.sort();
    let members = workspace_members(root)?;
    let problems = layout_problems(&members, &crate_dirs);
    if !problems.is_empty() {
        bail!("workspace layout:\n  {}", problems.join("\n  "));
    }
    eprintln!(
        "    {} members: {} crates, xtask, benches (package raptor-benches)",
        members.len(),
        crate_dirs.len()
    );
    Ok(())
}

/// The packages only tests may use: a `[dev-dependencies]` entry, never a normal or build
/// dependency (a library or program that needed one would ship test support).
pub const TEST_SUPPORT: [&str; 1] = ["raptor-testkit"];

/// One dependency of a workspace member as `cargo metadata` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    /// The member that depends.
    pub package: String,
    /// The package it depends on.
    pub name: String,
    /// `normal`, `dev` or `build`.
    pub kind: String,
}

/// The dependencies on [`TEST_SUPPORT`] packages that are not dev-dependencies. Empty when
/// there are none.
pub fn test_support_problems(dependencies: &[Dependency]) -> Vec<String> {
    dependencies
        .iter()
        .filter(|d| TEST_SUPPORT.contains(&d.name.as_str()) && d.kind != "dev")
        .map(|d| {
            format!(
                "{} has {} as a {} dependency: test support belongs in [dev-dependencies] only",
                d.package, d.name, d.kind
            )
        })
        .collect()
}

/// Every dependency of every workspace member, from `cargo metadata`.
fn workspace_dependencies(root: &Path) -> anyhow::Result<Vec<Dependency>> {
    let meta = metadata(root)?;
    let packages = meta["packages"]
        .as_array()
        .context("cargo metadata has no packages")?;
    let mut deps = Vec::new();
    for p in packages {
        let package = p["name"].as_str().context("a package without a name")?;
        for d in p["dependencies"].as_array().into_iter().flatten() {
            deps.push(Dependency {
                package: package.to_string(),
                name: d["name"]
                    .as_str()
                    .context("a dependency without a name")?
                    .to_string(),
                // `null` is a normal dependency.
                kind: d["kind"].as_str().unwrap_or("normal").to_string(),
            });
        }
    }
    Ok(deps)
}

/// Fails when a workspace member depends on a [`TEST_SUPPORT`] package other than as a
/// dev-dependency.
pub fn test_support_is_dev_only(root: &Path) -> anyhow::Result<()> {
    eprintln!(
        "\n==> test support: {} only in [dev-dependencies]",
        TEST_SUPPORT.join(", ")
    );
    let deps = workspace_dependencies(root)?;
    let problems = test_support_problems(&deps);
    if !problems.is_empty() {
        bail!(
            "test support outside dev-dependencies:\n  {}",
            problems.join("\n  ")
        );
    }
    let users: BTreeSet<&str> = deps
        .iter()
        .filter(|d| TEST_SUPPORT.contains(&d.name.as_str()))
        .map(|d| d.package.as_str())
        .collect();
    eprintln!(
        "    dev-dependency of {} members: none otherwise",
        users.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(s: &str) -> Vec<String> {
        outside_citations(s).into_iter().map(|c| c.text).collect()
    }

    #[test]
    fn every_kind_of_outside_citation_is_found_with_its_line() {
        // The citations are assembled from the checker's own names (this file must not
        // contain them whole).
        let [spec_s, spec_md, trainer, pipeline, shared] = OUTSIDE_DOCUMENTS;
        let (notes, note_file) = (RESEARCH_NOTES, format!("{RESEARCH_PREFIX}dpmuon.md"));
        let iss = concat!("iss", "ue");
        let doc = format!(
            "fine line\nsee {spec_s}4 for the rule\n\
             as in {iss} 14, and Issue #17; {iss}s 3 too\nthe {iss}-19 cases\n\
             {note_file} §2.3 and the {notes} §7\n\
             {trainer} and {pipeline}, ../{shared}/{spec_md}\n"
        );
        let found = outside_citations(&doc);
        let lines: Vec<usize> = found.iter().map(|c| c.line).collect();
        assert_eq!(lines, [2, 3, 3, 3, 4, 5, 5, 6, 6, 6, 6]);
        let want: Vec<String> = [
            spec_s.to_string(),
            format!("{iss} 14"),
            "Issue #17".to_string(),
            format!("{iss}s 3"),
            format!("{iss}-19"),
            notes.to_string(),
            note_file.clone(),
            spec_md.to_string(),
            trainer.to_string(),
            pipeline.to_string(),
            shared.to_string(),
        ]
        .into();
        assert_eq!(texts(&doc), want);
    }

    #[test]
    fn ordinary_words_are_not_citations() {
        for ok in [
            "pub const SPECIAL_TOKENS: [&str; 4]",
            "let spec = TableSpec::new(\"text\", None);",
            "toml_datetime 0.7.5+spec-1.1.0",
            "Higham 2002, §24.1; the RAPTOR paper, §5.2",
            // Assembled so that this file itself never reads like a citation.
            concat!(
                "an is",
                "sue with the tis",
                "sue 3 times; no is",
                "sue here"
            ),
            "issue a warning at 3 points",
            "research-grade code, research-notes.txt",
            "TRAINER DESIGN in words",
        ] {
            assert_eq!(texts(ok), Vec::<String>::new(), "{ok}");
        }
    }

    #[test]
    fn non_ascii_lines_are_searched_too() {
        let cited = concat!("iss", "ue 12");
        assert_eq!(texts(&format!("Ω ÉTAPE: voir {cited} ×2")), [cited]);
        let note = format!("{RESEARCH_PREFIX}raptor.md");
        assert_eq!(texts(&format!("ΣΣ {note}")), [note]);
    }

    /// The checks pass on this repository as it is (what `cargo xtask test` runs first).
    #[test]
    fn this_repository_stands_alone_and_has_the_documented_layout() {
        let root = crate::workspace_root().unwrap();
        stand_alone(&root).unwrap();
        layout(&root).unwrap();
        test_support_is_dev_only(&root).unwrap();
        typed_streams(&root).unwrap();
        used_dependencies(&root).unwrap();
        crate_maps(&root).unwrap();
    }

    #[test]
    fn code_maps_are_checked_against_the_members() {
        let members = [
            member("raptor-a", "crates/raptor-a"),
            member("raptor-benches", "benches"),
        ];
        let arch = "| crate | what |\n|---|---|\n| `raptor-a` | x |\n\
                    | `benches/` (package `raptor-benches`) | y |\n";
        let readme = "| [`raptor-a`](crates/raptor-a) | x |\n";
        assert!(crate_map_problems(arch, readme, &members).is_empty());
        let arch_short = "| `raptor-a` | x |\n| `raptor-gone` | z |\n";
        assert_eq!(
            crate_map_problems(arch_short, "", &members),
            [
                "ARCHITECTURE.md: no code-map row for the member raptor-benches",
                "ARCHITECTURE.md: a row for raptor-gone, which is no member",
                "README.md: no crate-table row for raptor-a"
            ]
        );
    }

    #[test]
    fn an_unused_dependency_is_found_unless_a_comment_explains_it() {
        let manifest = "[package]\nname = \"x\"\n\n[dependencies]\nserde.workspace = true\n\
                        rand-core = { workspace = true }\n# feature os_rng for from_os_rng\n\
                        getrandom.workspace = true\n\n[dev-dependencies]\ninsta = \"1\"\n\n\
                        [lints]\nworkspace = true\n";
        let code = "use serde::Serialize;\nfn f() { let serde_json = 1; }\n";
        assert_eq!(
            unused_dependencies(manifest, code),
            ["rand-core (dependencies)", "insta (dev-dependencies)"]
        );
        // Named as a path, with the underscore spelling of a dashed name: used.
        let code = "use serde::Serialize;\nfn g() { rand_core::RngCore::next_u32(r); insta::assert_snapshot!(x); }";
        assert!(unused_dependencies(manifest, code).is_empty());
        // A longer identifier that contains the name is not a use.
        assert!(!names_ident("my_insta_thing", "insta"));
    }

    #[test]
    fn parsing_a_stream_or_expert_from_a_string_is_found() {
        let code = "let s = plan.sigmas.get(\"experts\").unwrap_or(0.0);\n\
                    let ok = GroupId::Expert(id);\n\
                    if g.starts_with(\"expert[\") {}\n\
                    let x = p.sigmas[\"shared\"];\n";
        let lines: Vec<usize> = stream_name_parsing(code).iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, [1, 3, 4]);
        assert!(stream_name_parsing("let s = sigmas.iter();").is_empty());
    }

    fn dep(package: &str, name: &str, kind: &str) -> Dependency {
        Dependency {
            package: package.into(),
            name: name.into(),
            kind: kind.into(),
        }
    }

    #[test]
    fn test_support_only_as_a_dev_dependency() {
        let ok = [
            dep("raptor-data", "raptor-testkit", "dev"),
            dep("raptor-data", "serde", "normal"),
            dep("raptor-routing", "proptest", "dev"),
        ];
        assert_eq!(test_support_problems(&ok), Vec::<String>::new());
        let bad = [
            dep("raptor-data", "raptor-testkit", "normal"),
            dep("raptor-models", "raptor-testkit", "build"),
            dep("raptor-models", "raptor-testkit", "dev"),
        ];
        assert_eq!(
            test_support_problems(&bad),
            [
                "raptor-data has raptor-testkit as a normal dependency: test support belongs in \
                 [dev-dependencies] only",
                "raptor-models has raptor-testkit as a build dependency: test support belongs in \
                 [dev-dependencies] only",
            ]
        );
    }

    #[test]
    fn an_architecture_file_must_map_every_source_and_state_invariants() {
        let sources = [
            "src/lib.rs".to_string(),
            "src/run/mod.rs".into(),
            "src/run/io.rs".into(),
        ];
        let all = |_: &str| true;
        let good = "# x\n\n## Code map\n\n- `src/lib.rs`: root.\n- `src/run/`: the loop.\n\n\
                    ## Invariants\n\n- holds.\n";
        assert_eq!(
            architecture_problems(good, &sources, &all),
            Vec::<String>::new()
        );
        let missing =
            "## Code map\n- `src/lib.rs`: root.\n- `src/run/mod.rs`: loop.\n## Invariants\n- x\n";
        assert_eq!(
            architecture_problems(missing, &sources, &all),
            ["src/run/io.rs is in no code-map entry"]
        );
        let none = |p: &str| p != "src/gone.rs";
        let stale = "## Code map\n- `src/`: all.\n- `src/gone.rs`: old.\n## Invariants\n- x\n";
        assert_eq!(
            architecture_problems(stale, &sources, &none),
            ["the code map names src/gone.rs, which does not exist"]
        );
        let no_inv = "## Code map\n- `src/`: all.\n## Invariants\n\nnothing\n";
        assert_eq!(
            architecture_problems(no_inv, &sources, &all),
            ["the `## Invariants` section has no bullet"]
        );
        assert_eq!(
            architecture_problems("# x\n", &sources, &all),
            ["no `## Code map` section"]
        );
    }

    #[test]
    fn naming_the_method_is_found_outside_comments_only() {
        let code = "// Method is fine in a comment\nlet m = Method::Raptor;\nlet x = MethodFamily::A;\n\
                    use crate::config::{Method, Scope};\nlet my_Method_name = 1;\n";
        let found: Vec<usize> = names_method(code).into_iter().map(|(n, _)| n).collect();
        assert_eq!(found, [2, 4]);
    }

    fn member(name: &str, dir: &str) -> Member {
        Member {
            name: name.into(),
            dir: dir.into(),
        }
    }

    #[test]
    fn the_documented_layout_passes() {
        let members = [
            member("raptor-clip", "crates/raptor-clip"),
            member("raptor-muon", "crates/raptor-muon"),
            member("xtask", "xtask"),
            member("raptor-benches", "benches"),
        ];
        let dirs = ["raptor-clip".to_string(), "raptor-muon".to_string()];
        assert_eq!(layout_problems(&members, &dirs), Vec::<String>::new());
    }

    #[test]
    fn layout_problems_name_each_difference() {
        // benches missing, an extra top-level member, a crate folder left out, a wrong name.
        let members = [
            member("raptor-clip", "crates/raptor-clip"),
            member("raptor-muonx", "crates/raptor-muon"),
            member("xtask", "xtask"),
            member("tools", "tools"),
        ];
        let dirs = [
            "raptor-clip".to_string(),
            "raptor-muon".to_string(),
            "raptor-plan".to_string(),
        ];
        let problems = layout_problems(&members, &dirs);
        assert_eq!(
            problems,
            [
                "benches is not a workspace member",
                "crates/raptor-plan is not a workspace member",
                "workspace member tools is neither a folder under crates/ nor one of the \
                 top-level members (xtask, benches)",
                "crates/raptor-muon holds the package raptor-muonx, expected raptor-muon",
            ]
        );
        // The benches' package keeps its own name; another name there is an error.
        let members = [member("xtask", "xtask"), member("benches", "benches")];
        assert_eq!(
            layout_problems(&members, &[]),
            ["benches holds the package benches, expected raptor-benches"]
        );
        // The benches moved back under crates/ without a folder there is caught too.
        let members = [
            member("xtask", "xtask"),
            member("raptor-benches", "crates/raptor-benches"),
        ];
        assert_eq!(
            layout_problems(&members, &[]),
            [
                "benches is not a workspace member",
                "workspace member crates/raptor-benches is neither a folder under crates/ nor \
                 one of the top-level members (xtask, benches)",
            ]
        );
    }
}
