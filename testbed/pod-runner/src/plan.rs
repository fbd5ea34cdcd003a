//! Pure parsing of a Tekton TaskRun pod into the steps to run on the host.
//!
//! Tekton (pkg/pod/script.go) writes each step's `script` into the `place-scripts` init container
//! as a heredoc of the base64-encoded script:
//!
//! ```text
//! scriptfile="/tekton/scripts/script-0-abcde"
//! touch ${scriptfile} && chmod +x ${scriptfile}
//! cat > ${scriptfile} << '_EOF_'
//! IyEvYmluL3NoCnNldCAtZQplY2hvIGhp
//! _EOF_
//! /tekton/bin/entrypoint decode-script "${scriptfile}"
//! ```
//!
//! and (pkg/pod/entrypoint.go) rewrites each step container to run `/tekton/bin/entrypoint` with
//! `... -entrypoint <scriptfile or command[0]> -- <remaining command and args>`.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

pub const PLACE_SCRIPTS: &str = "place-scripts";
pub const STEP_PREFIX: &str = "step-";
const HEREDOC: &str = "_EOF_";

/// What a step runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// A script from `place-scripts` (already decoded; Tekton prepended `#!/bin/sh\nset -e\n`
    /// when the script had no shebang).
    Script { path_in_pod: String, body: String },
    /// A plain command (`command:` in the step), looked up on the host's PATH.
    Command { program: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct StepPlan {
    /// Container name, `step-<name>`.
    pub container: String,
    pub program: Program,
    /// Arguments after `--`.
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
    pub working_dir: Option<String>,
    /// `-on_error` value, e.g. `continue` or `stopAndFail`.
    pub on_error: Option<String>,
}

/// Decodes the heredocs of a `place-scripts` shell text: script path in the pod -> script body.
pub fn parse_place_scripts(text: &str) -> Result<HashMap<String, String>> {
    let mut scripts = HashMap::new();
    let mut current_file: Option<String> = None;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some(rest) = line.strip_prefix("scriptfile=\"") {
            let file = rest
                .strip_suffix('"')
                .ok_or_else(|| anyhow!("malformed scriptfile line: {line:?}"))?;
            current_file = Some(file.to_string());
        } else if line.starts_with("cat > ${scriptfile} << '") {
            let file = current_file
                .take()
                .ok_or_else(|| anyhow!("heredoc without a preceding scriptfile= line"))?;
            let delim = line
                .trim_start_matches("cat > ${scriptfile} << '")
                .trim_end_matches('\'');
            if delim != HEREDOC {
                bail!("unexpected heredoc delimiter {delim:?} for {file}");
            }
            let mut encoded = String::new();
            loop {
                let l = lines
                    .next()
                    .ok_or_else(|| anyhow!("unterminated heredoc for {file}"))?;
                if l == delim {
                    break;
                }
                encoded.push_str(l.trim());
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded.as_bytes())
                .with_context(|| format!("script {file} is not valid base64"))?;
            let body =
                String::from_utf8(bytes).with_context(|| format!("script {file} is not UTF-8"))?;
            scripts.insert(file, body);
        }
    }
    Ok(scripts)
}

/// The `place-scripts` text of a pod, if it has that init container.
pub fn place_scripts_text(pod: &Pod) -> Option<&str> {
    let spec = pod.spec.as_ref()?;
    let init = spec
        .init_containers
        .as_ref()?
        .iter()
        .find(|c| c.name == PLACE_SCRIPTS)?;
    // command: ["sh"], args: ["-c", TEXT]
    let args = init.args.as_ref()?;
    match args.as_slice() {
        [flag, text, ..] if flag == "-c" => Some(text.as_str()),
        _ => None,
    }
}

/// Parses the entrypoint args of a step container: returns (`-entrypoint` value, flags, args
/// after `--`).
pub fn parse_entrypoint_args(
    args: &[String],
) -> (Option<String>, BTreeMap<String, String>, Vec<String>) {
    let mut entrypoint = None;
    let mut flags = BTreeMap::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            return (entrypoint, flags, args[i + 1..].to_vec());
        }
        if let Some(name) = a.strip_prefix("--").or_else(|| a.strip_prefix('-')) {
            // Boolean flags Tekton passes without a value.
            let boolean = matches!(
                name,
                "breakpoint_on_failure" | "debug_before_step" | "wait_file_content"
            );
            if boolean || i + 1 >= args.len() {
                flags.insert(name.to_string(), String::new());
                i += 1;
                continue;
            }
            let value = args[i + 1].clone();
            if name == "entrypoint" {
                entrypoint = Some(value.clone());
            }
            flags.insert(name.to_string(), value);
            i += 2;
        } else {
            i += 1;
        }
    }
    (entrypoint, flags, Vec::new())
}

/// Plans one step container.
pub fn plan_step(container: &Container, scripts: &HashMap<String, String>) -> Result<StepPlan> {
    let args = container.args.clone().unwrap_or_default();
    let uses_entrypoint = container
        .command
        .as_ref()
        .and_then(|c| c.first())
        .is_some_and(|c| c.ends_with("/entrypoint"));
    let (entrypoint, flags, rest) = if uses_entrypoint {
        parse_entrypoint_args(&args)
    } else {
        // Not rewritten by Tekton (should not happen): run command + args as given.
        let mut cmd = container.command.clone().unwrap_or_default();
        let first = if cmd.is_empty() {
            None
        } else {
            Some(cmd.remove(0))
        };
        cmd.extend(args);
        (first, BTreeMap::new(), cmd)
    };
    let entrypoint = entrypoint.ok_or_else(|| {
        anyhow!(
            "step {} has neither script nor command: the pod-runner cannot look up an image's \
             entrypoint offline; give the step a `script` or a `command`",
            container.name
        )
    })?;
    let program = match scripts.get(&entrypoint) {
        Some(body) => Program::Script {
            path_in_pod: entrypoint.clone(),
            body: body.clone(),
        },
        None if entrypoint.starts_with("/tekton/scripts/") => {
            bail!(
                "step {} runs {entrypoint}, which place-scripts does not define",
                container.name
            )
        }
        None => Program::Command {
            program: entrypoint,
        },
    };
    Ok(StepPlan {
        container: container.name.clone(),
        program,
        args: rest,
        env: container.env.clone().unwrap_or_default(),
        working_dir: container.working_dir.clone(),
        on_error: flags.get("on_error").cloned().filter(|v| !v.is_empty()),
    })
}

/// Plans all step containers of a TaskRun pod, in order (sidecars are ignored).
pub fn plan_pod(pod: &Pod) -> Result<Vec<StepPlan>> {
    let scripts = match place_scripts_text(pod) {
        Some(text) => parse_place_scripts(text)?,
        None => HashMap::new(),
    };
    let spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| anyhow!("pod has no spec"))?;
    spec.containers
        .iter()
        .filter(|c| c.name.starts_with(STEP_PREFIX))
        .map(|c| plan_step(c, &scripts))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_pod() -> Pod {
        serde_json::from_str(include_str!("../fixtures/taskrun-pod.json")).expect("fixture parses")
    }

    #[test]
    fn decodes_heredocs_of_a_real_pod() {
        let pod = fixture_pod();
        let text = place_scripts_text(&pod).expect("place-scripts present");
        let scripts = parse_place_scripts(text).unwrap();
        assert_eq!(scripts.len(), 2, "{scripts:?}");
        let mut bodies: Vec<_> = scripts.values().cloned().collect();
        bodies.sort();
        // A script without shebang gets Tekton's preamble; one with a shebang is kept verbatim.
        assert!(
            bodies
                .iter()
                .any(|b| b.starts_with("#!/bin/sh\nset -e\n") && b.contains("kubectl"))
        );
        assert!(bodies.iter().any(|b| b.starts_with("#!/usr/bin/env bash")));
    }

    #[test]
    fn maps_each_step_to_its_script_by_entrypoint_arg() {
        let pod = fixture_pod();
        let plans = plan_pod(&pod).unwrap();
        let names: Vec<_> = plans.iter().map(|p| p.container.as_str()).collect();
        assert_eq!(names, ["step-create", "step-bash", "step-cmd"]);
        match &plans[0].program {
            Program::Script { path_in_pod, body } => {
                assert!(path_in_pod.starts_with("/tekton/scripts/script-0-"));
                assert!(body.contains("kubectl create configmap"), "{body}");
                // params are substituted by Tekton before the script is encoded
                assert!(body.contains("fixture-value"), "{body}");
            }
            other => panic!("unexpected {other:?}"),
        }
        match &plans[1].program {
            Program::Script { path_in_pod, .. } => {
                assert!(path_in_pod.starts_with("/tekton/scripts/script-1-"))
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(
            plans[2].program,
            Program::Command {
                program: "echo".into()
            }
        );
        assert_eq!(plans[2].args, ["hello", "from", "command"]);
        assert!(plans[0].env.iter().any(|e| e.name == "GREETING"));
    }

    #[test]
    fn heredoc_roundtrip_with_dollar_signs() {
        let body = "#!/bin/sh\nset -e\necho \"$(date) ${HOME}\"\n";
        let enc = base64::engine::general_purpose::STANDARD.encode(body);
        let text = format!(
            "scriptfile=\"/tekton/scripts/script-0-x\"\ntouch ${{scriptfile}} && chmod +x ${{scriptfile}}\ncat > ${{scriptfile}} << '_EOF_'\n{enc}\n_EOF_\n/tekton/bin/entrypoint decode-script \"${{scriptfile}}\"\n"
        );
        let scripts = parse_place_scripts(&text).unwrap();
        assert_eq!(scripts["/tekton/scripts/script-0-x"], body);
    }

    #[test]
    fn unterminated_heredoc_is_an_error() {
        let text = "scriptfile=\"/tekton/scripts/a\"\ncat > ${scriptfile} << '_EOF_'\nYWJj\n";
        assert!(parse_place_scripts(text).is_err());
    }

    #[test]
    fn entrypoint_args_split_at_double_dash() {
        let args: Vec<String> = [
            "-post_file",
            "/tekton/run/0/out",
            "-termination_path",
            "/tekton/termination",
            "-step_metadata_dir",
            "/tekton/run/0/status",
            "-breakpoint_on_failure",
            "-on_error",
            "continue",
            "-entrypoint",
            "/tekton/scripts/script-0-abc",
            "--",
            "a",
            "-b",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (ep, flags, rest) = parse_entrypoint_args(&args);
        assert_eq!(ep.as_deref(), Some("/tekton/scripts/script-0-abc"));
        assert_eq!(flags["on_error"], "continue");
        assert_eq!(rest, ["a", "-b"]);
    }

    #[test]
    fn step_without_script_or_command_fails_clearly() {
        let c = Container {
            name: "step-x".into(),
            command: Some(vec!["/tekton/bin/entrypoint".into()]),
            args: Some(vec![
                "-post_file".into(),
                "/tekton/run/0/out".into(),
                "--".into(),
            ]),
            ..Default::default()
        };
        let err = plan_step(&c, &HashMap::new()).unwrap_err().to_string();
        assert!(err.contains("neither script nor command"), "{err}");
    }
}
