"""An HTML report read back with the standard library's parser: its elements by tag and
class, the links it would follow, its tables' rows and its <title> texts."""
from __future__ import annotations

from collections import Counter
from html.parser import HTMLParser

# attributes through which a page fetches or links to something
LINK_ATTRIBUTES = ("src", "href", "xlink:href", "action", "data")


class ReadPage(HTMLParser):
    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: Counter[tuple[str, str]] = Counter()  # (tag, each class it has) -> count; (tag, "") for every element
        self.links: list[str] = []
        self.rows: list[list[str]] = []  # every table row, header rows too, as cell texts
        self.titles: list[str] = []  # the texts of SVG <title> elements (hover text)
        self.open: list[str] = []
        self._cell: list[str] | None = None
        self._title: list[str] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags[(tag, "")] += 1
        for cls in (attrs.get("class") or "").split():
            self.tags[(tag, cls)] += 1
        self.links += [value for key, value in attrs.items() if key in LINK_ATTRIBUTES and value]
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "title" and "svg" in self.open:
            self._title = []
        self.open.append(tag)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None
        elif tag == "title" and self._title is not None:
            self.titles.append("".join(self._title))
            self._title = None
        if tag in self.open:
            del self.open[len(self.open) - 1 - self.open[::-1].index(tag):]

    def handle_data(self, data):
        for sink in (self._cell, self._title):
            if sink is not None:
                sink.append(data)

    def count(self, tag: str, cls: str = "") -> int:
        return self.tags[(tag, cls)]
