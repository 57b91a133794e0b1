//! Reference pages generated from their sources and checked in, so that they are read where
//! people look (GitHub, Artifact Hub) and cannot drift: the chart's values table (from the
//! `# --` comments of values.yaml, as helm-docs reads them) in charts/zklock/README.md, and the
//! API reference (from the CRDs' schemas) in docs/api-reference.md, and the command-line
//! reference (the binary's own `zklock admin cli-reference`) in docs/cli.md. A page that differs fails
//! with the command that rewrites it: `ZKLOCK_BLESS=1 cargo test --test repository generated`.

use std::path::PathBuf;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const BEGIN: &str = "<!-- generated: do not edit between these lines (tests/repository/generated.rs) -->\n";
const END: &str = "<!-- end of generated -->\n";

/// Checks that `file` holds `generated` between the markers, or rewrites it there when blessing.
fn check_generated(file: &str, generated: &str) {
    let path = root().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    let (start, end) = match (text.find(BEGIN), text.find(END)) {
        (Some(s), Some(e)) if s < e => (s + BEGIN.len(), e),
        _ => panic!("{file} lacks the markers of its generated part:\n{BEGIN}{END}"),
    };
    if text[start..end] == *generated {
        return;
    }
    if std::env::var_os("ZKLOCK_BLESS").is_some() {
        std::fs::write(&path, format!("{}{generated}{}", &text[..start], &text[end..])).unwrap();
        return;
    }
    panic!("{file} is out of date with its source: ZKLOCK_BLESS=1 cargo test --test repository generated");
}

/// `# -- text` comments (with their continuation lines) above keys, by dotted path.
fn described_keys(values: &str) -> Vec<(String, String)> {
    let mut out = vec![];
    let mut path: Vec<(usize, String)> = vec![];
    let mut comment: Option<String> = None;
    for line in values.lines() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim();
        if let Some(text) = trimmed.strip_prefix("# --") {
            comment = Some(text.trim().to_string());
            continue;
        }
        if let (Some(text), Some(c)) = (trimmed.strip_prefix('#'), comment.as_mut()) {
            c.push(' ');
            c.push_str(text.trim());
            continue;
        }
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('-') {
            comment = None;
            continue;
        }
        let Some((key, _)) = trimmed.split_once(':') else { continue };
        path.retain(|(depth, _)| *depth < indent);
        path.push((indent, key.trim().to_string()));
        if let Some(text) = comment.take() {
            out.push((path.iter().map(|(_, k)| k.as_str()).collect::<Vec<_>>().join("."), text));
        }
    }
    out
}

fn lookup<'a>(values: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(values, |v, key| &v[key])
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

#[test]
fn the_charts_values_table_is_generated_from_values_yaml() {
    let text = std::fs::read_to_string(root().join("charts/zklock/values.yaml")).unwrap();
    let values: Value = serde_yaml::from_str(&text).unwrap();
    let keys = described_keys(&text);
    assert!(keys.len() > 60, "the values are described: {} found", keys.len());
    let mut table = String::from("| Key | Default | Description |\n| --- | --- | --- |\n");
    for (path, description) in &keys {
        let value = lookup(&values, path);
        assert!(
            !value.is_null() || text.contains(&format!("{}: null", path.rsplit('.').next().unwrap())),
            "{path}: no such value"
        );
        let default = serde_json::to_string(value).unwrap();
        table.push_str(&format!("| `{path}` | `{}` | {} |\n", cell(&default), cell(description)));
    }
    check_generated("charts/zklock/README.md", &table);
}

/// The fields of one schema, depth first: (path, type, required, description).
fn fields(schema: &Value, path: &str, required: bool, out: &mut Vec<(String, String, bool, String)>) {
    let kind = match (schema["type"].as_str(), schema["x-kubernetes-int-or-string"].as_bool()) {
        (_, Some(true)) => "int or string".to_string(),
        (Some("array"), _) => format!("[]{}", schema["items"]["type"].as_str().unwrap_or("object")),
        (Some(t), _) => t.to_string(),
        (None, _) => "object".to_string(),
    };
    let description = schema["description"].as_str().unwrap_or("").replace('\n', " ");
    if !path.is_empty() {
        out.push((path.to_string(), kind, required, description));
    }
    let required_here: Vec<&str> =
        schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let properties = schema["properties"].as_object().or_else(|| schema["items"]["properties"].as_object());
    let under = if schema["type"] == "array" { format!("{path}[]") } else { path.to_string() };
    let required_items: Vec<&str> =
        schema["items"]["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if let Some(properties) = properties {
        for (name, child) in properties {
            let child_path = if under.is_empty() { name.clone() } else { format!("{under}.{name}") };
            let is_required = required_here.contains(&name.as_str()) || required_items.contains(&name.as_str());
            fields(child, &child_path, is_required, out);
        }
    }
}

#[test]
fn the_api_reference_is_generated_from_the_crds() {
    let mut page = String::new();
    for (_, crd) in zklock::api::crd_objects() {
        let crd = serde_json::to_value(&crd).unwrap();
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap();
        let scope = crd["spec"]["scope"].as_str().unwrap();
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let group = crd["spec"]["group"].as_str().unwrap();
            let schema = &version["schema"]["openAPIV3Schema"];
            page.push_str(&format!("## {kind} ({group}/{}, {scope})\n\n", version["name"].as_str().unwrap()));
            if let Some(description) = schema["description"].as_str() {
                page.push_str(&format!("{description}\n\n"));
            }
            for part in ["spec", "status"] {
                let mut rows = vec![];
                fields(&schema["properties"][part], part, false, &mut rows);
                if rows.is_empty() {
                    continue;
                }
                page.push_str("| Field | Type | Description |\n| --- | --- | --- |\n");
                for (path, kind, required, description) in rows {
                    let required = if required { " (required)" } else { "" };
                    page.push_str(&format!("| `{path}` | {kind}{required} | {} |\n", cell(&description)));
                }
                page.push('\n');
            }
            let rules: Vec<&str> = schema["properties"]["spec"]["x-kubernetes-validations"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["message"].as_str())
                .collect();
            if !rules.is_empty() {
                page.push_str("Admission refuses a spec when: ");
                page.push_str(&rules.join("; "));
                page.push_str(".\n\n");
            }
        }
    }
    check_generated("docs/api-reference.md", &page);
}

#[test]
fn the_cli_reference_is_the_binarys_own() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zklock"))
        .args(["admin", "cli-reference"])
        .env_remove("COLUMNS")
        .output()
        .expect("run zklock admin cli-reference");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reference = String::from_utf8(out.stdout).unwrap();
    for command in ["## `zklock acquire`", "## `zklock admin zk-queue`", "## `zklock check`", "## `zklock status`"] {
        assert!(reference.contains(command), "the reference has {command}");
    }
    check_generated("docs/cli.md", &reference);
}
