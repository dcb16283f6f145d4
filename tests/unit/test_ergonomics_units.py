"""Version summaries, cache stats and the missing HF folder error."""

from __future__ import annotations

from pathlib import Path

import pytest

from miniverl.errors import BackendError
from miniverl.models.tokenizers import _offline_error, load_pretrained
from miniverl.utils.versions import summarize_version_counts, summarize_versions


def test_version_summaries_state_the_count_and_ranges() -> None:
    assert summarize_versions(range(401)) == "401 distinct: 0-400"
    assert summarize_versions([3, 1, 2, 7]) == "4 distinct: 1-3, 7"
    assert summarize_versions([]) == "none"
    evens = summarize_versions(range(0, 40, 2))
    assert evens.startswith("20 distinct: 0, 2, 4, 6, ... (12 more ranges)")
    assert evens.endswith("32, 34, 36, 38")
    assert summarize_version_counts({"1": 2, "2": 3}) == "v1: 2, v2: 3"
    assert summarize_version_counts({str(v): 8 for v in range(1, 401)}) == (
        "400 distinct: 1-400 (3200 entries, 8-8 per version)"
    )


def test_cache_stats_summarizes_versions_unless_asked(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from test_cache_cli import app, build, runner

    build(tmp_path / "cache", {f"k{v}": v for v in range(12)})
    result = runner.invoke(app, ["cache", "stats", str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    assert "12 distinct: 0-11" in result.output and "v5: 1" not in result.output
    result = runner.invoke(app, ["cache", "stats", str(tmp_path / "cache"), "--all-versions"])
    assert result.exit_code == 0 and "v5: 1" in result.output


class _NeverCalled:
    @staticmethod
    def from_pretrained(*args: object, **kwargs: object) -> None:
        raise AssertionError("a missing folder must not reach the library")


@pytest.mark.parametrize("source", ["./models/qwen", "/no/such/dir", "~/nowhere/model", "a/b/c"])
def test_a_missing_model_folder_is_a_clear_error(source: str) -> None:
    with pytest.raises(BackendError, match=r"folder .* does not exist") as info:
        load_pretrained(_NeverCalled, source, revision=None, what="model")
    assert "hf download" in info.value.hint


def test_the_offline_hint_names_the_current_cli() -> None:
    hint = _offline_error("model", "Qwen/Qwen3-0.6B", None, "x").hint
    assert "hf download Qwen/Qwen3-0.6B" in hint and "huggingface-cli" not in hint
