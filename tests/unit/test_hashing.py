"""One hashing helper (utils/hashing.py), and digests that outlive a run never change.

The pinned hex values below were computed with the per-module helpers that
``miniverl.utils.hashing`` replaced; a changed canonical-JSON spelling would orphan every
teacher cache (journal checksums, alignment digests) and toy-teacher reuse directory.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

from miniverl.cache.index import journal_line
from miniverl.config.models import RunConfig
from miniverl.lab.teachers.adapter_fit import fit_digest
from miniverl.lab.teachers.toy_fit import _tasks_sha256, teacher_digest
from miniverl.models.tokenizers import compute_fingerprint
from miniverl.schemas.alignment import AlignmentMap
from miniverl.utils import hashing
from miniverl.utils.hashing import canonical_json, sha256_file, sha256_json, sha256_text

INPUTS = {"seed": 3, "name": "toy-é", "nested": {"b": [1, 2], "a": None}}


def test_alignment_digest_is_unchanged() -> None:
    alignment = AlignmentMap(
        trajectory_id="t-é",
        student_prediction_positions=[1, 2],
        teacher_prediction_positions=[3, 4],
        target_token_ids=[5, 6],
        model_token_mask=[True, True],
        token_weights=[1.0, 0.5],
        span_types=["model", "model"],
    )
    assert alignment.digest() == "b970baddf3e036955e914064fae90fe5388beb1eefbddd12f3533f3662b757a3"


def test_teacher_reuse_digests_are_unchanged() -> None:
    assert (
        teacher_digest(INPUTS) == "4784989ad974821fc32b4a48ef3bba0ccf38c624431acbacead2a934c9f39a2f"
    )
    task = SimpleNamespace(task_id="a", prompt="2+2", answer="4", data={"x": 1})
    assert (
        _tasks_sha256([task]) == "64bc1fd7227390f8891a1e14b6ff04643f6ad694adf68ee13fad229f1dfbe2da"
    )


def test_adapter_fit_and_tokenizer_digests_are_unchanged() -> None:
    assert fit_digest(INPUTS) == "c098f067a4e48c70dc6bc354853fe1a1df5d60c3d29520201198b798a35551b8"
    fingerprint = compute_fingerprint(lambda s: [len(s), 1], {"<a>": 1, "b": 2}, 10)
    assert fingerprint == "2d8810d040d2e2c0a196f6b4051af755da74f02e0fd5ddad19e91e271c829fba"


def test_cache_journal_checksum_is_unchanged() -> None:
    line = journal_line({"base": "b", "key": "é", "n": [1, 2]})
    assert (
        line
        == (
            '{"record":{"base":"b","key":"é","n":[1,2]},'
            '"sha256":"ed3e63aaf5e8d3e4ffe82c6cc67a51854825f3b011eb395629d108829a18158b"}\n'
        ).encode()
    )


def test_config_digest_is_the_sha256_of_its_canonical_yaml() -> None:
    config = RunConfig()
    assert config.digest() == hashlib.sha256(config.canonical_yaml().encode("utf-8")).hexdigest()


def test_the_two_canonical_spellings() -> None:
    assert canonical_json({"b": 1, "a": [1, "é"]}) == '{"a":[1,"\\u00e9"],"b":1}'
    assert canonical_json({"b": 1, "a": [1]}, compact=False) == '{"a": [1], "b": 1}'
    assert canonical_json({"a": "é"}, ensure_ascii=False) == '{"a":"é"}'
    assert sha256_json({"a": 1}) == sha256_text('{"a":1}')
    assert sha256_text("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_sha256_file_streams_in_blocks_and_reports_progress(tmp_path: Path) -> None:
    data = bytes(range(256)) * 41
    path = tmp_path / "blob"
    path.write_bytes(data)
    seen: list[int] = []
    assert (
        sha256_file(path, block_size=1000, progress=seen.append) == hashlib.sha256(data).hexdigest()
    )
    assert seen == [*range(1000, len(data), 1000), len(data)]


def test_no_module_outside_utils_hashing_builds_sha256_of_json_or_files() -> None:
    """The helper copies are gone: no ``hashlib.sha256(json.dumps(...``, no hand-rolled file loop."""
    src = Path(hashing.__file__).resolve().parents[1]
    offenders = []
    for path in sorted(src.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if path.name == "hashing.py":
            continue
        if "hashlib.sha256(json.dumps" in text or "sha256(_canonical(" in text:
            offenders.append(str(path.relative_to(src)))
    assert offenders == []


def test_sha256_file_limit_hashes_exactly_the_prefix(tmp_path) -> None:
    import hashlib

    from miniverl.utils.hashing import sha256_file

    data = bytes(range(256)) * 40
    path = tmp_path / "log.jsonl"
    path.write_bytes(data)
    for limit in (1, 7, 256, 5000, len(data), len(data) + 9):
        expected = hashlib.sha256(data[:limit]).hexdigest()
        assert sha256_file(path, limit=limit, block_size=64) == expected, limit
