//! The `keys` param: several keys taken all together (see `decide::multi_key`).

use crate::key_name::validate as validate_key;
use tekton_mutex_api::mutex::Order;

/// The most keys one run may take.
pub const MAX_KEYS: usize = 16;

/// `keys`: comma-separated Mutex names, each once, none empty.
pub fn parse(value: &str) -> Result<Vec<String>, String> {
    let mut keys: Vec<String> = Vec::new();
    for k in value.split(',').map(str::trim) {
        if k.is_empty() {
            return Err(format!(
                "param \"keys\" ({value:?}) has an empty entry: list Mutex names separated by commas, e.g. \"staging,db\""
            ));
        }
        validate_key(k)?;
        if keys.iter().any(|x| x == k) {
            return Err(format!(
                "param \"keys\" ({value:?}) lists {k:?} twice: list each key once"
            ));
        }
        keys.push(k.to_string());
    }
    if keys.len() > MAX_KEYS {
        return Err(format!(
            "param \"keys\" lists {} keys: a run may take at most {MAX_KEYS}",
            keys.len()
        ));
    }
    Ok(keys)
}

/// Why the locks of one run's `keys` cannot serve it together: they rank
/// waiters in different orders (every key must rank alike, or two runs could
/// each be first on one key). `locks` are (name, order), `kind` names them.
pub fn orders_differ<'a>(
    kind: &str,
    locks: impl IntoIterator<Item = (&'a str, Order)>,
) -> Option<String> {
    let mut locks = locks.into_iter();
    let (first, order) = locks.next()?;
    let (other, theirs) = locks.find(|(_, o)| *o != order)?;
    Some(format!(
        "the keys of param \"keys\" must share one order: {kind} {first} has order {}, but {kind} {other} has order {}; \
         set the same spec.order on both",
        order.as_str(),
        theirs.as_str()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{RunConfig, RunInput, Target};
    use kube::Resource;
    use tekton_mutex_api::mutex::Mutex;
    use tekton_mutex_api::tekton::{Param, TaskRef};

    fn config(params: &[(&str, &str)], name: Option<&str>) -> Result<RunConfig, String> {
        let params: Vec<Param> = params
            .iter()
            .map(|(n, v)| Param {
                name: n.to_string(),
                value: serde_json::json!(v),
            })
            .collect();
        let r = TaskRef {
            api_version: Mutex::api_version(&()).into(),
            kind: Mutex::kind(&()).into(),
            name: name.map(Into::into),
        };
        crate::params::parse(&RunInput {
            namespace: "ns",
            target: Target::Ref(&r),
            params: &params,
            timeout: None,
            retries: None,
        })
    }

    #[test]
    fn keys_stand_alone_and_the_first_is_the_key() {
        let cfg = config(&[("keys", "b,a")], None).unwrap();
        assert_eq!(
            (cfg.key.as_str(), cfg.keys),
            ("b", vec!["b".into(), "a".into()])
        );
        assert_eq!(config(&[("key", "x")], None).unwrap().keys, ["x"]);
        assert_eq!(
            config(&[], None).unwrap().keys,
            ["ns"],
            "the namespace's key"
        );
        for (params, name) in [
            (&[("keys", "a,b"), ("key", "a")][..], None),
            (&[("keys", "a,b")][..], Some("a")),
        ] {
            let err = config(params, name).unwrap_err();
            assert!(err.contains("use \"keys\" alone"), "{err}");
        }
        let err = config(&[("wait", "false"), ("keys", "a,b")], None).unwrap_err();
        assert!(err.contains("waits until it has them all"), "{err}");
        assert!(config(&[("wait", "false"), ("keys", "a")], None).is_ok());
    }

    #[test]
    fn several_keys_each_once() {
        assert_eq!(parse("a,b").unwrap(), ["a", "b"]);
        assert_eq!(
            parse(" b , a ").unwrap(),
            ["b", "a"],
            "order kept, spaces trimmed"
        );
        for (bad, want) in [
            ("a,,b", "empty entry"),
            ("", "empty entry"),
            ("a,", "empty entry"),
            ("a,b,a", "lists \"a\" twice"),
            ("a,B", "not a valid name"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(want), "{bad:?}: {err}");
        }
        let many: Vec<String> = (0..=MAX_KEYS).map(|i| format!("k{i}")).collect();
        assert!(parse(&many.join(",")).unwrap_err().contains("at most 16"));
    }
}
