#!/usr/bin/env python3
"""Draws the founding scenario's timeline picture from the demo's timeline data.

Usage: demo-picture.py TIMELINE.json OUT.svg

TIMELINE.json is what hack/demo-report.py stores (`{"lanes": [<lane>, ...]}`, one lane per
scenario, the same data the text report prints). OUT.svg gets one lane per scenario (any number),
on one time axis, each under its title and, on a line of its own, its verdict. Each deploy that
ran is a bar from its first to its last EVENT, with its apply and prune moments marked, a prune
that deleted the whole chart marked in red as the wipe-out, and a run that never deployed
(superseded, refused) as a short grey stub saying why.

The SVG is self-contained (text drawn as paths, no fonts, no scripts) and byte-for-byte the same
for the same input. Bars and markers carry ids a test can find:
  lane-<scenario>                   the lane (an axes group holding the rest)
  verdict-<scenario>                what the environment held afterwards (under the lane's title)
  deploy-<scenario>-v<N>            a deploy's bar
  apply-<scenario>-v<N>, prune-<scenario>-v<N>, wipeout-<scenario>-v<N>   its moments
  wait-<scenario>-v<N>              the time it waited for the lock before deploying
  superseded-<scenario>-v<N>, stub-<scenario>-v<N>   a run that never deployed (and *-label)
Needs matplotlib (hack/picture.sh provides a pinned one).
"""
import json
import re
import sys

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

# Self-contained and reproducible: glyphs as paths (no font needed to view it), fixed ids.
STYLE = {
    "svg.fonttype": "path",
    "svg.hashsalt": "tekton-mutex-timeline",
    "font.family": "DejaVu Sans",  # ships with matplotlib: the same glyphs on every machine
    "font.size": 10,
}
BAR = "#4c72b0"
APPLY = "#2ca02c"
PRUNE = "#222222"
WIPEOUT = "#d62728"
STUB = "#9e9e9e"
FAILED = "#b9c7e0"
WAIT = "#7f7f7f"
VERDICT_LINE_PT = 18  # room under a lane's title for its verdict line (10 pt text, and the title's descenders)
MIN_STUB_S = 0.35  # a superseded run's lock may end within a second; keep the stub visible
WORDS = "zero one two three four five six seven eight nine ten".split()
TITLES = {
    "unguarded": "Without the Mutex: all {n} deploy at once",
    "guarded": "With the Mutex: one at a time, the newest wins",
    "pending": "The same pipeline, queued by annotations alone: one at a time, the newest wins",
    "selected": "The same pipeline, as a Trigger starts it, taken by a selector: one at a time, the newest wins",
}


def count(n):
    return WORDS[n] if n < len(WORDS) else str(n)


def seconds(lane, ms):
    return (ms - lane["created_ms"]) / 1000


def verdict(lane):
    """The environment afterwards, in words, and the colour to say it in."""
    objects = lane["environment_after"]
    left = [o["version"] for o in objects if o["version"] is not None]
    newest = max(lane["versions"], key=int)
    env = lane["environment_namespace"]
    if not left:
        return f"{env} afterwards: WIPED OUT, 0 of {len(objects)} objects left", WIPEOUT
    if len(left) < len(objects):
        return f"{env} afterwards: damaged, {len(left)} of {len(objects)} objects left", WIPEOUT
    if set(left) == {newest}:
        return f"{env} afterwards: intact, {len(left)} of {len(objects)} objects at v{newest}", APPLY
    return f"{env} afterwards: {len(left)} objects, not at the newest v{newest}", "#b8860b"


def event(run, what):
    return next((e for e in run["events"] if e["what"] == what), None)


def deploy_span(lane, run):
    """Seconds from the deploy's start to its end (hack/demo-report.py's deploy_span_ms), at
    least a stub's width so a step that failed at once still shows."""
    start, end = (seconds(lane, ms) for ms in run["deploy_span_ms"])
    return start, max(end, start + MIN_STUB_S)


def short_error(error):
    """kubectl's 'Error from server (AlreadyExists): ...' as 'AlreadyExists'."""
    m = re.match(r"Error from server \((\w+)\)", error or "")
    if m:
        return m.group(1)
    return (error or "")[:40]


def label_spot(start, end, marks):
    """The middle of the widest stretch of the bar free of markers, for the version label."""
    points = sorted([start, end] + [m for m in marks if start < m < end])
    a, b = max(zip(points, points[1:]), key=lambda ab: ab[1] - ab[0])
    return (a + b) / 2


def draw_deploy(ax, lane, run, y):
    sc, v = lane["scenario"], run["version"]
    start, end = deploy_span(lane, run)
    failed = run.get("deploy_failed")
    (bar,) = ax.barh(y, end - start, left=start, height=0.56, color=FAILED if failed else BAR,
                     edgecolor=WIPEOUT if failed else "none", hatch="///" if failed else None)
    bar.set_gid(f"deploy-{sc}-v{v}")
    marks = [seconds(lane, e["ms"]) for e in run["events"] if e["what"] in ("applied", "prune-start", "pruned")]
    if end - start >= 1.0 and not failed:  # a failed bar is named by its label beside it
        ax.text(label_spot(start, end, marks), y, f"v{v}", va="center", ha="center", color="white",
                fontweight="bold", gid=f"deploy-{sc}-v{v}-label")
    if failed:
        why = short_error(run.get("deploy_error"))
        ax.text(end + 0.15, y, f"v{v} deploy failed" + (f": {why}" if why else ""), va="center", ha="left",
                color=WIPEOUT, gid=f"failed-{sc}-v{v}-label")
    draw_moments(ax, lane, run, y)
    lock = run["lock"]
    if lock and lock.get("start_ms") is not None and lock["start_ms"] < run["events"][0]["ms"] - 500:
        ax.plot([max(seconds(lane, lock["start_ms"]), 0), start], [y, y], color=WAIT, linestyle=":",
                linewidth=2, gid=f"wait-{sc}-v{v}")


def draw_moments(ax, lane, run, y):
    """The apply and prune moments on a deploy's bar, and the wipe-out if its prune deleted all."""
    sc, v = lane["scenario"], run["version"]
    applied = event(run, "applied")
    if applied:
        ax.plot([seconds(lane, applied["ms"])], [y], marker="v", markersize=9, color=APPLY,
                markeredgecolor="white", linestyle="none", gid=f"apply-{sc}-v{v}")
    pruned = event(run, "pruned")
    prune_at = event(run, "prune-start") or pruned
    if prune_at:
        ax.plot([seconds(lane, prune_at["ms"])], [y], marker="X", markersize=9, color=PRUNE,
                markeredgecolor="white", linestyle="none", gid=f"prune-{sc}-v{v}")
    deleted = int(pruned["fields"].get("deleted", "0")) if pruned else 0
    if deleted >= len(lane["environment_after"]):  # every object of the chart
        x = seconds(lane, pruned["ms"])
        ax.plot([x], [y], marker="X", markersize=16, color=WIPEOUT, markeredgecolor="white",
                linestyle="none", gid=f"wipeout-{sc}-v{v}")
        ax.annotate(f"wipe-out: v{v}'s prune deletes all {deleted} objects", (x, y), xytext=(12, 0),
                    textcoords="offset points", va="center", color=WIPEOUT, fontweight="bold",
                    gid=f"wipeout-{sc}-v{v}-label")
    elif deleted:
        ax.annotate(f"prune deletes {deleted}", (seconds(lane, pruned["ms"]), y), xytext=(10, 0),
                    textcoords="offset points", va="center", color=WIPEOUT, gid=f"damage-{sc}-v{v}-label")


def draw_stub(ax, lane, run, y):
    """A run that never deployed: a short grey stub from its lock's start to its end."""
    sc, v, lock = lane["scenario"], run["version"], run["lock"] or {}
    start = max(seconds(lane, lock["start_ms"]), 0) if lock.get("start_ms") is not None else 0
    end = seconds(lane, lock["end_ms"]) if lock.get("end_ms") is not None else start
    width = max(end - start, MIN_STUB_S)
    kind = "superseded" if lock.get("superseded") else "stub"
    (bar,) = ax.barh(y, width, left=start, height=0.3, color=STUB, edgecolor="none")
    bar.set_gid(f"{kind}-{sc}-v{v}")
    if lock.get("superseded"):
        by = lock.get("superseded_by")
        why = f"superseded by v{by}" if by else "superseded"
    else:
        why = f"never deployed ({lock.get('reason') or run['outcome']})"
    ax.text(start + width + 0.15, y, f"v{v} {why}", va="center", ha="left", color="#555555",
            gid=f"{kind}-{sc}-v{v}-label")


def draw_heading(ax, lane):
    """The lane's title and, on its own line below it, the verdict: two lines, left-aligned above
    the lane, so neither can run into the other however long the names in them are."""
    title = TITLES.get(lane["scenario"], lane["scenario"]).format(n=count(len(lane["versions"])))
    ax.set_title(title, loc="left", fontweight="bold", pad=VERDICT_LINE_PT + 4)
    text, colour = verdict(lane)
    ax.annotate(text, (0, 1), xycoords="axes fraction", xytext=(0, 4), textcoords="offset points",
                ha="left", va="bottom", color=colour, fontweight="bold", gid=f"verdict-{lane['scenario']}")


def draw_lane(ax, lane):
    rows = {v: i for i, v in enumerate(lane["versions"])}
    for run in lane["runs"]:
        if run.get("deploy_span_ms"):
            draw_deploy(ax, lane, run, rows[run["version"]])
        else:
            draw_stub(ax, lane, run, rows[run["version"]])
    ax.set_gid(f"lane-{lane['scenario']}")
    ax.set_yticks(range(len(rows)), [run["pipelinerun"] or f"v{run['version']}" for run in lane["runs"]],
                  fontsize=8, color="#555555")
    ax.set_ylim(len(rows) - 0.4, -0.6)
    draw_heading(ax, lane)
    ax.grid(axis="x", color="#e6e6e6")
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)


def legend_handles(lanes):
    failed = any(r.get("deploy_failed") for lane in lanes for r in lane["runs"])
    handles = [
        Patch(color=BAR, label="deploy: first to last step event"),
        Line2D([], [], marker="v", color=APPLY, linestyle="none", markersize=9, label="kubectl apply"),
        Line2D([], [], marker="X", color=PRUNE, linestyle="none", markersize=9, label="prune (delete version!=N)"),
        Line2D([], [], marker="X", color=WIPEOUT, linestyle="none", markersize=13,
               label="wipe-out: prune deleted every object"),
        Line2D([], [], color=WAIT, linestyle=":", linewidth=2, label="waiting for the Mutex"),
        Patch(color=STUB, label="never deployed (superseded)"),
    ]
    if failed:
        handles.append(Patch(facecolor=FAILED, edgecolor=WIPEOUT, hatch="///", label="deploy step failed"))
    return handles


def draw(timeline):
    """The picture of TIMELINE as a matplotlib figure, laid out (call it within
    plt.rc_context(STYLE), as render does)."""
    lanes = timeline["lanes"]
    fig, axes = plt.subplots(len(lanes), 1, figsize=(11, 2.3 + 2.15 * len(lanes)), sharex=True,
                             squeeze=False)
    for ax, lane in zip(axes[:, 0], lanes):
        draw_lane(ax, lane)
    env, n = lanes[0]["environment_namespace"], len(lanes[0]["versions"])
    axes[-1, 0].set_xlabel(f"seconds after the {count(n)} PipelineRuns were created (from each deploy step's log)")
    axes[-1, 0].set_xlim(left=-0.5)
    fig.suptitle(f"{count(n).capitalize()} promotions of {env} started at once", fontsize=13, fontweight="bold",
                 x=0.01, ha="left")
    fig.legend(handles=legend_handles(lanes), loc="lower center", ncol=4, frameon=False, fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def render(timeline, out):
    with plt.rc_context(STYLE):
        fig = draw(timeline)
        fig.savefig(out, format="svg", metadata={"Date": None})
        plt.close(fig)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: demo-picture.py TIMELINE.json OUT.svg")
    with open(sys.argv[1]) as f:
        timeline = json.load(f)
    if not timeline.get("lanes"):
        sys.exit(f"{sys.argv[1]}: no lanes to draw (hack/demo-report.py stores them)")
    render(timeline, sys.argv[2])


if __name__ == "__main__":
    main()
