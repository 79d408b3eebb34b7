"""scripts/ablation.py: the decision rule by hand, and every term's switch on a real calibration
(no simulation: that is the script's own run, minutes on the reference grids)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def A():
    spec = importlib.util.spec_from_file_location("ablation", ROOT / "scripts" / "ablation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _d(fit, test, med, p90, lmed, lp90, applies=True):
    return {"fit": fit, "test": test, "applies": applies, "median": med, "p90": p90, "level_median": lmed,
            "level_p90": lp90}


def test_a_term_is_kept_only_when_it_lowers_the_held_out_level_removed_error_by_a_point(A):
    base = [_d("a", "b", 0.10, 0.20, 0.05, 0.10), _d("b", "a", 0.30, 0.40, 0.06, 0.12)]
    out = {"terms": {
        "baseline": {"directions": base},
        # without it: level-removed p90 +1.5 and +0.7 points -> mean +1.1: kept
        "helps": {"directions": [_d("a", "b", 0.0, 0.0, 0.05, 0.115), _d("b", "a", 0.0, 0.0, 0.06, 0.127)]},
        # raw error 20 points worse without it, level removed the same: the level, not the model -> removed
        "level_only": {"directions": [_d("a", "b", 0.30, 0.40, 0.05, 0.10), _d("b", "a", 0.50, 0.60, 0.06, 0.12)]},
        # applies in one direction only: its gain is that direction's (+2 points on the median)
        "one_way": {"directions": [_d("a", "b", 0.1, 0.2, 0.07, 0.10), _d("b", "a", 0, 0, 0, 0, applies=False)]},
    }}
    A.decide(out)
    t = out["terms"]
    assert t["helps"]["gain"]["level_p90"] == pytest.approx(0.011) and t["helps"]["kept"]
    assert t["level_only"]["gain"]["median"] == pytest.approx(0.20) and not t["level_only"]["kept"]
    assert t["one_way"]["gain"]["level_median"] == pytest.approx(0.02) and t["one_way"]["kept"]
    assert "| helps |" in A.markdown(out) and "n/a" in A.markdown(out)


def test_every_switch_changes_the_calibration_it_applies_to(A):
    from devices.schema import DeviceProfile

    doc = yaml.safe_load((ROOT / "devices" / "profiles" / "this-host.yaml").read_text())
    for name, (_what, fn, overrides) in A.TERMS.items():
        if overrides:
            continue
        d = copy.deepcopy(doc)
        fn(d)
        assert d != doc, name                    # the bundled calibration has every term
        DeviceProfile.model_validate(d)          # and stays a valid profile without it


def test_removed_terms_are_listed_not_ablatable(A, capsys):
    """A term the ablation removed is no longer a switch: asking for it is one line and exit 2, and
    its profile keys are among those loading drops (devices/schema.py RETIRED_*_KEYS)."""
    from devices.schema import RETIRED_FLASH_KEYS

    assert not set(A.REMOVED) & set(A.TERMS)
    assert {"host_cpu_batch_reads", "host_cpu_curves"} <= set(RETIRED_FLASH_KEYS)
    assert not {"host_cpu_batch_reads", "host_cpu_curves"} & set(A.HOST_CPU_KEYS)
    assert A.main(["--terms", "host_cpu_curves"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already removed" in err and "host_cpu_curves" in err
