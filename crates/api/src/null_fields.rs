//! A null in a lock's spec means what leaving the field out means. YAML stores `selector:` with
//! its parts commented out as `selector: null`; were the field nullable, the object would keep
//! the null, and the controller (serde: no selector) and the admission policy's CEL (`has()`:
//! a selector) would read two things. A field that is not nullable has its null dropped by the
//! API server as the object is stored, so every reader sees the field left out.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

/// `crd` with no field of `spec`, at any depth, nullable (the status, written by the
/// controller alone, is left as it is).
pub fn spec_not_nullable(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let mut value = serde_json::to_value(crd).expect("a CRD always serializes");
    let versions = value["spec"]["versions"]
        .as_array_mut()
        .into_iter()
        .flatten();
    for version in versions {
        let spec = &mut version["schema"]["openAPIV3Schema"]["properties"]["spec"];
        drop_nullable(spec);
    }
    serde_json::from_value(value).expect("only nullable flags were dropped")
}

fn drop_nullable(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("nullable");
            map.values_mut().for_each(drop_nullable);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nullable),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    fn nullable_paths(v: &Value, path: &str, out: &mut Vec<String>) {
        if let Value::Object(map) = v {
            if map.get("nullable") == Some(&Value::Bool(true)) {
                out.push(path.to_string());
            }
            for (k, child) in map {
                nullable_paths(child, &format!("{path}.{k}"), out);
            }
        }
    }

    #[test]
    fn no_spec_field_of_either_lock_is_nullable_and_the_status_is_untouched() {
        for crd in [
            crate::mutex::Mutex::crd(),
            crate::cluster_mutex::ClusterMutex::crd(),
        ] {
            let before = serde_json::to_value(&crd).unwrap();
            let after = serde_json::to_value(spec_not_nullable(crd)).unwrap();
            let schema = |v: &Value, part: &str| {
                v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][part].clone()
            };
            let mut spec_nulls = Vec::new();
            nullable_paths(&schema(&before, "spec"), "spec", &mut spec_nulls);
            assert!(
                spec_nulls.iter().any(|p| p.contains("selector")),
                "{spec_nulls:?}"
            );
            spec_nulls.clear();
            nullable_paths(&schema(&after, "spec"), "spec", &mut spec_nulls);
            assert_eq!(spec_nulls, Vec::<String>::new());
            assert_eq!(schema(&before, "status"), schema(&after, "status"));
        }
    }
}
