"""Issue 55: every unknown name a user types gets "did you mean" from the valid set, through the real
entry point (one line on stderr, exit code 2, before any trace is read or synthesised)."""

from __future__ import annotations

import pytest

from flashsim.main import main
from traces.data import shipped_trace_path

SHIPPED = shipped_trace_path()
REPLAY = ["replay", "--trace", str(SHIPPED), "--device", "jetson-orin-nano-8gb", "--preset", "llm-in-a-flash"]


@pytest.mark.parametrize("argv, expected", [
    # model names: case only, then a typo; the valid names are listed
    (["plan", "--model", "llama-3.2-3B", "--device", "jetson-orin-nano-8gb"],
     "unknown model 'llama-3.2-3B'; did you mean 'llama-3.2-3b'? known: falcon-7b,"),
    (["models", "show", "mistral7b"], "did you mean 'mistral-7b'?"),
    (["plan", "--model", "llama-3.2-3b", "--device", "jetson-orin-nano"],
     "unknown device 'jetson-orin-nano'; did you mean 'jetson-orin-nano-8gb'"),
    ([*REPLAY[:-1], "llm-in-flash"], "unknown preset 'llm-in-flash'; did you mean 'llm-in-a-flash'?"),
    ([*REPLAY, "--set", "windw.k=3"], "'windw' is not a slot"),
    ([*REPLAY, "--set", "windw.k=3"], "did you mean 'window'?"),
    ([*REPLAY, "--set", "residncy=window"], "unknown setting 'residncy'; did you mean 'residency'?"),
    ([*REPLAY, "--set", "window.kk=3"], "unknown parameter 'kk'; did you mean 'k'? valid parameters: k,"),
    ([*REPLAY, "--set", "bundling.order=hotfirst"], "is not one of 'original', 'hot-first', 'coactivation'; "
                                                    "did you mean 'hot-first'?"),
    (["replay", "--trace", str(SHIPPED), "--device", "jetson-orin-nano-8gb@25W", "--preset", "naive"],
     "unknown power mode '25W'; did you mean '25w'?"),
    # verbs and option choices (argparse)
    (["replai"], "invalid choice: 'replai'; did you mean 'replay'"),
    (["models", "show", "llama-3.2-3b", "--dtype", "fp61"], "did you mean 'fp16'?"),
    (["adapt", "eval", "--timelines", "stepp:t=30%"], "unknown timeline kind 'stepp'; did you mean 'step'?"),
    # the trace folder beside the one given
    (["replay", "--trace", str(SHIPPED.parent / "smollm2-135m"), "--device", "jetson-orin-nano-8gb"],
     f"did you mean '{SHIPPED}'?"),
])
def test_issue55_unknown_names_suggest(capsys, argv, expected) -> None:
    try:
        rc = main(argv)
    except SystemExit as e:          # argparse's own usage errors exit from inside parse_args
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and expected in err and len(err.strip().splitlines()) == 1, err
