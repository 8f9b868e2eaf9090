"""Testbed files of `slora-vtc calibrate --out`'s form (a profile's model plus a measured run's
overhead and cold start): what calibration writes is read back as it was, and a file with a field
that is not what the simulator can run with is one line naming the file and the field, exit status 2
(not a traceback, a run that never ends, or a run that goes ahead with it)."""

import json
import math
from dataclasses import asdict

import pytest

from slora_vtc.backends.sim import TESTBEDS, load_testbed, save_testbed
from slora_vtc.calibrate_steps import VllmStepModel
from tests.helpers.cli import assert_one_line_error, run_cli
from tests.helpers.files import REPO

SHIPPED_STEP_TESTBED = REPO / "benchmarks" / "results" / "vllm_fidelity" / "testbed.json"
RUN = ("run", "--suite", "overload", "--scheduler", "vtc", "--duration", "5")


@pytest.mark.parametrize("name", sorted(TESTBEDS))
def test_a_saved_testbed_is_read_back_as_it_was(tmp_path, name):
    """`calibrate --out` writes with save_testbed: the built-in testbeds, written so, load unchanged."""
    path = tmp_path / "testbed.json"
    save_testbed(TESTBEDS[name], path)
    assert load_testbed(str(path)) == TESTBEDS[name]


def test_the_shipped_step_testbed_loads():
    assert isinstance(load_testbed(str(SHIPPED_STEP_TESTBED)), VllmStepModel)


def test_what_the_format_allows_is_read(tmp_path):
    """A whole knee written as a float, a cached coefficient given, zero coefficients among others."""
    path = tmp_path / "testbed.json"
    raw = {**asdict(TESTBEDS["a10g-2023"]), "decode_knee": 35.0, "cached_coef": 7.8e-9, "overhead_s": 0}
    raw["decode_coef"] = [0.03, 0, 0]
    path.write_text(json.dumps(raw))
    model = load_testbed(str(path))
    assert model.decode_knee == 35 and isinstance(model.decode_knee, int)
    assert model.cached_coef == 7.8e-9 and model.decode_coef == (0.03, 0.0, 0.0) and model.overhead_s == 0.0


def write_testbed(tmp_path, **changes):
    path = tmp_path / "tb.json"
    path.write_text(json.dumps({**asdict(TESTBEDS["a10g-2023"]), **changes}))
    return path


BAD = {
    "too-short": ({"prefill_coef": [0.1]}, ["'prefill_coef'", "list of 3 finite numbers >= 0", "[0.1]"]),
    "too-long": ({"decode_coef": [0.1] * 5}, ["'decode_coef'", "list of 3 finite numbers >= 0"]),
    "strings": ({"prefill_coef": ["a", "b", "c"]}, ["'prefill_coef'", "['a', 'b', 'c']"]),
    "a-string": ({"decode_coef": "abc"}, ["'decode_coef'", "'abc'"]),
    "nan-overhead": ({"overhead_s": math.nan}, ["'overhead_s'", "finite number >= 0", "nan"]),
    "nan-coefficients": ({"decode_coef": [math.nan] * 3}, ["'decode_coef'", "nan"]),
    "inf-coefficient": ({"prefill_coef": [0.04, math.inf, 0.0002]}, ["'prefill_coef'", "inf"]),
    "negative-overhead": ({"overhead_s": -1}, ["'overhead_s'", "finite number >= 0", "-1"]),
    "negative-cold-start": ({"cold_start_s": -5}, ["'cold_start_s'", "-5"]),
    "inf-cold-start": ({"cold_start_s": math.inf}, ["'cold_start_s'", "inf"]),
    "negative-knee": ({"decode_knee": -3}, ["'decode_knee'", "whole number >= 0", "-3"]),
    "fractional-knee": ({"decode_knee": 3.7}, ["'decode_knee'", "whole number", "3.7"]),
    "string-knee": ({"decode_knee": "35"}, ["'decode_knee'", "'35'"]),
    "negative-coefficients": ({"prefill_coef": [-1, -1, -1]}, ["'prefill_coef'", "[-1, -1, -1]"]),
    "string-cached": ({"cached_coef": "x"}, ["'cached_coef'", "or null", "'x'"]),
    "inf-overhead": ({"overhead_s": math.inf}, ["'overhead_s'", "inf"]),
    "no-time": (
        {"prefill_coef": [0, 0, 0], "decode_coef": [0, 0, 0], "overhead_s": 0},
        ["every step would take no time"],
    ),
}


@pytest.mark.parametrize("changes, parts", BAD.values(), ids=BAD.keys())
def test_a_bad_field_is_one_line_naming_the_file_and_the_field(tmp_path, capsys, changes, parts):
    path = write_testbed(tmp_path, **changes)
    code, _, err = run_cli(capsys, *RUN, "--testbed", path, "--out", tmp_path / "run.jsonl")
    assert_one_line_error(code, err, str(path), *parts)
    assert not (tmp_path / "run.jsonl").exists()


@pytest.mark.parametrize(
    "text, parts",
    [
        ("{not json", ["not a testbed file", "JSONDecodeError"]),
        ("[1, 2, 3]", ["not a testbed file", "JSON object", "list"]),
        (json.dumps({"prefill_coef": [0, 0, 1]}), ["not a testbed file", "missing field 'decode_coef'"]),
        (json.dumps({"kind": "other"}), ["not a testbed file", "unknown kind 'other'"]),
    ],
    ids=["not-json", "not-an-object", "missing-field", "unknown-kind"],
)
def test_a_file_that_is_not_a_testbed_is_one_line(tmp_path, capsys, text, parts):
    path = tmp_path / "tb.json"
    path.write_text(text)
    code, _, err = run_cli(capsys, *RUN, "--testbed", path, "--out", tmp_path / "run.jsonl")
    assert_one_line_error(code, err, str(path), *parts)


STEP_BAD = {
    **{
        f"inf-{name}": ({name: math.inf}, [f"'{name}'", "finite number >= 0", "inf"])
        for name in ("base_s", "prefill_token_s", "prefill_pair_s", "decode_req_s", "context_token_s", "gap_s")
    },
    "nan": ({"decode_req_s": math.nan}, ["'decode_req_s'", "nan"]),
    "no-time": (
        dict.fromkeys(("base_s", "prefill_token_s", "prefill_pair_s", "decode_req_s", "context_token_s"), 0.0),
        ["are all 0", "every step would take no time"],
    ),
}


@pytest.mark.parametrize("changes, parts", STEP_BAD.values(), ids=STEP_BAD.keys())
def test_a_bad_step_testbed_is_one_line_naming_the_file_and_the_field(tmp_path, capsys, changes, parts):
    path = tmp_path / "tb.json"
    path.write_text(json.dumps({**json.loads(SHIPPED_STEP_TESTBED.read_text()), **changes}))
    code, _, err = run_cli(capsys, *RUN, "--testbed", path, "--out", tmp_path / "run.jsonl")
    assert_one_line_error(code, err, str(path), *parts)
    assert not (tmp_path / "run.jsonl").exists()
