//! The server crate's import graph follows its layers (ARCHITECTURE.md):
//! a module may use only modules of a lower layer, or itself. In particular
//! `config` uses nothing of the crate, nothing imports `http` but `run` and
//! the crate root, and `http` and `reconcile` (peers) never import each
//! other, so no cycle can pass through `http`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of `crates/server/src` and its layer.
const LAYERS: &[(&str, u8)] = &[
    ("config", 0),
    ("clock", 1),
    ("telemetry", 1),
    ("tasks", 2),
    ("github", 2),
    ("app", 3),
    ("reconcile", 4),
    ("http", 4),
    ("run", 5),
    ("lib", 6),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src` belongs to.
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("under src");
    let first = relative
        .components()
        .next()
        .expect("a component")
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    first.trim_end_matches(".rs").to_owned()
}

/// The top-level modules `text` names through `crate::`, comments excepted.
fn uses(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let code = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `crate::{a::X, b}`: each item's first segment.
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        found.insert(name);
                    }
                }
                continue;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

/// Every (module, module it uses) edge that breaks the layering.
fn violations(src: &Path) -> Vec<String> {
    let layers: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut broken = Vec::new();
    for file in &files {
        let module = module_of(src, file);
        let Some(&layer) = layers.get(module.as_str()) else {
            broken.push(format!(
                "{}: module {module:?} has no layer in tests/layers.rs",
                file.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read file");
        for used in uses(&text) {
            if used == module {
                continue;
            }
            match layers.get(used.as_str()) {
                Some(&below) if below < layer => {}
                // Crate-root re-exports (`crate::Service`) and the like.
                None if used.starts_with(char::is_uppercase) => {}
                _ => broken.push(format!(
                    "{}: {module} (layer {layer}) uses crate::{used}",
                    file.display()
                )),
            }
        }
    }
    broken
}

#[test]
fn the_server_modules_use_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let broken = violations(&src);
    assert!(broken.is_empty(), "layering broken:\n{}", broken.join("\n"));
}

#[test]
fn the_check_sees_a_handler_used_by_the_domain() {
    // The check itself: an `app` file naming `http`, or `config` naming
    // anything of the crate, is reported.
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("app")).expect("mkdir");
    std::fs::create_dir_all(src.join("config")).expect("mkdir");
    std::fs::write(
        src.join("app/mod.rs"),
        "use crate::http::error::ApiError; // crate::run in a comment is fine\n",
    )
    .expect("write");
    std::fs::write(
        src.join("config/mod.rs"),
        "use crate::{clock::now, config::Secret};\n",
    )
    .expect("write");
    std::fs::write(src.join("http.rs"), "use crate::app::Service;\n").expect("write");
    let broken = violations(src);
    assert_eq!(broken.len(), 2, "{broken:#?}");
    assert!(broken[0].ends_with("app (layer 3) uses crate::http"));
    assert!(broken[1].ends_with("config (layer 0) uses crate::clock"));
}

/// The house rules of issue 57, over every crate's production sources
/// (`src/`, without the `tests.rs` files beside modules): no file over
/// 1,000 lines, at most three over 800, each of those saying why in its
/// module doc; and the README a landing page of at most 250 lines that
/// opens with the two commands.
#[test]
fn rooms_stay_small_and_the_readme_is_a_landing_page() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).expect("crates") {
        let src = entry.expect("entry").path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    let production = files.iter().filter(|f| {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
        name != "tests.rs" && !name.ends_with("_tests.rs")
    });
    let mut large = Vec::new();
    for file in production {
        let text = std::fs::read_to_string(file).expect("read");
        let lines = text.lines().count();
        assert!(lines <= 1_000, "{} has {lines} lines", file.display());
        if lines > 800 {
            assert!(
                text.contains("Why one file of over 800 lines"),
                "{} has {lines} lines and does not say why",
                file.display()
            );
            large.push(file.display().to_string());
        }
    }
    assert!(large.len() <= 3, "over 800 lines: {large:?}");

    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    assert!(readme.lines().count() <= 250, "README.md is a landing page");
    let first_block: Vec<&str> = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("README opens with a sh block")
        .lines()
        .collect();
    assert_eq!(first_block.len(), 2, "two commands: {first_block:?}");
    assert!(first_block[0].starts_with("cargo run --locked -p runway -- serve"));
    assert!(first_block[1].starts_with("cargo test --workspace --locked"));
}
