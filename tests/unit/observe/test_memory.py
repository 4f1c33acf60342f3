"""What filled a GPU (hpctrain.observe.memory), on CPU: the allocator snapshot's live blocks grouped by the
first frame outside torch, when the history is armed, the OOM verdict a supervisor writes from the summary,
and the NCCL flight recorder's settings. The CUDA path itself runs in tests/gpu/test_cuda_path.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpctrain.launch.exits import exit_outcome
from hpctrain.observe import memory
from hpctrain.plan.host import Planned
from hpctrain.rendezvous.group import FLIGHT_PREFIX_ENV, FLIGHT_RECORDER, arm_flight_recorder
from hpctrain.rundir import RunDir
from hpctrain.rundir.records import write_error_record

GIB = 1024**3


def _block(size: int, state: str, *frames: tuple[str, int, str]) -> dict:
    return {
        "size": size,
        "requested_size": size,
        "state": state,
        "frames": [{"filename": f, "line": line, "name": name} for f, line, name in frames],
    }


# The shape torch.cuda.memory._snapshot() returns (torch/cuda/_memory_viz.py reads the same keys).
SNAPSHOT = {
    "segments": [
        {
            "device": 0,
            "total_size": 30 * GIB,
            "blocks": [
                _block(
                    8 * GIB,
                    "active_allocated",
                    ("/v/site-packages/torch/nn/functional.py", 10, "linear"),
                    ("/x/hpctrain/models/gpt.py", 88, "forward"),
                ),
                _block(4 * GIB, "active_allocated", ("/x/hpctrain/models/gpt.py", 88, "forward")),
                _block(6 * GIB, "active_allocated", ("/home/me/proj/mynet.py", 12, "attn")),
                _block(9 * GIB, "inactive", ("/home/me/proj/mynet.py", 40, "freed")),
                _block(1 * GIB, "active_allocated"),
            ],
        }
    ]
}


def test_live_blocks_are_grouped_by_the_first_frame_outside_torch():
    allocated, top = memory.top_allocations(SNAPSHOT)
    assert allocated == 19 * GIB
    assert top == [
        {"bytes": 12 * GIB, "blocks": 2, "where": "hpctrain/models/gpt.py:88 in forward"},
        {"bytes": 6 * GIB, "blocks": 1, "where": "proj/mynet.py:12 in attn"},
        {"bytes": 1 * GIB, "blocks": 1, "where": "no stack recorded"},
    ]
    line = memory.summary_line({"allocated": allocated, "top": top})
    assert line.startswith(
        "19.00 GiB allocated; largest: 12.00 GiB in 2 at hpctrain/models/gpt.py:88 in forward, "
    )
    assert memory.top_allocations({}) == (0, [])


def test_the_history_is_armed_on_a_gpu_when_asked_or_after_an_out_of_memory(tmp_path: Path):
    assert memory.wanted(True, True, tmp_path) and not memory.wanted(True, False, tmp_path)
    assert not memory.wanted(None, True, tmp_path) and not memory.wanted(False, True, tmp_path)
    RunDir(tmp_path).append_answer({"time": 1.0, "action": "stopped", "kind": memory.OOM_KIND})
    assert memory.wanted(None, True, tmp_path) and not memory.wanted(False, True, tmp_path)


def test_a_raised_out_of_memory_is_named_with_what_filled_the_gpu_and_the_plan(tmp_path: Path):
    write_error_record(tmp_path, 1, "OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB")
    RunDir(tmp_path).memory.mkdir()
    allocated, top = memory.top_allocations(SNAPSHOT)
    RunDir(tmp_path).memory_summary(1).write_text(json.dumps({"allocated": allocated, "top": top}))
    outcome = exit_outcome(tmp_path, 1, "node2", 1, 4242, None, lambda: Planned(2 * GIB, 18 * GIB))
    assert outcome.kind == "out of memory", outcome
    assert outcome.detail.startswith("out of memory, as raised: 19.00 GiB allocated; largest: 12.00 GiB")
    assert outcome.detail.endswith("(plan: 18.00 GiB per GPU)"), outcome.detail
    # Without the history: the class alone.
    plain = exit_outcome(tmp_path, 0, "node2", 1, 4242, None, lambda: Planned(2 * GIB, 18 * GIB))
    assert plain.kind != "out of memory" or "allocated" not in plain.detail


def test_the_flight_recorder_dumps_into_the_run_directory_unless_the_user_says_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    for name in (*FLIGHT_RECORDER, *FLIGHT_PREFIX_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "500")  # the user's own
    arm_flight_recorder(RunDir(tmp_path))
    assert (
        os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "500"
        and os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    )
    assert all(os.environ[name] == str(tmp_path / "flight" / "rank") for name in FLIGHT_PREFIX_ENV)
    assert (tmp_path / "flight").is_dir()


@pytest.mark.parametrize(
    ("override", "words"),
    [
        (
            "trainer.memory_history=true",
            "trainer.memory_history=True: the CUDA allocator's history needs a GPU",
        ),
        ("trainer.memory_history=maybe", "trainer.memory_history"),
    ],
)
def test_bad_values_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, override: str, words: str
):
    from hpctrain.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(["cluster=slurm_test", override, "dry_run=true"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err, err
