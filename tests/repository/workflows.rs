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

    // The supply-chain evidence docs/verify.md tells users to check, made with the tools and
    // scripts the tests run, at the versions scripts/tools.sh installs for them.
    for (needle, what) in [
        ("cargo auditable build", "the macOS binaries are built with cargo auditable"),
        ("scripts/sbom.sh", "the SBOM comes from scripts/sbom.sh"),
        ("cosign sign --yes --recursive \"$IMAGE@$digest\"", "the image is signed by digest"),
        ("cosign sign --yes \"$CHART@$digest\"", "the chart is signed by digest"),
        ("cosign attest --yes --type cyclonedx", "the SBOM is attested on the image"),
        ("actions/attest-build-provenance", "the archives get build provenance"),
        ("helm install zklock \"$CHART_REPOSITORY/zklock\"", "the published chart is installed from the registry"),
        ("helm test zklock", "and tested"),
    ] {
        assert!(text.contains(needle), "{what}: the workflow has no `{needle}`");
    }
    let tools = std::fs::read_to_string(root().join("scripts/tools.sh")).unwrap();
    let static_build = std::fs::read_to_string(root().join("scripts/build-static.sh")).unwrap();
    assert!(static_build.contains("auditable build --release"), "scripts/build-static.sh builds with cargo auditable");
    for (variable, tool) in
        [("CARGO_AUDITABLE", "cargo-auditable@"), ("CARGO_CYCLONEDX", "cargo-cyclonedx@"), ("COSIGN", "cosign@")]
    {
        let version = text
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{variable}: ")))
            .unwrap_or_else(|| panic!("the workflow sets no {variable}"));
        assert!(
            tools.contains(&format!("{tool}{version}")),
            "the workflow's {variable} {version} is not what scripts/tools.sh installs"
        );
    }
    // docs/verify.md's keyless identity is this workflow's, for a tag.
    let verify = std::fs::read_to_string(root().join("docs/verify.md")).unwrap();
    assert!(
        verify.contains(r"\.github/workflows/release\.yml@refs/tags/v") && text.contains("tags: [\"v*.*.*\"]"),
        "docs/verify.md's certificate identity names this workflow, run for tags"
    );
    assert!(text.contains("id-token: write"), "keyless signing needs the OIDC token");

    // The linter finds what it should: a job output that does not exist.
    let broken = std::env::temp_dir().join(format!("zklock-broken-workflow-{}.yml", std::process::id()));
    std::fs::write(&broken, text.replace("needs.version.outputs.version", "needs.version.outputs.versoin")).unwrap();
    let (clean, said) = actionlint(&broken);
    let _ = std::fs::remove_file(&broken);
    assert!(!clean && said.contains("versoin"), "actionlint must catch a misspelt output:\n{said}");
}
