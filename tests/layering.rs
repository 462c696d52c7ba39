//! Layering rules that the compiler does not enforce inside one crate (issue 44): the simulator
//! is a user of the core, so it takes the core's types from the core, never through the wire
//! crate's re-exports (which would tie the simulator to the protocol's version of them).

use std::path::Path;

/// Every `.rs` file under `dir`, with its text.
fn sources(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push((
                path.display().to_string(),
                std::fs::read_to_string(&path).unwrap(),
            ));
        }
    }
    out
}

#[test]
fn the_simulator_takes_nothing_from_the_wire_crate() {
    let sim = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/sim");
    let offenders: Vec<String> = sources(&sim)
        .into_iter()
        .filter(|(_, text)| text.contains("ringmaster_proto"))
        .map(|(path, _)| path)
        .collect();
    assert!(
        offenders.is_empty(),
        "the simulator imports from ringmaster_proto (take it from ringmaster_core): {offenders:?}"
    );
}

#[test]
fn the_jobs_framework_does_not_import_the_master() {
    // The jobs framework is a framework: it talks to the master through the SDK and the
    // master starts it. The master imports from the jobs module, never the other way.
    let jobs = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/jobs");
    let files = sources(&jobs);
    assert!(!files.is_empty(), "no sources under {}", jobs.display());
    let mut offenders: Vec<String> = files
        .into_iter()
        .filter(|(_, text)| text.contains("crate::master") || text.contains("super::master"))
        .map(|(path, _)| path)
        .collect();
    offenders.sort();
    assert!(
        offenders.is_empty(),
        "the jobs framework names the master (move what it needs into src/jobs; the master \
         imports it from there): {offenders:?}"
    );
}

/// One module of a crate: its file and the modules it declares.
struct Module {
    file: std::path::PathBuf,
    parent: Option<usize>,
    children: std::collections::BTreeMap<String, usize>,
    /// Module paths this file names (`use` trees and paths in code), test code left out.
    paths: Vec<Vec<String>>,
    /// Names of the items the file defines.
    items: std::collections::BTreeSet<String>,
    /// `pub use` re-exports: the name they give and the path they name (a glob has no name).
    reexports: Vec<(Option<String>, Vec<String>)>,
}

/// Whether an item's attributes include `#[cfg(test)]` or `#[cfg(doc)]`: test code may
/// import anything, and a doc link is not a dependency.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Path>()
                .is_ok_and(|p| p.is_ident("test") || p.is_ident("doc"))
    })
}

/// The module paths a file names outside its test code, the items it defines and its
/// re-exports. A `pub use` is the module's interface, not a use: a path through it is followed
/// to the module that defines the item.
#[derive(Default)]
struct Paths {
    paths: Vec<Vec<String>>,
    items: std::collections::BTreeSet<String>,
    reexports: Vec<(Option<String>, Vec<String>)>,
}

/// Every path of a `use` tree with the name it binds (`None` for a glob).
fn use_paths(
    prefix: &mut Vec<String>,
    tree: &syn::UseTree,
    out: &mut Vec<(Option<String>, Vec<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(prefix, &p.tree, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut full = prefix.clone();
            let name = if n.ident == "self" {
                prefix.last().cloned().unwrap_or_default()
            } else {
                full.push(n.ident.to_string());
                n.ident.to_string()
            };
            out.push((Some(name), full));
        }
        syn::UseTree::Rename(r) => {
            let mut full = prefix.clone();
            if r.ident != "self" {
                full.push(r.ident.to_string());
            }
            out.push((Some(r.rename.to_string()), full));
        }
        syn::UseTree::Glob(_) => out.push((None, prefix.clone())),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                use_paths(prefix, tree, out);
            }
        }
    }
}

impl<'ast> syn::visit::Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if is_test(attrs) {
            return;
        }
        let name = match item {
            syn::Item::Fn(i) => Some(&i.sig.ident),
            syn::Item::Const(i) => Some(&i.ident),
            syn::Item::Static(i) => Some(&i.ident),
            syn::Item::Struct(i) => Some(&i.ident),
            syn::Item::Enum(i) => Some(&i.ident),
            syn::Item::Trait(i) => Some(&i.ident),
            syn::Item::Type(i) => Some(&i.ident),
            syn::Item::Mod(i) if i.content.is_some() => Some(&i.ident),
            _ => None,
        };
        if let Some(name) = name {
            self.items.insert(name.to_string());
        }
        if let syn::Item::Use(u) = item {
            let mut found = Vec::new();
            use_paths(&mut Vec::new(), &u.tree, &mut found);
            if matches!(u.vis, syn::Visibility::Inherited) {
                self.paths.extend(found.into_iter().map(|(_, path)| path));
            } else {
                self.reexports.extend(found);
            }
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.segments.len() > 1 {
            self.paths
                .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, path);
    }
}

/// Loads the module tree of the crate whose root file is `root`.
fn load_crate(root: &Path) -> Vec<Module> {
    let mut modules = vec![Module {
        file: root.to_path_buf(),
        parent: None,
        children: Default::default(),
        paths: Vec::new(),
        items: Default::default(),
        reexports: Vec::new(),
    }];
    let mut next = 0;
    while next < modules.len() {
        let file = modules[next].file.clone();
        let text = std::fs::read_to_string(&file).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut paths = Paths::default();
        syn::visit::visit_file(&mut paths, &ast);
        modules[next].paths = paths.paths;
        modules[next].items = paths.items;
        modules[next].reexports = paths.reexports;
        // `foo.rs` declares its modules in `foo/`; a crate root and `mod.rs`, beside them.
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        let dir = if next == 0 || stem == "mod" {
            file.parent().unwrap().to_path_buf()
        } else {
            file.parent().unwrap().join(&stem)
        };
        for item in &ast.items {
            let syn::Item::Mod(m) = item else { continue };
            if m.content.is_some() || is_test(&m.attrs) {
                continue;
            }
            let name = m.ident.to_string();
            let child = [
                dir.join(format!("{name}.rs")),
                dir.join(&name).join("mod.rs"),
            ]
            .into_iter()
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{}: no file for `mod {name}`", file.display()));
            let index = modules.len();
            modules.push(Module {
                file: child,
                parent: Some(next),
                children: Default::default(),
                paths: Vec::new(),
                items: Default::default(),
                reexports: Vec::new(),
            });
            modules[next].children.insert(name, index);
        }
        next += 1;
    }
    modules
}

/// The module a path names, from module `at`: `crate::`, `super::`, `self::` or a child's
/// name, then as many module names as match; an item a module only re-exports is followed to
/// the module it comes from. `None` for other crates and local items.
fn resolve(modules: &[Module], at: usize, path: &[String]) -> Option<usize> {
    resolve_within(modules, at, path, 8)
}

fn resolve_within(modules: &[Module], at: usize, path: &[String], depth: u32) -> Option<usize> {
    let (mut module, mut rest) = match path.first().map(String::as_str) {
        Some("crate") => (0, &path[1..]),
        Some("self") => (at, &path[1..]),
        Some("super") => {
            let mut module = at;
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                module = modules[module].parent?;
                rest = &rest[1..];
            }
            (module, rest)
        }
        Some(first) if modules[at].children.contains_key(first) => (at, path),
        _ => return None,
    };
    while let Some(&child) = rest.first().and_then(|s| modules[module].children.get(s)) {
        module = child;
        rest = &rest[1..];
    }
    let Some(name) = rest.first() else {
        return Some(module);
    };
    if depth == 0 || modules[module].items.contains(name) {
        return Some(module);
    }
    let m = &modules[module];
    for (given, target) in &m.reexports {
        if given.as_ref() == Some(name) {
            let mut full = target.clone();
            full.extend(rest[1..].iter().cloned());
            return resolve_within(modules, module, &full, depth - 1).or(Some(module));
        }
    }
    for (given, target) in &m.reexports {
        if given.is_none() {
            let mut full = target.clone();
            full.extend(rest.iter().cloned());
            if let Some(found) = resolve_within(modules, module, &full, depth - 1) {
                if modules[found].items.contains(name)
                    || modules[found]
                        .reexports
                        .iter()
                        .any(|(g, _)| g.as_ref() == Some(name))
                {
                    return Some(found);
                }
            }
        }
    }
    Some(module)
}

/// The import circles of one crate: groups of files that import each other, each with the
/// edges between them as `a -> b`.
fn circles(root: &Path) -> Vec<Vec<String>> {
    let modules = load_crate(root);
    let n = modules.len();
    let mut edges: Vec<std::collections::BTreeSet<usize>> = vec![Default::default(); n];
    for (at, module) in modules.iter().enumerate() {
        for path in &module.paths {
            if let Some(to) = resolve(&modules, at, path) {
                if to != at {
                    edges[at].insert(to);
                }
            }
        }
    }
    // Strongly connected components (Kosaraju): two passes of depth-first search.
    fn order(
        v: usize,
        edges: &[std::collections::BTreeSet<usize>],
        seen: &mut [bool],
        out: &mut Vec<usize>,
    ) {
        seen[v] = true;
        for &w in &edges[v] {
            if !seen[w] {
                order(w, edges, seen, out);
            }
        }
        out.push(v);
    }
    let mut seen = vec![false; n];
    let mut finished = Vec::new();
    for v in 0..n {
        if !seen[v] {
            order(v, &edges, &mut seen, &mut finished);
        }
    }
    let mut reverse: Vec<std::collections::BTreeSet<usize>> = vec![Default::default(); n];
    for (v, out) in edges.iter().enumerate() {
        for &w in out {
            reverse[w].insert(v);
        }
    }
    let mut seen = vec![false; n];
    let mut found = Vec::new();
    for &v in finished.iter().rev() {
        if seen[v] {
            continue;
        }
        let mut component = Vec::new();
        order(v, &reverse, &mut seen, &mut component);
        if component.len() > 1 {
            let name = |m: usize| modules[m].file.display().to_string();
            let mut lines: Vec<String> = component
                .iter()
                .flat_map(|&a| {
                    edges[a]
                        .iter()
                        .filter(|b| component.contains(b))
                        .map(move |&b| format!("{} -> {}", name(a), name(b)))
                })
                .collect();
            lines.sort();
            found.push(lines);
        }
    }
    found
}

#[test]
fn no_module_import_circles_in_the_workspace() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut roots = Vec::new();
    for member in [".", "core", "proto", "agent", "framework-sdk", "tools"] {
        let src = workspace.join(member).join("src");
        for root in ["lib.rs", "main.rs"] {
            if src.join(root).exists() {
                roots.push(src.join(root));
            }
        }
        if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
            for bin in bins.flatten().map(|e| e.path()) {
                if bin.extension().is_some_and(|e| e == "rs") {
                    roots.push(bin);
                } else if bin.join("main.rs").exists() {
                    roots.push(bin.join("main.rs"));
                }
            }
        }
    }
    let mut report = String::new();
    for root in &roots {
        for circle in circles(root) {
            report.push_str(&format!(
                "circle in {}:\n  {}\n",
                root.display(),
                circle.join("\n  ")
            ));
        }
    }
    assert!(
        report.is_empty(),
        "files that import each other (move what they share into a module both use):\n{report}"
    );
}
