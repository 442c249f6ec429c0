"""GCIDE (Debian ``dict-gcide``): dictionary senses with part of speech, subject field, origin and usage.

Every sense whose entry carries a WordNet source tag is dropped (WordNet glosses are reserved for
evaluation). The labels are taken out of the text: "(Zool.)", "[Obs.]" and the etymology never
reach it. The text is "headword, sense", the shape of a dictionary line.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from benchmarks.studies.anytext.dictd import read_entries
from benchmarks.studies.anytext.sources import Row

DICT = Path("usr/share/dictd")

#: the end-of-paragraph tags naming where a text came from ("[1913 Webster]", "[WordNet 1.5]", "[PJC]")
_SOURCE_TAG = re.compile(r"\[[^\[\]]*(?:Webster|WordNet|PJC|Century|\bAS\b)[^\[\]]*\]")
_WORDNET = re.compile(r"WordNet", re.IGNORECASE)

#: part of speech after the pronunciation: ", n." ", a." ", v. t." ", adv."
_POS = re.compile(r"\\,?\s*(?:\([^()]*\)\s*)?,?\s*(n|a|adj|v\. ?t|v\. ?i|v|adv)\.", re.IGNORECASE)
_POS_NAMES = {"n": "noun", "a": "adjective", "adj": "adjective", "adv": "adverb"}

#: the first word of an etymology "[L. abacus ...]" -> the language the word came from
_ORIGINS = {
    "L": "Latin",
    "LL": "Latin",
    "NL": "Latin",
    "ML": "Latin",
    "F": "French",
    "OF": "French",
    "Fr": "French",
    "Gr": "Greek",
    "LGr": "Greek",
    "AS": "Old English",
    "OE": "Old English",
    "ME": "Old English",
    "G": "German",
    "OHG": "German",
    "MHG": "German",
    "LG": "German",
    "D": "Dutch",
    "It": "Italian",
    "Sp": "Spanish",
    "Pg": "Portuguese",
    "Ar": "Arabic",
    "Heb": "Hebrew",
    "Icel": "Norse",
    "Sw": "Norse",
    "Dan": "Norse",
    "Norw": "Norse",
    "ON": "Norse",
    "Per": "Persian",
    "Pers": "Persian",
    "Skr": "Sanskrit",
    "Hind": "Hindi",
    "Turk": "Turkish",
    "Russ": "Russian",
    "Malay": "Malay",
    "Chin": "Chinese",
    "Jap": "Japanese",
    "W": "Welsh",
    "Ir": "Irish",
    "Gael": "Gaelic",
    "Celt": "Celtic",
    "Mex": "Mexican",
    "Peruv": "Peruvian",
    "Braz": "Brazilian",
}

#: usage marks "[Obs.]", "(Colloq.)" -> one spelling each
_USAGES = {
    "obs": "obsolete",
    "r": "rare",
    "colloq": "colloquial",
    "archaic": "archaic",
    "slang": "slang",
    "cant": "slang",
    "low": "slang",
    "vulgar": "vulgar",
    "poetic": "poetic",
    "poet": "poetic",
    "fig": "figurative",
    "humorous": "humorous",
    "jocose": "humorous",
    "prov. eng": "regional",
    "prov": "regional",
    "dial": "regional",
    "scot": "regional",
    "local": "regional",
    "local, u.s": "regional",
    "u.s": "regional",
    "u. s": "regional",
    "eng": "regional",
}

#: subject fields, abbreviations and spelt-out names -> one name each; others are kept as written
_FIELDS = {
    "zool": "zoology",
    "zoology": "zoology",
    "bot": "botany",
    "botany": "botany",
    "med": "medicine",
    "medicine": "medicine",
    "naut": "nautical",
    "mus": "music",
    "music": "music",
    "chem": "chemistry",
    "chemistry": "chemistry",
    "anat": "anatomy",
    "anatomy": "anatomy",
    "arch": "architecture",
    "geol": "geology",
    "math": "mathematics",
    "mathematics": "mathematics",
    "eccl": "ecclesiastical",
    "mil": "military",
    "her": "heraldry",
    "physiol": "physiology",
    "min": "mineralogy",
    "gram": "grammar",
    "mech": "mechanics",
    "astron": "astronomy",
    "rhet": "rhetoric",
    "print": "printing",
    "pros": "prosody",
    "com": "commerce",
    "elec": "electricity",
    "paleon": "paleontology",
    "geom": "geometry",
    "photog": "photography",
    "biol": "biology",
    "metal": "metallurgy",
    "far": "farriery",
    "theol": "theology",
    "myth": "mythology",
    "mythol": "mythology",
    "manuf": "manufacturing",
    "carp": "carpentry",
    "fort": "fortification",
    "gun": "gunnery",
    "script": "scripture",
    "philol": "philology",
    "pathol": "pathology",
    "surg": "surgery",
    "law": "law",
    "logic": "logic",
    "mining": "mining",
    "falconry": "falconry",
    "engin": "engineering",
    "steam engin": "engineering",
    "pharm": "pharmacy",
    "optics": "optics",
    "opt": "optics",
    "zool. & bot": "zoology",
    "philos": "philosophy",
    "metaph": "philosophy",
    "meteor": "meteorology",
    "physics": "physics",
    "bibliog": "bibliography",
    "agric": "agriculture",
    "r. r": "railways",
    "rom. antiq": "antiquities",
    "antiq": "antiquities",
    "gr. antiq": "antiquities",
    "eccl. hist": "ecclesiastical",
    "old law": "law",
    "civil law": "law",
    "crystallog": "crystallography",
    "dyeing": "dyeing",
    "cookery": "cookery",
    "mach": "machinery",
    "physiol. chem": "chemistry",
    "r. c. ch": "ecclesiastical",
    "o. eng. law": "law",
    "eng. law": "law",
    "scots law": "law",
    "ethnol": "ethnology",
    "paint": "painting",
    "computers": "computing",
    "phon": "phonetics",
    "phonetics": "phonetics",
    "class. myth": "mythology",
}

_ESCAPE = re.compile(r"\[([=.^~'\"`,*-]?)([a-z]{1,2})([=.^~'\"`,*-]?)\]")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_PARENS = re.compile(r"\([^()]*\)")
_LEADING_LABEL = re.compile(r"^\s*(?:\(([A-Z][^()]{0,30})\)|\[[^\[\]]*\])\s*")
_CITATION = re.compile(r"\s--\s?[A-Z{].*$")
_NUMBERED = re.compile(r"^\s+(\d+)\.\s")
_SUBSENSE = re.compile(r"(?:^|\s)\(([a-z])\)\s")


def _unescape(text: str) -> str:
    """Replace GCIDE's character escapes ("Zo[\"o]l.", "Sci[ae]na") by their letters."""
    return _ESCAPE.sub(lambda m: m.group(2), text)


def _plain(value: str) -> str:
    """Lower-case a label spelling with its accents removed ("Zoöl." -> "zool")."""
    decomposed = unicodedata.normalize("NFKD", _unescape(value))
    return "".join(c for c in decomposed if not unicodedata.combining(c)).lower().strip().rstrip(".").strip()


def _usage(mark: str) -> str | None:
    return _USAGES.get(_plain(mark))


def _field(mark: str) -> str | None:
    """Return the subject field a leading "(Zool.)" names, or None for what is not one (a usage, a remark)."""
    key = _plain(mark)
    if key in _USAGES or "?" in key or len(key) < 3 and key != "r. r":
        return None
    if key in _FIELDS:
        return _FIELDS[key]
    first = re.split(r"\s*(?:&|,|;| and )\s*", key)[0].rstrip(".")
    return _FIELDS.get(first, first if re.fullmatch(r"[a-z][a-z. ]{2,24}", first) else None)


def _split_header(lines: list[str]) -> tuple[str, list[str]]:
    """Split an entry into its header (headword, pronunciation, part of speech, etymology) and body lines."""
    header = [lines[0]]
    depth = lines[0].count("[") - lines[0].count("]")
    i = 1
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        bare = _PARENS.sub("", _BRACKETS.sub("", stripped)).strip(" .,;")
        if depth > 0 or (stripped[:1] in "([" and stripped and not bare):
            header.append(line)
            depth += line.count("[") - line.count("]")
            i += 1
            continue
        break
    return " ".join(s.strip() for s in header), lines[i:]


def _origin(header: str) -> str | None:
    for bracket in _BRACKETS.findall(header):
        words = bracket[1:-1].split()
        if not words:
            continue
        first = words[0].rstrip(".")
        if first in _ORIGINS:
            return _ORIGINS[first]
        if first.lower() in {"imp", "pl", "p", "see", "written", "obs", "r", "colloq"}:
            continue
        return None
    return None


def _pos(header: str) -> str | None:
    match = _POS.search(header)
    if not match:
        return None
    tag = match.group(1).lower().replace(" ", "")
    return "verb" if tag.startswith("v") else _POS_NAMES.get(tag)


def _clean(text: str) -> str:
    """Take a sense's markup out: braces, bracketed remarks, citations, character escapes."""
    text = _BRACKETS.sub("", _unescape(text))
    text = _CITATION.sub(" ", text)
    text = text.replace("{", "").replace("}", "").replace("\\", "")
    return re.sub(r"\s+", " ", text).strip(" ;,")


def _sense_rows(head: str, body: str, inherited: dict[str, str | None]) -> list[Row]:
    """Return the rows of one numbered (or the only) sense; "(a)", "(b)" sub-senses become rows of their own."""
    labels = dict(inherited)
    text = _unescape(body)
    while True:
        match = _LEADING_LABEL.match(text)
        if not match:
            break
        mark = match.group(1) or match.group(0).strip()[1:-1]
        if (usage := _usage(mark)) is not None:
            labels["usage"] = labels["usage"] or usage
        elif (field := _field(mark)) is not None:
            labels["field"] = field
        text = text[match.end() :]
    for bracket in _BRACKETS.findall(text):
        if (usage := _usage(bracket[1:-1])) is not None:
            labels["usage"] = usage
            break
    pieces = _SUBSENSE.split(text)
    if len(pieces) > 1:
        rows: list[Row] = []
        for sub in pieces[2::2]:
            rows.extend(_sense_rows(head, sub, labels))
        return rows
    cleaned = _clean(text)
    if len(cleaned.split()) < 3:
        return []
    return [{"term": head, "text": f"{head}, {cleaned}", **labels}]


def parse_entry(head: str, entry: str) -> list[Row]:
    """Return one row per sense of a GCIDE entry, or none when the entry is tagged WordNet."""
    if _WORDNET.search(entry):
        return []
    lines = [line for line in entry.splitlines()]
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return []
    header, body = _split_header(lines)
    header = _unescape(header)
    head = re.split(r"\s*\\", header, maxsplit=1)[0].strip() or head
    labels: dict[str, str | None] = {"pos": _pos(header), "origin": _origin(header), "field": None, "usage": None}
    after_pos = _POS.split(header, maxsplit=1)[-1]
    for mark in _PARENS.findall(_BRACKETS.sub("", after_pos)):
        inner = mark[1:-1]
        if (usage := _usage(inner)) is not None:
            labels["usage"] = usage
        elif inner[:1].isupper() and (field := _field(inner)) is not None:
            labels["field"] = field
    for bracket in _BRACKETS.findall(header):
        if (usage := _usage(bracket[1:-1])) is not None:
            labels["usage"] = usage
    paragraphs: list[list[str]] = [[]]
    for line in body:
        if not line.strip() or _SOURCE_TAG.fullmatch(line.strip()):
            paragraphs.append([])
        else:
            paragraphs[-1].append(_SOURCE_TAG.sub("", line))
    senses: list[str] = []
    numbered = any(_NUMBERED.match(p[0]) for p in paragraphs if p)
    for para in paragraphs:
        if not para:
            continue
        first = para[0]
        indent = len(first) - len(first.lstrip())
        stripped = first.strip()
        if indent > 6 or stripped.startswith(("Note:", "Syn:", "{", "--", "[")):
            continue  # a quotation, a note, synonyms or a compound of its own
        if numbered and not _NUMBERED.match(first):
            continue
        text = " ".join(s.strip() for s in para)
        senses.append(re.sub(r"^\d+\.\s*", "", text))
        if not numbered:
            break
    rows: list[Row] = []
    for sense in senses:
        rows.extend(_sense_rows(head, sense, labels))
    return rows


def parse(root: Path) -> list[Row]:
    """Return every sense of ``gcide.index`` + ``gcide.dict.dz`` under ``root`` as rows."""
    rows: list[Row] = []
    for head, entry in read_entries(root / DICT / "gcide.index", root / DICT / "gcide.dict.dz"):
        rows.extend(parse_entry(head, entry))
    return rows
