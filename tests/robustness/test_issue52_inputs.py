"""Issue 52 holes 3-9 and 11, inputs: alias bombs and huge configs refused before any allocation,
`--config` changes only what it names, a checkpoint must match its config, a store's manifest cannot
point outside the store, duplicate keys are refused, and tampered files or bad numbers give one line."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import yaml

from devices.errors import FlashsimError
from devices.schema import BUNDLED_DIR
from tests.robustness.conftest import assert_refused, cli, tiny_spec

DEVICE = ["--device", "jetson-orin-nano-8gb"]
HF = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
      "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152}


def alias_bomb(levels: int = 9, key: str = "name") -> str:
    """A YAML 'billion laughs': 9 levels of 9 references expand to 9**9 (387 million) strings."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    lines.append(f"{key}: *l{levels - 1}")
    return "\n".join(lines) + "\n"


# ---- hole 3: bounds up front -------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["sweep name", "config preset", "device profile", "model spec"])
def test_issue52_yaml_alias_bomb_refused(tmp_path, capsys, trace_dir, where):
    p = tmp_path / "bomb.yaml"
    if where == "sweep name":
        p.write_text(alias_bomb(key="name") + f"traces: [{trace_dir}]\ndevices: [apple-m1-max]\npresets: [naive]\n")
        argv = ["sweep", p, "--out", tmp_path / "o", "--dry-run"]
    elif where == "config preset":
        p.write_text(alias_bomb(key="preset"))
        argv = ["replay", "--trace", trace_dir, *DEVICE, "--config", p]
    elif where == "device profile":
        p.write_text(alias_bomb(key="notes") + (BUNDLED_DIR / "jetson-orin-nano-8gb.yaml").read_text())
        argv = ["devices", "show", p]
    else:
        p.write_text(alias_bomb(key="source") + yaml.safe_dump({"name": "x", "config": HF}))
        argv = ["models", "show", p]
    code, _, err = cli(capsys, *argv)
    assert_refused(code, err, tmp_path / "o", contains="alias")


def test_issue52_recursive_alias_refused(tmp_path, capsys, trace_dir):
    p = tmp_path / "c.yaml"
    p.write_text("residency: &r {name: window, k: [*r]}\n")
    code, _, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, "--config", p)
    assert_refused(code, err, contains="recursive alias")


def test_issue52_merge_keys_still_load(tmp_path):
    """Bounded aliases, not refused ones: a small anchor/merge document loads as YAML says."""
    from devices.safe_load import parse_yaml_text

    data = parse_yaml_text("base: &b {k: 1, j: 3}\nd:\n  <<: *b\n  k: 2\n", "x")
    assert data["d"] == {"k": 2, "j": 3}


def _limited_run(argv: list[str], cwd: Path) -> tuple[int, str, int]:
    """(exit code, stderr, peak RSS in KiB) of `flashsim ARGV` in a child limited to 4 GiB of
    address space (so the refusal does not depend on this host's RAM)."""
    import resource
    import subprocess
    import sys

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    p = subprocess.Popen([sys.executable, "-m", "flashsim", *map(str, argv)], cwd=cwd, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    err = p.stderr.read()                       # type: ignore[union-attr]
    _, status, usage = os.wait4(p.pid, 0)       # this child's own peak RSS
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, err, usage.ru_maxrss


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_issue52_100k_layer_config_refused_small(tmp_path):
    """A config.json of 100,000 layers: refused with the size in the message, in under 200 MB."""
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "config.json").write_text(json.dumps({**HF, "num_hidden_layers": 100_000}))
    code, err, rss_kib = _limited_run(["plan", "--model", tmp_path / "big", *DEVICE], REPO)
    assert code == 2 and "Traceback" not in err, err
    assert "100,000 layers" in err and "GiB" in err, err
    assert rss_kib < 200 * 1024, f"peak RSS {rss_kib / 1024:.0f} MiB"


@pytest.mark.slow
def test_issue52_alias_bomb_refused_small(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(alias_bomb(key="preset"))
    code, err, rss_kib = _limited_run(["replay", "--trace", REPO / "traces/data/smollm2-135m-builtin", *DEVICE,
                                       "--config", p], REPO)
    assert code == 2 and "alias" in err, err
    assert rss_kib < 200 * 1024, f"peak RSS {rss_kib / 1024:.0f} MiB"


def test_issue52_run_memory_checked_before_allocation(monkeypatch, tmp_path, capsys):
    """The same refusal in process: the plan's trace cells against the memory available (here 1 GiB)."""
    import devices.limits as lim

    monkeypatch.setattr(lim, "memory_available_bytes", lambda: 1 << 30)
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "config.json").write_text(json.dumps({**HF, "num_hidden_layers": 100_000}))
    code, _, err = cli(capsys, "plan", "--model", tmp_path / "big", *DEVICE)
    assert_refused(code, err, contains="100,000 layers x 1,536 neurons")


def test_issue52_memory_limit_includes_ulimit(monkeypatch):
    import resource

    from devices.limits import memory_available_bytes

    monkeypatch.setattr(resource, "getrlimit", lambda which: (1 << 30, resource.RLIM_INFINITY)
                        if which == resource.RLIMIT_AS else (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert memory_available_bytes() < 1 << 30


# ---- hole 4: --config overrides only what it names ---------------------------------------------------
def test_issue52_config_restating_one_slot_keeps_the_preset(tmp_path, capsys, trace_dir):
    p = tmp_path / "c.yaml"
    p.write_text("residency: {name: window, k: 3}\n")
    code, out, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, "--engine", "fast", "--config", p, "--json")
    assert code == 0, err
    s = json.loads(out)
    pol = s["config"]["policies"]
    from sim.policies.presets import preset_config

    assert pol["predictor"]["name"] == preset_config("llm-in-a-flash").predictor.name, pol   # the preset's, kept
    assert pol["residency"]["k"] == 3, pol
    assert s["config"]["differs_from_preset"] == ["window.k=3"]


def test_issue52_header_lists_every_difference(tmp_path, capsys, trace_dir):
    p = tmp_path / "c.yaml"
    p.write_text("prefetch: none\npredictor: none\nmemory: {stream_non_ffn: true}\n")
    code, out, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, "--engine", "fast", "--config", p,
                         "--preset", "neuroprefetcher")
    assert code == 0, err
    head = out.splitlines()[0]
    assert "preset neuroprefetcher with " in head and "predictor=none" in head and "prefetch=none" in head
    assert "memory.stream_non_ffn=True" in head


def test_issue52_dram_budget_and_set_conflict_refused(capsys, trace_dir):
    code, _, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, "--dram-budget", "1GiB",
                       "--set", "memory.dram_budget_bytes=2GiB")
    assert_refused(code, err, contains="given twice")


# ---- hole 5: checkpoint vs config ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.real.conftest import save_tiny_llama_folder, tiny_llama

    return save_tiny_llama_folder(tmp_path_factory.mktemp("hf") / "m", tiny_llama(2))


def _edited(src: Path, dst: Path, **config) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(config)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.slow    # torch + transformers: a tiny Llama saved as a HF folder
@pytest.mark.parametrize(("change", "contains"), [
    ({"num_hidden_layers": 4}, "'model.layers.2.input_layernorm.weight' (shape [32]) that config.json implies is not"),
    ({"num_hidden_layers": 1}, "'model.layers.1.input_layernorm.weight' in the checkpoint is not part"),
    ({"intermediate_size": 128}, "has shape [32, 64] in the checkpoint but config.json implies [32, 128]"),
])
def test_issue52_checkpoint_must_match_its_config(tmp_path, capsys, hf_folder, change, contains):
    folder = _edited(hf_folder, tmp_path / "m", **change)
    out = tmp_path / "s"
    code, _, err = cli(capsys, "real", "convert", "--model", folder, "--out", out)
    assert_refused(code, err, out, contains=contains)


@pytest.mark.slow    # torch + transformers: a tiny Llama saved as a HF folder
def test_issue52_pickled_checkpoint_refused(tmp_path, capsys, hf_folder):
    folder = tmp_path / "m"
    shutil.copytree(hf_folder, folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    code, _, err = cli(capsys, "real", "convert", "--model", folder, "--out", tmp_path / "s")
    assert_refused(code, err, tmp_path / "s", contains="safetensors only")


@pytest.mark.slow    # torch + transformers: a tiny Llama saved as a HF folder
@pytest.mark.parametrize("change", [{"hidden_size": "32"}, "a list"])
def test_issue52_config_json_of_wrong_type_refused(tmp_path, capsys, hf_folder, change):
    folder = tmp_path / "m"
    shutil.copytree(hf_folder, folder)
    if change == "a list":
        (folder / "config.json").write_text("[1, 2]")
    else:
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    code, _, err = cli(capsys, "real", "convert", "--model", folder, "--out", tmp_path / "s")
    assert_refused(code, err, tmp_path / "s")


@pytest.mark.slow    # torch + transformers: a tiny Llama saved as a HF folder
def test_issue52_lying_checkpoint_header_refused(tmp_path, capsys, hf_folder):
    folder = tmp_path / "m"
    shutil.copytree(hf_folder, folder)
    f = folder / "model.safetensors"
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    name = sorted(k for k in head if k != "__metadata__")[0]
    head[name]["data_offsets"][1] += 10**9
    text = json.dumps(head).encode()
    f.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
    code, _, err = cli(capsys, "real", "convert", "--model", folder, "--out", tmp_path / "s")
    assert_refused(code, err, tmp_path / "s", contains=name)


# ---- hole 6: store manifest paths confined -----------------------------------------------------------
@pytest.fixture(scope="module")
def shape_store(tmp_path_factory):
    from real.weights.convert import write_shape_store

    return write_shape_store(tiny_spec(), tmp_path_factory.mktemp("st") / "s", seed=0, dtype="fp32")


def _tampered(src: Path, dst: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    shutil.copytree(src, dst, symlinks=True)
    man = json.loads((dst / "manifest.json").read_text())
    edit(man, dst)
    (dst / "manifest.json").write_text(json.dumps(man))
    return dst


def _outside_order(man, dst):  # type: ignore[no-untyped-def]
    shutil.copy(dst / "order.npy", dst.parent / "outside.npy")
    man["order"]["file"] = "../outside.npy"


def _symlinked_bundle(man, dst):  # type: ignore[no-untyped-def]
    f = dst / "ffn" / "layer_000.bundled.bin"
    shutil.copy(f, dst.parent / "elsewhere.bin")
    f.unlink()
    f.symlink_to(dst.parent / "elsewhere.bin")


TAMPER = {
    "resident /etc/passwd": lambda man, dst: man["resident"].update(file="/etc/passwd"),
    "order ../outside.npy": _outside_order,
    "files entry ../x": lambda man, dst: man["files"].update({"../x": man["files"]["order.npy"]}),
    "symlink out of the store": _symlinked_bundle,
}


@pytest.mark.parametrize("how", sorted(TAMPER))
@pytest.mark.parametrize("verb", ["verify", "run"])
def test_issue52_manifest_paths_confined(tmp_path, capsys, shape_store, trace_dir, how, verb):
    store = _tampered(shape_store, tmp_path / "s", TAMPER[how])
    argv = (["real", "verify", store] if verb == "verify" else
            ["real", "run", "--store", store, "--trace", trace_dir, "--profile", "jetson-orin-nano-8gb"])
    code, _, err = cli(capsys, *argv)
    assert_refused(code, err, contains="outside the store")


# ---- hole 7: duplicate keys -------------------------------------------------------------------------
def test_issue52_duplicate_key_in_device_yaml_refused(tmp_path, capsys):
    text = (BUNDLED_DIR / "jetson-orin-nano-8gb.yaml").read_text()
    p = tmp_path / "dev.yaml"
    p.write_text(text.replace("memory:\n", "memory:\n  capacity_bytes: 858993459200\n", 1))
    code, _, err = cli(capsys, "devices", "show", p)
    assert_refused(code, err, contains="given twice")


@pytest.mark.parametrize("suffix", ["yaml", "json"])
def test_issue52_duplicate_key_in_config_refused(tmp_path, capsys, trace_dir, suffix):
    p = tmp_path / f"c.{suffix}"
    p.write_text("residency: window\nresidency: naive\n" if suffix == "yaml" else
                 '{"residency": "window", "residency": "naive"}')
    code, _, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, "--config", p)
    assert_refused(code, err, contains="given twice")


def test_issue52_duplicate_key_in_hf_config_refused(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    body = json.dumps(HF)[:-1] + ', "num_hidden_layers": 3}'
    (tmp_path / "m" / "config.json").write_text(body)
    code, _, err = cli(capsys, "models", "show", tmp_path / "m")
    assert_refused(code, err, contains="given twice")


# ---- hole 8: silent acceptance ----------------------------------------------------------------------
@pytest.mark.parametrize("body", ['[{"t_s": NaN, "available_bytes": 1000}]', '[[NaN, 1000]]',
                                  "t_s,available_bytes\nnan,1000\n"])
def test_issue52_budget_timeline_nan_refused(tmp_path, capsys, trace_dir, body):
    p = tmp_path / ("tl.csv" if body.startswith("t_s") else "tl.json")
    p.write_text(body)
    code, _, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, "--budget-timeline", p)
    assert_refused(code, err, contains="t_s")


def test_issue52_binary_budget_timeline_refused(tmp_path, capsys, trace_dir):
    p = tmp_path / "tl.json"
    p.write_bytes(b"\xff\xfe\x00\x01binary")
    code, _, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, "--budget-timeline", p)
    assert_refused(code, err, contains="UTF-8")


@pytest.mark.parametrize("run", ["100000000", "-3", "64"])
def test_issue52_real_read_run_out_of_range_refused(capsys, shape_store, run):
    code, _, err = cli(capsys, "real", "read", shape_store, f"--run={run}", "--tokens", "1", "--buffered")
    assert_refused(code, err, contains="--run")


def test_issue52_sweep_dry_run_refuses_a_repeated_point(tmp_path, capsys, trace_dir):
    p = tmp_path / "s.yaml"
    p.write_text(f"traces: [{trace_dir}]\ndevices: [apple-m1-max]\npresets: [naive, {{name: naive, set: {{}}}}]\n")
    code, _, err = cli(capsys, "sweep", p, "--out", tmp_path / "o", "--dry-run")
    assert_refused(code, err, tmp_path / "o", contains="same point")


@pytest.mark.parametrize("key", ["num_key_value_heads", "head_dim"])
def test_issue52_zero_in_hf_config_not_defaulted(tmp_path, capsys, key):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**HF, key: 0}))
    code, _, err = cli(capsys, "models", "show", tmp_path / "m")
    assert_refused(code, err, contains="n_kv_heads" if key == "num_key_value_heads" else "head_dim")


def test_issue52_device_with_an_empty_mode_refused(capsys):
    code, _, err = cli(capsys, "devices", "show", "jetson-orin-nano-8gb@")
    assert_refused(code, err, contains="no power mode")


# ---- hole 9: tampered files ---------------------------------------------------------------------------
def _predictor_file(tmp_path: Path) -> Path:
    import numpy as np

    from real.studies.predictor_train import FORMAT, VERSION, LowRankPredictor, save_predictor

    L, d, N, r = 2, 32, 64, 4
    meta = {"format": FORMAT, "version": VERSION, "model": "tiny", "n_layers": L, "d_model": d, "d_ff": N,
            "rank": r, "threshold": 0.5}
    pred = LowRankPredictor(np.zeros((L, d, r), np.float32), np.zeros((L, r, N), np.float32),
                            np.zeros((L, N), np.float32), 0.5, meta)
    return save_predictor(pred, tmp_path / "p.safetensors")


def _rewrite_header(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = edit(json.loads(raw[8:8 + n]))
    text = json.dumps(head).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


HEADER_TAMPER = {
    "header a list": lambda h: [h],
    "missing data_offsets": lambda h: {**h, "A": {k: v for k, v in h["A"].items() if k != "data_offsets"}},
    "negative shape": lambda h: {**h, "A": {**h["A"], "shape": [-2, 32, 4]}},
    "negative offset": lambda h: {**h, "A": {**h["A"], "data_offsets": [-8, h["A"]["data_offsets"][1]]}},
    "__metadata__ a list": lambda h: {**h, "__metadata__": ["x"]},
    "entry a string": lambda h: {**h, "A": "x"},
    "shape a string": lambda h: {**h, "A": {**h["A"], "shape": "2,32,4"}},
}


@pytest.mark.parametrize("how", sorted(HEADER_TAMPER))
def test_issue52_tampered_predictor_file_refused(tmp_path, how):
    from real.studies.predictor_train import load_predictor

    p = _predictor_file(tmp_path)
    load_predictor(p)
    _rewrite_header(p, HEADER_TAMPER[how])
    with pytest.raises(FlashsimError) as e:
        load_predictor(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("field", ["tensor count", "string length"])
def test_issue52_gguf_header_with_huge_counts_refused(tmp_path, capsys, field):
    """A GGUF header claiming 2**60 tensors (or a 2**60-byte string): refused, not a struct.error."""
    pytest.importorskip("gguf")
    p = tmp_path / "m.gguf"
    magic, version = b"GGUF", struct.pack("<I", 3)
    if field == "tensor count":
        body = struct.pack("<QQ", 2**60, 0)
    else:
        body = struct.pack("<QQ", 0, 1) + struct.pack("<Q", 2**60) + b"general.name"
    p.write_bytes(magic + version + body)
    code, _, err = cli(capsys, "real", "convert", "--model", p, "--out", tmp_path / "s")
    assert_refused(code, err, tmp_path / "s")


def test_issue52_profile_npz_claiming_terabytes_refused(tmp_path, capsys):
    import io
    import zipfile

    import numpy as np

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)})
    p = tmp_path / "prof.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("scores.npy", buf.getvalue())
    code, _, err = cli(capsys, "real", "convert", "--shape", "smollm2-135m", "--random", "--order", "hot-first",
                       "--profile", p, "--out", tmp_path / "s")
    assert_refused(code, err, tmp_path / "s", contains=str(p))


# ---- hole 11: numbers ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "contains"), [
    (["read", "--max-chunk", "0"], "--max-chunk"),
    (["read", "--max-chunk", "1e-3B"], "--max-chunk"),
    (["mmap", "--budget", "nan%"], "--budget"),
    (["mmap", "--budget", "1e30%"], "--budget"),
])
def test_issue52_real_numbers_refused(capsys, shape_store, argv, contains):
    verb, *rest = argv
    code, _, err = cli(capsys, "real", verb, shape_store, *rest, *(["--buffered"] if verb == "read" else []))
    assert_refused(code, err, contains=contains)
