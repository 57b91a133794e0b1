//! The command line where users meet it: the bash completion completes (sourced into a real
//! bash), zsh's and fish's scripts parse, every man page renders with its command's name, and run
//! as the kubectl plugin (a file named `kubectl-zklock`) the help names `kubectl zklock`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn zklock() -> Command {
    Command::new(env!("CARGO_BIN_EXE_zklock"))
}

fn stdout(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// A directory of the test's own, removed when the test ends (also when it fails).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("zklock-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// What bash offers after `words` (the last one being completed).
fn bash_completes(script: &Path, words: &[&str]) -> Vec<String> {
    let line = words.join(" ");
    let program = format!(
        "source {script}; COMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE='{line}'; COMP_POINT={point}; \
         _zklock zklock '{current}' '{previous}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script = script.display(),
        words = words.iter().map(|w| format!("'{w}'")).collect::<Vec<_>>().join(" "),
        cword = words.len() - 1,
        point = line.len(),
        current = words[words.len() - 1],
        previous = words[words.len() - 2],
    );
    stdout(Command::new("bash").args(["-c", &program]), "bash completion").lines().map(str::to_string).collect()
}

#[test]
fn completions_complete_commands_and_flags() {
    let dir = scratch("completion");
    let script = dir.0.join("zklock.bash");
    std::fs::write(&script, stdout(zklock().args(["completion", "bash"]), "zklock completion bash")).unwrap();
    let commands = bash_completes(&script, &["zklock", "qu"]);
    assert_eq!(commands, ["queue"], "zklock qu<TAB>");
    let flags = bash_completes(&script, &["zklock", "status", "--"]);
    for flag in ["--namespace", "--kubeconfig", "--context"] {
        assert!(flags.iter().any(|f| f == flag), "zklock status --<TAB> offers {flag}: {flags:?}");
    }
    let admin = bash_completes(&script, &["zklock", "admin", "zk-"]);
    assert_eq!(admin, ["zk-queue", "zk-revoke"], "zklock admin zk-<TAB>");

    let zsh = stdout(zklock().args(["completion", "zsh"]), "zklock completion zsh");
    assert!(zsh.starts_with("#compdef zklock"), "zsh's script declares what it completes");
    let fish = stdout(zklock().args(["completion", "fish"]), "zklock completion fish");
    assert!(fish.contains("complete -c zklock") && fish.contains("-a \"queue\""), "fish's script completes queue");
    let bad = zklock().args(["completion", "tcsh"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("possible values: bash"),
        "a wrong shell names the right ones"
    );
}

#[test]
fn every_command_has_a_man_page() {
    let dir = scratch("man");
    stdout(zklock().args(["admin", "man", "--dir"]).arg(&dir.0), "zklock admin man");
    let reference = stdout(zklock().args(["admin", "cli-reference"]), "zklock admin cli-reference");
    let commands: Vec<&str> = reference.lines().filter_map(|l| l.strip_prefix("## `")?.strip_suffix('`')).collect();
    assert!(commands.len() > 15, "{commands:?}");
    for command in commands {
        let file = dir.0.join(format!("{}.1", command.replace(' ', "-")));
        let page = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("man page of {command}: {e}"));
        assert!(page.contains(".SH NAME") && page.contains(".SH SYNOPSIS"), "{}", file.display());
        let roff = command.replace('-', "\\-");
        assert!(page.contains(&format!("\\fB{roff}\\fR")), "{} names `{command}` in its synopsis", file.display());
    }
}

#[test]
fn run_as_the_kubectl_plugin_the_help_says_kubectl_zklock() {
    let dir = scratch("plugin");
    let plugin = dir.0.join("kubectl-zklock");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_zklock"), &plugin).unwrap();
    let help = stdout(Command::new(&plugin).arg("--help"), "kubectl-zklock --help");
    assert!(help.contains("Usage: kubectl zklock <COMMAND>"), "{help}");
    assert!(help.contains("\n  kubectl zklock queue db-migrations -n shop"), "the examples as the plugin: {help}");
    let sub = stdout(Command::new(&plugin).args(["queue", "--help"]), "kubectl-zklock queue --help");
    assert!(sub.contains("Usage: kubectl zklock queue"), "{sub}");
    let plain = stdout(zklock().arg("--help"), "zklock --help");
    assert!(plain.contains("Usage: zklock <COMMAND>") && !plain.contains("kubectl zklock"), "{plain}");
}
