#!/usr/bin/env python3
"""Reads what one round of hack/demo.sh left behind and prints its story.

Usage: demo-report.py SCENARIO ROUND VERBOSE STATE.json PODS_DIR [TIMELINE.json]

STATE.json holds {"created_ms": ..., "versions": [...], "pipelineruns": <list>, "taskruns": <list>,
"customruns": <list>, "environment": <list of chart objects>}. PODS_DIR is the pod-runner's
directory of the pipelines' namespace (<cluster>/pods/<ns>), where each step's output is.

First reduces both to the round's timeline (`lane_of`: each run's deploy events, from the
"EVENT <epoch-ms> <what> k=v..." lines the deploy step echoes, its lock's outcome, and what the
environment held afterwards), then prints the story from that timeline alone: the events, what
happened to each run, and the final content of the environment. With TIMELINE.json, the timeline
is also stored there as the lane of SCENARIO (other scenarios' lanes in the file are kept), which
is what hack/demo-picture.py draws. The last line is machine-readable:
"RESULT present=<n> expected=<n> versions=<v,...> newest=<v> max_overlap=<n>".
"""
import json
import os
import sys
from datetime import datetime

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


# ------------------------------------------------------------------ reading the round's state

def succeeded(obj):
    for c in obj.get("status", {}).get("conditions", []) or []:
        if c.get("type") == "Succeeded":
            return c
    return {}


def step_log(pod_dir):
    """The deploy step's EVENT lines as [{"ms", "what", "fields"}] in log order, and its last
    error line (kubectl's "Error from server ..."; stderr goes to the same log), if any."""
    events, error = [], None
    path = os.path.join(pod_dir, "step-deploy.log")
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        return events, error
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "EVENT" and parts[1].isdigit():
            fields = dict(p.split("=", 1) for p in parts[3:] if "=" in p)
            events.append({"ms": int(parts[1]), "what": parts[2], "fields": fields})
        elif line.lower().startswith(("error", "fatal")):
            error = line.strip()
    return events, error


def epoch_ms(timestamp):
    """A Kubernetes RFC 3339 timestamp ("2026-11-30T16:17:07Z") in epoch milliseconds."""
    if not timestamp:
        return None
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)


def is_superseded(cond):
    # the reason was "Superseded"; newer controllers cancel with the reason Tekton expects and
    # say "Superseded: ..." in the message. Either way the message names the newer PipelineRun.
    return cond.get("reason") == "Superseded" or cond.get("message", "").lower().startswith("superseded")


def lock_of(cr, own_name, version_of):
    """What the run's Mutex CustomRun says: reason, message, results, and who superseded it."""
    if cr is None:
        return None
    cond = succeeded(cr)
    results = {r["name"]: r["value"] for r in cr.get("status", {}).get("results", []) or []}
    lock = {
        "reason": cond.get("reason", "pending"),
        "message": cond.get("message", ""),
        "token": results.get("token"),
        "waited_seconds": results.get("waited-seconds"),
        "superseded": is_superseded(cond),
        "superseded_by": None,
        "start_ms": epoch_ms(cr["metadata"].get("creationTimestamp")),
        "end_ms": epoch_ms(cr.get("status", {}).get("completionTime") or cond.get("lastTransitionTime")),
    }
    if lock["superseded"]:
        # the longest PipelineRun name in the message, so "x-8" does not match inside "x-81"
        named = [n for n in version_of if n != own_name and n in lock["message"]]
        if named:
            lock["superseded_by"] = version_of[max(named, key=len)]
    return lock


def queued_record(pr):
    """A PipelineRun queued as a whole has no lock run: the lock keeps the status a lock run would
    get in its annotation tekton-mutex.dev/lock-record. Shaped as a lock run for lock_of."""
    record = (pr.get("metadata", {}).get("annotations") or {}).get("tekton-mutex.dev/lock-record")
    if not record:
        return None
    return {"metadata": {"creationTimestamp": pr["metadata"].get("creationTimestamp")},
            "status": json.loads(record)}


def environment_after(env_objects):
    env = {(o["kind"], o["metadata"]["name"]): o for o in env_objects}
    objects = []
    for kind, name in CHART:
        o = env.get((kind, name))
        v = o["metadata"].get("labels", {}).get("version", "?") if o is not None else None
        objects.append({"kind": kind, "name": name, "version": v})
    return objects


def deploy_span_ms(events, completed_ms):
    """[start, end] of a deploy: its first and last EVENT, or for a step that stopped before its
    prune (failed, killed), until its TaskRun completed (a timestamp in whole seconds)."""
    if not events:
        return None
    start, end = events[0]["ms"], events[-1]["ms"]
    if events[-1]["what"] != "pruned" and completed_ms is not None:
        end = max(end, completed_ms)
    return [start, end]


def lane_of(scenario, st, pods_dir):
    """The round as a timeline: the data both the text report and the picture are made from."""
    versions = [str(v) for v in st["versions"]]
    prs = {p["metadata"]["name"]: p for p in st["pipelineruns"]}
    crs = {c["metadata"].get("labels", {}).get("tekton.dev/pipelineRun"): c for c in st["customruns"]}
    trs = {}
    for t in st["taskruns"]:
        labels = t["metadata"].get("labels", {})
        if labels.get("tekton.dev/pipelineTask") == "deploy":
            trs[labels.get("tekton.dev/pipelineRun")] = t
    version_of = {}
    for name, pr in prs.items():
        for p in pr["spec"].get("params", []):
            if p["name"] == "version":
                version_of[name] = str(p["value"])
    name_of = {v: n for n, v in version_of.items()}

    runs = []
    for v in versions:
        name = name_of.get(v)
        pr = prs.get(name, {})
        tr = trs.get(name) or {}
        pod = tr.get("status", {}).get("podName")
        events, error = step_log(os.path.join(pods_dir, pod)) if pod else ([], None)
        runs.append({
            "version": v,
            "pipelinerun": name,
            "outcome": succeeded(pr).get("reason", "Running"),
            "cancelled": pr.get("spec", {}).get("status"),
            "superseded_by": (pr.get("metadata", {}).get("annotations") or {}).get("tekton-mutex.dev/superseded-by"),
            "deploy_ran": bool(pod),
            "deploy_failed": succeeded(tr).get("status") == "False",
            "deploy_error": error,
            "deploy_span_ms": deploy_span_ms(events, epoch_ms(tr.get("status", {}).get("completionTime"))),
            "events": events,
            "lock": lock_of(crs.get(name) or queued_record(pr), name, version_of),
        })
    return {
        "scenario": scenario,
        "environment_namespace": st["environment_namespace"],
        "created_ms": st["created_ms"],
        "versions": versions,
        "runs": runs,
        "environment_after": environment_after(st["environment"]),
    }


def store_lane(path, lane):
    """Put LANE into the timeline file at PATH, replacing an earlier lane of its scenario."""
    try:
        timeline = json.load(open(path))
    except FileNotFoundError:
        timeline = {"lanes": []}
    timeline["lanes"] = [l for l in timeline["lanes"] if l["scenario"] != lane["scenario"]] + [lane]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(timeline, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------ the story, from the timeline

def intervals_of(lane):
    """(start ms, end ms, version) of each deploy that ran."""
    return [(*r["deploy_span_ms"], r["version"]) for r in lane["runs"] if r["deploy_span_ms"]]


def max_overlap_of(intervals):
    """The most deploys running at the same moment."""
    points = sorted([(a, 1) for a, _, _ in intervals] + [(b, -1) for _, b, _ in intervals])
    cur = most = 0
    for _, d in points:
        cur += d
        most = max(most, cur)
    return most


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


def print_timeline(lane):
    t0 = lane["created_ms"]
    timeline = sorted((e["ms"], r["version"], e["what"], e["fields"]) for r in lane["runs"] for e in r["events"])
    print(f"  timeline (seconds after the 5 PipelineRuns were created; from each deploy step's log):")
    for ms, v, what, f in timeline:
        print(f"    +{(ms - t0) / 1000:6.2f}s  v{v}  {describe(what, f)}")
    if not timeline:
        print("    (no deploy step ran)")
    print()


def lock_text(lock):
    if lock is None:
        return ""
    if lock["reason"] == "Acquired":
        return f"lock Acquired, token {lock['token'] or '?'}, waited {lock['waited_seconds'] or '?'}s"
    if lock["superseded"]:
        return yellow(f"lock {lock['reason']}: {lock['message']}")
    return f"lock {lock['reason']}"


def print_runs(lane):
    print("  runs:")
    for r in lane["runs"]:
        outcome = r["outcome"]
        if r.get("superseded_by"):
            outcome += f", cancelled (superseded by {r['superseded_by']})"
        elif r["cancelled"]:
            outcome += f", cancelled ({r['cancelled']})"
        deploy = "deploy never ran"
        if r["deploy_ran"]:
            deploy = red("deploy failed") + " " * 4 if r["deploy_failed"] else "deploy ran"
        print(f"    {r['pipelinerun'] or '?':<14} {deploy:<17} PipelineRun {outcome}")
        if r["deploy_failed"] and r["deploy_error"]:
            print(f"    {'':<14} {red(r['deploy_error'])}")
        lock = lock_text(r["lock"])
        if lock:
            print(f"    {'':<14} {lock}")
    print()


def main():
    scenario, round_no, verbose, state_path, pods_dir = sys.argv[1:6]
    verbose = verbose == "1"
    lane = lane_of(scenario, json.load(open(state_path)), pods_dir)
    if len(sys.argv) > 6:
        store_lane(sys.argv[6], lane)
    newest = max(lane["versions"], key=int)
    max_overlap = max_overlap_of(intervals_of(lane))

    if verbose:
        print_timeline(lane)
        print_runs(lane)

    # ---- the environment, as the run left it
    objects = lane["environment_after"]
    present = sum(1 for o in objects if o["version"] is not None)
    seen_versions = {o["version"] for o in objects if o["version"] is not None}
    if verbose:
        print(f"  environment {lane['environment_namespace']} afterwards:")
        for o in objects:
            if o["version"] is None:
                print(red(f"    MISSING  {o['kind']}/{o['name']}"))
            else:
                print(f"    present  {o['kind']}/{o['name']}  version={o['version']}")
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
