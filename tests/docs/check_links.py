#!/usr/bin/env python3
"""Every relative link in README.md and docs/**/*.md resolves.

Usage:
  tests/docs/check_links.py               check README.md and docs/**/*.md of this checkout
  tests/docs/check_links.py FILE.md ...   check those files (paths inside the checkout)
  tests/docs/check_links.py --self-test   show that the check catches each kind of broken link

A relative link (inline `[text](target)`, an image, a reference definition `[name]: target`, or an
HTML `href`/`src`) must name a file or directory that exists inside the repository, and a
`#anchor` must name a heading of the target Markdown file (GitHub's slugs: lower case, punctuation
dropped, spaces as hyphens, `-1`, `-2` for repeats) or an `id`/`name` anchor in it. Links with a
scheme (https:, mailto:) are not fetched. Links in code spans and fenced code blocks are not links.
Exits 1 and names each broken link (file:line) when one does not resolve. Python 3 only, no
packages: hack/docs.sh runs it, and hack/test.sh runs that.
"""
import glob
import os
import re
import sys
import tempfile
import unicodedata
from urllib.parse import unquote

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_REF = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
HTML_ANCHOR = re.compile(r"""<[a-z]+\b[^>]*?\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s{0,3}(```+|~~~+)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text):
    """(line number, line) of TEXT outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * 3
            elif m.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            yield number, line


def without_code_spans(line):
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def links(text):
    """(line number, target) of every link in Markdown TEXT."""
    for number, line in prose_lines(text):
        line = without_code_spans(line)
        for pattern in (INLINE, REFERENCE, HTML_REF):
            for m in pattern.finditer(line):
                yield number, m.group(1)


def heading_text(raw):
    """A heading as GitHub renders its text: code spans, links and emphasis reduced to their words."""
    text = CODE_SPAN.sub(lambda m: m.group(2), raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"(\*\*|__|\*|\b_|_\b|~~)", "", text)
    return text


def slug(text):
    """GitHub's anchor for a heading's text: lower case, only letters, digits, marks, '-', '_' and
    spaces kept, each space a hyphen."""
    kept = []
    for ch in text.strip().lower():
        category = unicodedata.category(ch)
        if ch in "-_" or category[0] in "LNM":
            kept.append(ch)
        elif ch == " ":
            kept.append("-")
    return "".join(kept)


def anchors(text):
    """The anchors a Markdown file offers: its headings' slugs (repeats numbered) and HTML ids."""
    found, seen = set(), {}
    for _, line in prose_lines(text):
        m = HEADING.match(line)
        if m:
            base = slug(heading_text(m.group(2)))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        for a in HTML_ANCHOR.finditer(line):
            found.add(a.group(1))
    return found


def problems(path, root):
    """What is wrong with the relative links of the Markdown file PATH, as 'file:line: message'."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    here = os.path.dirname(path)
    shown = os.path.relpath(path, root)
    found = []
    for number, target in links(text):
        if SCHEME.match(target) or target.startswith("//"):
            continue
        file_part, _, anchor = target.partition("#")
        file_part = unquote(file_part.split("?")[0])
        if file_part.startswith("/"):
            resolved = os.path.normpath(os.path.join(root, file_part.lstrip("/")))
        else:
            resolved = os.path.normpath(os.path.join(here, file_part)) if file_part else path
        where = f"{shown}:{number}: link ({target})"
        if os.path.commonpath([resolved, root]) != root:
            found.append(f"{where} leaves the repository")
            continue
        if not os.path.exists(resolved):
            found.append(f"{where}: no such file {os.path.relpath(resolved, root)}")
            continue
        if anchor:
            if not resolved.endswith(".md") or os.path.isdir(resolved):
                found.append(f"{where}: an anchor into {os.path.relpath(resolved, root)}, which is not Markdown")
                continue
            with open(resolved, encoding="utf-8") as f:
                offered = anchors(f.read())
            if unquote(anchor).lower() not in {a.lower() for a in offered}:
                found.append(f"{where}: no heading #{anchor} in {os.path.relpath(resolved, root)}")
    return found


def default_files(root):
    files = [os.path.join(root, "README.md")]
    files += sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
    return [f for f in files if os.path.exists(f)]


def check(files, root):
    found, count = [], 0
    for path in files:
        found += problems(os.path.abspath(path), root)
        with open(path, encoding="utf-8") as f:
            count += sum(1 for _, t in links(f.read()) if not SCHEME.match(t) and not t.startswith("//"))
    return found, count


def self_test():
    """Each kind of broken link is reported, and the good ones are not."""
    good = {
        "README.md": "# Title\n\n## Lock scopes\n\n### `ClusterMutex`: one lock across namespaces\n\n"
                     "## Lock scopes\n\nSee [docs](docs/design.md), [a dir](docs/), [scopes](#lock-scopes), "
                     "[again](#lock-scopes-1), [cmtx](#clustermutex-one-lock-across-namespaces), "
                     "![pic](docs/pic.svg), [up](https://github.com/jenkins-x/jx/issues/6167), "
                     "`[not a link](nowhere.md)`.\n\n```\n[nor this](nowhere.md)\n```\n\n[ref]: docs/design.md#code-map\n",
        "docs/design.md": "# Design\n\n## Code map\n\nBack to [the README](../README.md#title).\n",
        "docs/pic.svg": "<svg/>",
    }
    broken = {
        "[gone](docs/missing.md)": "no such file docs/missing.md",
        "[anchor](docs/design.md#no-such-heading)": "no heading #no-such-heading",
        "[here](#nowhere)": "no heading #nowhere",
        "[out](../shared/notes.md)": "leaves the repository",
        "![img](docs/missing.png)": "no such file docs/missing.png",
        "<a href=\"docs/gone.md\">x</a>": "no such file docs/gone.md",
        "[svg anchor](docs/pic.svg#x)": "not Markdown",
        "[ref2]: docs/design.md#nope": "no heading #nope",
    }
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.realpath(tmp)
        for name, text in good.items():
            os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
            with open(os.path.join(root, name), "w") as f:
                f.write(text)
        found, count = check(default_files(root), root)
        if found or count != 8:
            failures.append(f"good links reported as broken, or not all seen ({count} of 8): {found}")
        for link, expected in broken.items():
            with open(os.path.join(root, "README.md"), "w") as f:
                f.write(good["README.md"] + "\n" + link + "\n")
            found, _ = check(default_files(root), root)
            if len(found) != 1 or expected not in found[0]:
                failures.append(f"{link}: expected one report saying '{expected}', got {found}")
    for failure in failures:
        print(f"check_links self-test: FAIL: {failure}", file=sys.stderr)
    if failures:
        return 1
    print(f"check_links self-test: ok ({len(broken)} kinds of broken link caught, the good ones passed)")
    return 0


def main(args):
    if args == ["--self-test"]:
        return self_test()
    if any(a.startswith("-") for a in args):
        print(__doc__, file=sys.stderr)
        return 2
    files = [os.path.abspath(a) for a in args] or default_files(ROOT)
    found, count = check(files, ROOT)
    for problem in found:
        print(f"broken link: {problem}", file=sys.stderr)
    if found:
        print(f"check_links: {len(found)} of {count} relative links in {len(files)} files do not resolve",
              file=sys.stderr)
        return 1
    print(f"check_links: all {count} relative links in {len(files)} files resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
