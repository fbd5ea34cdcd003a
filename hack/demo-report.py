#!/usr/bin/env python3
"""Reads what one round of hack/demo.sh left behind and prints its story.

Usage: demo-report.py SCENARIO ROUND VERBOSE STATE.json PODS_DIR

STATE.json holds {"created_ms": ..., "versions": [...], "pipelineruns": <list>, "taskruns": <list>,
"customruns": <list>, "environment": <list of chart objects>}. PODS_DIR is the pod-runner's
directory of the pipelines' namespace (<cluster>/pods/<ns>), where each step's output is.

Prints the timeline (from the "EVENT <epoch-ms> <what> k=v..." lines the deploy step echoes),
what happened to each run, and the final content of the environment. The last line is
machine-readable: "RESULT present=<n> expected=<n> versions=<v,...> newest=<v> max_overlap=<n>".
"""
import json
import os
import sys

CHART = (
    [("ConfigMap", n) for n in ("app-config", "exposecontroller", "skills-server-redis", "skills-server-redis-health")]
    + [("Service", n) for n in ("api-poi-v2", "skills-vue-x", "testx")]
    + [("ServiceAccount", n) for n in ("cleanup", "expose", "api-poi-v2")]
)

tty = sys.stdout.isatty() and os.environ.get("NO_COLOR") is None
def color(code, s):
    return f"\033[{code}m{s}\033[0m" if tty else s
red = lambda s: color("1;31", s)
green = lambda s: color("1;32", s)
yellow = lambda s: color("33", s)
dim = lambda s: color("2", s)


def succeeded(obj):
    for c in obj.get("status", {}).get("conditions", []) or []:
        if c.get("type") == "Succeeded":
            return c
    return {}


def events_of(pod_dir):
    out = []
    path = os.path.join(pod_dir, "step-deploy.log")
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "EVENT" and parts[1].isdigit():
            fields = dict(p.split("=", 1) for p in parts[3:] if "=" in p)
            out.append((int(parts[1]), parts[2], fields))
    return out


def main():
    scenario, round_no, verbose, state_path, pods_dir = sys.argv[1:6]
    verbose = verbose == "1"
    st = json.load(open(state_path))
    t0 = st["created_ms"]
    versions = [str(v) for v in st["versions"]]
    newest = max(versions, key=int)
    prs = {p["metadata"]["name"]: p for p in st["pipelineruns"]}
    crs = {c["metadata"].get("labels", {}).get("tekton.dev/pipelineRun"): c for c in st["customruns"]}
    trs = {}
    for t in st["taskruns"]:
        labels = t["metadata"].get("labels", {})
        if labels.get("tekton.dev/pipelineTask") == "deploy":
            trs[labels.get("tekton.dev/pipelineRun")] = t
    name_of = {}
    for name, pr in prs.items():
        for p in pr["spec"].get("params", []):
            if p["name"] == "version":
                name_of[str(p["value"])] = name

    # ---- the timeline, from the deploy step's own log lines
    timeline = []
    intervals = []
    for v in versions:
        tr = trs.get(name_of.get(v))
        pod = tr and tr.get("status", {}).get("podName")
        if not pod:
            continue
        evs = events_of(os.path.join(pods_dir, pod))
        if evs:
            intervals.append((evs[0][0], evs[-1][0], v))
        for ms, what, f in evs:
            timeline.append((ms, v, what, f))
    timeline.sort()

    def describe(what, f):
        if what == "start":
            return "deploy starts"
        if what == "applied":
            return f"kubectl apply: {f.get('objects', '?')} objects now say version={f.get('version')}"
        if what == "prune-start":
            return f"kubectl delete -l {f.get('selector')}"
        if what == "pruned":
            n = int(f.get("deleted", "0"))
            s = f"  -> deleted {n} object{'s' if n != 1 else ''}"
            return red(s + "  <-- WIPE-OUT") if n >= len(CHART) else (yellow(s) if n else s)
        return what + " " + " ".join(f"{k}={v}" for k, v in f.items())

    # the most deploys running at the same moment
    points = sorted([(a, 1) for a, _, _ in intervals] + [(b, -1) for _, b, _ in intervals], key=lambda x: (x[0], x[1]))
    cur = max_overlap = 0
    for _, d in points:
        cur += d
        max_overlap = max(max_overlap, cur)

    if verbose:
        print(f"  timeline (seconds after the 5 PipelineRuns were created; from each deploy step's log):")
        for ms, v, what, f in timeline:
            print(f"    +{(ms - t0) / 1000:6.2f}s  v{v}  {describe(what, f)}")
        if not timeline:
            print("    (no deploy step ran)")
        print()
        print("  runs:")
        for v in versions:
            name = name_of.get(v, "?")
            pr = prs.get(name, {})
            c = succeeded(pr)
            cr = crs.get(name)
            lock = ""
            if cr is not None:
                cc = succeeded(cr)
                results = {r["name"]: r["value"] for r in cr.get("status", {}).get("results", []) or []}
                if cc.get("reason") == "Acquired":
                    lock = f"lock Acquired, token {results.get('token', '?')}, waited {results.get('waited-seconds', '?')}s"
                elif cc.get("message", "").startswith("Superseded:"):
                    lock = yellow(f"lock {cc.get('reason')}: {cc.get('message', '')}")
                else:
                    lock = f"lock {cc.get('reason', 'pending')}"
            cancelled = pr.get("spec", {}).get("status")
            superseded_by = (pr.get("metadata", {}).get("annotations") or {}).get("tekton-mutex.dev/superseded-by")
            outcome = c.get("reason", "Running")
            if superseded_by:
                outcome += f", cancelled (superseded by {superseded_by})"
            elif cancelled:
                outcome += f", cancelled ({cancelled})"
            tr = trs.get(name)
            deploy = "deploy ran" if tr and tr.get("status", {}).get("podName") else "deploy never ran"
            print(f"    {name:<14} {deploy:<17} PipelineRun {outcome}")
            if lock:
                print(f"    {'':<14} {lock}")
        print()

    # ---- the environment, as the run left it
    env = {(o["kind"], o["metadata"]["name"]): o for o in st["environment"]}
    present, seen_versions = 0, set()
    lines = []
    for kind, name in CHART:
        o = env.get((kind, name))
        if o is None:
            lines.append(red(f"    MISSING  {kind}/{name}"))
        else:
            present += 1
            v = o["metadata"].get("labels", {}).get("version", "?")
            seen_versions.add(v)
            lines.append(f"    present  {kind}/{name}  version={v}")
    if verbose:
        print(f"  environment {st['environment_namespace']} afterwards:")
        print("\n".join(lines))
        print()
    vs = ",".join(sorted(seen_versions, key=lambda s: int(s) if s.isdigit() else 0)) or "-"
    if present == 0:
        verdict = red(f"WIPED OUT: 0 of {len(CHART)} resources left")
    elif present < len(CHART):
        verdict = red(f"DAMAGED: {present} of {len(CHART)} resources left (version {vs})")
    elif seen_versions == {newest}:
        verdict = green(f"intact: {present} of {len(CHART)} resources, all at the newest version {newest}")
    else:
        verdict = yellow(f"all {present} resources present, but at version {vs}, not the newest {newest}")
    overlap = f"at most {max_overlap} deploy{'s' if max_overlap != 1 else ''} at once"
    print(f"  {scenario} round {round_no}: {verdict}; {overlap}")
    print(f"RESULT present={present} expected={len(CHART)} versions={vs} newest={newest} max_overlap={max_overlap}")


if __name__ == "__main__":
    main()
