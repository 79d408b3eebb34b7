"""SelectInfer's offline profiler: neuron scores s_n = sum_t |a_n(t)| per task and over all tasks,
and the rankings of base (task-specific) and secondary (model-specific) neurons.

Scores use the stored top-K magnitudes (neurons outside a token's top K contribute 0 for that
token, which is exact for every neuron that was ever among the strongest); a trace without
magnitudes (K = 0) scores by activation counts instead, and says so in `meta["score"]`.

File format (`.npz`, read with allow_pickle=False; no pickle anywhere):
    scores_all            float32 [L, N]   s_n over every token of every trace
    scores_task.<task>    float32 [L, N]   s_n over that task's tokens
    rank_secondary        int32   [L, N]   neurons by scores_all, descending (model-specific order)
    rank_base.<task>      int32   [L, N]   neurons by scores_task.<task>, descending
    meta_json             uint8   [bytes]  UTF-8 JSON: {"schema_version", "model", "tasks",
                                           "tokens_per_task", "traces", "score"}
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from devices.errors import FlashsimError
from traces.format import Trace
from traces.outputs import replace_output

PROFILE_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class NeuronProfile:
    """Scores and rankings from one or more traces of the same model shape."""

    scores_all: np.ndarray                     # float32 [L, N]
    scores_task: dict[str, np.ndarray]         # task -> float32 [L, N]
    meta: dict = field(default_factory=dict)

    @property
    def tasks(self) -> list[str]:
        return sorted(self.scores_task)

    @property
    def n_layers(self) -> int:
        return int(self.scores_all.shape[0])

    @property
    def n_neurons(self) -> int:
        return int(self.scores_all.shape[1])

    def secondary_ranking(self) -> np.ndarray:
        """int32 [L, N]: neurons by model-wide score, descending (ties by index: stable)."""
        return _rank(self.scores_all)

    def base_ranking(self, task: str) -> np.ndarray:
        """int32 [L, N]: neurons by the task's score, descending."""
        if task not in self.scores_task:
            raise FlashsimError(f"task {task!r} is not in the profile; it has {', '.join(self.tasks)}")
        return _rank(self.scores_task[task])


def _rank(scores: np.ndarray) -> np.ndarray:
    return np.argsort(-scores, axis=1, kind="stable").astype(np.int32)


def profile_traces(traces: Sequence[Trace]) -> NeuronProfile:
    """Score every neuron of every layer over the given traces (same L and N required)."""
    if not traces:
        raise FlashsimError("profile: give at least one trace")
    L, N = traces[0].n_layers, traces[0].n_neurons
    for t in traces:
        if (t.n_layers, t.n_neurons) != (L, N):
            raise FlashsimError(f"{t.path}: {t.n_layers} x {t.n_neurons} neurons, but the first trace has {L} x {N}")
    by_mag = all(t.top_k > 0 for t in traces)
    scores_all = np.zeros((L, N), np.float64)
    scores_task: dict[str, np.ndarray] = {}
    tokens_per_task: dict[str, int] = {}
    for t in traces:
        tasks = t.task_of_token
        for task in sorted(set(tasks)):
            sel = np.flatnonzero(tasks == task)
            tokens_per_task[task] = tokens_per_task.get(task, 0) + len(sel)
            acc = scores_task.setdefault(task, np.zeros((L, N), np.float64))
            for layer in range(L):
                if by_mag:
                    idx, mag = t.top(layer)
                    acc[layer] += np.bincount(np.asarray(idx[sel]).ravel(), minlength=N,
                                              weights=np.asarray(mag[sel], np.float64).ravel())
                else:
                    acc[layer] += t.mask(layer, sel).sum(axis=0)
    for acc in scores_task.values():
        scores_all += acc
    meta = {
        "schema_version": PROFILE_SCHEMA_VERSION,
        "model": traces[0].spec.name,
        "tasks": sorted(scores_task),
        "tokens_per_task": tokens_per_task,
        "traces": [str(t.path) for t in traces],
        "score": "sum_abs_activation" if by_mag else "activation_count",
    }
    return NeuronProfile(scores_all.astype(np.float32),
                         {k: v.astype(np.float32) for k, v in scores_task.items()}, meta)


def save_profile(profile: NeuronProfile, out: str | Path) -> Path:
    """Write atomically (temporary name, then rename)."""
    out = Path(out)
    if out.suffix != ".npz":
        raise FlashsimError(f"{out}: a neuron profile file must end in .npz")
    arrays = {"scores_all": profile.scores_all, "rank_secondary": profile.secondary_ranking(),
              "meta_json": np.frombuffer(json.dumps(profile.meta).encode(), np.uint8)}
    for task in profile.tasks:
        arrays[f"scores_task.{task}"] = profile.scores_task[task]
        arrays[f"rank_base.{task}"] = profile.base_ranking(task)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FlashsimError(f"{out}: cannot create its folder ({e.strerror})") from None
    if out.is_dir():
        raise FlashsimError(f"{out}: is a directory; give a file name ending in .npz")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        replace_output(tmp, out)
    except OSError as e:
        raise FlashsimError(f"{out}: cannot write the profile ({e.strerror})") from None
    finally:
        tmp.unlink(missing_ok=True)
    return out


def check_npz_sizes(path: Path) -> None:
    """Every array of an .npz must hold the bytes its header claims: a member whose header claims
    more data than the member has (4 TiB in a few hundred bytes) is refused before it is read."""
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with z.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                    shape, _fortran, dtype = read(f)
                    need = int(np.prod(shape, dtype=object)) * dtype.itemsize + f.tell()
                if need > info.file_size:
                    raise FlashsimError(f"{path}: array {info.filename!r} claims {list(shape)} {dtype} "
                                        f"({need:,} bytes) but holds {info.file_size:,}; the file is damaged")
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise FlashsimError(f"{path}: not a readable .npz neuron profile ({e})") from None


def load_neuron_profile(path: str | Path) -> NeuronProfile:
    """Read a profile file; FlashsimError names the file and what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise FlashsimError(f"{path}: neuron profile file not found")
    check_npz_sizes(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise FlashsimError(f"{path}: not a readable .npz neuron profile ({e})") from None
    if "meta_json" not in arrays or "scores_all" not in arrays:
        raise FlashsimError(f"{path}: missing 'meta_json' or 'scores_all'; not a flashsim neuron profile")
    try:
        meta = json.loads(arrays["meta_json"].tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise FlashsimError(f"{path}: field 'meta_json' is not valid JSON") from None
    if meta.get("schema_version") != PROFILE_SCHEMA_VERSION:
        raise FlashsimError(f"{path}: field 'schema_version': {meta.get('schema_version')!r} is not supported")
    scores_all = arrays["scores_all"]
    if scores_all.ndim != 2 or scores_all.dtype != np.float32:
        raise FlashsimError(f"{path}: array 'scores_all' must be float32 [layers, neurons], "
                            f"got {scores_all.dtype} {list(scores_all.shape)}")
    scores_task = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith("scores_task.")}
    for name, a in [("scores_all", scores_all), *((f"scores_task.{k}", v) for k, v in scores_task.items())]:
        if a.shape != scores_all.shape or a.dtype != np.float32:
            raise FlashsimError(f"{path}: array {name!r} is {a.dtype} {list(a.shape)}, expected float32 "
                                f"{list(scores_all.shape)}")
        if not np.all(np.isfinite(a)) or np.any(a < 0):
            raise FlashsimError(f"{path}: array {name!r} has negative, NaN or infinite scores")
    if sorted(scores_task) != sorted(meta.get("tasks", [])):
        raise FlashsimError(f"{path}: field 'meta_json.tasks' {meta.get('tasks')} does not match the "
                            f"scores_task arrays {sorted(scores_task)}")
    n = scores_all.shape[1]
    for name in ["rank_secondary", *(f"rank_base.{t}" for t in scores_task)]:
        r = arrays.get(name)
        if r is None:
            raise FlashsimError(f"{path}: array {name!r} is missing; re-run `flashsim trace profile`")
        if r.shape != scores_all.shape or not np.array_equal(np.sort(r, axis=1),
                                                              np.broadcast_to(np.arange(n), r.shape)):
            raise FlashsimError(f"{path}: array {name!r} is not a ranking (a permutation of the "
                                f"{n} neurons per layer)")
    return NeuronProfile(scores_all, scores_task, meta)
