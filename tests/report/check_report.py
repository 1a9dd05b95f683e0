#!/usr/bin/python3
"""Checks for the study report test (driven by chromium_report_test.sh).

  check_report.py dom DOM.html [--study STUDY.json] [--hostile]
      DOM.html is Chromium's --dump-dom of the rendered report. Checks the
      page's self-check element (#kvq-status: every chart rendered, no error,
      no warning, finished), and independently of it that every chart
      container (div.chart) holds an <svg> with data marks (children of Vega's
      g.role-mark groups), and (except with --hostile) that no chart text was
      cut short with an ellipsis. With --study, the outlier heatmap must draw one
      rect per value of the study's channel statistics. With --hostile, the
      strings planted by `hostile` must show as text and nothing they contain
      may have become markup.
  check_report.py screenshot SHOT.png DOM.html
      The screenshot (same window width as the DOM run) is not blank, and in
      each chart's box (recorded by the page in DOM.html) something was
      painted, in colour: thresholds in check_screenshot.
  check_report.py page-height DOM.html
      Prints the page height the page recorded (for the screenshot's size).
  check_report.py hostile IN.json OUT.json
      Copies a study, planting strings that would break an unescaped page.
"""
import json
import sys
from html.parser import HTMLParser

# Planted into every free-text field the report shows (see `hostile`). If any
# reached the page unescaped, the first would end the <script> element that
# holds the chart data (the page would lose its charts) and run a script,
# the <img> would try a load (blocked by the page's policy: an error), and the
# <b> would become an element.
HOSTILE = ("</script><script>document.title='INJECTED'</script>"
           "<img src=x onerror=\"document.title='INJECTED'\"><b id=kvq-injected>x</b>"
           "<!-- &amp; \u2028 '\"")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}
# Scripts the page is made of: the self-check, vega, vega-lite, vega-embed,
# the chart data (JSON) and the chart driver.
EXPECTED_SCRIPTS = 6


class Dom(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack = []  # (tag, attrs)
        self.status = None
        self.errors_text = []
        self.charts = {}  # id -> {"svg": n, "marks": n, "rect_marks": n, "attrs": {...}}
        self.scripts = 0
        self.injected = []
        self.title = ""
        self.text = []
        self.cut_labels = []  # chart text Vega shortened with an ellipsis

    def _chart(self):
        for tag, attrs in reversed(self.stack):
            if tag == "div" and "chart" in attrs.get("class", "").split():
                return attrs.get("id", "?")
        return None

    def handle_starttag(self, tag, attrs_list):
        attrs = dict(attrs_list)
        if tag == "div" and attrs.get("id") == "kvq-status":
            self.status = attrs
        if tag == "div" and "chart" in attrs.get("class", "").split():
            self.charts[attrs.get("id", "?")] = {"svg": 0, "marks": 0, "rect_marks": 0,
                                                 "attrs": attrs}
        if tag == "script":
            self.scripts += 1
        if attrs.get("id") == "kvq-injected" or tag == "img":
            self.injected.append(tag)
        chart = self._chart()
        if chart is not None:
            if tag == "svg":
                self.charts[chart]["svg"] += 1
            parent_tag, parent = self.stack[-1] if self.stack else ("", {})
            parent_classes = parent.get("class", "").split()
            if parent_tag == "g" and "role-mark" in parent_classes:
                self.charts[chart]["marks"] += 1
                if "mark-rect" in parent_classes:
                    self.charts[chart]["rect_marks"] += 1
        if tag not in VOID:
            self.stack.append((tag, attrs))

    def handle_startendtag(self, tag, attrs_list):
        self.handle_starttag(tag, attrs_list)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        tags = [t for t, _ in self.stack]
        if tags and tags[-1] == "title":
            self.title += data
        if any(a.get("id") == "kvq-errors" for _, a in self.stack):
            self.errors_text.append(data)
        if "script" not in tags and "style" not in tags:
            self.text.append(data)
        if "svg" in tags and data.rstrip().endswith("\u2026"):
            chart = self._chart()
            if chart is not None:
                self.cut_labels.append(f"{chart}: {data.strip()}")


def heatmap_cells(study):
    cells = 0
    for layer in study.get("outliers", {}).get("layers", []):
        for key in ("k_pre_rope_channel_mean_abs", "k_post_rope_channel_mean_abs",
                    "v_channel_mean_abs"):
            for head in layer.get(key) or []:
                cells += sum(1 for v in head if v is not None)
    return cells


def check_dom(path, study_path, hostile):
    dom = Dom()
    with open(path, encoding="utf-8") as f:
        dom.feed(f.read())
    failures = []
    status = dom.status
    if status is None:
        return ["no #kvq-status element in the page"]
    print("status:", {k: v for k, v in status.items() if k.startswith("data-")})
    expected = int(status.get("data-charts-expected", "-1"))
    if status.get("data-done") != "1":
        failures.append("the page did not finish rendering (data-done != 1)")
    if status.get("data-charts-ok") != str(expected) or expected <= 0:
        failures.append(f"charts ok {status.get('data-charts-ok')} of {expected}")
    for key in ("data-charts-failed", "data-errors", "data-warnings"):
        if status.get(key) != "0":
            failures.append(f"{key} = {status.get(key)}")
    if "".join(dom.errors_text).strip():
        failures.append("page reported: " + " | ".join(dom.errors_text))
    if len(dom.charts) != expected:
        failures.append(f"{len(dom.charts)} chart containers, page expects {expected}")
    for chart, seen in dom.charts.items():
        print(f"{chart}: {seen['svg']} svg, {seen['marks']} marks "
              f"(page counted {seen['attrs'].get('data-marks')})")
        if seen["svg"] < 1 or seen["marks"] < 1:
            failures.append(f"{chart}: no SVG with marks")
    if dom.scripts != EXPECTED_SCRIPTS:
        failures.append(f"{dom.scripts} <script> elements, expected {EXPECTED_SCRIPTS}")
    if study_path:
        with open(study_path, encoding="utf-8") as f:
            cells = heatmap_cells(json.load(f))
        got = dom.charts.get("chart-outlier-heatmap", {}).get("rect_marks", 0)
        print(f"outlier heatmap: {got} rects for {cells} channel values")
        if cells and got != cells:
            failures.append(f"outlier heatmap drew {got} rects for {cells} values")
    if dom.cut_labels and not hostile:  # the planted strings are too long for any label
        failures.append("labels cut short: " + " | ".join(dom.cut_labels[:5]))
    if hostile:
        if dom.injected:
            failures.append(f"planted markup became elements: {dom.injected}")
        if dom.title.strip() == "INJECTED":
            failures.append("a planted script ran (document.title changed)")
        if HOSTILE not in "".join(dom.text):
            failures.append("the planted string is not shown verbatim as text")
    return failures


def chart_boxes(dom_path):
    """{chart id: (x, y, width, height)} recorded by the page when it finished."""
    dom = Dom()
    with open(dom_path, encoding="utf-8") as f:
        dom.feed(f.read())
    boxes = {}
    for chart, seen in dom.charts.items():
        box = seen["attrs"].get("data-box")
        if box:
            boxes[chart] = tuple(int(v) for v in box.split(","))
    return boxes, int((dom.status or {}).get("data-page-height", "0"))


def check_screenshot(path, dom_path):
    import matplotlib.image  # python3-matplotlib, a project package
    import numpy
    pixels = matplotlib.image.imread(path)[..., :3]  # [height, width, rgb] in [0, 1]
    failures = []
    std = float(pixels.std())
    print(f"screenshot {pixels.shape[1]}x{pixels.shape[0]}: pixel std {std:.4f}")
    # A blank or single-colour page has std 0; the fixture's report ~0.18, the
    # same page with its charts missing (text and tables only) ~0.11.
    if std < 0.05:
        failures.append(f"screenshot looks blank: pixel std {std:.4f} < 0.05")
    boxes, _ = chart_boxes(dom_path)
    if not boxes:
        failures.append("the page recorded no chart positions (data-box)")
    for chart, (x, y, w, h) in sorted(boxes.items(), key=lambda kv: kv[1][1]):
        region = pixels[y:y + h, x:x + w]
        if region.size == 0 or y + h > pixels.shape[0]:
            failures.append(f"{chart}: box {x},{y},{w},{h} outside the screenshot")
            continue
        ink = float((numpy.abs(region - 1.0).max(axis=-1) > 0.1).mean())
        saturation = region.max(axis=-1) - region.min(axis=-1)
        colour = float((saturation > 0.25).mean())
        print(f"{chart}: {w}x{h} at {x},{y}: {100 * ink:.2f}% ink, {100 * colour:.2f}% coloured")
        # Thresholds from the fixture's charts at 1400 px wide: ink 8-57% and
        # coloured 0.65% (Pareto: a few red points on grey) to 49% (heatmaps)
        # per chart. An empty container is white (0%, 0%); axes, legends and
        # text are grey or black, so a chart that painted only those has ink
        # but no coloured pixels. Every chart of the report draws its data
        # marks in colour.
        if ink < 0.02:
            failures.append(f"{chart}: blank in the screenshot ({100 * ink:.2f}% ink < 2%)")
        if colour < 0.002:
            failures.append(f"{chart}: no coloured marks in the screenshot "
                            f"({100 * colour:.2f}% < 0.2%)")
    return failures


def make_hostile(src, dst):
    with open(src, encoding="utf-8") as f:
        study = json.load(f)
    study["command"] = HOSTILE
    study.setdefault("model", {})["path"] = HOSTILE
    study.setdefault("text", {})["path"] = HOSTILE
    if study.get("schemes"):
        study["schemes"][0]["name"] = HOSTILE
        study["schemes"][0]["k_type"] = HOSTILE
    if study.get("memory", {}).get("series"):
        study["memory"]["series"][0]["name"] = HOSTILE
    if study.get("fake_quant", {}).get("rows"):
        study["fake_quant"]["rows"][0]["name"] = HOSTILE
    study.setdefault("timings_seconds", {})[HOSTILE] = 1.0
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(study, f)


def main(argv):
    if len(argv) >= 3 and argv[1] == "dom":
        study = argv[argv.index("--study") + 1] if "--study" in argv else None
        failures = check_dom(argv[2], study, "--hostile" in argv)
    elif len(argv) == 4 and argv[1] == "screenshot":
        failures = check_screenshot(argv[2], argv[3])
    elif len(argv) == 3 and argv[1] == "page-height":
        print(chart_boxes(argv[2])[1])
        return 0
    elif len(argv) == 4 and argv[1] == "hostile":
        make_hostile(argv[2], argv[3])
        return 0
    else:
        print(__doc__)
        return 2
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
