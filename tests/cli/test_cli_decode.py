"""``--decode exact|fast`` on the command line: recorded by init, changed by switch-encoder, used by
every command that decodes the pair's images, shown by status, measured by model check and probe.

The gallery is six 1600x1067 JPEG photos: an 8x8 graph decodes them at 1/8 DCT scale when fast,
so fast and exact vectors differ (by a cosine of about 1e-4 with the linear test models)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rm_qdrant import OnnxEncoder, open_store
from rm_qdrant.pair.record import load_pair
from tests.conftest import one_error_line


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _expected(model: Path, uris: list[str], decode: str, output: str = "new") -> np.ndarray:
    """The model's vectors of the images at ``uris`` decoded ``decode``, as a cosine collection keeps them."""
    return _unit(OnnxEncoder(model, decode=decode).encode([Path(u) for u in uris], [output])[output])


def _stored(tmp_path: Path, collection: str, vector: str = "") -> dict[str, np.ndarray]:
    """Each point's vector ``vector`` of ``collection``, by image uri (points without it left out)."""
    with open_store(tmp_path / "q") as store:
        page, _ = store.scroll(collection, limit=100, with_vectors=True, vector=vector)
    return {r.payload["uri"]: np.asarray(r.vector) for r in page if r.vector is not None}


def _pair(rmq, models, photo_folder, *init_args: object) -> None:
    rmq("index", "--collection", "gallery", "--data", photo_folder, "--encoder", models.old)
    rmq("init", "--name", "p", "--encoder", models.rm, *init_args)


@pytest.mark.parametrize(
    ("layout", "new_collection", "new_vector"),
    [
        (["--old-collection", "gallery"], "p-new", ""),
        (
            ["--mode", "single-collection", "--collection", "gallery", "--new-vector", "fresh"],
            "gallery",
            "fresh",
        ),
    ],
    ids=["paired", "single-collection"],
)
def test_init_decode_fast_migrates_the_vectors_of_fast_decoded_pixels(
    rmq, models, photo_folder, tmp_path, layout, new_collection, new_vector
):
    _pair(rmq, models, photo_folder, *layout, "--decode", "fast")
    status = json.loads(rmq("status", "--name", "p", "--json").output)
    assert status["decode"] == "fast"
    assert "decode        fast" in rmq("status", "--name", "p").output
    rmq("migrate", "--name", "p")
    stored = _stored(tmp_path, new_collection, new_vector)
    uris = sorted(stored)
    assert len(uris) == 6
    got = np.stack([stored[u] for u in uris])
    np.testing.assert_allclose(got, _expected(models.rm, uris, "fast"), atol=1e-5)
    assert np.abs(got - _expected(models.rm, uris, "exact")).max() > 1e-3  # not the exact pixels' vectors


def test_init_decodes_exact_unless_told(rmq, models, photo_folder, tmp_path):
    _pair(rmq, models, photo_folder, "--old-collection", "gallery")
    out = json.loads(rmq("status", "--name", "p", "--json").output)
    assert out["decode"] == "exact"
    assert "decode        exact" in rmq("status", "--name", "p").output
    rmq("migrate", "--name", "p")
    stored = _stored(tmp_path, "p-new")
    uris = sorted(stored)
    np.testing.assert_allclose(
        np.stack([stored[u] for u in uris]), _expected(models.rm, uris, "exact"), atol=1e-5
    )


def test_switch_encoder_decode_changes_what_the_next_batch_uses(rmq, models, photo_folder, tmp_path):
    _pair(rmq, models, photo_folder, "--old-collection", "gallery")
    rmq("migrate", "--name", "p", "--until", "0.5", "--batch", "3")
    first = sorted(_stored(tmp_path, "p-new"))
    assert len(first) == 3
    text = rmq("switch-encoder", "--name", "p", "--decode", "fast").output
    assert "still serves new-rm (rm mode)" in text
    assert "decode: exact -> fast; the 3 points already in new were decoded exact" in text
    with open_store(tmp_path / "q") as store:
        assert load_pair(store, "p").decode == "fast"
    rmq("migrate", "--name", "p", "--batch", "3")
    stored = _stored(tmp_path, "p-new")
    later = sorted(set(stored) - set(first))
    assert len(later) == 3
    np.testing.assert_allclose(
        np.stack([stored[u] for u in first]), _expected(models.rm, first, "exact"), atol=1e-5
    )
    np.testing.assert_allclose(
        np.stack([stored[u] for u in later]), _expected(models.rm, later, "fast"), atol=1e-5
    )
    # with a graph: checked decoded as new's vectors were made until now, then the mode changes back
    out = json.loads(
        rmq("switch-encoder", "--name", "p", "--encoder", models.rm, "--decode", "exact", "--json").output
    )
    assert out["decode"] == {"before": "fast", "after": "exact"} and out["decoded_before"] == 6
    assert out["check"]["checked"] == 6 and out["pair"]["decode"] == "exact"
    same = rmq("switch-encoder", "--name", "p", "--encoder", models.rm).output
    assert "decode: exact (unchanged)" in same


def test_switch_encoder_needs_a_graph_or_a_decode_mode(rmq, models, photo_folder):
    _pair(rmq, models, photo_folder, "--old-collection", "gallery")
    assert "give the graph to serve (--encoder), the decode mode (--decode), the re-rank" in one_error_line(
        rmq("switch-encoder", "--name", "p", ok=False)
    )
    line = one_error_line(
        rmq("switch-encoder", "--name", "p", "--decode", "fast", "--new-model", models.new_only, ok=False)
    )
    assert "--new-model go with --encoder" in line


@pytest.mark.parametrize(
    "args",
    [
        ["init", "--name", "q", "--old-collection", "gallery", "--encoder", "{rm}", "--decode", "slow"],
        ["switch-encoder", "--name", "p", "--decode", "slow"],
        ["switch-encoder", "--name", "p", "--encoder", "{rm}", "--decode", "slow"],
        ["probe", "--name", "p", "--decode", "slow"],
        ["model", "check", "{old}", "--collection", "gallery", "--decode", "slow"],
    ],
    ids=["init", "switch-encoder", "switch-encoder-with-graph", "probe", "model-check"],
)
def test_an_unknown_decode_mode_is_one_line_and_changes_nothing(rmq, models, photo_folder, tmp_path, args):
    _pair(rmq, models, photo_folder, "--old-collection", "gallery")
    line = one_error_line(rmq(*[a.format(rm=models.rm, old=models.old) for a in args], ok=False))
    assert "'slow' is not one of 'exact', 'fast'" in line
    with open_store(tmp_path / "q") as store:
        assert load_pair(store, "p").decode == "exact"
        assert not store.has_collection("q-new")


def test_model_check_decode_fast_measures_fast_against_the_stored_and_the_exact_vectors(
    rmq, models, photo_folder
):
    rmq("index", "--collection", "gallery", "--data", photo_folder, "--encoder", models.old)
    plain = json.loads(rmq("model", "check", models.old, "--collection", "gallery", "--json").output)
    assert plain["decode"] == "exact" and plain["fast"] is None and plain["matches"]
    result = rmq("model", "check", models.old, "--collection", "gallery", "--decode", "fast", "--json")
    out = json.loads(result.output)
    assert out["matches"] and out["min"] > 0.99999  # the exact-decoded vectors are the stored ones
    fast = out["fast"]
    assert fast["checked"] == 6
    against_stored, against_exact = fast["against_stored"], fast["against_exact"]
    assert 0.999 < against_stored["min"] < 0.99999 and against_stored["min"] <= against_stored["median"] < 1
    # the stored vectors are the exact-decoded ones: fast is as far from either
    assert against_exact["min"] == pytest.approx(against_stored["min"], abs=1e-6)
    text = rmq("model", "check", models.old, "--collection", "gallery", "--decode", "fast").output
    assert "decoded fast, 6 images:" in text
    assert "fast against the stored vectors:        cosine min 0.999" in text
    assert "fast against the exact-decoded vectors: cosine min 0.999" in text


def test_model_check_decodes_as_the_pair_over_the_collection_records(rmq, models, photo_folder):
    _pair(rmq, models, photo_folder, "--old-collection", "gallery", "--decode", "fast")
    out = json.loads(rmq("model", "check", models.old, "--collection", "gallery", "--json").output)
    assert (out["decode"], out["decode_from_pair"]) == ("fast", "p") and out["fast"]["checked"] == 6
    assert (
        "decoded fast (as pair 'p' records), 6 images"
        in rmq("model", "check", models.old, "--collection", "gallery").output
    )
    told = json.loads(
        rmq("model", "check", models.old, "--collection", "gallery", "--decode", "exact", "--json").output
    )
    assert told["decode"] == "exact" and told["fast"] is None


def test_probe_decode_forecasts_another_mode_without_recording_or_caching_it(
    rmq, models, photo_folder, tmp_path, monkeypatch
):
    from rm_qdrant.api import probing

    decoded = []
    drawn = probing.draw_with_steps

    def spy(store, pair, encoder, *args, **kwargs):
        decoded.append(encoder.decoding)
        return drawn(store, pair, encoder, *args, **kwargs)

    monkeypatch.setattr(probing, "draw_with_steps", spy)
    _pair(rmq, models, photo_folder, "--old-collection", "gallery")
    base = json.loads(rmq("probe", "--name", "p", "--sample", "6", "--k", "2", "--json").output)
    assert (base["decode"], base["recorded_decode"]) == ("exact", "exact") and base["cache"]
    estimate = json.loads(rmq("status", "--name", "p", "--json").output)["estimate"]
    out = json.loads(
        rmq("probe", "--name", "p", "--sample", "6", "--k", "2", "--decode", "fast", "--json").output
    )
    assert (out["decode"], out["recorded_decode"], out["cache"]) == ("fast", "exact", None)
    assert decoded == ["exact", "fast"]
    status = json.loads(rmq("status", "--name", "p", "--json").output)
    assert status["decode"] == "exact" and status["estimate"] == estimate  # the exact forecast stays
    text = rmq("probe", "--name", "p", "--sample", "6", "--k", "2", "--decode", "fast").output
    assert "decoded fast; order random; nothing written" in text
    assert "decoded fast as asked, the pair records exact: a what-if, not kept" in text
    # once the pair decodes fast, the exact forecast no longer is its estimate
    rmq("switch-encoder", "--name", "p", "--decode", "fast")
    assert json.loads(rmq("status", "--name", "p", "--json").output)["estimate"] is None


def test_index_into_a_fast_pair_decodes_fast(rmq, models, photo_folder, tmp_path):
    first = tmp_path / "first"
    (first / "a").mkdir(parents=True)
    (first / "a" / "000.jpg").write_bytes(next(photo_folder.glob("a/*.jpg")).read_bytes())
    rmq("index", "--collection", "gallery", "--data", first, "--encoder", models.old)
    rmq("init", "--name", "p", "--old-collection", "gallery", "--encoder", models.rm, "--decode", "fast")
    rmq("index", "--name", "p", "--data", photo_folder, "--encoder", models.old)
    stored = {u: v for u, v in _stored(tmp_path, "gallery").items() if u.startswith(str(photo_folder))}
    uris = sorted(stored)
    assert len(uris) == 6
    got = np.stack([stored[u] for u in uris])
    np.testing.assert_allclose(got, _expected(models.old, uris, "fast", "embedding"), atol=1e-5)
    assert np.abs(got - _expected(models.old, uris, "exact", "embedding")).max() > 1e-3
