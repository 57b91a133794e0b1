//! What is made from the command line's one definition: shell completions, man pages and the
//! Markdown reference (docs/cli.md, which tests/repository/generated.rs keeps equal to it).

use std::io::Write;
use std::path::Path;

/// The widths and the environment's values that would make two renders differ: a reference is
/// the same wherever it is made.
fn settled(cmd: clap::Command) -> clap::Command {
    fn hide_env_values(cmd: clap::Command) -> clap::Command {
        cmd.mut_args(|a| a.hide_env_values(true)).mut_subcommands(hide_env_values)
    }
    hide_env_values(cmd).term_width(100)
}

/// Every command of the tree under `cmd` (itself first), with its path (`zklock admin zk-queue`),
/// leaving out hidden ones and clap's `help`.
fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
    out.push((path.to_string(), cmd.clone()));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        walk(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

/// The command-line reference as Markdown: each command's long help, as `--help` prints it.
pub fn markdown(cmd: clap::Command) -> String {
    let mut cmd = settled(cmd);
    cmd.build();
    let mut commands = vec![];
    let name = cmd.get_name().to_string();
    walk(&cmd, &name, &mut commands);
    let mut out = String::new();
    for (path, mut sub) in commands {
        let help = sub.render_long_help().to_string();
        let help: Vec<&str> = help.lines().map(str::trim_end).collect();
        out.push_str(&format!("## `{path}`\n\n```text\n{}\n```\n\n", help.join("\n").trim_end()));
    }
    out
}

/// Writes one man page per command into `dir`: `zklock.1`, `zklock-queue.1`,
/// `zklock-admin-zk-queue.1`, ….
pub fn man_pages(cmd: clap::Command, dir: &Path) -> Result<u8, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let mut cmd = settled(cmd);
    cmd.build();
    let mut commands = vec![];
    let name = cmd.get_name().to_string();
    walk(&cmd, &name, &mut commands);
    for (path, sub) in commands {
        let page_name = path.replace(' ', "-");
        // Named by its path, so that each page says `zklock admin zk-queue`, not `zk-queue`.
        let sub = sub.display_name(page_name.clone()).bin_name(path.clone());
        let mut page = vec![];
        clap_mangen::Man::new(sub).render(&mut page).map_err(|e| format!("man page of {path}: {e}"))?;
        let file = dir.join(format!("{page_name}.1"));
        std::fs::write(&file, page).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    }
    Ok(0)
}

/// Prints the completion script of `shell` for the command `bin`.
pub fn completion(mut cmd: clap::Command, shell: clap_complete::Shell, bin: &str) -> Result<u8, String> {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut cmd, bin, &mut out);
    out.flush().map_err(|e| format!("cannot write the completion script: {e}"))?;
    Ok(0)
}
