#!/usr/bin/env python3
"""Step output where the pod-runner lane keeps it, for the real-kubelet lane (TEKTON_MUTEX_KUBELET=real).

The pod-runner writes each step's output to <cluster>/pods/<namespace>/<pod>/<container>.log, and the
demo's report and some tests read it there. The kubelet writes container logs in the CRI format
(`<time> <stream> <P|F> <text>`) to <cluster>/pod-logs/<namespace>_<pod>_<uid>/<container>/<n>.log.
This follows those files (polling) and appends the plain text to the pod-runner's paths, so both
lanes offer the same files. `kubectl logs` reads the kubelet's files, not these.

    step-logs.py --from <cluster>/pod-logs --to <cluster>/pods
"""
import argparse
import os
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--from", dest="src", required=True)
    p.add_argument("--to", dest="dst", required=True)
    p.add_argument("--interval", type=float, default=0.1)
    args = p.parse_args()
    offsets = {}  # source file -> bytes consumed (complete lines only)
    print(f"following {args.src} into {args.dst}", flush=True)
    while True:
        seen = set()
        try:
            pods = os.listdir(args.src)
        except FileNotFoundError:
            pods = []
        for pod_dir in pods:
            parts = pod_dir.split("_")
            if len(parts) != 3:
                continue
            ns, pod, _uid = parts
            base = os.path.join(args.src, pod_dir)
            try:
                containers = os.listdir(base)
            except OSError:
                continue
            for container in containers:
                cdir = os.path.join(base, container)
                try:
                    files = sorted(f for f in os.listdir(cdir) if f.endswith(".log"))
                except OSError:
                    continue
                for name in files:
                    src = os.path.join(cdir, name)
                    seen.add(src)
                    try:
                        with open(src, "rb") as f:
                            f.seek(offsets.get(src, 0))
                            data = f.read()
                    except OSError:
                        continue
                    end = data.rfind(b"\n")
                    if end < 0:
                        continue
                    out = []
                    for line in data[: end + 1].splitlines():
                        fields = line.split(b" ", 3)
                        if len(fields) < 3:
                            continue
                        text = fields[3] if len(fields) == 4 else b""
                        out.append(text + (b"\n" if fields[2] == b"F" else b""))
                    offsets[src] = offsets.get(src, 0) + end + 1
                    if out:
                        dst_dir = os.path.join(args.dst, ns, pod)
                        os.makedirs(dst_dir, exist_ok=True)
                        with open(os.path.join(dst_dir, container + ".log"), "ab") as f:
                            f.write(b"".join(out))
        offsets = {k: v for k, v in offsets.items() if k in seen}  # pods deleted: forget them
        time.sleep(args.interval)  # poll interval of a log follower, not synchronization


if __name__ == "__main__":
    main()
