#!/usr/bin/env python3
"""Steps as admin, for the real-kubelet lane (TEKTON_MUTEX_KUBELET=real).

On the pod-runner, a step's kubectl uses the admin kubeconfig. With a real kubelet it uses its pod's
ServiceAccount, Tekton's `default` in the pod's namespace. This watches namespaces and binds
`cluster-admin` to each namespace's `default` ServiceAccount (one ClusterRoleBinding per namespace,
owned by the Namespace, so that the garbage collector removes it with the namespace). Other
ServiceAccounts keep exactly the rights RBAC gives them (tests use some as restricted users).

    step-rbac.py --kubectl KUBECTL --kubeconfig KUBECONFIG
"""
import argparse
import json
import subprocess
import sys
import time

PREFIX = "tekton-mutex-steps-"


def binding(ns, uid):
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": PREFIX + ns,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": ns, "uid": uid}],
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}],
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kubectl", required=True)
    p.add_argument("--kubeconfig", required=True)
    args = p.parse_args()
    kc = [args.kubectl, "--kubeconfig", args.kubeconfig]
    done = set()
    print("watching namespaces", flush=True)
    while True:
        watch = subprocess.Popen(
            kc + ["get", "namespaces", "--watch", "-o",
                  "jsonpath={.metadata.name} {.metadata.uid} {.status.phase}{\"\\n\"}"],
            stdout=subprocess.PIPE, text=True)
        for line in watch.stdout:
            fields = line.split()
            if len(fields) != 3 or fields[2] != "Active" or fields[1] in done:
                continue
            ns, uid = fields[0], fields[1]
            r = subprocess.run(kc + ["apply", "-f", "-"], input=json.dumps(binding(ns, uid)),
                               text=True, capture_output=True)
            if r.returncode == 0:
                done.add(uid)
                print(f"bound {ns}/default to cluster-admin", flush=True)
            else:
                print(f"binding {ns}/default failed: {r.stderr.strip()}", file=sys.stderr, flush=True)
        watch.wait()
        time.sleep(1)  # the watch ended (apiserver restart, timeout): start a new one


if __name__ == "__main__":
    main()
