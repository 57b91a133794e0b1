//! The release workflow cannot run here (no GitHub, no registry): it is linted with actionlint
//! (which runs shellcheck on its scripts), and it must build the image with the script the
//! image test checks.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn actionlint(file: &std::path::Path) -> (bool, String) {
    let linter = root().join(".tools/bin/actionlint");
    let out = Command::new(&linter)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (TOOLS_WITH_IMAGE=1 scripts/tools.sh installs it)", linter.display()));
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn the_release_workflow_lints_clean_and_builds_the_image_with_the_tested_script() {
    let workflow = root().join(".github/workflows/release.yml");
    let (clean, said) = actionlint(&workflow);
    assert!(clean, "actionlint on the release workflow:\n{said}");
    let text = std::fs::read_to_string(&workflow).unwrap();
    assert!(text.contains("scripts/image.sh --binary"), "the release image comes from scripts/image.sh");
    assert!(text.contains("scripts/build-static.sh"), "the released binaries come from scripts/build-static.sh");
    assert!(
        text.contains("scripts/archive.sh --binary"),
        "the archives come from scripts/archive.sh (tested with krew)"
    );
    assert!(
        text.contains("scripts/krew.sh --version"),
        "the krew manifest comes from scripts/krew.sh (tested with krew)"
    );

    // The linter finds what it should: a job output that does not exist.
    let broken = std::env::temp_dir().join(format!("zklock-broken-workflow-{}.yml", std::process::id()));
    std::fs::write(&broken, text.replace("needs.version.outputs.version", "needs.version.outputs.versoin")).unwrap();
    let (clean, said) = actionlint(&broken);
    let _ = std::fs::remove_file(&broken);
    assert!(!clean && said.contains("versoin"), "actionlint must catch a misspelt output:\n{said}");
}
