"""Issue 52 holes 1-2, output paths: a device node, FIFO or socket is never replaced, and a folder the
tool did not write is never emptied or removed; /, home and a repository root are refused outright.
Every node and folder here is private to the test (mknod in tmp_path), never the system's."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from devices.errors import FlashsimError
from tests.robustness.conftest import assert_refused, cli, tiny_spec
from traces.outputs import check_output_dir, write_atomic

DEVICE = ["--device", "jetson-orin-nano-8gb"]


def _node(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / f"node-{kind}"
    if kind == "chardev":
        try:
            os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))      # a private /dev/null
        except (PermissionError, OSError) as e:
            pytest.skip(f"mknod not permitted here ({e})")
    elif kind == "fifo":
        os.mkfifo(p)
    else:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(p))
        s.close()
    return p


def _same_kind(p: Path, kind: str) -> bool:
    m = os.lstat(p).st_mode
    return {"chardev": stat.S_ISCHR, "fifo": stat.S_ISFIFO, "socket": stat.S_ISSOCK}[kind](m)


@pytest.mark.parametrize("kind", ["chardev", "fifo", "socket"])
@pytest.mark.parametrize("option", ["--records", "--timeline"])
def test_issue52_output_onto_a_node_refused(tmp_path, capsys, trace_dir, kind, option):
    node = _node(tmp_path, kind)
    code, _, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, "--engine", "fast", option, node)
    assert_refused(code, err, contains="regular files")
    assert _same_kind(node, kind), f"{node} was replaced"
    assert sorted(p.name for p in tmp_path.iterdir()) == [node.name]


def test_issue52_output_onto_a_symlink_to_a_node_refused(tmp_path, capsys, trace_dir):
    node = _node(tmp_path, "chardev")
    link = tmp_path / "link.parquet"
    link.symlink_to(node)
    code, _, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, "--engine", "fast", "--records", link)
    assert_refused(code, err, contains="character device")
    assert _same_kind(node, "chardev") and link.is_symlink()


def test_issue52_write_atomic_never_replaces_a_node(tmp_path):
    node = _node(tmp_path, "fifo")
    with pytest.raises(FlashsimError, match="FIFO"):
        write_atomic(node, lambda tmp: tmp.write_text("x"))
    assert _same_kind(node, "fifo") and sorted(p.name for p in tmp_path.iterdir()) == [node.name]


def _user_folder(tmp_path: Path) -> Path:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.tex").write_text("a user's only copy")
    return d


def _assert_kept(d: Path) -> None:
    assert (d / "thesis.tex").read_text() == "a user's only copy"
    assert sorted(p.name for p in d.iterdir()) == ["thesis.tex"]
    assert not [p for p in d.parent.iterdir() if p.name.startswith(f".{d.name}.")], "a temporary was left"


SYNTH = ["--model", "smollm2-135m", "--tokens", "4", "--active-fraction", "0.1", "--overlap", "0.5",
         "--hot-skew", "0.3"]


def test_issue52_trace_synth_force_keeps_a_user_folder(tmp_path, capsys):
    d = _user_folder(tmp_path)
    code, _, err = cli(capsys, "trace", "synth", *SYNTH, "--out", d, "--force")
    assert_refused(code, err, contains="not a flashsim trace")
    _assert_kept(d)


def test_issue52_convert_overwrite_keeps_a_user_folder(tmp_path, capsys):
    d = _user_folder(tmp_path)
    code, _, err = cli(capsys, "real", "convert", "--shape", "smollm2-135m", "--random", "--out", d, "--overwrite")
    assert_refused(code, err, contains="not a flashsim store")
    _assert_kept(d)


def test_issue52_real_run_trace_out_keeps_a_user_folder(tmp_path, capsys, trace_dir):
    from real.weights.convert import write_shape_store

    store = write_shape_store(tiny_spec(), tmp_path / "s", seed=0, dtype="fp32")
    d = _user_folder(tmp_path)
    code, _, err = cli(capsys, "real", "run", "--store", store, "--trace", trace_dir, "--profile",
                       "jetson-orin-nano-8gb", "--trace-out", d, "--tokens", "2")
    assert_refused(code, err, contains="not a flashsim trace")
    _assert_kept(d)


def test_issue52_store_is_not_replaced_by_a_trace(tmp_path, capsys):
    """The marker must be of the writer's own kind: --force on a store folder does not delete it."""
    from real.weights.convert import write_shape_store

    store = write_shape_store(tiny_spec(), tmp_path / "s", seed=0, dtype="fp32")
    before = sorted(p.name for p in store.rglob("*"))
    code, _, err = cli(capsys, "trace", "synth", *SYNTH, "--out", store, "--force")
    assert_refused(code, err, contains="not a flashsim trace")
    assert sorted(p.name for p in store.rglob("*")) == before


def test_issue52_empty_folder_is_a_valid_new_output(tmp_path, capsys):
    d = tmp_path / "empty"
    d.mkdir()
    code, _, err = cli(capsys, "trace", "synth", *SYNTH, "--out", d)
    assert code == 0, err
    assert (d / "manifest.json").is_file()


def test_issue52_own_trace_replaced_only_with_the_flag(tmp_path, capsys):
    d = tmp_path / "t"
    assert cli(capsys, "trace", "synth", *SYNTH, "--out", d)[0] == 0
    code, _, err = cli(capsys, "trace", "synth", *SYNTH, "--out", d)
    assert_refused(code, err, contains="--force")
    code, _, err = cli(capsys, "trace", "synth", *SYNTH, "--out", d, "--force", "--seed", "1")
    assert code == 0, err


@pytest.mark.parametrize("which", ["root", "home", "repository"])
def test_issue52_protected_folders_refused_outright(tmp_path, capsys, monkeypatch, which):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("x")
    monkeypatch.setenv("HOME", str(home))
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    target = {"root": Path("/"), "home": home, "repository": repo}[which]
    code, _, err = cli(capsys, "real", "convert", "--shape", "smollm2-135m", "--random", "--out", target, "--overwrite")
    assert_refused(code, err, contains="root, home or a repository")
    assert (home / ".bashrc").exists() and (repo / ".git").is_dir()


def test_issue52_check_output_dir_refuses_the_source_tree():
    repo = Path(__file__).resolve().parents[2]
    with pytest.raises(FlashsimError, match="repository"):
        check_output_dir(repo, "--out", overwrite=True, kind="trace")
