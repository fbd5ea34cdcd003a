//! `tkn mutex completion bash|zsh|fish`: a shell completion script, made from
//! the command's own definition, so it never lags behind a flag. Needs no cluster.

use super::target::Result;
use clap::Args;
use clap_complete::Shell;

/// The name the script completes: the plugin's own binary. tkn does not pass
/// completion on to plugins, so `tkn mutex` itself cannot be completed.
const BIN: &str = "tkn-mutex";

#[derive(Args)]
pub struct CompletionArgs {
    /// The shell: bash, zsh or fish (also elvish, powershell).
    #[arg(value_enum)]
    shell: Shell,
}

/// `command` is the plugin's whole definition (`Cli::command()`), passed in by the parent.
pub fn run(a: CompletionArgs, command: clap::Command) -> Result<()> {
    print!("{}", script(a.shell, command));
    Ok(())
}

/// Load it with e.g. `source <(tkn-mutex completion bash)`.
pub fn script(shell: Shell, mut command: clap::Command) -> String {
    // clap_complete's bash script spells a hyphenated name two ways, so that no
    // subcommand's options complete (clap-rs/clap#6421): it is made for a name
    // without a hyphen, then registered for the real one.
    let name = match shell {
        Shell::Bash => BIN.replace('-', "_"),
        _ => BIN.to_string(),
    };
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, name.as_str(), &mut out);
    let text = String::from_utf8_lossy(&out);
    match shell {
        Shell::Bash => text.replace(&format!(" {name}\n"), &format!(" {BIN}\n")),
        _ => text.into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::CommandFactory;

    fn script(shell: Shell) -> String {
        super::script(shell, Cli::command())
    }

    #[test]
    fn completion_scripts_complete_the_plugin_and_its_commands() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let s = script(shell);
            assert!(s.contains("tkn-mutex"), "{shell}: {s}");
            assert!(s.contains("describe") && s.contains("context"), "{shell}");
        }
        let bash = script(Shell::Bash);
        assert!(bash.contains("-o default tkn-mutex\n"), "{bash}");
        // The state the loop sets is the one a case arm matches.
        assert!(bash.contains("cmd=\"tkn_mutex__subcmd__list\""), "{bash}");
        assert!(
            bash.contains("\n        tkn_mutex__subcmd__list)\n"),
            "{bash}"
        );
    }
}
