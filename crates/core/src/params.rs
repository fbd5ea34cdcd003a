//! Reading a Mutex run's configuration: params, target and timeout.
//!
//! Pure: everything here turns a run's spec into a [`RunConfig`] or into an
//! actionable message for an `InvalidParams` failure. Nothing is silently ignored.

use crate::duration::parse_go_duration;
pub use crate::model::CancelMode;
use kube::Resource;
use std::time::Duration;
use tekton_mutex_api::mutex::{MAX_CAPACITY, Mutex, MutexSpec, Order, Supersede};
use tekton_mutex_api::tekton::{EmbeddedSpec, Param, TaskRef};

pub mod annotations;
pub mod keys;

/// One param a lock task accepts, and how its value is read.
pub struct ParamDef {
    pub name: &'static str,
    read: fn(&mut Reading, &str) -> Result<(), String>,
}

/// Every param a lock task accepts, in the order the README lists them: the one
/// definition the parser, its "unknown param" message and the metrics read.
pub const PARAMS: &[ParamDef] = &[
    ParamDef {
        name: "key",
        read: read_key,
    },
    ParamDef {
        name: "supersede",
        read: read_supersede,
    },
    ParamDef {
        name: "group",
        read: read_group,
    },
    ParamDef {
        name: "cancel-mode",
        read: read_cancel_mode,
    },
    ParamDef {
        name: "sequence",
        read: read_sequence,
    },
    ParamDef {
        name: "priority",
        read: read_priority,
    },
    ParamDef {
        name: "wait",
        read: read_wait,
    },
    ParamDef {
        name: crate::release_after::PARAM,
        read: read_release_after,
    },
    ParamDef {
        name: "keys",
        read: read_keys,
    },
];

/// The fields of a run's own spec that an `InvalidParams` message may name.
pub const RUN_SPEC_FIELDS: &[&str] = &["timeout", "retries"];

/// The params being read into a run's config, and the `key` param if given
/// (it is settled against the target once every param is read).
pub struct Reading<'a> {
    cfg: &'a mut RunConfig,
    key: Option<String>,
}

/// The wait limit of a standalone run that sets no timeout: what Tekton's own
/// `CustomRun.GetTimeout()` answers then (`apisconfig.DefaultTimeoutMinutes`).
pub const STANDALONE_DEFAULT_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// At most this many retries: each one keeps an entry in the run's `retriesStatus`.
pub const MAX_RETRIES: u32 = 100;

/// How long a run may wait, from its `spec.timeout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitLimit {
    /// No `spec.timeout`. Tekton sets one on a PipelineRun's CustomRun only when the
    /// pipeline task has a `timeout` or the PipelineRun's tasks timeout exceeds
    /// `default-timeout-minutes`; otherwise the PipelineRun's own timeouts end the wait.
    Unset,
    /// `0s`: wait forever.
    Never,
    After(Duration),
}
/// What a run points at: a Mutex object by name, an embedded spec, or just the kind.
#[derive(Clone, Debug, PartialEq)]
pub enum Target<'a> {
    Ref(&'a TaskRef),
    Spec(&'a EmbeddedSpec),
}

impl Target<'_> {
    /// Is this run ours? Runs of any other kind are never touched.
    pub fn is_mutex(&self) -> bool {
        let (api_version, kind) = match self {
            Target::Ref(r) => (&r.api_version, &r.kind),
            Target::Spec(s) => (&s.api_version, &s.kind),
        };
        *api_version == Mutex::api_version(&()) && *kind == Mutex::kind(&())
    }
}

/// A valid Mutex run's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct RunConfig {
    /// The Mutex object's name, within the run's namespace (the first of `keys`).
    pub key: String,
    /// Every key the run takes, all together: `key` alone unless the `keys` param is given.
    pub keys: Vec<String>,
    /// Spec for the Mutex object when this run has to create it.
    pub spec: MutexSpec,
    /// The fields an embedded spec sets: an existing Mutex must agree with each.
    pub spec_fields: SpecFields,
    pub supersede: Supersede,
    /// None: the PipelineRun's `tekton.dev/pipeline` label.
    pub group: Option<String>,
    pub cancel_mode: CancelMode,
    pub sequence: Option<i64>,
    pub priority: i64,
    pub wait: bool,
    pub timeout: WaitLimit,
    pub retries: u32,
    /// Pipeline tasks after which the slot goes free (`release-after`); empty: the whole PipelineRun.
    pub release_after: Vec<String>,
}

/// The fields of a Mutex spec that a run's embedded spec sets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SpecFields {
    #[serde(default)]
    pub capacity: Option<u32>,
    #[serde(default)]
    pub order: Option<Order>,
}

impl RunConfig {
    /// This config as one of its keys sees it: a run of several keys is judged
    /// by each key's Mutex under that key's own name.
    pub fn for_key(&self, key: &str) -> RunConfig {
        RunConfig {
            key: key.to_string(),
            ..self.clone()
        }
    }

    /// Why this run cannot use the key's existing Mutex: its embedded spec sets a
    /// field to another value. A field it does not set takes the Mutex's.
    pub fn spec_conflict(&self, existing: &MutexSpec) -> Option<String> {
        let differs = |field: &str, ours: String, theirs: String| {
            format!(
                "the embedded Mutex spec sets {field} {ours}, but Mutex {key} already has {field} {theirs}: \
                 make them equal, or drop {field} from the embedded spec to use the Mutex as it is",
                key = self.key
            )
        };
        let (ours, theirs) = (self.spec.key.as_deref(), existing.key.as_deref());
        if let Some(m) = crate::key_name::mismatch(&self.key, ours, theirs) {
            return Some(m);
        }
        let f = &self.spec_fields;
        if let Some(c) = f.capacity.filter(|c| *c != existing.lock.capacity) {
            return Some(differs(
                "capacity",
                c.to_string(),
                existing.lock.capacity.to_string(),
            ));
        }
        if let Some(o) = f.order.filter(|o| *o != existing.lock.order) {
            return Some(differs(
                "order",
                o.as_str().into(),
                existing.lock.order.as_str().into(),
            ));
        }
        None
    }
}

/// The raw spec fields a config is read from.
pub struct RunInput<'a> {
    pub namespace: &'a str,
    pub target: Target<'a>,
    pub params: &'a [Param],
    pub timeout: Option<&'a str>,
    pub retries: Option<i64>,
}

pub fn parse(input: &RunInput) -> Result<RunConfig, String> {
    let mut cfg = RunConfig {
        key: input.namespace.to_string(),
        keys: Vec::new(),
        spec: MutexSpec::default(),
        spec_fields: SpecFields::default(),
        supersede: Supersede::default(),
        group: None,
        cancel_mode: CancelMode::default(),
        sequence: None,
        priority: 0,
        wait: true,
        timeout: WaitLimit::Unset,
        retries: 0,
        release_after: Vec::new(),
    };
    let key_param = read_params(&mut cfg, input.params)?;
    read_target(&mut cfg, &input.target, key_param)?;
    read_run_spec(&mut cfg, input.timeout, input.retries)?;
    if cfg.keys.is_empty() {
        cfg.keys = vec![cfg.key.clone()];
    }
    Ok(cfg)
}

/// Every param, each at most once and a string. Returns the `key` param, if given.
fn read_params(cfg: &mut RunConfig, params: &[Param]) -> Result<Option<String>, String> {
    let mut reading = Reading { cfg, key: None };
    let mut seen = Vec::new();
    for p in params {
        if seen.contains(&p.name.as_str()) {
            return Err(format!("param {:?} is given more than once", p.name));
        }
        seen.push(p.name.as_str());
        let value = match &p.value {
            serde_json::Value::String(s) => s.as_str(),
            other => {
                return Err(format!(
                    "param {:?} must be a string, got {}",
                    p.name,
                    json_type(other)
                ));
            }
        };
        let Some(def) = PARAMS.iter().find(|d| d.name == p.name) else {
            let names: Vec<&str> = PARAMS.iter().map(|d| d.name).collect();
            return Err(format!(
                "unknown param {:?}: allowed params are {}",
                p.name,
                names.join(", ")
            ));
        };
        (def.read)(&mut reading, value)?;
    }
    Ok(reading.key)
}

/// Keys are exact bytes once surrounding whitespace is trimmed: a key read
/// from a task result written with `echo` ends in a newline, and must name
/// the same lock as the key typed by hand.
fn read_key(r: &mut Reading, value: &str) -> Result<(), String> {
    r.key = Some(value.trim().to_string());
    Ok(())
}

/// The largest `sequence`: build numbers never get near it, and a larger one
/// would mark its supersede group so high that every later run were stale.
pub const MAX_SEQUENCE: i64 = 1 << 53;

fn read_sequence(r: &mut Reading, value: &str) -> Result<(), String> {
    let sequence = parse_int("sequence", value)?;
    if sequence > MAX_SEQUENCE {
        return Err(format!(
            "param \"sequence\" is {sequence}: a sequence is a build number, at most 2^53 \
             ({MAX_SEQUENCE}); a larger one would make every later run of its group stale"
        ));
    }
    r.cfg.sequence = Some(sequence);
    Ok(())
}

fn read_priority(r: &mut Reading, value: &str) -> Result<(), String> {
    r.cfg.priority = parse_int("priority", value)?;
    Ok(())
}

fn read_release_after(r: &mut Reading, value: &str) -> Result<(), String> {
    r.cfg.release_after = crate::release_after::parse(value)?;
    Ok(())
}

fn read_keys(r: &mut Reading, value: &str) -> Result<(), String> {
    r.cfg.keys = keys::parse(value)?;
    Ok(())
}

fn read_supersede(r: &mut Reading, value: &str) -> Result<(), String> {
    r.cfg.supersede = match value {
        "pending" => Supersede::Pending,
        "none" => Supersede::None,
        "running" => Supersede::Running,
        _ => {
            return Err(invalid_choice(
                "supersede",
                value,
                &["pending", "none", "running"],
            ));
        }
    };
    Ok(())
}

fn read_group(r: &mut Reading, value: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > 253 {
        return Err(format!(
            "param \"group\" must be 1 to 253 characters, got {value:?}"
        ));
    }
    r.cfg.group = Some(value.to_string());
    Ok(())
}

fn read_cancel_mode(r: &mut Reading, value: &str) -> Result<(), String> {
    r.cfg.cancel_mode = match value {
        "CancelledRunFinally" => CancelMode::CancelledRunFinally,
        "Cancelled" => CancelMode::Cancelled,
        "StoppedRunFinally" => CancelMode::StoppedRunFinally,
        _ => {
            let allowed = ["CancelledRunFinally", "Cancelled", "StoppedRunFinally"];
            return Err(invalid_choice("cancel-mode", value, &allowed));
        }
    };
    Ok(())
}

fn read_wait(r: &mut Reading, value: &str) -> Result<(), String> {
    r.cfg.wait = match value {
        "true" => true,
        "false" => false,
        _ => return Err(invalid_choice("wait", value, &["true", "false"])),
    };
    Ok(())
}

/// The key (the referenced object's name, else the `key` param, else the
/// namespace) and, for an embedded spec, the spec a new Mutex gets.
fn read_target(
    cfg: &mut RunConfig,
    target: &Target,
    mut key_param: Option<String>,
) -> Result<(), String> {
    match target {
        Target::Ref(r) => {
            if let Some(name) = r.name.as_deref().filter(|n| !n.is_empty()) {
                if let Some(k) = key_param.as_deref().filter(|k| *k != name) {
                    return Err(format!(
                        "param \"key\" ({k:?}) conflicts with the Mutex object named in the task reference ({name:?}): \
                         the object's name is the key, so drop the param or make them equal"
                    ));
                }
                key_param = Some(name.to_string());
            }
        }
        Target::Spec(s) => {
            if let Some(spec) = &s.spec {
                cfg.spec_fields = parse_embedded_spec(spec)?;
                cfg.spec = cfg.spec_fields.apply_to(MutexSpec::default());
            }
        }
    }
    if !cfg.keys.is_empty() {
        return settle_keys(cfg, key_param);
    }
    // Free-form keys map to an object name; the Mutex keeps the key itself.
    if let Some(k) = key_param {
        cfg.key = crate::key_name::object_name(&k)?;
        cfg.spec.key = Some(k);
    } else {
        cfg.spec.key = Some(cfg.key.clone());
    }
    Ok(())
}

/// The run's own `timeout` and `retries`.
fn read_run_spec(
    cfg: &mut RunConfig,
    timeout: Option<&str>,
    retries: Option<i64>,
) -> Result<(), String> {
    if let Some(t) = timeout {
        let d = parse_go_duration(t)
            .map_err(|e| format!("spec.timeout {t:?} is not a duration: {e}"))?;
        cfg.timeout = if d.is_zero() {
            WaitLimit::Never
        } else {
            WaitLimit::After(d)
        };
    }
    if let Some(r) = retries {
        cfg.retries = u32::try_from(r)
            .ok()
            .filter(|r| *r <= MAX_RETRIES)
            .ok_or_else(|| format!("spec.retries must be 0 to {MAX_RETRIES}, got {r}"))?;
    }
    Ok(())
}

fn parse_embedded_spec(spec: &serde_json::Value) -> Result<SpecFields, String> {
    let fields: SpecFields = serde_json::from_value(spec.clone()).map_err(|e| {
        format!("customSpec.spec is not a Mutex spec ({e}): allowed fields are capacity (integer 1 to {MAX_CAPACITY}) and order (oldest-first or newest-first)")
    })?;
    if let Some(c) = fields.capacity.filter(|c| !(1..=MAX_CAPACITY).contains(c)) {
        return Err(format!(
            "customSpec.spec.capacity must be 1 to {MAX_CAPACITY}, got {c}"
        ));
    }
    Ok(fields)
}

impl SpecFields {
    fn apply_to(self, mut spec: MutexSpec) -> MutexSpec {
        spec.lock.capacity = self.capacity.unwrap_or(spec.lock.capacity);
        spec.lock.order = self.order.unwrap_or(spec.lock.order);
        spec
    }
}

fn parse_int(name: &str, value: &str) -> Result<i64, String> {
    value
        .trim()
        .parse::<i64>()
        .map_err(|_| format!("param {name:?} must be an integer, got {value:?}"))
}

fn invalid_choice(name: &str, value: &str, allowed: &[&str]) -> String {
    format!(
        "param {name:?} has invalid value {value:?}: allowed values are {}",
        allowed.join(", ")
    )
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
    }
}

/// After every param is read: `keys` stands alone, and its first key is `key`.
/// `key_given` is the `key` param or the Mutex named in the task reference.
fn settle_keys(cfg: &mut RunConfig, key_given: Option<String>) -> Result<(), String> {
    if let Some(k) = key_given {
        return Err(format!(
            "param \"keys\" and a single key ({k:?}, from param \"key\" or the Mutex named in the task reference) are both given: \
             use \"keys\" alone (its first key is the run's `token`), or \"key\" alone"
        ));
    }
    if cfg.keys.len() > 1 && !cfg.wait {
        return Err(
            "param \"wait\" is \"false\" with several keys: a run that takes several keys waits until it has them all; \
             drop \"wait\", or take one key"
                .into(),
        );
    }
    cfg.key = cfg.keys[0].clone();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tekton_mutex_api::mutex::LockSpec;

    fn mutex_ref(name: Option<&str>) -> TaskRef {
        TaskRef {
            api_version: Mutex::api_version(&()).into(),
            kind: Mutex::kind(&()).into(),
            name: name.map(Into::into),
        }
    }

    fn parse_with(params: &[(&str, serde_json::Value)], r: &TaskRef) -> Result<RunConfig, String> {
        let params: Vec<Param> = params
            .iter()
            .map(|(n, v)| Param {
                name: n.to_string(),
                value: v.clone(),
            })
            .collect();
        parse(&RunInput {
            namespace: "jx-staging",
            target: Target::Ref(r),
            params: &params,
            timeout: None,
            retries: None,
        })
    }

    #[test]
    fn a_key_is_trimmed_so_echoed_results_name_the_same_lock() {
        let by_hand = parse_with(&[("key", json!("jx-staging"))], &mutex_ref(None)).unwrap();
        for echoed in ["jx-staging\n", "  jx-staging\t"] {
            let cfg = parse_with(&[("key", json!(echoed))], &mutex_ref(None)).unwrap();
            assert_eq!(
                (&cfg.key, &cfg.spec.key),
                (&by_hand.key, &by_hand.spec.key),
                "{echoed:?}"
            );
        }
        let blank = parse_with(&[("key", json!(" \n"))], &mutex_ref(None)).unwrap_err();
        assert!(blank.contains("key is empty"), "{blank}");
    }

    #[test]
    fn a_sequence_above_2_pow_53_is_invalid() {
        let ok = parse_with(&[("sequence", json!("9007199254740992"))], &mutex_ref(None));
        assert_eq!(ok.unwrap().sequence, Some(MAX_SEQUENCE));
        let err = parse_with(
            &[("sequence", json!("9223372036854775807"))],
            &mutex_ref(None),
        )
        .unwrap_err();
        assert!(
            err.starts_with("param \"sequence\"") && err.contains("2^53"),
            "{err}"
        );
    }

    /// A bad value of each param, and the param its message must name.
    const BAD_VALUES: &[(&str, &str)] = &[
        ("key", ""),
        ("supersede", "sometimes"),
        ("group", ""),
        ("cancel-mode", "Stop"),
        ("sequence", "seven"),
        ("priority", "high"),
        ("wait", "maybe"),
        ("release-after", ""),
        ("keys", "a,,b"),
    ];

    /// The param table is the one list: every param has a bad-value case here,
    /// its message starts with its name (what the metrics count by), and the
    /// README's Params table documents it.
    #[test]
    fn every_param_is_parsed_named_in_its_errors_and_documented() {
        let names: Vec<&str> = PARAMS.iter().map(|d| d.name).collect();
        let cased: Vec<&str> = BAD_VALUES.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names, cased,
            "a param without a bad-value case (or one too many)"
        );
        let readme = include_str!("../../../README.md");
        for (name, bad) in BAD_VALUES {
            let err = parse_with(&[(name, json!(bad))], &mutex_ref(None)).unwrap_err();
            let named = err.starts_with(&format!("param \"{name}\"")) || err.starts_with("key ");
            assert!(named, "{name}: {err}");
            assert!(
                readme.contains(&format!("| `{name}` |")),
                "README lists no param {name}"
            );
        }
    }

    #[test]
    fn defaults_key_to_namespace() {
        let cfg = parse_with(&[], &mutex_ref(None)).unwrap();
        assert_eq!(cfg.key, "jx-staging");
        assert_eq!(cfg.supersede, Supersede::Pending);
        assert_eq!(cfg.cancel_mode, CancelMode::CancelledRunFinally);
        assert!(cfg.wait);
        assert_eq!(cfg.timeout, WaitLimit::Unset);
    }

    #[test]
    fn object_name_wins_over_namespace_and_param_must_agree() {
        assert_eq!(
            parse_with(&[], &mutex_ref(Some("prod"))).unwrap().key,
            "prod"
        );
        assert_eq!(
            parse_with(&[("key", json!("prod"))], &mutex_ref(Some("prod")))
                .unwrap()
                .key,
            "prod"
        );
        let err = parse_with(&[("key", json!("other"))], &mutex_ref(Some("prod"))).unwrap_err();
        assert!(err.contains("conflicts"), "{err}");
        assert_eq!(
            parse_with(&[("key", json!("env-a"))], &mutex_ref(None))
                .unwrap()
                .key,
            "env-a"
        );
    }

    #[test]
    fn rejects_bad_input_with_allowed_values() {
        let cases: &[(&[(&str, serde_json::Value)], &str)] = &[
            (
                &[("colour", json!("red"))],
                "allowed params are key, supersede",
            ),
            (&[("key", json!(["a"]))], "must be a string, got an array"),
            (
                &[("key", json!({"a": 1}))],
                "must be a string, got an object",
            ),
            (&[("key", json!(""))], "key is empty"),
            (&[("key", json!("k".repeat(1025)))], "at most 1024 bytes"),
            (
                &[("supersede", json!("all"))],
                "allowed values are pending, none, running",
            ),
            (
                &[("cancel-mode", json!("Stop"))],
                "allowed values are CancelledRunFinally, Cancelled, StoppedRunFinally",
            ),
            (
                &[("sequence", json!("12a"))],
                "\"sequence\" must be an integer",
            ),
            (
                &[("priority", json!("high"))],
                "\"priority\" must be an integer",
            ),
            (&[("wait", json!("yes"))], "allowed values are true, false"),
            (&[("group", json!(""))], "\"group\" must be 1 to 253"),
            (
                &[("key", json!("a")), ("key", json!("b"))],
                "more than once",
            ),
        ];
        for (params, want) in cases {
            let err = parse_with(params, &mutex_ref(None)).unwrap_err();
            assert!(
                err.contains(want),
                "params {params:?}: {err:?} does not mention {want:?}"
            );
        }
    }

    #[test]
    fn reads_every_policy_param() {
        let cfg = parse_with(
            &[
                ("supersede", json!("running")),
                ("group", json!("envs")),
                ("cancel-mode", json!("StoppedRunFinally")),
                ("sequence", json!("81")),
                ("priority", json!("-3")),
                ("wait", json!("false")),
            ],
            &mutex_ref(None),
        )
        .unwrap();
        assert_eq!(cfg.supersede, Supersede::Running);
        assert_eq!(cfg.group.as_deref(), Some("envs"));
        assert_eq!(cfg.cancel_mode, CancelMode::StoppedRunFinally);
        assert_eq!(cfg.sequence, Some(81));
        assert_eq!(cfg.priority, -3);
        assert!(!cfg.wait);
    }

    #[test]
    fn timeout_and_embedded_spec() {
        let spec = EmbeddedSpec {
            api_version: Mutex::api_version(&()).into(),
            kind: Mutex::kind(&()).into(),
            spec: Some(json!({"capacity": 2})),
        };
        let input = RunInput {
            namespace: "ns",
            target: Target::Spec(&spec),
            params: &[],
            timeout: Some("0s"),
            retries: Some(2),
        };
        let cfg = parse(&input).unwrap();
        assert_eq!(cfg.spec.lock.capacity, 2);
        assert_eq!(cfg.timeout, WaitLimit::Never);
        assert_eq!(cfg.retries, 2);

        let bad = EmbeddedSpec {
            spec: Some(json!({"capacty": 2})),
            ..spec.clone()
        };
        let err = parse(&RunInput {
            target: Target::Spec(&bad),
            ..input
        })
        .unwrap_err();
        assert!(err.contains("allowed fields are capacity"), "{err}");
        for (capacity, want) in [
            (json!(0), "must be 1 to 10000, got 0"),
            (json!(10_001), "must be 1 to 10000, got 10001"),
            (
                json!(5_000_000_000u64),
                "allowed fields are capacity (integer 1 to 10000)",
            ),
        ] {
            let huge = EmbeddedSpec {
                spec: Some(json!({"capacity": capacity})),
                ..spec.clone()
            };
            let err = parse(&RunInput {
                target: Target::Spec(&huge),
                ..input
            })
            .unwrap_err();
            assert!(err.contains(want), "{err}");
        }
        let input = RunInput {
            namespace: "ns",
            target: Target::Spec(&spec),
            params: &[],
            timeout: Some("soon"),
            retries: None,
        };
        assert!(parse(&input).unwrap_err().contains("spec.timeout"));
    }

    #[test]
    fn an_embedded_spec_must_agree_with_the_existing_mutex() {
        let embedded = |spec: serde_json::Value| {
            let s = EmbeddedSpec {
                api_version: Mutex::api_version(&()).into(),
                kind: Mutex::kind(&()).into(),
                spec: Some(spec),
            };
            let input = RunInput {
                namespace: "jx-staging",
                target: Target::Spec(&s),
                params: &[],
                timeout: None,
                retries: None,
            };
            parse(&input).unwrap()
        };
        let existing = MutexSpec {
            lock: LockSpec {
                capacity: 2,
                order: Order::OldestFirst,
                ..LockSpec::default()
            },
            ..MutexSpec::default()
        };
        let err = embedded(json!({"capacity": 3}))
            .spec_conflict(&existing)
            .unwrap();
        assert!(
            err.contains("sets capacity 3, but Mutex jx-staging already has capacity 2"),
            "{err}"
        );
        let err = embedded(json!({"capacity": 2, "order": "newest-first"}))
            .spec_conflict(&existing)
            .unwrap();
        assert!(err.contains("order newest-first"), "{err}");
        assert_eq!(
            embedded(json!({"capacity": 2})).spec_conflict(&existing),
            None
        );
        assert_eq!(
            embedded(json!({})).spec_conflict(&existing),
            None,
            "a field not set takes the Mutex's"
        );
        let by_ref = parse_with(&[], &mutex_ref(Some("jx-staging"))).unwrap();
        assert_eq!(by_ref.spec_conflict(&existing), None);
    }

    #[test]
    fn retries_are_bounded() {
        let r = mutex_ref(None);
        let with_retries = |retries| {
            parse(&RunInput {
                namespace: "ns",
                target: Target::Ref(&r),
                params: &[],
                timeout: None,
                retries: Some(retries),
            })
        };
        assert_eq!(with_retries(100).unwrap().retries, 100);
        for bad in [101, -1, i64::MAX] {
            let err = with_retries(bad).unwrap_err();
            assert!(err.contains("spec.retries must be 0 to 100"), "{err}");
        }
    }

    #[test]
    fn only_mutex_targets_are_ours() {
        assert!(Target::Ref(&mutex_ref(None)).is_mutex());
        let other = TaskRef {
            api_version: "example.dev/v1".into(),
            kind: "Wait".into(),
            name: None,
        };
        assert!(!Target::Ref(&other).is_mutex());
    }

    proptest::proptest! {
        /// Whatever a user writes, parsing answers with a config or a message: never a panic.
        #[test]
        fn parsing_never_panics(
            name in proptest::sample::select(vec!["key", "supersede", "group", "cancel-mode", "sequence", "priority", "wait", "other"]),
            value in ".{0,300}",
            timeout in proptest::option::of(".{0,30}"),
            retries in proptest::option::of(proptest::num::i64::ANY),
        ) {
            let params = vec![Param { name: name.to_string(), value: json!(value) }];
            let r = mutex_ref(None);
            let _ = parse(&RunInput { namespace: "ns", target: Target::Ref(&r), params: &params, timeout: timeout.as_deref(), retries });
        }
    }
}
