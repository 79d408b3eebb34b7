"""`flashsim devices|models|demo`: JSON contracts and error paths through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flashsim.main import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_devices_json_is_a_list_with_names(capsys) -> None:
    rc, out, _ = run(capsys, "devices", "--json")
    data = json.loads(out)
    assert rc == 0 and isinstance(data, list) and len(data) >= 7
    assert all("name" in d for d in data)


def test_devices_show_json(capsys) -> None:
    rc, out, _ = run(capsys, "devices", "show", "apple-m1-max", "--json")
    d = json.loads(out)
    assert rc == 0 and d["name"] == "apple-m1-max"
    assert d["profile"]["flash"]["sequential_read_bytes_per_s"] == pytest.approx(6.1e9)


MODEL_KEYS = {"n_layers", "d_model", "d_ff", "ffn_kind", "dtype_bytes", "ffn_neuron_bytes", "ffn_bytes_total",
              "total_weight_bytes", "kv_bytes_per_token"}


def test_models_show_json_contract(capsys) -> None:
    rc, out, _ = run(capsys, "models", "show", "opt-6.7b", "--json")
    d = json.loads(out)
    assert rc == 0 and set(d) >= MODEL_KEYS
    assert d["ffn_neuron_bytes"] == 16384 and d["dtype_bytes"] == 2
    rc, out, _ = run(capsys, "models", "show", "opt-6.7b", "--json", "--dtype", "int8")
    assert json.loads(out)["dtype_bytes"] == pytest.approx(8.5 / 8)


def test_models_list_json(capsys) -> None:
    rc, out, _ = run(capsys, "models", "--json")
    assert rc == 0 and {m["name"] for m in json.loads(out)} >= {"llama-3.2-3b", "smollm2-135m"}


@pytest.mark.parametrize("argv, expect", [
    (("devices", "show", "jetson-nano"), "unknown device 'jetson-nano'"),
    (("models", "show", "lama-2-7b"), "did you mean 'llama-2-7b'"),
    (("models", "show", "/nonexistent/model"), "no such model folder"),
])
def test_errors_are_one_line_exit_2(capsys, argv, expect) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and expect in err and "Traceback" not in err


def test_debug_shows_the_traceback() -> None:
    from devices import FlashsimError

    with pytest.raises(FlashsimError):
        main(["--debug", "devices", "show", "nope"])


def test_console_script_usage_error_exit_2() -> None:
    r = subprocess.run([sys.executable, "-m", "flashsim", "devices", "--bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr


def test_demo_first_order_section(capsys) -> None:
    # the foundation's fit table is one section of `flashsim demo` (the whole demo: tests/analysis/test_demo.py)
    from flashsim.commands.demo import first_order, first_order_table

    estimates = first_order(1024)
    first_order_table(estimates, 1024)
    out = capsys.readouterr().out
    assert "First-order fit" in out and "smollm2-135m" in out
    nano_3b = next(e for e in estimates if e.model == "llama-3.2-3b" and e.device == "jetson-orin-nano-8gb")
    assert nano_3b.verdict in {"fits", "streams-ffn", "does-not-fit"}
