"""Prompt files: the builtin suite and every malformed-line error (one line, exit 2, nothing
written, before any model is loaded)."""

from __future__ import annotations

import json

import pytest

from devices.errors import FlashsimError
from flashsim.main import main
from traces.capture.prompts import BUILTIN_PROMPTS, load_prompts


def test_builtin_suite_covers_five_tasks_round_robin():
    prompts = load_prompts("builtin")
    tasks = ["qa", "translation", "summarization", "code", "story"]
    assert [p.task for p in prompts] == tasks * 4
    assert len({p.id for p in prompts}) == 20
    assert [p.task for p in load_prompts("builtin", limit=5)] == tasks
    assert BUILTIN_PROMPTS.is_file() and all(len(p.text) > 20 for p in prompts)


def _write(tmp_path, lines):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps({"id": "a", "task": "qa", "text": "Why is the sky blue?"})


@pytest.mark.parametrize("bad, message", [
    ('{"id": "b", "task": "qa", "text": "x"', r":3: malformed JSON at column"),
    ('["a", "qa", "x"]', r":3: expected a JSON object"),
    ('{"id": "b", "task": "qa"}', r":3: field 'text' must be a non-empty string \(missing\)"),
    ('{"id": "b", "task": "", "text": "x"}', r":3: field 'task' must be a non-empty string"),
    ('{"id": 7, "task": "qa", "text": "x"}', r":3: field 'id' must be a non-empty string \(int 7\)"),
    ('{"id": "b", "task": "qa", "text": "x", "lang": "en"}', r":3: unknown key\(s\) 'lang'"),
    ('{"id": "a", "task": "qa", "text": "x"}', r":3: duplicate id 'a' \(first on line 1\)"),
])
def test_malformed_line_names_the_line(tmp_path, bad, message):
    path = _write(tmp_path, [GOOD, "", bad])
    with pytest.raises(FlashsimError, match=message):
        load_prompts(path)


def test_file_level_errors(tmp_path):
    with pytest.raises(FlashsimError, match="no such file"):
        load_prompts(tmp_path / "missing.jsonl")
    with pytest.raises(FlashsimError, match="no prompts"):
        load_prompts(_write(tmp_path, ["", "  "]))
    (tmp_path / "latin1.jsonl").write_bytes(b'{"id": "a", "task": "qa", "text": "caf\xe9"}\n')
    with pytest.raises(FlashsimError, match="not UTF-8"):
        load_prompts(tmp_path / "latin1.jsonl")
    with pytest.raises(FlashsimError, match="--limit-prompts must be >= 1"):
        load_prompts("builtin", limit=0)


def test_cli_malformed_prompts_exit_2_nothing_written(tmp_path, capsys):
    path = _write(tmp_path, [GOOD, '{"id": "b", "task": "qa", "text": oops}'])
    out = tmp_path / "trace"
    rc = main(["capture", "--model", "smollm2-135m", "--prompts", str(path), "--max-new-tokens", "4",
               "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert f"{path}:2: malformed JSON" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]


@pytest.mark.parametrize("argv, message", [
    (["--sparsity", "topk"], "needs a target fraction"),
    (["--sparsity", "threshold:1.5"], "must be in (0, 1]"),
    (["--sparsity", "topk:0.1.2"], "'0.1.2' is not a number"),  # was a traceback (traces/sparsity.py)
    (["--max-new-tokens", "-1"], "--max-new-tokens must be >= 0"),
    (["--limit-prompts", "0"], "--limit-prompts must be >= 1"),
    (["--temperature", "-1"], "--temperature must be a number >= 0"),
    (["--temperature", "nan"], "--temperature must be a number >= 0"),
])
def test_cli_bad_options_exit_2(tmp_path, capsys, argv, message):
    rc = main(["capture", "--out", str(tmp_path / "t"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0]
    assert not (tmp_path / "t").exists()


def test_cli_bad_magnitude_fraction_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["capture", "--out", str(tmp_path / "t"), "--magnitude-fraction", "2"])
    assert e.value.code == 2 and "must be in [0, 1]" in capsys.readouterr().err
