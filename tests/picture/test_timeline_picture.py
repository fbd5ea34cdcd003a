"""The timeline picture (hack/demo-picture.py) read back as SVG, and the timeline it is drawn from.

Run by hack/test.sh through `hack/picture.sh test` (which provides matplotlib). The SVG is parsed,
never compared byte for byte, except that the committed docs/timeline.svg must be what the
generator draws from docs/timeline.json (a generated artefact must not drift).

The fixture tests/picture/timeline-fixture.json reproduces the founding scenario: five unguarded
deploys overlapping, the first prune deleting the whole chart; then the guarded round, v77 and v81
deploying one after the other and v78..v80 superseded.
"""
import copy
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from datetime import datetime, timezone

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURE = os.path.join(ROOT, "tests", "picture", "timeline-fixture.json")
SVG_NS = "{http://www.w3.org/2000/svg}"
XLINK_HREF = "{http://www.w3.org/1999/xlink}href"
RED = "#d62728"
GREY = "#9e9e9e"


def load_hack_module(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "hack", file))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


picture = load_hack_module("demo_picture", "demo-picture.py")
report = load_hack_module("demo_report", "demo-report.py")


def fixture():
    with open(FIXTURE) as f:
        return json.load(f)


def render(timeline):
    """Draw TIMELINE and return (svg bytes, parsed root with comments kept)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "timeline.svg")
        picture.render(timeline, out)
        with open(out, "rb") as f:
            data = f.read()
    return data, parse(data)


def parse(data):
    parser = ET.XMLParser(target=ET.TreeBuilder(insert_comments=True))
    parser.feed(data)
    return parser.close()


def by_id(root, ident):
    return next((e for e in root.iter() if e.get("id") == ident), None)


def lane(root, scenario):
    found = by_id(root, f"lane-{scenario}")
    assert found is not None, f"no lane-{scenario} group in the SVG"
    return found


def path_x_extent(group):
    """(min x, max x) of the path drawn in GROUP (a bar: a rectangle of absolute coordinates)."""
    path = next(group.iter(f"{SVG_NS}path"))
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", path.get("d"))]
    xs = numbers[0::2]
    return min(xs), max(xs)


def shapes(lane_group, kind):
    """{version: element} of the groups with id <kind>-<scenario>-v<N> (not their labels)."""
    pattern = re.compile(rf"{kind}-[a-z]+-v(\d+)$")
    return {m.group(1): e for e in lane_group.iter() if (m := pattern.match(e.get("id") or ""))}


def bars(lane_group, kind="deploy"):
    return {v: path_x_extent(e) for v, e in shapes(lane_group, kind).items()}


def marker_x(group):
    return float(next(group.iter(f"{SVG_NS}use")).get("x"))


def styles(group):
    return " ".join(e.get("style", "") for e in group.iter())


def text_of(group):
    """What a text group says: matplotlib draws glyphs as paths and keeps the string as a comment."""
    return " ".join(e.text.strip() for e in group.iter() if e.tag is ET.Comment)


def max_overlap(extents):
    points = sorted([(a, 1) for a, _ in extents] + [(b, -1) for _, b in extents])
    cur = most = 0
    for _, d in points:
        cur += d
        most = max(most, cur)
    return most


def ran(timeline_lane):
    return {r["version"] for r in timeline_lane["runs"] if r["deploy_span_ms"]}


class FixtureReproducesTheScenario(unittest.TestCase):
    """The data itself: an overlap without the Mutex, one deploy at a time with it."""

    def test_fixture_overlaps_unguarded_and_serializes_guarded(self):
        lanes = {l["scenario"]: l for l in fixture()["lanes"]}
        self.assertEqual(report.max_overlap_of(report.intervals_of(lanes["unguarded"])), 5)
        self.assertEqual(report.max_overlap_of(report.intervals_of(lanes["guarded"])), 1)
        self.assertEqual(ran(lanes["guarded"]), {"77", "81"})


class PictureOfFixture(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.timeline = fixture()
        cls.lanes = {l["scenario"]: l for l in cls.timeline["lanes"]}
        cls.svg, cls.root = render(cls.timeline)

    def test_is_self_contained_svg(self):
        self.assertEqual(self.root.tag, f"{SVG_NS}svg")
        tags = {e.tag for e in self.root.iter() if isinstance(e.tag, str)}
        self.assertNotIn(f"{SVG_NS}script", tags)
        self.assertNotIn(f"{SVG_NS}text", tags, "text must be drawn as paths (no fonts needed)")
        self.assertNotIn(b"@font-face", self.svg)
        for e in self.root.iter():
            ref = e.get(XLINK_HREF) or e.get("href")
            self.assertTrue(ref is None or ref.startswith("#"), f"external reference {ref}")

    def test_one_bar_per_deploy_that_ran_in_each_lane(self):
        for scenario, data in self.lanes.items():
            with self.subTest(scenario):
                self.assertEqual(set(bars(lane(self.root, scenario))), ran(data))

    def test_apply_and_prune_marked_on_each_bar(self):
        for scenario in self.lanes:
            group = lane(self.root, scenario)
            deploys = bars(group)
            for kind in ("apply", "prune"):
                marks = shapes(group, kind)
                self.assertEqual(set(marks), set(deploys), f"{kind} markers of {scenario}")
                for v, mark in marks.items():
                    x0, x1 = deploys[v]
                    self.assertTrue(x0 <= marker_x(mark) <= x1, f"{kind} of v{v} off its bar")

    def test_wipe_out_marked_red_in_the_unguarded_lane_only(self):
        wipeouts = shapes(lane(self.root, "unguarded"), "wipeout")
        self.assertEqual(set(wipeouts), {"78"}, "the fixture's v78 prune deletes all 10 objects")
        self.assertIn(RED, styles(wipeouts["78"]))
        self.assertIn("wipe-out", text_of(by_id(self.root, "wipeout-unguarded-v78-label")))
        self.assertEqual(shapes(lane(self.root, "guarded"), "wipeout"), {})

    def test_unguarded_bars_overlap(self):
        self.assertEqual(max_overlap(bars(lane(self.root, "unguarded")).values()), 5)

    def test_guarded_bars_do_not_overlap(self):
        extents = bars(lane(self.root, "guarded")).values()
        self.assertEqual(len(extents), 2)
        self.assertEqual(max_overlap(extents), 1)

    def test_superseded_runs_are_short_grey_stubs_saying_by_whom(self):
        group = lane(self.root, "guarded")
        stubs = bars(group, "superseded")
        self.assertEqual(set(stubs), {"78", "79", "80"})
        shortest_deploy = min(x1 - x0 for x0, x1 in bars(group).values())
        for v, (x0, x1) in stubs.items():
            self.assertLess(x1 - x0, shortest_deploy / 4, f"v{v}'s stub is not short")
            self.assertIn(GREY, styles(shapes(group, "superseded")[v]))
        by = {r["version"]: r["lock"]["superseded_by"] for r in self.lanes["guarded"]["runs"] if not r["events"]}
        for v, newer in by.items():
            label = text_of(by_id(self.root, f"superseded-guarded-v{v}-label"))
            self.assertIn(f"superseded by v{newer}", label)

    def test_same_input_same_bytes(self):
        self.assertEqual(render(self.timeline)[0], self.svg)


class TheChecksCanFail(unittest.TestCase):
    """A wrong picture is caught: the same checks on a guarded lane whose deploys overlap."""

    def test_overlapping_guarded_deploys_are_seen(self):
        timeline = fixture()
        guarded = next(l for l in timeline["lanes"] if l["scenario"] == "guarded")
        v77, v81 = (next(r for r in guarded["runs"] if r["version"] == v) for v in ("77", "81"))
        shift = v81["events"][0]["ms"] - v77["events"][1]["ms"]  # v81 starts at v77's apply
        for e in v81["events"]:
            e["ms"] -= shift
        v81["deploy_span_ms"] = [ms - shift for ms in v81["deploy_span_ms"]]
        _, root = render(timeline)
        self.assertEqual(max_overlap(bars(lane(root, "guarded")).values()), 2)

    def test_a_deploy_without_events_gets_no_bar(self):
        timeline = fixture()
        unguarded = next(l for l in timeline["lanes"] if l["scenario"] == "unguarded")
        unguarded["runs"][0]["events"] = []
        unguarded["runs"][0]["deploy_span_ms"] = None
        _, root = render(timeline)
        self.assertEqual(set(bars(lane(root, "unguarded"))), {"78", "79", "80", "81"})


def demo_state(scenario, t0, deploys, locks, env_version, failed=()):
    """What hack/demo.sh saves for a round (STATE.json), reduced to the fields the report reads.
    DEPLOYS: {version: [(offset ms, event line rest)]}; LOCKS: {version: (reason, message)};
    FAILED: the versions whose deploy TaskRun failed."""
    versions = sorted(set(deploys) | set(locks), key=int)
    name = lambda v: f"{scenario}-{v}"
    stamp = lambda ms: datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "created_ms": t0,
        "environment_namespace": "jx-staging",
        "versions": [int(v) for v in versions],
        "pipelineruns": [{"metadata": {"name": name(v)}, "spec": {"params": [{"name": "version", "value": v}]},
                          "status": {"conditions": [{"type": "Succeeded", "reason": "Succeeded"}]}} for v in versions],
        "taskruns": [{"metadata": {"labels": {"tekton.dev/pipelineTask": "deploy", "tekton.dev/pipelineRun": name(v)}},
                      "status": {"podName": f"{name(v)}-deploy-pod", "completionTime": stamp(t0 + 3000),
                                 "conditions": [{"type": "Succeeded", "status": "False" if v in failed else "True"}]}}
                     for v in deploys],
        "customruns": [{"metadata": {"labels": {"tekton.dev/pipelineRun": name(v)}, "creationTimestamp": stamp(t0)},
                        "status": {"completionTime": stamp(t0 + 1000),
                                   "conditions": [{"type": "Succeeded", "reason": r, "message": m}]}}
                       for v, (r, m) in locks.items()],
        "environment": [{"kind": k, "metadata": {"name": n, "labels": {"version": env_version}}}
                        for k, n in report.CHART] if env_version else [],
    }


def write_step_logs(pods_dir, scenario, t0, deploys, failed=()):
    for v, events in deploys.items():
        pod = os.path.join(pods_dir, f"{scenario}-{v}-deploy-pod")
        os.makedirs(pod)
        with open(os.path.join(pod, "step-deploy.log"), "w") as f:
            for offset, rest in events:
                f.write(f"EVENT {t0 + offset} {rest}\n")
            f.write("  deleted configmap/app-config\n")  # not an EVENT line: ignored
            if v in failed:  # the step's stderr is in the same log
                f.write('Error from server (AlreadyExists): error when creating "STDIN": configmaps "testx" already exists\n')


def deploy_events(v, start, deleted):
    return [(start, f"start version={v} environment=jx-staging"), (start + 300, f"applied version={v} objects=10"),
            (start + 6300, f"prune-start version={v} selector=chart-release=jx,version!={v}"),
            (start + 6500, f"pruned version={v} deleted={deleted}")]


class PictureOfTheDemoReportsTimeline(unittest.TestCase):
    """From what the demo saves (STATE.json and the step logs) through hack/demo-report.py, as
    hack/demo.sh runs it, to the picture: the text report and the picture read one timeline."""

    def test_report_stores_the_lanes_the_picture_draws(self):
        t0 = 1_764_519_427_000
        with tempfile.TemporaryDirectory() as tmp:
            timeline_path = os.path.join(tmp, "timeline.json")
            rounds = {
                # v10 fails on its apply: five concurrent client-side applies can race on create
                "unguarded": ({"8": deploy_events("8", 500, 10), "9": deploy_events("9", 700, 0),
                               "10": deploy_events("10", 600, 0)[:1]}, {}, None),
                "guarded": ({"8": deploy_events("8", 500, 0), "81": deploy_events("81", 7500, 0)},
                            {"8": ("Acquired", "acquired"),
                             # the reason as controllers set it before and after Tekton's cancel reasons
                             "9": ("CustomRunCancelled", "Superseded: superseded by newer PipelineRun guarded-81 on jx-staging"),
                             "81": ("Acquired", "acquired")}, "81"),
            }
            outputs = {}
            for scenario, (deploys, locks, env_version) in rounds.items():
                state_path = os.path.join(tmp, f"{scenario}.json")
                failed = {"10"} if scenario == "unguarded" else set()
                with open(state_path, "w") as f:
                    json.dump(demo_state(scenario, t0, deploys, locks, env_version, failed), f)
                pods = os.path.join(tmp, "pods", scenario)
                write_step_logs(pods, scenario, t0, deploys, failed)
                outputs[scenario] = subprocess.run(
                    [sys.executable, os.path.join(ROOT, "hack", "demo-report.py"), scenario, "1", "1", state_path, pods,
                     timeline_path], check=True, capture_output=True, text=True).stdout
            with open(timeline_path) as f:
                timeline = json.load(f)

        self.assertIn("RESULT present=0 expected=10", outputs["unguarded"])
        self.assertIn("max_overlap=3", outputs["unguarded"])
        self.assertIn("deploy failed", outputs["unguarded"])
        self.assertIn("RESULT present=10 expected=10 versions=81 newest=81 max_overlap=1", outputs["guarded"])
        self.assertEqual([l["scenario"] for l in timeline["lanes"]], ["unguarded", "guarded"])
        guarded = timeline["lanes"][1]
        v9 = next(r for r in guarded["runs"] if r["version"] == "9")
        self.assertTrue(v9["lock"]["superseded"])
        self.assertEqual(v9["lock"]["superseded_by"], "81", "guarded-8 is a prefix of guarded-81, not the superseder")

        _, root = render(timeline)
        self.assertEqual(set(bars(lane(root, "unguarded"))), {"8", "9", "10"})
        x0, x1 = bars(lane(root, "unguarded"))["10"]
        self.assertGreater(x1, x0, "a failed deploy's bar runs until its TaskRun completed")
        self.assertIn("v10 deploy failed: AlreadyExists", text_of(by_id(root, "failed-unguarded-v10-label")))
        self.assertEqual(set(shapes(lane(root, "unguarded"), "wipeout")), {"8"})
        self.assertEqual(set(bars(lane(root, "guarded"))), {"8", "81"})
        self.assertEqual(max_overlap(bars(lane(root, "guarded")).values()), 1)
        self.assertIn("superseded by v81", text_of(by_id(root, "superseded-guarded-v9-label")))


class CommittedPicture(unittest.TestCase):
    def test_docs_timeline_svg_is_drawn_from_docs_timeline_json(self):
        with open(os.path.join(ROOT, "docs", "timeline.json")) as f:
            timeline = json.load(f)
        with open(os.path.join(ROOT, "docs", "timeline.svg"), "rb") as f:
            committed = f.read()
        drawn, root = render(timeline)
        self.assertTrue(drawn == committed, "docs/timeline.svg is stale: run hack/picture.sh")
        lanes = {l["scenario"]: l for l in timeline["lanes"]}
        self.assertEqual(set(bars(lane(root, "unguarded"))), ran(lanes["unguarded"]))
        self.assertEqual(max_overlap(bars(lane(root, "guarded")).values()), 1)
        self.assertTrue(shapes(lane(root, "unguarded"), "wipeout"), "the README picture shows no wipe-out")


if __name__ == "__main__":
    unittest.main()
