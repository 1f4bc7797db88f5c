"""benchmarks/text/make_corpus.py reads WordNet's data.noun as ``man 5 wndb`` says, labels a synset
by the one category above it (through hypernyms and instance hypernyms), drops short and
repeated definitions, and draws the same corpus from the same seed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from benchmarks.text import make_corpus

# Lines of WordNet 3.0's data.noun, each with its hypernym pointers only (the format's own
# pointer count says so), and the licence header's first line.
LINES = [
    "  1 This software and database is being provided to you, the LICENSEE, by  \n",
    "01471682 05 n 02 vertebrate 0 craniate 0 000 | animals having a bony or cartilaginous skeleton"
    " with a segmented spinal column and a large brain enclosed in a skull or cranium  \n",
    "01503061 05 n 01 bird 0 001 @ 01471682 n 0000 | warm-blooded egg-laying vertebrates characterized"
    " by feathers and forelimbs modified as wings  \n",
    "01524359 05 n 02 passerine 0 passeriform_bird 0 001 @ 01503061 n 0000 | perching birds mostly"
    " small and living near the ground with feet having 4 toes arranged to allow for gripping the"
    " perch; most are songbirds; hatchlings are helpless  \n",
    "01525720 05 n 02 oscine 0 oscine_bird 0 001 @ 01524359 n 0000 | passerine bird having"
    " specialized vocal apparatus  \n",
    "10794014 18 n 02 writer 0 author 0 000 | writes (books or stories or articles or the like)"
    " professionally (for pay)  \n",
    "10444194 18 n 01 poet 0 001 @ 10794014 n 0000 | a writer of poems (the term is usually reserved"
    " for writers of good poetry)  \n",
    "10894065 18 n 02 Chaucer 0 Geoffrey_Chaucer 0 001 @i 10444194 n 0000 | English poet remembered"
    " as author of the Canterbury Tales (1340-1400)  \n",
    # a bird that is also a writer: under two categories, so in neither
    "99999901 05 n 01 bird_writer 0 002 @ 01503061 n 0000 @ 10794014 n 0000 | a songbird that"
    " writes songs for other birds  \n",
    # too short, and a definition that two synsets share
    '99999902 05 n 01 wren 0 001 @ 01525720 n 0000 | small songbird; "a wren sang"  \n',
    "99999903 05 n 01 twin_a 0 001 @ 01503061 n 0000 | a bird that has a twin definition here  \n",
    "99999904 05 n 01 twin_b 0 001 @ 01503061 n 0000 | A bird that has a twin definition here  \n",
]
CATEGORIES = {"bird": "01503061", "writer": "10794014"}


@pytest.fixture
def synsets() -> dict[str, make_corpus.Synset]:
    parsed = (make_corpus.parse_line(line) for line in LINES)
    return {s.offset: s for s in parsed if s is not None}


def test_a_line_gives_its_lexicographer_file_first_lemma_definition_and_hypernyms(synsets):
    assert synsets["10894065"] == make_corpus.Synset(
        offset="10894065",
        lexname="noun.person",
        lemma="Chaucer",
        text="English poet remembered as author of the Canterbury Tales (1340-1400)",
        parents=("10444194",),
    )
    assert synsets["01524359"].text == (
        "perching birds mostly small and living near the ground with feet having 4 toes arranged "
        "to allow for gripping the perch"
    )
    assert synsets["99999902"].text == "small songbird"
    assert len(synsets) == len(LINES) - 1  # the licence line is not a synset


def test_each_usable_synset_is_labelled_by_the_one_category_above_it(synsets):
    labels = {s.lemma: label for s, label in make_corpus.labelled(synsets, CATEGORIES)}
    assert labels == {
        "bird": "bird",
        "passerine": "bird",
        "oscine": "bird",  # two hypernym steps up
        "writer": "writer",
        "poet": "writer",
        "Chaucer": "writer",  # an instance of poet, a kind of writer
    }  # vertebrate: under none; bird writer: under two; wren: 2 words; the twins: one text


def test_a_category_that_is_not_wordnet_30s_is_refused(synsets):
    with pytest.raises(SystemExit, match="01503061 is not 'fish'"):
        make_corpus.labelled(synsets, {"fish": "01503061"})


def test_the_same_seed_draws_the_same_held_out_split(synsets):
    rows = make_corpus.labelled(synsets, CATEGORIES)
    records = make_corpus.sample(rows, gallery=2, queries=1, seed=3)
    assert records == make_corpus.sample(rows, gallery=2, queries=1, seed=3)
    assert [r["id"] for r in records] == list(range(6))
    assert [r["split"] for r in records] == ["gallery"] * 4 + ["query"] * 2
    assert sorted(r["label"] for r in records if r["split"] == "query") == ["bird", "writer"]
    assert len({r["text"] for r in records}) == 6
    with pytest.raises(SystemExit, match="bird has 3 usable synsets"):
        make_corpus.sample(rows, gallery=3, queries=1)


def test_the_corpus_file_has_the_same_bytes_for_the_same_records(synsets, tmp_path: Path):
    records = make_corpus.sample(make_corpus.labelled(synsets, CATEGORIES), gallery=2, queries=1)
    first = make_corpus.write_corpus(records, tmp_path / "a.jsonl.gz")
    assert make_corpus.write_corpus(records, tmp_path / "b.jsonl.gz") == first
    with gzip.open(tmp_path / "a.jsonl.gz", "rt") as f:
        assert [json.loads(line) for line in f] == records


def test_the_lexname_alternative_labels_by_file_and_keeps_the_files_large_enough(synsets):
    rows = make_corpus.labelled_by_lexname(synsets, least=4)
    assert {s.lemma: label for s, label in rows} == {
        "vertebrate": "noun.animal",
        "bird": "noun.animal",
        "passerine": "noun.animal",
        "oscine": "noun.animal",
        "bird writer": "noun.animal",
    }  # noun.person has 3 usable synsets here, fewer than 4
    assert {label for _, label in make_corpus.labelled_by_lexname(synsets, least=3)} == {
        "noun.animal",
        "noun.person",
    }
