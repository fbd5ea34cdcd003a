//! Free-form keys: whatever string a pipeline already has (a repo URL,
//! `$(params.repo)-pr-$(params.pr)`) names exactly one Mutex object.
//!
//! Pure. A key that is a valid object name is its own name. Any other key is
//! mapped to a readable prefix plus a short hash of the whole string, e.g.
//! `https://github.com/org/repo@main` becomes `github-com-org-repo-main-3f9a1c2b`.
//! The hash keeps keys with the same prefix apart; the Mutex keeps the original
//! string in `spec.key`, so a hash collision (or a key that spells another
//! key's mapped name) is refused by [`mismatch`] instead of sharing the lock.

use sha2::{Digest, Sha256};

/// The longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// The readable part of a mapped name, at most (the name stays a valid label too).
const PREFIX_MAX: usize = 54;
/// Hex digits of the SHA-256 of the key that end a mapped name.
const HASH_HEX: usize = 8;

/// The Mutex object name for a key, or the message for an `InvalidParams` failure.
pub fn object_name(key: &str) -> Result<String, String> {
    if key.is_empty() {
        return Err("key is empty: give a non-empty key (any string up to 1024 bytes)".into());
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "key is {} bytes long: a key may have at most {MAX_KEY_BYTES} bytes",
            key.len()
        ));
    }
    if is_object_name(key) {
        return Ok(key.to_string());
    }
    Ok(mapped(key))
}

/// Is this a valid Kubernetes object name (a DNS-1123 subdomain)?
pub fn is_object_name(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Readable prefix (lowercase letters and digits, every other run of
/// characters one '-', a URL scheme dropped) and the key's hash.
fn mapped(key: &str) -> String {
    let rest = key.split_once("://").map_or(key, |(_, rest)| rest);
    let mut prefix = String::with_capacity(PREFIX_MAX);
    for c in rest.chars().map(|c| c.to_ascii_lowercase()) {
        if prefix.len() >= PREFIX_MAX {
            break;
        }
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            prefix.push(c);
        } else if !prefix.is_empty() && !prefix.ends_with('-') {
            prefix.push('-');
        }
    }
    let prefix = prefix.trim_end_matches('-');
    let prefix = if prefix.is_empty() { "key" } else { prefix };
    format!("{prefix}-{}", short_hash(key))
}

fn short_hash(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex[..HASH_HEX].to_string()
}

/// Why a run whose key is `ours` cannot use the existing Mutex `name` whose
/// `spec.key` is `theirs`: two different keys never share a Mutex. A Mutex
/// without `spec.key` (created by hand, or before keys were kept) belongs to
/// the key that is its name.
pub fn mismatch(name: &str, ours: Option<&str>, theirs: Option<&str>) -> Option<String> {
    let ours = ours.unwrap_or(name);
    let theirs = theirs.unwrap_or(name);
    (ours != theirs).then(|| {
        format!(
            "key {ours:?} maps to Mutex {name}, which already belongs to key {theirs:?}: \
             two keys never share a Mutex, so change this key (for example add a suffix), \
             or delete Mutex {name} once nothing holds or waits for it"
        )
    })
}

/// A key names a Mutex object, so it must be a valid Kubernetes object name
/// (a DNS-1123 subdomain).
pub fn validate(key: &str) -> Result<(), String> {
    if is_object_name(key) {
        Ok(())
    } else {
        Err(format!(
            "key {key:?} is not a valid name: use at most 253 lowercase letters, digits, '-' or '.', \
             starting and ending with a letter or digit (it names a Mutex object)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn valid_names_stay_as_they_are() {
        for key in ["prod", "jx-staging", "a.b-c", "0"] {
            assert_eq!(object_name(key).unwrap(), key);
        }
    }

    #[test]
    fn a_repo_url_gets_a_readable_prefix_and_a_hash() {
        let name = object_name("https://github.com/org/repo@main").unwrap();
        let (prefix, hash) = name.rsplit_once('-').unwrap();
        assert_eq!(prefix, "github-com-org-repo-main");
        assert_eq!(hash.len(), HASH_HEX);
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(
            object_name("Prod").unwrap().split_once('-').unwrap().0,
            "prod"
        );
        assert!(object_name("___").unwrap().starts_with("key-"));
    }

    #[test]
    fn same_prefix_different_names() {
        let a = object_name("https://github.com/org/repo@main").unwrap();
        let b = object_name("http://github.com/org/repo@main").unwrap();
        let c = object_name("https://github.com/org/repo/main").unwrap();
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(b, c);
    }

    #[test]
    fn empty_and_too_long_keys_are_refused() {
        assert!(object_name("").unwrap_err().contains("key is empty"));
        let long = "x".repeat(MAX_KEY_BYTES + 1);
        assert!(
            object_name(&long)
                .unwrap_err()
                .contains("at most 1024 bytes")
        );
        assert!(object_name(&"é".repeat(MAX_KEY_BYTES / 2)).is_ok());
        assert!(object_name(&"é".repeat(MAX_KEY_BYTES / 2 + 1)).is_err());
    }

    #[test]
    fn a_mutex_belongs_to_one_key() {
        assert_eq!(mismatch("prod", None, None), None);
        assert_eq!(mismatch("prod", Some("prod"), None), None);
        let name = object_name("Prod").unwrap();
        assert_eq!(mismatch(&name, Some("Prod"), Some("Prod")), None);
        let err = mismatch(&name, Some(&name), Some("Prod")).unwrap();
        assert!(err.contains("already belongs to key \"Prod\""), "{err}");
        assert!(mismatch(&name, Some("Prod"), None).is_some());
    }

    proptest! {
        /// Every accepted key names a valid object, at most 63 characters
        /// unless it was already a valid name.
        #[test]
        fn every_key_maps_to_a_valid_name(key in ".{1,300}") {
            let name = object_name(&key).unwrap();
            prop_assert!(is_object_name(&name), "{name:?}");
            prop_assert!(name == key || name.len() <= PREFIX_MAX + 1 + HASH_HEX);
        }

        /// Valid names map to themselves; nothing else does.
        #[test]
        fn only_valid_names_are_kept(key in "[a-z0-9.-]{1,80}") {
            let name = object_name(&key).unwrap();
            prop_assert_eq!(name == key, is_object_name(&key));
        }

        /// Two keys that share the readable prefix still get different names.
        #[test]
        fn keys_that_share_a_prefix_get_different_names(
            base in "[A-Za-z0-9:/@._-]{60,80}",
            a in "[a-z]{1,8}",
            b in "[a-z]{1,8}",
        ) {
            prop_assume!(a != b);
            let ka = format!("{base}/{a}");
            let kb = format!("{base}/{b}");
            let (na, nb) = (object_name(&ka).unwrap(), object_name(&kb).unwrap());
            prop_assert_ne!(na, nb);
        }

        #[test]
        fn mapping_is_deterministic(key in ".{1,100}") {
            prop_assert_eq!(object_name(&key), object_name(&key));
        }
    }
}

#[cfg(test)]
mod run_tests {
    use crate::params::{RunInput, Target, parse};
    use kube::Resource;
    use tekton_mutex_api::mutex::{Mutex, MutexSpec};
    use tekton_mutex_api::tekton::{Param, TaskRef};

    fn config(key: &str) -> crate::params::RunConfig {
        let r = TaskRef {
            api_version: Mutex::api_version(&()).into(),
            kind: Mutex::kind(&()).into(),
            name: None,
        };
        let params = [Param {
            name: "key".into(),
            value: serde_json::json!(key),
        }];
        parse(&RunInput {
            namespace: "ns",
            target: Target::Ref(&r),
            params: &params,
            timeout: None,
            retries: None,
        })
        .unwrap()
    }

    #[test]
    fn a_run_keeps_its_key_on_the_mutex_it_creates() {
        let url = "https://github.com/org/repo@main";
        let cfg = config(url);
        assert!(
            cfg.key.starts_with("github-com-org-repo-main-"),
            "{}",
            cfg.key
        );
        assert_eq!(cfg.spec.key.as_deref(), Some(url));
        assert_eq!(config("prod").spec.key.as_deref(), Some("prod"));
    }

    #[test]
    fn a_run_refuses_a_mutex_of_another_key() {
        let cfg = config("Prod");
        let theirs = MutexSpec {
            key: Some("prod!".into()),
            ..MutexSpec::default()
        };
        let err = cfg.spec_conflict(&theirs).unwrap();
        assert!(err.contains("already belongs to key \"prod!\""), "{err}");
        let ours = MutexSpec {
            key: Some("Prod".into()),
            ..MutexSpec::default()
        };
        assert_eq!(cfg.spec_conflict(&ours), None);
        // A hand-made Mutex without spec.key belongs to the key that is its name.
        let literal = config(&cfg.key);
        assert_eq!(literal.spec_conflict(&MutexSpec::default()), None);
        assert!(literal.spec_conflict(&ours).is_some());
    }
}
