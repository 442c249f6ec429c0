"""EDICT (Debian ``edict``, EUC-JP): English glosses of Japanese words with field, part of speech and register.

A row is one sense: its glosses joined by "; ", with every "(n)", "(comp)", "(arch)" tag taken out.
Only senses that carry a field or a register are kept (the rest carry nothing but a part of speech).
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.studies.anytext.sources import Row

EDICT = Path("usr/share/edict/edict")

#: JMdict field tags -> a readable name
FIELDS = {
    "comp": "computing",
    "Buddh": "Buddhism",
    "food": "food",
    "math": "mathematics",
    "med": "medicine",
    "sports": "sports",
    "music": "music",
    "sumo": "sumo",
    "ling": "linguistics",
    "baseb": "baseball",
    "astron": "astronomy",
    "physics": "physics",
    "chem": "chemistry",
    "mahj": "mahjong",
    "law": "law",
    "biol": "biology",
    "anat": "anatomy",
    "geol": "geology",
    "MA": "martial arts",
    "hanaf": "hanafuda",
    "finc": "finance",
    "bot": "botany",
    "mil": "military",
    "Shinto": "Shinto",
    "archit": "architecture",
    "shogi": "shogi",
    "Christn": "Christianity",
    "engr": "engineering",
    "econ": "economics",
    "bus": "business",
    "zool": "zoology",
    "physiol": "physiology",
    "phil": "philosophy",
    "go": "go",
    "gramm": "grammar",
    "pathol": "pathology",
    "elec": "electricity",
    "cards": "card games",
    "tradem": "trademark",
}
#: JMdict misc tags that say how a word is used -> a register
REGISTERS = {
    "arch": "archaic",
    "obs": "obsolete",
    "dated": "dated",
    "col": "colloquial",
    "sl": "slang",
    "net-sl": "slang",
    "m-sl": "slang",
    "hon": "honorific",
    "hum": "humble",
    "pol": "polite",
    "vulg": "vulgar",
    "derog": "derogatory",
    "fam": "familiar",
    "joc": "jocular",
    "sens": "sensitive",
    "male": "male speech",
    "fem": "female speech",
    "poet": "poetic",
    "chn": "children's language",
}
#: other misc tags: taken out of the text, no label
OTHER_TAGS = frozenset(
    {"P", "uk", "uK", "abbr", "on-mim", "yoji", "id", "proverb", "io", "iK", "ik", "ok", "oK", "ateji", "obsc"}
    | {"gikun", "rare", "litf", "quote", "X", "exp", "unc", "num", "ctr", "int", "conj", "prt", "pn", "aux"}
)
_POS_TOKEN = re.compile(r"(?:n|n-\w+|v\w*(?:-\w+)?|adj-?\w*|adv(?:-to)?|pref|suf|aux-\w+|cop\S*|vs-\w+)")
_TAG_GROUP = re.compile(r"^\(([^()]+)\)\s*")


def _pos(tokens: list[str]) -> str | None:
    for token in tokens:
        if token in {"n", "pn", "n-suf", "n-pref", "n-adv", "n-t"}:
            return "noun"
        if token.startswith("adj"):
            return "adjective"
        if token.startswith("adv"):
            return "adverb"
        if token.startswith("v") and token != "vs":
            return "verb"
        if token == "exp":
            return "expression"
        if token == "int":
            return "interjection"
    return None


def _is_tag(token: str) -> bool:
    return (
        token in FIELDS
        or token in REGISTERS
        or token in OTHER_TAGS
        or token.isdigit()
        or token.endswith(":")
        or bool(_POS_TOKEN.fullmatch(token))
    )


def parse_line(line: str) -> list[Row]:
    """Return the labelled senses of one EDICT line ``WORD [READING] /(pos) (1) (field) gloss/gloss/.../``."""
    if "/" not in line:
        return []
    head, _, rest = line.partition(" /")
    word = head.split(" [")[0].strip()
    rows: list[Row] = []
    current: Row | None = None
    glosses: list[str] = []

    def close() -> None:
        if current is not None and glosses and (current["field"] or current["register"]):
            rows.append({**current, "text": "; ".join(glosses)})

    for gloss in rest.strip("/\n").split("/"):
        gloss = gloss.strip()
        if not gloss or gloss in {"(P)", "EntL"} or gloss.startswith("EntL"):
            continue
        tags: list[str] = []
        while (match := _TAG_GROUP.match(gloss)) and all(_is_tag(t) for t in match.group(1).split(",")):
            tags.extend(match.group(1).split(","))
            gloss = gloss[match.end() :]
        if tags and (current is None or any(t.isdigit() for t in tags) or _pos(tags)):
            close()
            current, glosses = {"term": word, "field": None, "pos": None, "register": None}, []
        if current is None:
            current = {"term": word, "field": None, "pos": None, "register": None}
        for tag in tags:
            if tag in FIELDS and current["field"] is None:
                current["field"] = FIELDS[tag]
            elif tag in REGISTERS and current["register"] is None:
                current["register"] = REGISTERS[tag]
        current["pos"] = current["pos"] or _pos(tags)
        if gloss:
            glosses.append(gloss)
    close()
    return rows


def parse(root: Path) -> list[Row]:
    """Return every sense of ``usr/share/edict/edict`` under ``root`` that has a field or a register."""
    text = (root / EDICT).read_bytes().decode("euc_jp", errors="replace")
    rows: list[Row] = []
    for line in text.splitlines()[1:]:  # the first line is the file's own header
        rows.extend(parse_line(line))
    return rows
