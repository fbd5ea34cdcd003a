"""The timeline picture's layout: no two pieces of text overlap, and all text is inside the figure.

Run by hack/test.sh through `hack/picture.sh test` (which provides matplotlib). The figure that
hack/demo-picture.py draws is laid out once more on matplotlib's own Agg backend, and each text
artist that is drawn reports its box on that renderer (get_window_extent). Drawn on the committed
timeline (docs/timeline.json), the test fixture, and variants of it that push the layout: a long
environment name, ten runs, every verdict, a failed deploy's label, and three panels.
"""
import copy
import importlib.util
import json
import os
import unittest

import matplotlib.pyplot as plt
from matplotlib.backends.backend_agg import FigureCanvasAgg  # the layout measured on Agg, whatever the backend
from matplotlib.text import Text

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GAP_PX = 2.0  # two boxes closer than this (at 72 dpi: 2 pt) count as touching


def load_picture():
    spec = importlib.util.spec_from_file_location("demo_picture_layout", os.path.join(ROOT, "hack", "demo-picture.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


picture = load_picture()


def load(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return json.load(f)


def drawn_text_boxes(timeline):
    """[(text, Bbox in display pixels)] of every text the figure draws, laid out on Agg, and the
    figure's own box. Only texts drawn count: tick labels outside the view are not."""
    drawn = []
    original = Text.draw

    def record(self, renderer):
        if self.get_visible() and self.get_text().strip():
            drawn.append(self)
        return original(self, renderer)

    with plt.rc_context(picture.STYLE):
        fig = picture.draw(timeline)
        canvas = FigureCanvasAgg(fig)
        Text.draw = record
        try:
            canvas.draw()
        finally:
            Text.draw = original
        renderer = canvas.get_renderer()
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in drawn]
        figure_box = fig.bbox.frozen()
        plt.close(fig)
    return boxes, figure_box


def overlaps(boxes, gap=GAP_PX):
    """The pairs of texts whose boxes, each grown by gap/2 on every side, intersect."""
    found = []
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            if (box_a.x0 - gap < box_b.x1 and box_b.x0 - gap < box_a.x1
                    and box_a.y0 - gap < box_b.y1 and box_b.y0 - gap < box_a.y1):
                found.append((a, b))
    return found


def outside(boxes, figure_box):
    return [text for text, box in boxes
            if box.x0 < figure_box.x0 - 0.5 or box.y0 < figure_box.y0 - 0.5
            or box.x1 > figure_box.x1 + 0.5 or box.y1 > figure_box.y1 + 0.5]


def lanes_of(timeline):
    return {lane["scenario"]: lane for lane in timeline["lanes"]}


def long_environment(timeline):
    for lane in timeline["lanes"]:
        lane["environment_namespace"] = "jx-production-europe-west1"
    return timeline


def ten_runs(timeline):
    """Ten promotions: the fixture's five, and five more of each run, one version later."""
    for lane in timeline["lanes"]:
        more = []
        for run in lane["runs"]:
            twin = copy.deepcopy(run)
            twin["version"] = str(int(run["version"]) + 5)
            if twin["pipelinerun"]:
                twin["pipelinerun"] = f"{lane['scenario']}-{twin['version']}"
            more.append(twin)
        lane["runs"] += more
        lane["versions"] = [r["version"] for r in lane["runs"]]
    return timeline


def environment_left(timeline, scenario, versions):
    """The environment after SCENARIO holds VERSIONS (None: the object is gone)."""
    lane = lanes_of(timeline)[scenario]
    for obj, version in zip(lane["environment_after"], versions):
        obj["version"] = version
    return timeline


def failed_deploy(timeline):
    run = lanes_of(timeline)["unguarded"]["runs"][2]
    run["deploy_failed"] = True
    run["deploy_error"] = 'Error from server (AlreadyExists): error when creating "STDIN": configmaps "testx" already exists'
    return timeline


def three_panels(timeline):
    """A third lane of a scenario the picture has no title for (its name is its title)."""
    third = copy.deepcopy(lanes_of(timeline)["guarded"])
    third["scenario"] = "guarded-without-editing-the-pipeline"
    timeline["lanes"].append(third)
    return timeline


def variants():
    fixture = lambda: load("tests", "picture", "timeline-fixture.json")  # noqa: E731
    return {
        "docs/timeline.json": load("docs", "timeline.json"),
        "fixture": fixture(),
        "long environment name": long_environment(fixture()),
        "ten runs": ten_runs(fixture()),
        "damaged unguarded": environment_left(fixture(), "unguarded", ["81"] * 3 + [None] * 7),
        "guarded not at the newest": environment_left(fixture(), "guarded", ["80"] * 10),
        "failed deploy": failed_deploy(fixture()),
        "three panels": three_panels(fixture()),
        "all at once": three_panels(failed_deploy(ten_runs(long_environment(fixture())))),
    }


class NoTextOverlaps(unittest.TestCase):
    def test_no_two_texts_overlap(self):
        for name, timeline in variants().items():
            with self.subTest(name):
                boxes, _ = drawn_text_boxes(timeline)
                self.assertGreater(len(boxes), 20, "too few texts drawn: is the measurement broken?")
                self.assertEqual(overlaps(boxes), [], f"overlapping texts in the picture of {name}")

    def test_all_text_inside_the_figure(self):
        for name, timeline in variants().items():
            with self.subTest(name):
                boxes, figure_box = drawn_text_boxes(timeline)
                self.assertEqual(outside(boxes, figure_box), [], f"text outside the picture of {name}")

    def test_titles_and_verdicts_are_drawn(self):
        boxes, _ = drawn_text_boxes(load("tests", "picture", "timeline-fixture.json"))
        texts = [t for t, _ in boxes]
        self.assertIn("Without the Mutex: all five deploy at once", texts)
        self.assertIn("jx-staging afterwards: WIPED OUT, 0 of 10 objects left", texts)
        self.assertIn("With the Mutex: one at a time, the newest wins", texts)
        self.assertIn("jx-staging afterwards: intact, 10 of 10 objects at v81", texts)


class TheOverlapCheckCanFail(unittest.TestCase):
    """The check sees an overlap: a text drawn twice at one spot, and one moved onto another."""

    def test_a_text_on_top_of_another_is_seen(self):
        boxes, _ = drawn_text_boxes(load("tests", "picture", "timeline-fixture.json"))
        title = next(b for t, b in boxes if t.startswith("Without the Mutex"))
        verdict = next((t, b) for t, b in boxes if "WIPED OUT" in t)
        moved = verdict[1].translated(title.x1 - verdict[1].x0 - 5, title.y0 - verdict[1].y0)
        self.assertEqual(overlaps([("title", title), ("verdict", moved)]), [("title", "verdict")])
        self.assertEqual(overlaps([("title", title), ("again", title)]), [("title", "again")])

    def test_boxes_apart_by_less_than_the_gap_count_as_touching(self):
        boxes, _ = drawn_text_boxes(load("tests", "picture", "timeline-fixture.json"))
        title = next(b for t, b in boxes if t.startswith("Without the Mutex"))
        beside = title.translated(title.width + GAP_PX / 2, 0)
        self.assertEqual(overlaps([("a", title), ("b", beside)]), [("a", "b")])
        far = title.translated(title.width + GAP_PX * 2, 0)
        self.assertEqual(overlaps([("a", title), ("b", far)]), [])


if __name__ == "__main__":
    unittest.main()
