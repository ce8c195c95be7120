"""One grammar for the name of every kernel configuration, CUTLASS-style: a family's frozen
`Config` declares its fields, and its name is made from them (`Config.name()`), never read
back inside. Names are parsed once, where they come in (`--variant`, the tuning cache, JSON):

    name  := family ("_" field)*
    field := tag value
    tag   := [a-z]+
    value := int ("x" int)*

e.g. tc_3xtf32_b128x64x32_w64x32_s3_k4. A tag means the same in every family (TAGS); a
family's fields come in its Config's order. A field declared with a default is left out of
the name when it has that value (no `_k1`: K is not split) and may be left out when parsing.
A family's name alone is no Config: it stands for the configuration the family's heuristic
picks for the node, which only the family can say. A name with some other field left out
is an error: partial names would make one name mean different kernels on different nodes.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import PluginError

# The vocabulary: each tag, what its value counts. Rows x columns are those of the output
# a worker computes: image rows x columns for the direct families, maps x pixels (of the
# batch) for the GEMM families, batch rows x outputs for Gemm.
TAGS = {
    "b": "block tile: rows x columns of the outputs a thread block computes, then the K depth it loads at a time",
    "w": "warp tile: rows x columns of the outputs a warp computes",
    "t": "thread tile: rows x columns of the outputs a thread computes",
    "m": "output maps a thread computes",
    "n": "8-pixel MMA tiles a warp computes per step",
    "c": "channel slices: threads that share the input channels of one output",
    "s": "stages: K slices in flight in shared memory",
    "k": "K split: parts the K loop is split over, their partial sums added in a fixed order",
    "o": "occupancy: blocks per SM the registers are budgeted for",
    "r": "rows a warp computes",
    "p": "planes: output maps a thread block computes side by side",
    "l": "loads: 1 stages a block's inputs in shared memory, 0 reads them from global memory where they are used",
    "h": "half links: the tensors a 16-bit kernel keeps channel-last in its format, 1 X + 2 Y + 4 the residual",
    "v": "vector: channels a thread computes side by side, read as one run of the format's bits",
}

_FIELD = re.compile(r"([a-z]+)(\d+(?:x\d+)*)")


def tagged(tag: str, size: int = 1, default: Any = dataclasses.MISSING) -> Any:
    """A Config field its name spells as `tag` and `size` integers joined by "x" (a tuple
    when size > 1); with a default, the name leaves it out when it has that value."""
    if tag not in TAGS:
        raise ValueError(f"unknown tag {tag!r}: add it to TAGS with its meaning")
    return dataclasses.field(default=default, metadata={"tag": tag, "size": size})


@dataclass(frozen=True)
class Config:
    """A configured variant of a family. This base has no fields: the family's name is its
    whole configuration. Families with choices subclass it with `tagged` fields."""

    family: str

    @classmethod
    def fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if "tag" in f.metadata]

    def name(self) -> str:
        parts = [self.family]
        for f in self.fields():
            value = getattr(self, f.name)
            if value != f.default:
                parts.append(f.metadata["tag"] + "x".join(map(str, value if f.metadata["size"] > 1 else (value,))))
        return "_".join(parts)

    def __str__(self) -> str:
        return self.name()

    @classmethod
    def form(cls, family: str) -> str:
        """The grammar of this family's names, e.g. "tc_3xtf32_b<int>x<int>x<int>_w<int>x<int>_s<int>[_k<int>]"."""
        parts = [family]
        for f in cls.fields():
            text = "_" + f.metadata["tag"] + "x".join(["<int>"] * f.metadata["size"])
            parts.append(f"[{text}]" if f.default is not dataclasses.MISSING else text)
        return "".join(parts)

    @classmethod
    def meanings(cls) -> str:
        """"b (block tile: ...), s (stages: ...)": the tags this family's names take."""
        return ", ".join(f"{f.metadata['tag']} ({TAGS[f.metadata['tag']]})" for f in cls.fields())

    @classmethod
    def from_fields(cls, family: str, name: str, texts: list[str]) -> "Config":
        """The Config of `family` the field texts of `name` spell; a PluginError saying what is wrong."""
        by_tag = {f.metadata["tag"]: f for f in cls.fields()}
        values: dict[str, Any] = {}
        for text in texts:
            match = _FIELD.fullmatch(text)
            # a field that is not tag-then-integers is a bad value of the tag it starts with, if any
            known = [t for t in by_tag if text.startswith(t)]
            tag = match.group(1) if match else max(known, key=len) if known else re.match(r"[a-z]*", text).group() or text
            if tag not in by_tag:
                takes = f"its fields are {cls.meanings()}" if by_tag else "its name alone is its whole configuration"
                raise PluginError(f"{name!r}: {family} has no field {tag!r}; {takes}")
            f = by_tag[tag]
            numbers = tuple(int(n) for n in match.group(2).split("x")) if match else ()
            if len(numbers) != f.metadata["size"]:
                example = tag + "x".join(["8"] * f.metadata["size"])
                raise PluginError(f"{name!r}: the field {text!r} must be {tag} and {f.metadata['size']} integer(s) joined by 'x' (e.g. {example})")
            if f.name in values:
                raise PluginError(f"{name!r}: the field {tag} is given twice")
            values[f.name] = numbers if f.metadata["size"] > 1 else numbers[0]
        missing = [f.metadata["tag"] for f in by_tag.values() if f.name not in values and f.default is dataclasses.MISSING]
        if missing:
            raise PluginError(
                f"{name!r}: {family} needs its field(s) {', '.join(missing)}: a name is the family alone "
                f"(the heuristic's pick) or {cls.form(family)}"
            )
        return cls(family, **values)


def parse(name: str, configs: Mapping[str, type[Config]], op: str) -> tuple[str, Config | None]:
    """(family, Config) for a configured name, (family, None) for a family's name alone;
    `configs` maps each family to its Config class. The longest family the name starts
    with owns it ("const_mo_m8" is const_mo's, not const's)."""
    owners = [family for family in configs if name == family or name.startswith(family + "_")]
    if not owners:
        raise PluginError(f"unknown {op} variant {name!r}; the families are {', '.join(configs)} (a name is a family and its fields, e.g. {_example(configs)})")
    family = max(owners, key=len)
    if name == family:
        return family, None
    return family, configs[family].from_fields(family, name, name[len(family) + 1 :].split("_"))


def _example(configs: Mapping[str, type[Config]]) -> str:
    return next((cls.form(family) for family, cls in configs.items() if cls.fields()), next(iter(configs)))
